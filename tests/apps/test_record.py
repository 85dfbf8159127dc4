"""vipc-record / vipc-replay: real camera, recorder and replayer processes."""

import json
import os
import signal
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
from camera_helpers import CAMERA, RECORD, REPLAY, connect, finish, reap, receive, run_without, start

import msgq
from msgq.testing import unique_name, unique_topic
from visionipc.apps.camera.pattern import read_stamp
from visionipc.apps.record import quality
from visionipc.apps.record.index import INDEX_COLUMNS, index_schema, quality_schema, read_index, read_topic
from visionipc.apps.record.reader import iter_frames
from visionipc.apps.record.recorder import main as record_main
from visionipc.apps.record.replay import main as replay_main

SIZE = ("--width", 96, "--height", 64)


@pytest.fixture(autouse=True)
def _no_process_left():
    yield
    reap()


def _visible(folder):
    return sorted(
        os.path.relpath(os.path.join(d, f), folder)
        for d, _, files in os.walk(folder)
        for f in files
        if not f.startswith(".")
    )


def _hidden(folder):
    return sorted(f for _, _, files in os.walk(folder) for f in files if f.startswith("."))


def _wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_duration_and_segments_give_the_documented_files_and_columns(tmp_path):
    name, topic, out = unique_name("cam"), unique_topic("events"), str(tmp_path / "rec")
    camera = start(CAMERA, "--name", name, "--stream", "road", "--width", 160, "--height", 96, "--fps", 30)
    connect(name, "road").close()
    pub = msgq.pub_sock(topic)
    recorder = start(
        RECORD,
        "--name",
        name,
        "--stream",
        "road",
        "--topic",
        topic,
        "--out",
        out,
        "--duration",
        1.6,
        "--segment-seconds",
        0.5,
        "--codec",
        "mp4v",  # the OpenCV format (the PyAV codecs: test_record_codecs.py)
    )
    _wait_for(lambda: os.path.exists(os.path.join(out, "recording.json")))
    for i in range(5):
        pub.send(b"event %d" % i)
        time.sleep(0.1)
    rc, _, err = finish(recorder)
    pub.close()
    camera.send_signal(signal.SIGINT)
    assert finish(camera)[0] == 0
    assert rc == 0, err
    manifest = json.load(open(os.path.join(out, "recording.json")))
    info = manifest["streams"]["road"]
    assert manifest["status"] == "complete" and manifest["topics"] == [topic]
    assert (info["width"], info["height"], info["format"], info["codec"], info["lossless"]) == (
        160,
        96,
        "nv12",
        "mp4v",
        False,
    )
    segments = info["segments"]
    assert segments >= 3
    assert _visible(out) == sorted(
        ["recording.json"]
        + [f"frames/road/{n:06d}.mp4" for n in range(segments)]
        + [f"index/road/{n:06d}.parquet" for n in range(segments)]
        + [f"topics/{topic}/000000.parquet"]
    )
    assert _hidden(out) == []
    first = pq.read_table(os.path.join(out, "index/road/000000.parquet"))
    # a lossy stream's index also holds the frames' metrics as captured (--frame-metrics lossy)
    assert first.schema.equals(quality_schema()) and tuple(first.column_names) == INDEX_COLUMNS + quality.COLUMNS
    rows = read_index(out, "road").to_pylist()
    assert len(rows) == info["frames"] and info["missed"] == 0
    ids = [r["frame_id"] for r in rows]
    assert ids == list(range(ids[0], ids[0] + len(ids))) and info["gaps"] == 0
    for r in rows:
        assert r["timestamp_sof"] <= r["timestamp_eof"] <= r["publish_time"] <= r["receive_time"]
        assert r["segment_file"] == f"frames/road/{r['segment']:06d}.mp4"
        assert (r["stream"], r["width"], r["height"], r["format"]) == ("road", 160, 96, "nv12")
    for n in range(segments):
        positions = [r["position"] for r in rows if r["segment"] == n]
        assert positions == list(range(len(positions))) and positions
    # lossy frames still carry their stamps
    stamps = [(row["frame_id"], read_stamp(image, "bgr8")) for row, image in iter_frames(out, "road")]
    assert sum(a == b for a, b in stamps) >= 0.9 * len(stamps)
    messages = read_topic(out, topic).to_pylist()
    assert [m["data"] for m in messages] == [b"event %d" % i for i in range(5)]
    assert [m["seq"] for m in messages] == list(range(5))


