"""Fleet health live on Structured Streaming (issue 33, item 1): ``spark.readStream.format("vipc")``
and ``vipc-analyze --follow`` on recordings whose segments complete while they are followed.

A recorder is replayed segment by segment in vipc-record's own order (its writer made the
recording: synthetic.write_recording; each media file then index file appears under a hidden
.partial name and is renamed, recording.json says "recording" until the end), so what the
stream sees is what it sees beside a live vipc-record."""

import json
import os
import re
import time

import pandas as pd
import pytest
from pipeline_helpers import spark  # noqa: F401 - fixture
from stream_helpers import SEGMENT, START_NS, Recorder, follow, frames_of, kill, said, same_tables, stop, table, wait

from visionipc.apps.pipeline import stream
from visionipc.apps.pipeline.cli import main

KILLS = [("carB", 1), ("carA", 2), ("carB", 2), ("carA", 3), ("carB", 3)]  # the 5: (recording, segment)


def _batch_of(checkpoint: str, path: str, segment: int):
    """The batch whose planned offset (``offsets/N``, written before Spark runs it) first has
    the segment complete, None before it is planned."""
    folder = os.path.join(checkpoint, "offsets")
    for n in sorted(int(f) for f in os.listdir(folder) if f.isdigit()) if os.path.isdir(folder) else ():
        try:
            offset = json.loads(open(os.path.join(folder, str(n))).read().splitlines()[2])
        except (OSError, IndexError, ValueError):  # being written
            continue
        if stream.unranges(offset["recordings"].get(path, {}).get("road", ""), [segment]):
            return n
    return None


def _committed(checkpoint: str, batch: int) -> bool:
    return os.path.exists(os.path.join(checkpoint, "commits", str(batch)))


@pytest.mark.timeout(1200)  # a JVM per start (6 of them): a minute each on a quiet 2-core machine, more under load
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
    checkpoint = os.path.join(out, "checkpoint")
    proc = follow(rec.fleet, out, log_path)
    try:
        wait(lambda: frames_of(out, "carA") == SEGMENT and frames_of(out, "carB") == SEGMENT, proc=proc)
        # a segment completes: in the table and on the live page (measured, printed for the report)
        t0 = time.monotonic()
        rec.complete("carA", 1)
        wait(lambda: frames_of(out, "carA") == 2 * SEGMENT, proc=proc)
        table_s = time.monotonic() - t0
        page = os.path.join(out, "live.html")
        wait(lambda: os.path.exists(page) and re.search(r"<td>carA</td><td>road</td><td>60</td>", open(page).read()))
        page_s = time.monotonic() - t0
        print(f"completed segment -> table {table_s:.2f} s, live page {page_s:.2f} s (trigger 1 s)")
        assert "http-equiv='refresh'" in open(page).read()
        # 5 SIGKILLs mid-stream, each restarted: each after a checkpoint commit (the batch before
        # it, replayed after the last restart, committed), in the middle of the batch that reads a
        # segment just completed: right after Spark logged its offset (before the health job), or
        # once its health partition was written (before the windows' upsert and the commit)
        expect, last = {"carA": 2 * SEGMENT, "carB": SEGMENT}, None
        for i, (name, segment) in enumerate(KILLS):
            if last is not None:
                wait(lambda last=last: _committed(checkpoint, last), proc=proc)
            rec.complete(name, segment)
            expect[name] += rec.frames(name, segment)
            path = os.path.join(rec.fleet, name)
            batch = wait(lambda p=path, s=segment: _batch_of(checkpoint, p, s), proc=proc)
            if i % 2:
                wait(lambda n=name: frames_of(out, n) == expect[n], proc=proc)
            kill(proc)
            assert not _committed(checkpoint, batch), f"kill {i + 1} came after batch {batch} was committed"
            last, since = batch, os.path.getsize(log_path)
            proc = follow(rec.fleet, out, log_path, *(("--idle-timeout", "8") if i == len(KILLS) - 1 else ()))
        wait(lambda: all(frames_of(out, n) == f for n, f in expect.items()), proc=proc)
        # late recordings: one inside the watermark (in its windows), one beyond it (reported)
        for name in ("lateC", "oldD"):
            rec.begin(name)
        for name in ("carA", "carB", "lateC", "oldD"):
            rec.rest(name)
            rec.finish(name)
        assert proc.wait(timeout=180) == 0, open(log_path).read()
    finally:
        stop(proc)
    assert f"] batch {last}: " in said(log_path, since)  # the last killed batch, replayed with its segment
    log_text = open(log_path).read()
    assert re.search(r"late: batch \d+ had segments older than the watermark", log_text), log_text
    # the streamed tables equal a batch run's over the same recordings
    reference = str(tmp_path / "batch")
    assert main([rec.fleet, "--out", reference, "--jobs", "health", "-q"]) == 0
    same_tables(out, reference)
    # the windows: every frame of the recordings on time once, none of the one beyond the watermark
    windows = table(out, "health_windows")
    counted = windows.groupby("recording")["frames"].sum().to_dict()
    health = table(reference, "health").set_index("recording")["frames"].to_dict()
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
    # the batch's offset edited by hand into nonsense: one line, not a traceback or a hang
    batches = [int(f) for f in os.listdir(os.path.join(checkpoint, "offsets")) if f.isdigit()]
    planned = os.path.join(checkpoint, "offsets", str(max(batches)))
    lines = open(planned).read().splitlines()
    with open(planned, "w") as f:
        f.write("\n".join(lines[:2] + [json.dumps({"recordings": {os.path.join(rec.fleet, "a"): {"road": "x-1"}}})]))
    with pytest.raises(Exception, match="malformed stream offset") as e:
        drain()
    assert _recording_error(str(e.value)).startswith("malformed stream offset 'x-1' for ")
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
    for argv, message in (
        (["--trigger", "0"], "--trigger must be > 0"),
        (["--watermark", "-1"], "--watermark must be > 0"),
        (["--incremental"], "--follow and --incremental"),
    ):
        with pytest.raises(SystemExit) as e:
            main([str(tmp_path), "--out", str(tmp_path / "o"), "--follow", *argv])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert message in err[-1], err
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
