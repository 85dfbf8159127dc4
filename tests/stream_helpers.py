"""Helpers of the streaming tests (``vipc-analyze --follow``, ``spark.readStream.format("vipc")``)
on a classic session, on Spark Connect and over s3://: a recorder that completes segments into
a fleet folder (local or an S3 bucket) one at a time, in vipc-record's order, and the readers of
the tables a follow writes (import what a test module needs)."""

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from visionipc.apps.pipeline import fs, synthetic

SEGMENT = 30  # frames per segment
START_NS = 1_000_000_000_000  # the streams' first receive time (synthetic's clock)
HEALTH = ("health", "drops", "fps_timeline", "latency_histogram", "events")


def _wall(seconds_ago: float = 0.0) -> str:
    t = datetime.now(timezone.utc) - timedelta(seconds=seconds_ago)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Recorder:
    """Recordings made in ``stage`` (local) and completed into ``fleet`` (a local folder, or an
    s3:// location where each object appears whole when its upload ends) a segment at a time."""

    def __init__(self, root, fleet=None):
        self.stage = os.path.join(root, "stage")
        self.fleet = fleet or os.path.join(root, "fleet")
        self.local = fs.is_local(self.fleet)
        if self.local:
            os.makedirs(self.fleet, exist_ok=True)

    def make(self, name: str, seconds_ago: float = 0.0, **road) -> None:
        spec = dict(frames=4 * SEGMENT, width=32, height=24, segment_frames=SEGMENT, start_ns=START_NS, **road)
        path = synthetic.write_recording(os.path.join(self.stage, name), {"road": spec}, wall_time=_wall(seconds_ago))
        info = json.load(open(os.path.join(path, "recording.json")))
        info["start"]["monotonic_ns"] = START_NS  # the recorder's clock at its start (as vipc-record writes it)
        with open(os.path.join(path, "recording.json"), "w") as f:
            json.dump(info, f)

    def _put(self, rel: str, data: bytes, hidden: str) -> None:
        """``fleet/rel`` appears whole: written under ``hidden`` and renamed (local), one PUT (S3)."""
        if not self.local:
            fs.write_bytes(fs.join(self.fleet, rel), data)
            return
        final = os.path.join(self.fleet, rel)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        with open(os.path.join(os.path.dirname(final), hidden), "wb") as f:
            f.write(data)
        os.replace(os.path.join(os.path.dirname(final), hidden), final)

    def _staged(self, *rel: str) -> bytes:
        with open(os.path.join(self.stage, *rel), "rb") as f:
            return f.read()

    def begin(self, name: str) -> None:
        info = json.loads(self._staged(name, "recording.json"))
        self._put(f"{name}/recording.json", json.dumps(dict(info, status="recording")).encode(), "x.json")
        # a segment being written: hidden, half a file, never read
        self._put(f"{name}/index/road/.000099.partial.parquet", b"PAR1 half", ".x")
        if self.local:
            os.makedirs(os.path.join(self.fleet, name, "frames", "road"), exist_ok=True)

    def complete(self, name: str, segment: int) -> None:
        for kind, ext in (("frames", "mkv"), ("index", "parquet")):  # media first, the index last
            rel = f"{kind}/road/{segment:06d}.{ext}"
            self._put(f"{name}/{rel}", self._staged(name, rel), f".{segment:06d}.partial.{ext}")

    def frames(self, name: str, segment: int) -> int:
        return pq.read_metadata(os.path.join(self.stage, name, "index", "road", f"{segment:06d}.parquet")).num_rows

    def rest(self, name: str) -> None:
        """Complete every segment not complete yet."""
        for segment in range(len(os.listdir(os.path.join(self.stage, name, "index", "road")))):
            if not fs.exists(fs.join(self.fleet, name, "index", "road", f"{segment:06d}.parquet")):
                self.complete(name, segment)

    def finish(self, name: str) -> None:
        filesystem, path = fs.resolve(fs.join(self.fleet, name, "index", "road", ".000099.partial.parquet"))
        filesystem.delete_file(path)
        self._put(f"{name}/recording.json", self._staged(name, "recording.json"), "x.json")