def test_sigkill_leaves_no_corrupt_visible_segment(tmp_path):
    name, out = unique_name("cam"), str(tmp_path / "rec")
    camera = start(CAMERA, "--name", name, "--stream", "s", *SIZE, "--fps", 60, "--format", "gray")
    connect(name, "s").close()
    recorder = start(RECORD, "--name", name, "--out", out, "--segment-seconds", 0.3, "--lossless")
    _wait_for(
        lambda: (
            len(os.listdir(os.path.join(out, "index", "s"))) >= 2
            if os.path.isdir(os.path.join(out, "index", "s"))
            else False
        )
    )
    time.sleep(0.15)  # mid-segment
    recorder.kill()
    recorder.wait()
    camera.send_signal(signal.SIGTERM)
    assert finish(camera)[0] == 0
    manifest = json.load(open(os.path.join(out, "recording.json")))
    assert manifest["status"] == "recording"
    assert len(_hidden(out)) <= 2 and all(".partial." in f for f in _hidden(out))
    rows = read_index(out, "s").to_pylist()
    frames = list(iter_frames(out, "s"))  # every indexed frame decodes
    assert len(frames) == len(rows) > 0
    assert all(read_stamp(image, "gray8") == row["frame_id"] for row, image in frames)
    indexed = {r["segment_file"] for r in rows}
    videos = {f for f in _visible(out) if f.startswith("frames/")}
    assert indexed <= videos and len(videos - indexed) <= 1  # at most the one renamed just before the kill


def test_lossless_record_replay_record_is_bit_exact(tmp_path):
    config = tmp_path / "cams.toml"
    name, again = unique_name("cam"), unique_name("replay")
    config.write_text(
        f'name = "{name}"\n[[stream]]\nname = "yuv"\nformat = "nv12"\n'
        '[[stream]]\nname = "colour"\nformat = "bgr"\n[[stream]]\nname = "raw"\nformat = "raw16"\n'
        '[[stream]]\nname = "mono"\nformat = "gray"\n'
    )
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    camera = start(
        CAMERA, "--config", config, *SIZE, "--fps", 40, "--frames", 24, "--drop-frames", 5, "--wait-clients", 1
    )
    recorder = start(RECORD, "--name", name, "--out", first, "--lossless", "--frames", 23)
    rc, _, err = finish(recorder)
    assert rc == 0, err
    assert finish(camera)[0] == 0
    recorder = start(RECORD, "--name", again, "--out", second, "--lossless", "--idle-timeout", 1)
    # a pool that holds all 24 frames: a recorder that a loaded machine starts late
    # (after connecting) still finds every frame; what is checked here is the bits
    replay = start(REPLAY, first, "--name", again, "--rate", 1.5, "--wait-clients", 1, "--buffers", 24)
    rc, _, err = finish(replay)
    assert rc == 0, err
    rc, _, err = finish(recorder)
    assert rc == 0, err
    for stream, fmt in (("yuv", "nv12"), ("colour", "bgr8"), ("raw", "raw16"), ("mono", "gray8")):
        a, b = list(iter_frames(first, stream)), list(iter_frames(second, stream))
        ids = [row["frame_id"] for row, _ in a]
        assert ids == [i for i in range(24) if i != 5], stream
        assert [row["frame_id"] for row, _ in b] == ids
        assert [read_stamp(image, fmt, 96) for _, image in a] == ids
        for (_, x), (_, y) in zip(a, b):
            assert x.dtype == y.dtype and np.array_equal(x, y), stream
        assert a[0][1].dtype == (np.uint16 if fmt == "raw16" else np.uint8)


def _recorded(tmp_path, frames=12, fps=50, size=SIZE, mode="--lossless"):
    name, out = unique_name("cam"), str(tmp_path / "rec")
    camera = start(
        CAMERA, "--name", name, "--stream", "s", *size, "--fps", fps, "--frames", frames, "--wait-clients", 1
    )
    recorder = start(RECORD, "--name", name, "--out", out, mode, "--frames", frames)
    assert finish(recorder)[0] == 0 and finish(camera)[0] == 0
    return out


