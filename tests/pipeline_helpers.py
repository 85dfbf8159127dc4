"""Fixtures of the Spark pipeline tests: one local Spark session for the whole test
run (a new one for the next test when it died: ``live_spark``); recordings made by the
real vipc-record from the real synthetic vipc-camera with injected drops and delays; and
synthetic recordings (vipc-record's writer) for what a camera cannot be told to show:
black, frozen and blurred pictures (import the fixtures into a test module to use them)."""

import glob
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from camera_helpers import CAMERA, RECORD, finish, reap, start

from msgq.testing import isolated_prefix, unique_name
from visionipc.apps.pipeline import synthetic
from visionipc.apps.pipeline.session import spark_session

FPS = 30
DROPS = [10, 20, 35]
DELAYS_MS = {30: 50, 40: 120}
W, H = 64, 48


_SESSION = None  # the session the tests share (live_spark)


def _alive(session) -> bool:
    """Whether the session's JVM answers and its SparkContext is not stopped."""
    try:
        return session is not None and not session.sparkContext._jsc.sc().isStopped()
    except Exception:  # noqa: BLE001 - py4j: the JVM is gone ("SparkSession$ does not exist", refused...)
        return False


def _jvm_answers() -> bool:
    """Whether PySpark's gateway still reaches a JVM."""
    from pyspark import SparkContext

    try:
        return SparkContext._gateway is not None and SparkContext._gateway.jvm.java.lang.System.nanoTime() > 0
    except Exception:  # noqa: BLE001 - py4j: the JVM is gone
        return False


def _forget() -> None:
    """Let a dead (or hung) session go: its JVM ended (killed if it still runs) and PySpark's
    globals, which still name its gateway, cleared so that the next session starts a new JVM."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)  # the JVM this process launched (spark-submit execs java)
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)
    if gateway is not None:
        try:
            gateway.shutdown()
        except Exception:  # noqa: BLE001 - its JVM is gone
            pass
    SparkContext._gateway = SparkContext._jvm = SparkContext._active_spark_context = None
    SparkSession._instantiatedSession = SparkSession._activeSession = None


def live_spark():
    """The tests' local[2] session: the same one while it lives, a new one (a new JVM) when it
    died (a test that timed out, a JVM that crashed or was killed), so later tests still run."""
    global _SESSION
    if not _alive(_SESSION):
        if _SESSION is not None and not _jvm_answers():  # a stopped session's JVM is reused
            _forget()
        _SESSION = spark_session("local[2]", app_name="visionipc-tests", ui=False)
    return _SESSION


def _stop_at_exit() -> None:
    if _alive(_SESSION):
        _SESSION.stop()


@pytest.fixture
def spark(request):
    """One local Spark session for the whole test run, checked before each test (``live_spark``)."""
    if _SESSION is None:
        request.config.add_cleanup(_stop_at_exit)  # stopped once, when the test run ends
    return live_spark()


CAMERA_FRAMES = 120
DELAY_FLAG = ",".join(f"{k}:{v}" for k, v in DELAYS_MS.items())


def _camera_recording(out, *, streams, fps, frames, fmt="nv12", width=96, height=64):
    """Run vipc-camera (synthetic, with DROPS and DELAYS_MS injected) and vipc-record until
    the camera's last frame is recorded; returns the recording folder."""
    name = unique_name("cam")
    camera = start(
        CAMERA,
        "--name",
        name,
        *[a for s in streams for a in ("--stream", s)],
        "--source",
        "synthetic",
        "--width",
        width,
        "--height",
        height,
        "--fps",
        fps,
        "--frames",
        frames,
        "--format",
        fmt,
        "--drop-frames",
        ",".join(map(str, DROPS)),
        "--delay-frames",
        DELAY_FLAG,
        "--wait-clients",
        1,
    )
    # lossless keeps pixels exact; the lossy (mp4v) path is covered by recordings["quality"]
    recorder = start(
        RECORD, "--name", name, "--out", out, "--idle-timeout", 1.5, "--segment-seconds", 1.5, "--lossless"
    )
    try:
        rc, _, err = finish(camera, timeout=60)
        assert rc == 0, err
        rc, _, err = finish(recorder, timeout=60)
        assert rc == 0, err
    finally:
        reap()
    return str(out)


@pytest.fixture(scope="session")
def camera_recordings(tmp_path_factory):
    """``{"lossless": path, "gray": path}`` recorded (lossless FFV1) from the real camera: 120
    frames at 30 fps with frames 10, 20, 35 dropped and 30, 40 delayed by 50 and 120 ms;
    "lossless" has one NV12 stream "road", "gray" two GRAY8 streams "left" and "right"."""
    root = tmp_path_factory.mktemp("camera")
    with isolated_prefix():
        return {
            "lossless": _camera_recording(root / "lossless", streams=["road"], fps=FPS, frames=CAMERA_FRAMES),
            "gray": _camera_recording(
                root / "gray", streams=["left", "right"], fps=FPS, frames=CAMERA_FRAMES, fmt="gray"
            ),
        }


def missing_ids(index, stream):
    """Frame ids absent between the first and last recorded one (numpy on the raw index)."""
    ids = index.loc[index["stream"] == stream, "frame_id"].to_numpy()
    return sorted(set(range(ids.min(), ids.max() + 1)) - set(ids.tolist()))


@pytest.fixture(scope="session")
def recordings(tmp_path_factory):
    """``{"faults": path, "quality": path}``: a stream with injected drops and delays over
    three segments, and streams with black, frozen, sharp and blurred pictures, and a lossy one."""
    root = tmp_path_factory.mktemp("recordings")
    faults = synthetic.write_recording(
        root / "faults",
        {
            "road": dict(frames=120, width=W, height=H, fps=FPS, drop=DROPS, delay_ms=DELAYS_MS, segment_frames=50),
            "wide": dict(frames=45, width=32, height=32, fps=FPS, format="gray8", latency_ms=5),
        },
    )
    quality = synthetic.write_recording(
        root / "quality",
        {
            "sharp": dict(frames=24, width=W, height=H, black=[5], frozen=[12, 13], segment_frames=10),
            "blurry": dict(frames=12, width=W, height=H, blur=3, format="gray8"),
            "compressed": dict(frames=12, width=W, height=H, lossless=False),
        },
    )  # mp4v, stored as BGR
    return {"faults": faults, "quality": quality, "root": str(root)}


def raw_index(recording):
    """A recording's index read with nothing but pyarrow: the reference the jobs are checked against."""
    files = sorted(glob.glob(os.path.join(recording, "index", "*", "*.parquet")))
    return pq.ParquetDataset(files).read().to_pandas()


def numpy_latency(index, stream):
    rows = index[index["stream"] == stream]
    lat = (rows["receive_time"].to_numpy(np.int64) - rows["timestamp_eof"].to_numpy(np.int64)) / 1e6
    return list(np.percentile(lat, [50, 95, 99])) + [lat.max()]
