"""vipc-record's PyAV codecs (H.264, HEVC, AV1, FFV1): bit-exact lossless storage of every
pixel format, lossy quality, seeking, clear refusals, and camera -> record -> replay ->
vipc-analyze with each codec in real processes."""

import json
import os

import numpy as np
import pytest
from camera_helpers import CAMERA, RECORD, REPLAY, connect, finish, reap, receive, start
from pipeline_helpers import spark  # noqa: F401

from msgq.testing import unique_name
from visionipc import pixels
from visionipc.apps.pipeline.cli import main as analyze_main
from visionipc.apps.record import codecs, index
from visionipc.apps.record.checks import RecordingError
from visionipc.apps.record.reader import iter_frames, iter_segment_frames
from visionipc.apps.record.recorder import main as record_main
from visionipc.apps.record.writer import StreamWriter

FORMATS = ("nv12", "i420", "gray8", "rgb8", "bgr8", "raw16")
W, H = 64, 48


@pytest.fixture(autouse=True)
def _no_process_left():
    yield
    reap()


def _write(folder, storage, images, segment_seconds=0):
    """``images`` through vipc-record's segment writer; returns the stream's index rows."""
    writer = StreamWriter(None, str(folder), "s", storage, segment_seconds)
    for i, image in enumerate(images):
        t = 1_000_000_000 + i * 33_000_000
        writer.add(image, dict(frame_id=i, timestamp_sof=t, timestamp_eof=t, publish_time=t, receive_time=t))
    writer.close_segment()
    return index.read_index(str(folder), "s").to_pylist()


def _decode(folder, storage, rows):
    return list(iter_segment_frames(None, str(folder), [(r["segment_file"], r["position"]) for r in rows], storage))


def _noise(fmt, n, seed=0):
    rng = np.random.default_rng(seed)
    shape, dtype = pixels.compact_shape(fmt, W, H), pixels.compact_dtype(fmt)
    return [rng.integers(0, np.iinfo(dtype).max, shape, dtype=dtype, endpoint=True) for _ in range(n)]