def test_replay_keeps_ids_scales_timing_and_loops(tmp_path):
    out = _recorded(tmp_path)
    rows = read_index(out, "s").to_pylist()
    name = unique_name("replay")
    replay = start(REPLAY, out, "--name", name, "--rate", 2.0, "--loop", "--wait-clients", 1)
    frames = receive(name, "s", count=2 * len(rows))
    replay.send_signal(signal.SIGTERM)
    rc, _, err = finish(replay)
    assert rc == 0, err
    ids = [r["frame_id"] for r in rows]
    assert [f["frame_id"] for f in frames] == ids + ids
    assert [f["stamp"] for f in frames] == ids + ids
    recorded = np.diff([r["timestamp_sof"] for r in rows])
    replayed = np.diff([f["sof"] for f in frames[: len(rows)]])
    assert np.all(np.abs(replayed - recorded / 2) <= 1)  # intervals scaled by --rate
    # Paced, not as fast as it can: each pass begins at the monotonic time its first
    # timestamp_sof was moved to, and no frame is sent before its recorded offset / --rate
    # after it (a loaded machine only sends later; the send's CLOCK_MONOTONIC stamp).
    offsets = [(r["publish_time"] - rows[0]["publish_time"]) / 2 for r in rows]
    for loop in (frames[: len(rows)], frames[len(rows) :]):
        began = loop[0]["sof"] - round((rows[0]["timestamp_sof"] - rows[0]["publish_time"]) / 2)
        early = [f["frame_id"] for f, due in zip(loop, offsets, strict=True) if f["publish"] < began + due - 1_000]
        assert early == [], f"sent before they were due: {early}"
    span = (frames[len(rows) - 1]["publish"] - frames[0]["publish"]) / 1e6
    print(f"measured: --rate 2 replay sent {len(rows)} frames over {span:.1f} ms (due: {offsets[-1] / 1e6:.1f} ms)")


def test_original_timestamps_are_kept_on_request(tmp_path):
    out = _recorded(tmp_path, frames=5)
    rows = read_index(out, "s").to_pylist()
    name = unique_name("replay")
    replay = start(REPLAY, out, "--name", name, "--rate", "max", "--original-timestamps", "--wait-clients", 1)
    frames = receive(name, "s", count=len(rows))
    assert finish(replay)[0] == 0
    assert [(f["sof"], f["eof"]) for f in frames] == [(r["timestamp_sof"], r["timestamp_eof"]) for r in rows]


def test_record_bad_input_is_a_clear_error(tmp_path, capsys):
    assert record_main(["--name", unique_name("none"), "--out", str(tmp_path / "a"), "--connect-timeout", "0.3"]) == 2
    assert "no VisionIPC server" in capsys.readouterr().err
    name = unique_name("cam")
    camera = start(CAMERA, "--name", name, "--stream", "road", *SIZE)
    connect(name, "road").close()
    assert record_main(["--name", name, "--stream", "rear", "--out", str(tmp_path / "b")]) == 2
    assert "has no stream 'rear' (it has: road)" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert record_main(["--name", name, "--out", str(tmp_path / "full")]) == 2
    assert "not empty" in capsys.readouterr().err
    assert record_main(["--name", name, "--out", str(tmp_path / "c"), "--duration", "-1"]) == 2
    assert "--duration must be" in capsys.readouterr().err
    assert record_main(["--name", name, "--out", str(tmp_path / "d"), "--topic", "bad/topic", "--duration", "0.1"]) == 2
    assert "--topic" in capsys.readouterr().err
    camera.send_signal(signal.SIGINT)
    assert finish(camera)[0] == 0
    with pytest.raises(SystemExit):
        record_main(["--name", name])  # no --out: argparse's usage error
    assert "--out" in capsys.readouterr().err


