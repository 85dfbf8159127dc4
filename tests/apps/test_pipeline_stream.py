"""Fleet health live on Structured Streaming (issue 33, item 1): ``spark.readStream.format("vipc")``
and ``vipc-analyze --follow`` on recordings whose segments complete while they are followed.

A recorder is replayed segment by segment in vipc-record's own order (its writer made the
recording: synthetic.write_recording; each media file then index file appears under a hidden
.partial name and is renamed, recording.json says "recording" until the end), so what the
stream sees is what it sees beside a live vipc-record."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from pipeline_helpers import spark  # noqa: F401 - fixture

from visionipc.apps.pipeline import synthetic
from visionipc.apps.pipeline.cli import main

SEGMENT = 30  # frames per segment
START_NS = 1_000_000_000_000  # the streams' first receive time (synthetic's clock)
HEALTH = ("health", "drops", "fps_timeline", "latency_histogram", "events")


def _wall(seconds_ago: float = 0.0) -> str:
    t = datetime.now(timezone.utc) - timedelta(seconds=seconds_ago)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class Recorder:
    """Recordings made in ``stage`` and completed into ``fleet`` a segment at a time."""

    def __init__(self, root):
        self.stage, self.fleet = os.path.join(root, "stage"), os.path.join(root, "fleet")
        os.makedirs(self.fleet, exist_ok=True)

    def make(self, name: str, seconds_ago: float = 0.0, **road) -> None:
        spec = dict(frames=4 * SEGMENT, width=32, height=24, segment_frames=SEGMENT, start_ns=START_NS, **road)
        path = synthetic.write_recording(os.path.join(self.stage, name), {"road": spec}, wall_time=_wall(seconds_ago))
        info = json.load(open(os.path.join(path, "recording.json")))
        info["start"]["monotonic_ns"] = START_NS  # the recorder's clock at its start (as vipc-record writes it)
        self._json(os.path.join(path, "recording.json"), info)

    def _json(self, path, doc):
        with open(path + ".tmp", "w") as f:
            json.dump(doc, f)
        os.replace(path + ".tmp", path)

    def begin(self, name: str) -> None:
        info = json.load(open(os.path.join(self.stage, name, "recording.json")))
        os.makedirs(os.path.join(self.fleet, name, "index", "road"), exist_ok=True)
        os.makedirs(os.path.join(self.fleet, name, "frames", "road"), exist_ok=True)
        self._json(os.path.join(self.fleet, name, "recording.json"), dict(info, status="recording"))
        # a segment being written: hidden, half a file, never read
        with open(os.path.join(self.fleet, name, "index", "road", ".000099.partial.parquet"), "wb") as f:
            f.write(b"PAR1 half")

    def complete(self, name: str, segment: int) -> None:
        for kind, ext in (("frames", "mkv"), ("index", "parquet")):  # media first, the index last
            final = os.path.join(self.fleet, name, kind, "road", f"{segment:06d}.{ext}")
            hidden = os.path.join(os.path.dirname(final), f".{segment:06d}.partial.{ext}")
            shutil.copyfile(os.path.join(self.stage, name, kind, "road", f"{segment:06d}.{ext}"), hidden)
            os.replace(hidden, final)

    def frames(self, name: str, segment: int) -> int:
        return pq.read_metadata(os.path.join(self.stage, name, "index", "road", f"{segment:06d}.parquet")).num_rows

    def rest(self, name: str) -> None:
        """Complete every segment not complete yet."""
        for segment in range(len(os.listdir(os.path.join(self.stage, name, "index", "road")))):
            if not os.path.exists(os.path.join(self.fleet, name, "index", "road", f"{segment:06d}.parquet")):
                self.complete(name, segment)

    def finish(self, name: str) -> None:
        os.remove(os.path.join(self.fleet, name, "index", "road", ".000099.partial.parquet"))
        shutil.copyfile(os.path.join(self.stage, name, "recording.json"), os.path.join(self.fleet, name, "x.json"))
        os.replace(os.path.join(self.fleet, name, "x.json"), os.path.join(self.fleet, name, "recording.json"))


def _table(out, name: str):
    where = os.path.join(out, "tables", name)
    if not os.path.isdir(where):
        return None
    parts = ds.partitioning(pa.schema([("date", pa.string()), ("recording_id", pa.string())]), flavor="hive")
    try:
        frame = ds.dataset(where, format="parquet", partitioning=parts).to_table().to_pandas()
    except (OSError, pa.ArrowException):  # a partition being replaced
        return None
    return frame if len(frame) else None  # (only Spark's hidden staging folders yet)


def _sorted(frame, name):
    from visionipc.apps.pipeline.tables import ORDER

    frame = frame[sorted(frame.columns)]
    return frame.sort_values(["recording_id", *ORDER[name]], ignore_index=True)


def _frames(out, recording: str) -> int:
    h = _table(out, "health")
    if h is None:
        return 0
    return int(h.loc[h["recording"] == recording, "frames"].sum())


def _wait(what, timeout: float = 120.0, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"vipc-analyze --follow ended ({proc.returncode}): {open(proc.err_path).read()}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what.__doc__ or what}")


def _follow(fleet, out, log_path, *extra):
    err = open(log_path, "a")
    cmd = [sys.executable, "-m", "visionipc.apps.pipeline.cli", fleet, "--out", out, "--follow"]
    cmd += ["--trigger", "1", "--window", "1", "--watermark", "30", "--master", "local[1]", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    proc.err_path = log_path
    return proc


def _said(log_path, since: int) -> str:
    with open(log_path) as f:
        f.seek(since)
        return f.read()


def _kill(proc) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM, as a machine that died
    proc.wait(timeout=30)


# the issue asks for 5: each restart starts a JVM (30-45 s on the shared 2-core test machine), so the
# suite kills twice; VIPC_STREAM_KILLS=5 runs the 5 (docs/pipeline.md)
KILLS = int(os.environ.get("VIPC_STREAM_KILLS", "2"))


@pytest.mark.timeout(300 + 150 * KILLS)  # a JVM per start: a minute on a quiet 2-core machine, minutes under load
def test_follow_live_kills_late_and_batch_equality(spark, tmp_path):  # noqa: F811 - fixture
    rec = Recorder(tmp_path)
    rec.make("carA", drop=[40, 41, 95])
    rec.make("carB", delay_ms={70: 120})
    rec.make("lateC", seconds_ago=10)  # inside the 30 s watermark
    rec.make("oldD", seconds_ago=3600)  # far beyond it
    for name in ("carA", "carB"):
        rec.begin(name)
        rec.complete(name, 0)
    out, log_path = str(tmp_path / "out"), str(tmp_path / "follow.log")
    proc, since = _follow(rec.fleet, out, log_path), 0
    try:
        _wait(lambda: _frames(out, "carA") == SEGMENT and _frames(out, "carB") == SEGMENT, proc=proc)
        # a segment completes: in the table and on the live page (measured, printed for the report)
        t0 = time.monotonic()
        rec.complete("carA", 1)
        _wait(lambda: _frames(out, "carA") == 2 * SEGMENT, proc=proc)
        table_s = time.monotonic() - t0
        page = os.path.join(out, "live.html")
        _wait(lambda: os.path.exists(page) and re.search(r"<td>carA</td><td>road</td><td>60</td>", open(page).read()))
        page_s = time.monotonic() - t0
        print(f"completed segment -> table {table_s:.2f} s, live page {page_s:.2f} s (trigger 1 s)")
        assert "http-equiv='refresh'" in open(page).read()
        # killed mid-stream (after a batch of its own, a segment just completed), restarted each time
        expect = {"carA": 2 * SEGMENT, "carB": SEGMENT}
        for i, (name, segment) in enumerate([("carB", 1), ("carA", 2), ("carB", 2), ("carA", 3), ("carB", 3)][:KILLS]):
            _wait(lambda since=since: "] batch " in _said(log_path, since), proc=proc)
            rec.complete(name, segment)
            expect[name] += rec.frames(name, segment)
            time.sleep(0.5)
            _kill(proc)
            since = os.path.getsize(log_path)
            proc = _follow(rec.fleet, out, log_path, *(("--idle-timeout", "8") if i == KILLS - 1 else ()))
        _wait(lambda: all(_frames(out, n) == f for n, f in expect.items()), proc=proc)
        # late recordings: one inside the watermark (in its windows), one beyond it (reported)
        for name in ("lateC", "oldD"):
            rec.begin(name)
        for name in ("carA", "carB", "lateC", "oldD"):
            rec.rest(name)
            rec.finish(name)
        assert proc.wait(timeout=180) == 0, open(log_path).read()
    finally:
        if proc.poll() is None:
            _kill(proc)
    log_text = open(log_path).read()
    assert re.search(r"late: batch \d+ had segments older than the watermark", log_text), log_text
    # the streamed tables equal a batch run's over the same recordings
    reference = str(tmp_path / "batch")
    assert main([rec.fleet, "--out", reference, "--jobs", "health", "-q"]) == 0
    for name in HEALTH:
        pd.testing.assert_frame_equal(_sorted(_table(out, name), name), _sorted(_table(reference, name), name))
    # the windows: every frame of the recordings on time once, none of the one beyond the watermark
    windows = _table(out, "health_windows")
    counted = windows.groupby("recording")["frames"].sum().to_dict()
    health = _table(reference, "health").set_index("recording")["frames"].to_dict()
    assert counted == {name: health[name] for name in ("carA", "carB", "lateC")}
    assert not windows.duplicated(["recording", "stream", "window_start"]).any()
    assert health["oldD"] == 4 * SEGMENT


def test_read_stream_picks_up_completed_segments_exactly_once(spark, tmp_path):  # noqa: F811 - fixture
    from visionipc.apps.pipeline import datasource
    from visionipc.apps.pipeline.follow import _recording_error

    datasource.register(spark)
    rec = Recorder(tmp_path)
    for name in ("a", "b"):
        rec.make(name)
    rec.begin("a")
    rec.complete("a", 0)
    rec.complete("a", 1)
    sink, checkpoint = str(tmp_path / "rows"), str(tmp_path / "checkpoint")

    def drain():
        stream = spark.readStream.format("vipc").option("event_time", "true").load(rec.fleet)
        query = (
            stream.writeStream.format("parquet")
            .option("path", sink)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        return spark.read.parquet(sink).toPandas()

    rows = drain()
    assert sorted(set(zip(rows["recording_id"], rows["segment"]))) == [("a", 0), ("a", 1)]
    rec.complete("a", 2)
    rec.begin("b")  # a new recording
    rec.complete("b", 0)
    rows = drain()  # a new query on the same checkpoint: only what is new
    assert len(rows) == 4 * SEGMENT and not rows.duplicated(["recording_id", "stream", "frame_id"]).any()
    assert sorted(set(zip(rows["recording_id"], rows["segment"]))) == [("a", 0), ("a", 1), ("a", 2), ("b", 0)]
    # a corrupt segment: the batch that lists it fails with one line naming it
    with open(os.path.join(rec.fleet, "b", "index", "road", "000001.parquet"), "wb") as f:
        f.write(b"not parquet")
    with pytest.raises(Exception, match=r"corrupt index file .*000001\.parquet") as e:
        drain()
    assert _recording_error(str(e.value)).startswith("corrupt index file")
    # event_time: recording.json's start wall time + the frame's receive time on the recorder's clock
    info = json.load(open(os.path.join(rec.fleet, "a", "recording.json")))
    start = pd.Timestamp(info["start"]["wall_time"])
    first = rows[rows["recording_id"] == "a"].sort_values("frame_id").iloc[0]
    expected = start + pd.Timedelta(int(first["receive_time"]) - START_NS, "ns")
    got = pd.Timestamp(first["event_time"])
    got = got.tz_localize(spark.conf.get("spark.sql.session.timeZone")) if got.tzinfo is None else got
    assert abs(got - expected) < pd.Timedelta(1, "us")


def test_follow_bad_input_is_one_line(tmp_path, capsys):
    assert main([str(tmp_path / "missing"), "--out", str(tmp_path / "o"), "--follow"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing" in err[0], err
    for argv, said in (
        (["--trigger", "0"], "--trigger must be > 0"),
        (["--watermark", "-1"], "--watermark must be > 0"),
        (["--incremental"], "--follow and --incremental"),
    ):
        with pytest.raises(SystemExit) as e:
            main([str(tmp_path), "--out", str(tmp_path / "o"), "--follow", *argv])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert said in err[-1], err
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--out", str(tmp_path / "o"), "--checkpoint", str(tmp_path / "c")])
    assert "--checkpoint and --idle-timeout go with --follow" in capsys.readouterr().err


def test_offsets_are_bounded_by_the_listing_and_a_malformed_one_is_one_line(tmp_path):
    from visionipc.apps.pipeline import stream
    from visionipc.apps.record.checks import RecordingError

    rec = Recorder(tmp_path)
    rec.make("a")
    rec.begin("a")
    for segment in (0, 1, 2):
        rec.complete("a", segment)
    path = os.path.join(rec.fleet, "a")
    done = stream.snapshot([rec.fleet])
    assert done == {"recordings": {path: {"road": "0-2"}}}
    assert stream.new_files({"recordings": {path: {"road": "0"}}}, done) == [(path, "road", 1), (path, "road", 2)]
    # a range edited by hand: only the segments listed count (never a trillion numbers expanded)
    huge = {"recordings": {path: {"road": "0-999999999999"}}}
    assert stream.new_files(huge, done) == []
    assert stream.new_files({"recordings": {}}, huge) == [(path, "road", s) for s in (0, 1, 2)]
    assert stream.unranges("1-3,7,9-999999999999", [0, 1, 2, 5, 7, 8, 10**6]) == {1, 2, 7, 10**6}
    for bad in ("x-1", "5-2", "1--2", "-3", "1,,2", " 1"):
        with pytest.raises(RecordingError, match=r"^malformed stream offset .* start a new --checkpoint\)$") as e:
            stream.new_files({"recordings": {}}, {"recordings": {path: {"road": bad}}})
        assert "\n" not in str(e.value) and path in str(e.value)
    for bad in ({"recordings": []}, {"recordings": {path: {"road": 3}}}, {}, []):
        with pytest.raises(RecordingError, match=r"^malformed stream offset .*--checkpoint\)$"):
            stream.new_files(done, bad)
