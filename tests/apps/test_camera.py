"""vipc-camera: real daemon processes, real clients, real frames."""

import re
import signal
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
import pytest
from camera_helpers import CAMERA, connect, finish, reap, receive, run_without, start

from msgq.testing import unique_name
from visionipc.apps.camera.daemon import main
from visionipc.apps.camera.pattern import read_stamp

FPS = 50
PERIOD_NS = 1e9 / FPS


@pytest.fixture(autouse=True)
def _no_process_left():
    yield
    reap()


def _camera(name, *args, frames=30, fps=FPS, size=(160, 96)):
    return start(
        CAMERA,
        "--name",
        name,
        "--width",
        size[0],
        "--height",
        size[1],
        "--fps",
        fps,
        "--frames",
        frames,
        "--wait-clients",
        1,
        *args,
    )


def _on_schedule(sofs):
    """Every start of frame lies on the absolute schedule start + k / fps (no drift)."""
    slots = (np.asarray(sofs, np.float64) - sofs[0]) / PERIOD_NS
    return np.abs(slots - np.round(slots)).max() < 1e-3 and np.all(np.diff(np.round(slots)) >= 1)


@pytest.mark.parametrize("fmt", ["nv12", "bgr", "gray", "i420", "rgb", "raw16"])
def test_synthetic_frames_carry_their_id_and_follow_the_schedule(fmt):
    name = unique_name("cam")
    proc = _camera(name, "--stream", "road", "--format", fmt, frames=25)
    frames = receive(name, "road")
    rc, _, err = finish(proc)
    assert rc == 0, err
    assert [f["frame_id"] for f in frames] == list(range(25))
    assert [f["stamp"] for f in frames] == list(range(25))
    assert all(f["eof"] >= f["sof"] and f["publish"] >= f["eof"] and f["recv"] >= f["publish"] for f in frames)
    assert _on_schedule([f["sof"] for f in frames])
    assert frames[0]["format"] == {"bgr": "bgr8", "gray": "gray8", "rgb": "rgb8"}.get(fmt, fmt)
    assert "25 frames published" in err


def test_pattern_moves_between_frames():
    name = unique_name("cam")
    proc = _camera(name, "--stream", "s", "--format", "gray", frames=3)
    client = connect(name, "s")
    images = []
    for _ in range(3):
        frame = client.recv(2000)
        images.append(frame.array[48:].copy())  # below the header band
    client.close()
    assert finish(proc)[0] == 0
    assert not np.array_equal(images[0], images[1]) and not np.array_equal(images[1], images[2])


def test_video_file_source_is_resized_and_converted(tmp_path):
    path = str(tmp_path / "clip.avi")
    writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"MJPG"), 25, (64, 48))
    levels = [20 * i for i in range(8)]
    for level in levels:
        writer.write(np.full((48, 64, 3), level, np.uint8))
    writer.release()
    name = unique_name("cam")
    proc = start(
        CAMERA,
        "--name",
        name,
        "--stream",
        "s",
        "--source",
        path,
        "--width",
        32,
        "--height",
        24,
        "--format",
        "gray",
        "--wait-clients",
        1,
    )
    frames = receive(name, "s")
    rc, _, err = finish(proc)
    assert rc == 0, err  # the file ended: the daemon stops by itself
    assert "@ 25 fps" in err  # the file's own rate when --fps is not given
    assert [f["frame_id"] for f in frames] == list(range(len(levels)))
    assert (frames[0]["width"], frames[0]["height"]) == (32, 24)
    assert np.allclose([f["mean"] for f in frames], levels, atol=3)


def test_missing_v4l2_device_is_a_clear_error(capsys):
    assert main(["--name", unique_name("cam"), "--stream", "s", "--source", "/dev/video97"]) == 2
    assert "no camera device /dev/video97" in capsys.readouterr().err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_every_stream_cleanly(sig):
    name = unique_name("cam")
    proc = start(CAMERA, "--name", name, "--stream", "a", "--stream", "b", "--width", 96, "--height", 64)
    assert len(receive(name, "a", count=2)) == 2 and len(receive(name, "b", count=2)) == 2
    proc.send_signal(sig)
    rc, _, err = finish(proc, timeout=10)
    assert rc == 0, err
    assert "frames published" in err


def test_dropped_frames_never_arrive_and_delayed_ones_arrive_late():
    name = unique_name("cam")
    proc = _camera(name, "--stream", "s", "--drop-frames", "3,7,8", "--delay-frames", "10:120,20:30", frames=30)
    frames = receive(name, "s")
    assert finish(proc)[0] == 0
    assert [f["frame_id"] for f in frames] == [i for i in range(30) if i not in (3, 7, 8)]
    assert [f["stamp"] for f in frames] == [f["frame_id"] for f in frames]
    late = {f["frame_id"]: (f["publish"] - f["eof"]) / 1e6 for f in frames}
    assert late[10] >= 120 and late[20] >= 30
    assert late[11] >= 120 - 2 * PERIOD_NS / 1e6  # queued behind frame 10, in order
    assert _on_schedule([f["sof"] for f in frames])  # capture kept its schedule meanwhile