def test_replay_bad_input_is_a_clear_error(tmp_path, capsys):
    assert replay_main([str(tmp_path / "missing"), "--name", "x"]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert replay_main([str(tmp_path), "--name", "x"]) == 2
    assert "no recording.json" in capsys.readouterr().err
    out = _recorded(tmp_path, frames=3)
    assert replay_main([out, "--name", "x", "--stream", "rear"]) == 2
    assert "has no stream 'rear'" in capsys.readouterr().err
    assert replay_main([out, "--name", "x", "--rate", "fast"]) == 2
    assert "--rate" in capsys.readouterr().err
    assert replay_main([out, "--name", "bad/name"]) == 2
    assert "name" in capsys.readouterr().err


@pytest.mark.parametrize("blocked", ["cv2", "pyarrow"])
def test_missing_record_extra_names_it(blocked, tmp_path):
    rc, err = run_without(blocked, "visionipc.apps.record.recorder:main", ["--name", "x", "--out", tmp_path / "r"])
    assert rc == 2 and "pip install 'visionipc[record]'" in err
    rc, err = run_without(blocked, "visionipc.apps.record.replay:main", [tmp_path, "--name", "x"])
    assert rc == 2 and "pip install 'visionipc[record]'" in err


def test_lossy_recording_replays_as_nv12_with_readable_stamps(tmp_path):
    out = _recorded(tmp_path, frames=10, size=("--width", 160, "--height", 96), mode="-q")
    assert json.load(open(os.path.join(out, "recording.json")))["streams"]["s"]["stored_as"] == "planes"  # H.264
    name = unique_name("replay")
    replay = start(REPLAY, out, "--name", name, "--wait-clients", 1, "--wake", "handoff")
    frames = receive(name, "s", count=10)
    assert finish(replay)[0] == 0
    assert [f["frame_id"] for f in frames] == list(range(10)) and frames[0]["format"] == "nv12"
    assert sum(f["stamp"] == f["frame_id"] for f in frames) >= 9


def test_a_restarted_camera_with_another_size_is_counted_not_recorded(tmp_path):
    name, out = unique_name("cam"), str(tmp_path / "rec")
    camera = start(CAMERA, "--name", name, "--stream", "s", *SIZE, "--fps", 50, "--frames", 10, "--wait-clients", 1)
    # the recorder waits for the restarted camera (idle from the first one's last frame: 15 s
    # leave room for a camera process to start on a loaded machine; 2 s did not, beside stress-ng)
    recorder = start(RECORD, "--name", name, "--out", out, "--idle-timeout", 15, "--lossless")
    assert finish(camera)[0] == 0
    # the restarted camera sends once the recorder is back (under load it could otherwise
    # send its 10 frames before the recorder reconnects, leaving nothing to count)
    resized = ("--width", 128, "--height", 64, "--fps", 50, "--frames", 10, "--wait-clients", 1)
    camera = start(CAMERA, "--name", name, "--stream", "s", *resized)
    assert finish(camera)[0] == 0
    rc, _, err = finish(recorder)
    assert rc == 0, err
    info = json.load(open(os.path.join(out, "recording.json")))["streams"]["s"]
    assert info["frames"] == 10 and info["width"] == 96
    assert [read_stamp(image, "nv12", 96) for _, image in iter_frames(out, "s")] == list(range(10))
    assert info["missed"] >= 1  # the resized server's frames that reached the recorder


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_closes_the_open_segment_properly(sig, tmp_path):
    name, out = unique_name("cam"), str(tmp_path / "rec")
    camera = start(CAMERA, "--name", name, "--stream", "s", *SIZE, "--fps", 50)
    connect(name, "s").close()
    recorder = start(RECORD, "--name", name, "--out", out, "--lossless")
    _wait_for(lambda: os.path.isdir(os.path.join(out, "frames", "s")) and _hidden(out))  # a segment is open
    time.sleep(0.3)
    recorder.send_signal(sig)
    rc, _, err = finish(recorder)
    camera.send_signal(signal.SIGINT)
    assert finish(camera)[0] == 0
    assert rc == 0, err
    assert _hidden(out) == []
    manifest = json.load(open(os.path.join(out, "recording.json")))
    assert manifest["status"] == "complete" and manifest["streams"]["s"]["segments"] == 1
    frames = list(iter_frames(out, "s"))
    assert len(frames) == manifest["streams"]["s"]["frames"] > 5
    assert all(read_stamp(image, "nv12", 96) == row["frame_id"] for row, image in frames)


def test_recorded_topics_are_replayed_beside_the_frames(tmp_path):
    name, topic, out = unique_name("cam"), unique_topic("events"), str(tmp_path / "rec")
    camera = start(CAMERA, "--name", name, "--stream", "s", *SIZE, "--fps", 20, "--frames", 20, "--wait-clients", 1)
    pub = msgq.pub_sock(topic)
    recorder = start(RECORD, "--name", name, "--out", out, "--topic", topic, "--frames", 20)
    _wait_for(lambda: os.path.exists(os.path.join(out, "recording.json")))
    for i in range(3):
        pub.send(b"m%d" % i)
        time.sleep(0.05)
    assert finish(camera)[0] == 0
    rc, _, err = finish(recorder)
    pub.close()
    assert rc == 0, err
    sub = msgq.sub_sock(topic, timeout=10000)  # before the replayer publishes (its start-up: seconds under load)
    replay = start(REPLAY, out, "--name", unique_name("replay"), "--wait-clients", 0, "--rate", 4)
    got = [sub.receive() for _ in range(3)]
    sub.close()
    assert finish(replay)[0] == 0
    assert got == [b"m0", b"m1", b"m2"]


def test_lossy_streams_keep_the_metrics_of_the_frames_as_captured(tmp_path):
    """Four recorders of one camera: lossy H.264 (default: metrics measured before the codec,
    kept in the index), lossless (decoded by the pipeline), lossless --frame-metrics all (kept
    in the index too) and lossy --frame-metrics none. The pipeline's numbers for the lossy
    recording equal the lossless recording's, frame by frame."""
    from visionipc.apps.pipeline import metrics

    name, frames = unique_name("cam"), 12
    camera = start(
        CAMERA, "--name", name, "--stream", "s", "--width", 160, "--height", 96, "--fps", 30,
        "--frames", frames, "--wait-clients", 4,
    )  # fmt: skip
    outs = {kind: str(tmp_path / kind) for kind in ("lossy", "lossless", "all", "none")}
    recorders = [
        start(RECORD, "--name", name, "--out", outs["lossy"], "-q", "--frames", frames),
        start(RECORD, "--name", name, "--out", outs["lossless"], "-q", "--lossless", "--frames", frames),
        start(
            RECORD,
            "--name",
            name,
            "--out",
            outs["all"],
            "-q",
            "--lossless",
            "--frame-metrics",
            "all",
            "--frames",
            frames,
        ),
        start(RECORD, "--name", name, "--out", outs["none"], "-q", "--frame-metrics", "none", "--frames", frames),
    ]
    assert [finish(r)[0] for r in recorders] == [0, 0, 0, 0] and finish(camera)[0] == 0
    manifests = {k: json.load(open(os.path.join(v, "recording.json")))["streams"]["s"] for k, v in outs.items()}
    want = {"lossy": True, "lossless": False, "all": True, "none": False}
    assert {k: m["frame_metrics"] for k, m in manifests.items()} == want
    columns = {k: pq.read_schema(os.path.join(v, "index", "s", "000000.parquet")).names for k, v in outs.items()}
    assert columns["lossy"] == columns["all"] == list(INDEX_COLUMNS) + ["brightness", "contrast", "sharpness", "motion"]
    assert columns["lossless"] == columns["none"] == list(INDEX_COLUMNS)
    assert read_index(outs["lossy"], "s").schema.equals(index_schema())  # readers of the index columns see no change
    m = {k: metrics.metrics_pandas([v]).set_index("frame_id") for k, v in outs.items()}
    common = sorted(set(m["lossy"].index) & set(m["lossless"].index))
    assert len(common) >= frames - 2
    names = ["brightness", "contrast", "sharpness"]
    np.testing.assert_allclose(m["lossy"].loc[common, names], m["lossless"].loc[common, names], rtol=1e-6)
    both = sorted(set(m["all"].index) & set(m["lossless"].index))  # measured as captured = decoded, lossless
    np.testing.assert_allclose(m["all"].loc[both, names], m["lossless"].loc[both, names], rtol=1e-6)
    after = [f for f in common if f - 1 in common]  # motion: the same previous frame in both
    np.testing.assert_allclose(m["lossy"].loc[after, "motion"], m["lossless"].loc[after, "motion"], rtol=1e-6)
    # without them the codec's loss shows: H.264 crf 23 softens the pattern's edges
    decoded = m["none"].loc[sorted(set(common) & set(m["none"].index)), "sharpness"]
    assert (decoded < m["lossless"].loc[decoded.index, "sharpness"] * 0.995).all()