def _smooth(fmt, n):
    """Moving luma gradients; chroma rows (NV12/I420) a gentle slope."""
    y, x = np.mgrid[0 : pixels.compact_shape(fmt, W, H)[0], 0:W]
    images = [((x * 3 + y * 2 + 4 * i) % 200 + 20).astype(np.uint8) for i in range(n)]
    for image in images:
        image[H:] = (100 + x[H:] // 4).astype(np.uint8)
    return images


@pytest.mark.parametrize("fmt", FORMATS)
def test_ffv1_stores_every_pixel_format_bit_exactly(fmt, tmp_path):
    storage = codecs.AvStorage(fmt, W, H, "ffv1")
    images = _noise(fmt, 3)
    rows = _write(tmp_path, storage, images)
    assert [r["segment_file"] for r in rows] == ["frames/s/000000.mkv"] * 3
    back = _decode(tmp_path, storage, rows)
    assert len(back) == 3
    for a, b in zip(images, back):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


@pytest.mark.parametrize("codec", ["h264", "hevc", "av1"])
@pytest.mark.parametrize("fmt", ["nv12", "gray8"])
def test_lossy_codecs_give_the_streams_own_layout_back_closely(codec, fmt, tmp_path):
    storage = codecs.AvStorage(fmt, W, H, codec, crf=20)
    images = _smooth(fmt, 6)
    rows = _write(tmp_path, storage, images)
    back = _decode(tmp_path, storage, rows)
    assert len(back) == 6
    for a, b in zip(images, back):
        assert b.shape == a.shape and b.dtype == np.uint8
        mse = np.mean((a.astype(float) - b) ** 2)
        assert 10 * np.log10(255**2 / max(mse, 1e-9)) > 30  # PSNR, dB
    assert storage.describe()["encoder"] == codecs.CODECS[codec][0]


def _realtime_threads():
    """This process's threads in a real-time scheduling class."""
    realtime = (os.SCHED_FIFO, os.SCHED_RR)
    return [int(t) for t in os.listdir("/proc/self/task") if os.sched_getscheduler(int(t)) in realtime]


@pytest.mark.parametrize("codec", ["av1", "h264"])
def test_opening_an_encoder_leaves_every_thread_ordinarily_scheduled(codec, tmp_path):
    """SVT-AV1 opened by root moves the opening thread and its own threads to SCHED_FIFO 99
    (the suite runs as root in CI): a recorder's every encoder is opened so it cannot, and
    threads the process starts later are not real-time either."""
    from visionipc.apps.record import mcap_io

    assert _realtime_threads() == []
    storage = codecs.AvStorage("nv12", W, H, codec, crf=30)
    _write(tmp_path / "mkv", storage, _smooth("nv12", 3))  # vipc-record's writer
    assert _realtime_threads() == []
    ctx = mcap_io.open_video_encoder(storage, 30)  # the MCAP format and vipc-foxglove
    assert ctx.is_open and _realtime_threads() == []
    codecs.check_encoder(storage.encoder)  # vipc-record's start-up check
    assert _realtime_threads() == []
    # threads started afterwards too: libzmq re-applies the policy glibc recorded for the
    # thread that starts its context (SVT-AV1 sets it through pthread_setschedparam)
    import zmq

    context = zmq.Context()
    try:
        context.socket(zmq.PUB).close()
        assert _realtime_threads() == []
    finally:
        context.term()


def test_raw16_is_always_lossless_and_rgb_goes_through_yuv(tmp_path):
    assert codecs.AvStorage("raw16", W, H, "h264").codec == "ffv1"
    storage = codecs.AvStorage("rgb8", W, H, "h264", crf=18)
    images = [np.dstack([im[:H], im[:H] // 2, 255 - im[:H]]) for im in _smooth("gray8", 2)]
    back = _decode(tmp_path, storage, _write(tmp_path, storage, images))
    assert back[0].shape == (H, W, 3) and np.abs(back[0].astype(int) - images[0]).mean() < 6


def test_far_frames_are_reached_by_seeking_and_match_a_full_decode(tmp_path):
    storage = codecs.AvStorage("gray8", W, H, "h264", gop=5)
    rows = _write(tmp_path, storage, _smooth("gray8", 45))
    everything = _decode(tmp_path, storage, rows)
    some = [rows[i] for i in (1, 38, 39, 44)]  # 38 is past SEEK_GAP: a seek to the keyframe at 35
    for row, image in zip(some, _decode(tmp_path, storage, some)):
        assert np.array_equal(image, everything[row["position"]])
    with pytest.raises(RecordingError, match="000000.mkv: frame position 90: the segment ends before"):
        _decode(tmp_path, storage, [dict(rows[0], position=90)])


def test_codec_options_and_missing_hardware_are_clear_errors(tmp_path, capsys):
    name = unique_name("cam")
    camera = start(CAMERA, "--name", name, "--stream", "road", "--width", 96, "--height", 64)
    connect(name, "road").close()
    base = ["--name", name, "--duration", "0.2", "-q"]
    assert record_main(base + ["--out", str(tmp_path / "a"), "--lossless", "--codec", "h264"]) == 2
    assert "--lossless stores with ffv1" in capsys.readouterr().err
    assert record_main(base + ["--out", str(tmp_path / "b"), "--codec", "ffv1", "--hwaccel"]) == 2
    assert "no hardware encoder for ffv1" in capsys.readouterr().err
    assert record_main(base + ["--out", str(tmp_path / "c"), "--crf", "99"]) == 2
    assert "--crf must be" in capsys.readouterr().err
    try:
        codecs.check_encoder("h264_nvenc")
        nvenc = True
    except codecs.UsageError:
        nvenc = False
    rc = record_main(base + ["--out", str(tmp_path / "d"), "--hwaccel"])
    if nvenc:  # a machine with an NVIDIA GPU: it records
        assert (
            rc == 0 and json.load(open(tmp_path / "d" / "recording.json"))["streams"]["road"]["codec"] == "h264_nvenc"
        )
    else:
        assert rc == 2 and "h264_nvenc cannot be used here (NVENC needs an NVIDIA GPU" in capsys.readouterr().err
        assert not (tmp_path / "d").exists()
    camera.terminate()
    finish(camera)


RECORDINGS = {c: ["--codec", c] for c in ("h264", "hevc", "av1", "ffv1", "mp4v")}
RECORDINGS["mcap"] = ["--codec", "h264", "--format", "mcap"]  # MCAP segments (test_record_mcap.py)
FRAMES = 10


def test_record_with_each_codec_then_replay_and_analyse(spark, tmp_path):  # noqa: F811
    """One camera, one recorder per codec at once; each recording replays with its frame ids
    and readable stamps, and vipc-analyze reads them all in one run."""
    name = unique_name("cam")
    # 16 buffers: no frame is overwritten while a loaded machine starts six recorders
    camera = start(
        CAMERA, "--name", name, "--stream", "road", "--width", 96, "--height", 64, "--fps", 30,
        "--frames", FRAMES, "--wait-clients", len(RECORDINGS), "--buffers", 16,
    )  # fmt: skip
    outs = {c: str(tmp_path / c) for c in RECORDINGS}
    recorders = [start(RECORD, "--name", name, "--out", outs[c], *RECORDINGS[c], "--frames", FRAMES) for c in outs]
    for r in recorders:
        rc, _, err = finish(r, timeout=90)
        assert rc == 0, err
    assert finish(camera)[0] == 0
    for codec, out in outs.items():
        info = json.load(open(os.path.join(out, "recording.json")))
        assert info["streams"]["road"]["codec"] == RECORDINGS[codec][1] and info["streams"]["road"]["frames"] == FRAMES
        assert info["format_version"] == index.FORMAT_VERSION
        if codec == "mp4v":  # a format_version 1 recording (OpenCV, BGR) stays readable
            info["format_version"] = 1
            json.dump(info, open(os.path.join(out, "recording.json"), "w"))
        else:
            assert [image.shape for _, image in iter_frames(out, "road")] == [(96, 96)] * FRAMES
        replay_name = unique_name("replay")
        replay = start(REPLAY, out, "--name", replay_name, "--rate", "max", "--wait-clients", 1)
        frames = receive(replay_name, "road", count=FRAMES)
        assert finish(replay)[0] == 0
        assert [f["frame_id"] for f in frames] == list(range(FRAMES)), codec
        # --rate max outruns the client: a frame whose buffer the replayer reused (8 buffers,
        # so at most FRAMES - 8 of them) is reported not valid; every valid one is its own frame
        assert all(f["stamp"] == f["frame_id"] for f in frames if f["valid"]), (codec, frames)
        assert sum(f["valid"] for f in frames) >= FRAMES - 8, codec
    report = tmp_path / "analysis"
    assert analyze_main([*outs.values(), "--out", str(report), "--jobs", "health,metrics"]) == 0
    import pandas as pd

    from visionipc.apps.pipeline.runs import latest

    run = latest(str(report))  # the published run folder
    health = pd.read_parquet(os.path.join(run, "health.parquet"))
    assert sorted(health["recording_id"]) == sorted(RECORDINGS)
    assert set(health["frames"]) == {FRAMES}
    assert len(pd.read_parquet(os.path.join(run, "metrics"))) == FRAMES * len(RECORDINGS)


@pytest.mark.parametrize("codec", ["h264", "mp4v"])  # PyAV's storage, and the OpenCV format's
def test_a_manifest_whose_stored_as_does_not_match_its_format_is_refused(codec):
    import cv2

    from visionipc.apps.record.storage import Storage

    made = codecs.AvStorage("nv12", W, H, codec) if codec != codecs.LEGACY else Storage(cv2, "nv12", W, H, False)
    info = dict(made.describe(), format="nv12", width=W, height=H)
    assert type(Storage.from_manifest(cv2, info)) is type(made)
    wrong = pixels.GRAY if made.kind != pixels.GRAY else pixels.PLANES
    with pytest.raises(ValueError, match=f"stored_as '{wrong}' does not match format nv12"):
        Storage.from_manifest(cv2, dict(info, stored_as=wrong))
