"""Fixtures of the Spark pipeline tests: one local Spark session for the whole test
run and tiny recordings (import the fixtures into a test module to use them)."""

import glob
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from visionipc.pipeline import synthetic
from visionipc.pipeline.session import spark_session

FPS = 30
DROPS = [10, 20, 35]
DELAYS_MS = {30: 50, 40: 120}
W, H = 64, 48


@pytest.fixture(scope="session")
def spark():
    session = spark_session("local[2]", app_name="visionipc-tests", ui=False)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def recordings(tmp_path_factory):
    """``{"faults": path, "quality": path}``: a stream with injected drops and delays over
    three segments, and streams with black, frozen, sharp and blurred pictures."""
    root = tmp_path_factory.mktemp("recordings")
    faults = synthetic.write_recording(root / "faults", {
        "road": dict(frames=120, width=W, height=H, fps=FPS, drop=DROPS, delay_ms=DELAYS_MS, segment_frames=50),
        "wide": dict(frames=45, width=32, height=32, fps=FPS, format="gray8", latency_ms=5)})
    quality = synthetic.write_recording(root / "quality", {
        "sharp": dict(frames=24, width=W, height=H, black=[5], frozen=[12, 13], segment_frames=10),
        "blurry": dict(frames=12, width=W, height=H, blur=3, format="gray8")})
    return {"faults": faults, "quality": quality, "root": str(root)}


def raw_index(recording):
    """A recording's index read with nothing but pyarrow: the reference the jobs are checked against."""
    files = sorted(glob.glob(os.path.join(recording, "index", "*", "*.parquet")))
    return pq.ParquetDataset(files).read().to_pandas()


def numpy_latency(index, stream):
    rows = index[index["stream"] == stream]
    lat = (rows["receive_time"].to_numpy(np.int64) - rows["timestamp_eof"].to_numpy(np.int64)) / 1e6
    return list(np.percentile(lat, [50, 95, 99])) + [lat.max()]