@pytest.mark.parametrize("wake", ["handoff", "all"])
def test_wake_choice_reaches_every_client_and_the_summary_counts_the_servers_wake_ups(wake, monkeypatch):
    """``--wake handoff``: three clients asleep in recv() (threads here) get every frame
    while the camera's own system calls wake at most one of them per frame; with
    ``--wake all`` they wake every sleeper (three per frame, bar a client still awake)."""
    monkeypatch.setenv("MSGQ_SPIN_US", "0")  # the clients sleep at once
    name, frames, clients = unique_name("cam"), 20, 3
    proc = _camera(name, "--stream", "s", "--wake", wake, "--wait-clients", clients, frames=frames)
    conns = [connect(name, "s") for _ in range(clients)]
    with ThreadPoolExecutor(clients) as pool:
        got = list(pool.map(lambda c: receive(name, "s", client=c), conns))
    rc, _, err = finish(proc)
    assert rc == 0, err
    for frames_of_one in got:
        assert [f["stamp"] for f in frames_of_one] == list(range(frames))
    woken = int(re.search(rf"(\d+) sleeping clients woken by the server \(wake {wake}\)", err).group(1))
    if wake == "handoff":
        assert 0 < woken <= frames, err
    else:
        assert woken > 2 * frames, err


def test_config_file_gives_each_stream_its_own_settings(tmp_path):
    config = tmp_path / "cams.toml"
    name = unique_name("cam")
    config.write_text(
        f'name = "{name}"\nwake = "handoff"\n'
        '[[stream]]\nname = "road"\nwidth = 128\nheight = 96\nformat = "bgr"\ndrop_frames = [2]\n'
        '[[stream]]\nname = "wide"\nwidth = 96\nheight = 64\nformat = "nv12"\nframes = 5\n'
    )
    proc = start(CAMERA, "--config", config, "--frames", 6, "--fps", 100, "--wait-clients", 1)
    clients = [connect(name, stream) for stream in ("road", "wide")]  # both before the first frame
    road, wide = (receive(name, c.stream, client=c) for c in clients)
    rc, _, err = finish(proc)
    assert rc == 0, err
    assert [f["frame_id"] for f in road] == [0, 1, 3, 4, 5] and road[0]["format"] == "bgr8"
    assert (road[0]["width"], wide[0]["width"]) == (128, 96)
    assert [f["frame_id"] for f in wide] == list(range(5)) and wide[0]["format"] == "nv12"
    assert "(wake handoff)" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--stream", "s"], "--name"),
        (["--name", "x"], "no stream"),
        (["--name", "x", "--stream", "s", "--fps", "0"], "fps must be"),
        (["--name", "x", "--stream", "s", "--format", "yuyv"], "unknown pixel format"),
        (["--name", "x", "--stream", "s", "--width", "101", "--height", "50"], "even width"),
        (["--name", "x", "--stream", "s", "--width", "40000", "--height", "64"], "must be 1..32768 on each side"),
        (["--name", "x", "--stream", "s", "--width", "40", "--height", "30", "--format", "gray"], "at least"),
        (["--name", "x", "--stream", "s", "--delay-frames", "30"], "FRAME_ID:MILLISECONDS"),
        (["--name", "x", "--stream", "s", "--drop-frames", "a,b"], "not a frame id"),
        (["--name", "x", "--stream", "s", "--stream", "s"], "given twice"),
        (["--name", "x", "--stream", "s", "--source", "/no/such/file.mp4"], "not 'synthetic'"),
        (["--name", "x", "--stream", "bad/name"], "stream name"),
        (["--name", "x", "--config", "/no/such.toml"], "does not exist"),
    ],
)
def test_bad_input_is_a_clear_error(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, message",
    [
        ('[[stream]]\nname = "s"\nwidht = 3\n', "widht"),
        ('wak = "handoff"\n[[stream]]\nname = "s"\n', "unknown key(s) wak"),
        ('wake = "fast"\n[[stream]]\nname = "s"\n', "wake must be 'all' or 'handoff', not 'fast'"),
    ],
)
def test_unknown_or_bad_config_key_is_named(tmp_path, capsys, text, message):
    config = tmp_path / "c.toml"
    config.write_text(text)
    assert main(["--name", unique_name("x"), "--config", str(config)]) == 2
    assert message in capsys.readouterr().err


def test_bad_wake_is_a_clear_error(capsys, monkeypatch):
    with pytest.raises(SystemExit) as e:
        main(["--name", "x", "--stream", "s", "--wake", "fast"])
    assert e.value.code == 2 and "invalid choice: 'fast'" in capsys.readouterr().err
    monkeypatch.setenv("MSGQ_WAKE", "fast")
    assert main(["--name", unique_name("x"), "--stream", "s"]) == 2
    assert "MSGQ_WAKE must be 'all' or 'handoff', not 'fast'" in capsys.readouterr().err


def test_read_stamp_rejects_an_unstamped_image():
    assert read_stamp(np.zeros((48, 160), np.uint8), "gray8") is None
    assert read_stamp(np.full((48, 160), 255, np.uint8), "gray8") is None


def test_missing_opencv_names_the_extra_to_install():
    rc, err = run_without("cv2", "visionipc.apps.camera.daemon:main", ["--name", "x", "--stream", "s"])
    assert rc == 2 and "pip install 'visionipc[cv]'" in err


def test_a_server_name_in_use_is_one_line_not_a_traceback(capsys):
    """Issue 34: a second vipc-camera with the same --name printed a 20-line traceback."""
    from visionipc import VisionIpcServer

    name = unique_name("taken")
    holder = VisionIpcServer(name)
    try:
        status = main(["--name", name, "--stream", "road", "--source", "synthetic", "--frames", "1"])
    finally:
        holder.close()
    err = capsys.readouterr().err
    assert status == 1
    assert err.count("\n") == 1 and err.startswith("vipc-camera: error: another VisionIPC server"), err