def table(out, name: str):
    """A table of ``out/tables`` as pandas (pyarrow), None while it has no rows."""
    where = os.path.join(out, "tables", name)
    if not os.path.isdir(where):
        return None
    parts = ds.partitioning(pa.schema([("date", pa.string()), ("recording_id", pa.string())]), flavor="hive")
    try:
        frame = ds.dataset(where, format="parquet", partitioning=parts).to_table().to_pandas()
    except (OSError, pa.ArrowException):  # a partition being replaced
        return None
    return frame if len(frame) else None  # (only Spark's hidden staging folders yet)


def ordered(frame, name):
    from visionipc.apps.pipeline.tables import ORDER

    frame = frame[sorted(frame.columns)]
    return frame.sort_values(["recording_id", *ORDER[name]], ignore_index=True)


def frames_of(out, recording: str) -> int:
    h = table(out, "health")
    if h is None:
        return 0
    return int(h.loc[h["recording"] == recording, "frames"].sum())


def wait(what, timeout: float = 120.0, proc=None):
    """What ``what()`` gives once it is neither None nor False (polled each 20 ms)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got is not None and got is not False:  # (0 is an answer: batch 0)
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"vipc-analyze --follow ended ({proc.returncode}): {open(proc.err_path).read()}")
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what.__doc__ or what}")


def follow(fleet, out, log_path, *extra, spark=("--master", "local[1]"), env=None):
    """``vipc-analyze FLEET --out OUT --follow`` (trigger 1 s, windows 1 s, watermark 30 s) as
    its own process group, stderr appended to ``log_path``; ``spark``: where it runs."""
    err = open(log_path, "a")
    cmd = [sys.executable, "-m", "visionipc.apps.pipeline.cli", fleet, "--out", out, "--follow"]
    cmd += ["--trigger", "1", "--window", "1", "--watermark", "30", *spark, *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True, env=env)
    proc.err_path = log_path
    return proc


def said(log_path, since: int) -> str:
    with open(log_path) as f:
        f.seek(since)
        return f.read()


def kill(proc) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM, as a machine that died
    proc.wait(timeout=30)


def stop(proc) -> None:
    if proc.poll() is None:
        kill(proc)


def same_tables(out, reference, names=HEALTH) -> None:
    """Each table of ``names`` in ``out`` equals ``reference``'s, cell for cell."""
    import pandas as pd

    for name in names:
        pd.testing.assert_frame_equal(ordered(table(out, name), name), ordered(table(reference, name), name))


def follow_to_the_end(rec: Recorder, out: str, log_path: str, spark, env=None) -> None:
    """Two recordings followed as they grow, to the end: a segment each when the follow starts,
    one more of carA while it runs (in ``health`` within the follow), then the rest, each
    recording finished; the follow stops after 8 s without a new segment (exit 0)."""
    rec.make("carA", drop=[40, 41, 95])
    rec.make("carB", delay_ms={70: 120})
    for name in ("carA", "carB"):
        rec.begin(name)
        rec.complete(name, 0)
    proc = follow(rec.fleet, out, log_path, "--idle-timeout", "8", spark=spark, env=env)
    try:
        wait(lambda: frames_of(out, "carA") == SEGMENT and frames_of(out, "carB") == SEGMENT, 300, proc)
        rec.complete("carA", 1)
        wait(lambda: frames_of(out, "carA") == 2 * SEGMENT, proc=proc)
        for name in ("carA", "carB"):
            rec.rest(name)
            rec.finish(name)
        assert proc.wait(timeout=240) == 0, open(log_path).read()
    finally:
        stop(proc)


def windows_count_every_frame(out, reference) -> None:
    """``health_windows`` holds every frame of the batch run's ``health`` once."""
    windows = table(out, "health_windows")
    assert not windows.duplicated(["recording", "stream", "window_start"]).any()
    counted = windows.groupby("recording")["frames"].sum().to_dict()
    assert counted == table(reference, "health").set_index("recording")["frames"].to_dict()
