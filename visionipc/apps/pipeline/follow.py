"""``vipc-analyze --follow``: fleet health live, on Structured Streaming.

One streaming query over ``spark.readStream.format("vipc")`` (stream.py: the segments
recorders complete, as they complete them), checkpointed (``--checkpoint``). Each
micro-batch:

* health per stream in event-time windows (``--window``, by the frame's wall-clock receive
  time) with a watermark (``--watermark``): Spark's windowed aggregation in update mode,
  upserted into the ``health_windows`` table. A segment later than the watermark is left
  out of the windows by Spark and reported (a log line, the live page's late count);
* the whole-recording tables of the batch run (health, drops, fps_timeline,
  latency_histogram, events: tables.py, the same job code, jobs.health_pass) for every
  recording whose complete segments changed (tables.fingerprint), its partitions
  replaced, so the streamed tables equal a batch run's over the same recordings whatever
  was late, and a batch replayed after a crash writes the same rows again;
* ``OUT/live.html``: each stream's state, the worst first, refreshing itself.

A driver killed at any point resumes from the checkpoint: Spark replays the batch it had
not committed (the same segments: stream.py's offsets) and the writes are idempotent.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from visionipc.apps.pipeline import fs, tables
from visionipc.apps.record.checks import RecordingError

if TYPE_CHECKING:
    import argparse

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

WINDOWS = "health_windows"
TABLES = tuple(tables.HEALTH_TABLES) + (WINDOWS,)
STATE = "follow-tables.json"  # in the checkpoint: what the tables hold, per recording
PAGE = "live.html"
log = logging.getLogger("vipc-analyze")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("following a fleet live (--follow; docs/pipeline.md)")
    g.add_argument(
        "--follow",
        action="store_true",
        help="keep analysing as recorders complete segments (Structured Streaming): the health tables "
        "and health_windows in OUT/tables, OUT/live.html; Ctrl-C stops, a restart resumes; on a classic "
        "session or Spark Connect (--remote)",
    )
    g.add_argument("--checkpoint", metavar="DIR", help="the stream's checkpoint (default OUT/checkpoint)")
    g.add_argument("--trigger", type=float, default=5.0, metavar="S", help="micro-batch every S seconds (default 5)")
    g.add_argument("--window", type=float, default=60.0, metavar="S", help="event-time window (default 60 s)")
    g.add_argument(
        "--watermark",
        type=float,
        default=300.0,
        metavar="S",
        help="segments up to S seconds later than the newest event time are still counted in their "
        "windows, later ones are reported (default 300)",
    )
    g.add_argument(
        "--idle-timeout", type=float, default=None, metavar="S", help="stop after S seconds without a new segment"
    )


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.follow:
        if args.checkpoint or args.idle_timeout is not None:
            p.error("--checkpoint and --idle-timeout go with --follow")
        return
    for flag in ("trigger", "window", "watermark"):
        if not getattr(args, flag) > 0:
            p.error(f"--{flag} must be > 0 seconds")
    if args.idle_timeout is not None and args.idle_timeout <= 0:
        p.error("--idle-timeout must be > 0 seconds")
    if args.incremental:
        p.error("--follow and --incremental: choose one (--follow analyses each change as it comes)")


# ---- the micro-batch: tables ----------------------------------------------------------


def _load_state(where: str) -> Dict[str, Any]:
    try:
        return json.loads(fs.read_bytes(where))
    except (OSError, ValueError):  # none yet, or cut short by a kill: everything is written again
        return {}


class Sink:
    """``foreachBatch``'s function (picklable: on Spark Connect it runs in the server)."""

    def __init__(self, paths: List[str], out: str, checkpoint: str, slots: int) -> None:
        self.paths, self.out, self.state, self.slots = paths, out, fs.join(checkpoint, STATE), slots

    def __call__(self, windows: DataFrame, batch_id: int) -> None:
        from visionipc.apps.pipeline.read import find_recordings, recording_info
        from visionipc.apps.pipeline.stream import discover

        spark = windows.sparkSession
        found = discover(self.paths)
        recs = find_recordings(found) if found else []
        infos = {r.path: recording_info(r) for r in recs}
        ids = {r.path: tables.stable_id(r, infos[r.path]) for r in recs}
        state = _load_state(self.state)
        now = {r.path: [tables.fingerprint(r, ids[r.path]), r.recording_id] for r in recs if r.index_files()}
        changed = [r for r in recs if r.path in now and state.get(r.path) != now[r.path]]
        if changed:
            self._health(spark, changed, infos, ids)
        rows = windows.toPandas()
        if len(rows):
            self._windows(spark, rows, recs, infos, ids)
        if changed:
            fs.write_bytes(self.state, json.dumps({**state, **now}, sort_keys=True).encode())

    def _health(self, spark, recs, infos, ids) -> None:
        from visionipc.apps.pipeline import jobs
        from visionipc.apps.pipeline.analysis import SMALL, recording_date
        from visionipc.apps.pipeline.read import index_files

        files = index_files(recs, skip_empty=True, contents=False)  # each file checked where a task reads it
        res = jobs.health_pass(spark, files, self.slots)
        names = {r.recording_id: ids[r.path] for r in recs}
        dates = {r.recording_id: recording_date(infos[r.path]) for r in recs}
        for kind, name in SMALL.items():
            if name in tables.HEALTH_TABLES:
                tables.write_small(spark, self.out, name, res[kind], names, dates)

    def _windows(self, spark, rows, recs, infos, ids) -> None:
        """Upsert the batch's updated windows into their recordings' partitions."""
        import pandas as pd

        from visionipc.apps.pipeline.analysis import recording_date

        by_path = {r.path: r for r in recs}
        rows = rows[rows["recording_path"].isin(by_path)]
        touched = [by_path[p] for p in sorted(set(rows["recording_path"]))]
        names = {r.recording_id: ids[r.path] for r in touched}
        dates = {r.recording_id: recording_date(infos[r.path]) for r in touched}
        fresh = rows.assign(recording_id=rows["recording_path"].map({r.path: r.recording_id for r in touched}))
        fresh = fresh.drop(columns=["recording_path"]).assign(
            window_start=_utc(pd.to_datetime(fresh["window_start_s"], unit="s", utc=True)),
            window_end=_utc(pd.to_datetime(fresh["window_end_s"], unit="s", utc=True)),
        )
        fresh = fresh.drop(columns=["window_start_s", "window_end_s"])
        old = [_partition(self.out, WINDOWS, dates[r.recording_id], ids[r.path], r.recording_id) for r in touched]
        both = pd.concat([f for f in old if f is not None] + [fresh], ignore_index=True)
        both = both.drop_duplicates(["recording_id", "stream", "window_start"], keep="last")
        tables.write_small(spark, self.out, WINDOWS, both[list(fresh.columns)], names, dates)


def _partition(out: str, name: str, date, rid: str, recording: str):
    """One recording's rows of a table (pandas, ``recording_id`` = its name), None if none."""
    import pandas as pd
    import pyarrow.parquet as pq

    where = fs.join(tables.location(out, name), f"date={date or '__HIVE_DEFAULT_PARTITION__'}", f"recording_id={rid}")
    if not fs.isdir(where):
        return None
    filesystem, path = fs.resolve(where)
    frame = pq.read_table(path, filesystem=filesystem, partitioning=None).to_pandas()
    for column in ("window_start", "window_end"):
        frame[column] = _utc(pd.to_datetime(frame[column], utc=True))
    return frame.drop(columns=["recording"]).assign(recording_id=recording)


def _utc(times):
    """Microsecond UTC timestamps (Spark's own precision; Arrow's ns would not convert)."""
    return times.astype("datetime64[us, UTC]")


# ---- the query --------------------------------------------------------------------------


def windowed(spark: SparkSession, rows: DataFrame, window_s: float, watermark_s: float) -> DataFrame:
    """Index rows -> per recording x stream x event-time window: frames, the frame ids' span,
    frames missing inside it, latency (receive - eof) mean and max; late rows dropped. SQL
    text, not pyspark.sql.functions: the same on a classic and a Spark Connect session."""
    rows.withWatermark("event_time", f"{watermark_s} seconds").createOrReplaceTempView("vipc_follow_rows")
    return spark.sql(
        f"""
        SELECT recording_path, stream, unix_micros(w.start) / 1e6 AS window_start_s,
               unix_micros(w.end) / 1e6 AS window_end_s, frames, first_frame_id, last_frame_id,
               last_frame_id - first_frame_id + 1 - frames AS missing, latency_mean_ms, latency_max_ms
        FROM (SELECT window(event_time, '{window_s} seconds') AS w, recording_path, stream,
                     count(1) AS frames, min(frame_id) AS first_frame_id, max(frame_id) AS last_frame_id,
                     avg((receive_time - timestamp_eof) / 1e6) AS latency_mean_ms,
                     max((receive_time - timestamp_eof) / 1e6) AS latency_max_ms
              FROM vipc_follow_rows GROUP BY window(event_time, '{window_s} seconds'), recording_path, stream)
        """
    )


def start_query(spark: SparkSession, args: argparse.Namespace, out: str, checkpoint: str, slots: int) -> StreamingQuery:
    from visionipc.apps.pipeline import datasource

    datasource.register(spark)
    rows = spark.readStream.format("vipc").option("paths", ",".join(args.recordings)).option("event_time", "true")
    return (
        windowed(spark, rows.load(), args.window, args.watermark)
        .writeStream.outputMode("update")
        .foreachBatch(Sink(list(args.recordings), out, checkpoint, slots))
        .trigger(processingTime=f"{args.trigger} seconds")
        .option("checkpointLocation", tables._spark_path(checkpoint))
        .queryName("vipc_follow")
        .start()
    )


# ---- the live page --------------------------------------------------------------------


def read_table(out: str, name: str) -> Any:
    """A whole table as pandas via pyarrow (no Spark job), None while it has no rows."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    where = tables.location(out, name)
    if not fs.isdir(where):
        return None
    filesystem, path = fs.resolve(where)
    parts = ds.partitioning(pa.schema([("date", pa.string()), ("recording_id", pa.string())]), flavor="hive")
    frame = ds.dataset(path, filesystem=filesystem, format="parquet", partitioning=parts).to_table().to_pandas()
    return frame if len(frame) else None


def write_page(out: str, facts: Dict[str, Any], refresh_s: float) -> None:
    """``OUT/live.html``: each stream's state from the tables, the worst first."""
    from visionipc.apps.pipeline import report

    parts = []
    try:
        health, windows = read_table(out, "health"), read_table(out, WINDOWS)
    except (OSError, ValueError) as e:  # a partition replaced while it was read: the next refresh
        log.debug(f"live page: {e}")
        return
    if health is not None:
        state = report.fleet_summary(health.assign(recording_id=health["recording"]))
        if windows is not None:
            last = windows.groupby(["recording", "stream"], as_index=False)["window_end"].max()
            last = last.rename(columns={"recording": "recording_id", "window_end": "last_window_end"})
            state = state.merge(last, on=["recording_id", "stream"], how="left")
        parts.append(report.heading_part(2, f"Streams ({len(state)}, worst first)"))
        parts.append(report.table_part(state))
    if windows is not None:
        recent = windows.sort_values("window_start", ascending=False).head(100)
        shown = ["recording", "stream", "window_start", "window_end", "frames", "missing"]
        shown += ["first_frame_id", "last_frame_id", "latency_mean_ms", "latency_max_ms"]
        parts.append(report.details_part(f"Recent event-time windows ({len(recent)})", recent[shown]))
    page = report.render("vipc-analyze --follow", facts, parts, refresh=max(1, round(refresh_s)))
    fs.write_bytes(fs.join(out, PAGE), page.encode())


# ---- the driver -----------------------------------------------------------------------


def _recording_error(text: str) -> Optional[str]:
    """The message of a RecordingError (bad input) raised in the source or in foreachBatch,
    as Spark wraps it ("RecordingError: ..." or "(RecordingError('...'))"), else None."""
    found = re.search(r"RecordingError\(([\"'])(.*?)\1\)|RecordingError: (.*)", text)
    return None if found is None else (found.group(2) or found.group(3)).strip()


def _unreachable(error: BaseException, out: str, checkpoint: str) -> Optional[Exception]:
    """The one-line error of a checkpoint or tables location Spark's own writer cannot reach
    (object storage without its Hadoop connector), None for any other error."""
    from visionipc.apps.pipeline.fs import StorageError

    reason = tables.unreachable(error)
    if not reason:
        return None
    return StorageError(
        f"--follow: Spark cannot write its checkpoint ({checkpoint}) or the tables ({out}/tables) there: {reason}; "
        "Spark writes both itself, so give --checkpoint and --out a local or HDFS folder (the recordings may "
        "stay on s3://), or run a Spark with Hadoop's S3 connector (hadoop-aws; docs/pipeline.md)"
    )


def _dropped(progress: Any) -> int:
    return sum(int(op.numRowsDroppedByWatermark or 0) for op in progress.stateOperators or ())


def run(args: argparse.Namespace, step: Callable[[str], None]) -> int:
    from visionipc.apps.pipeline import cluster, runs
    from visionipc.apps.pipeline.session import spark_session
    from visionipc.apps.pipeline.stream import discover

    out = runs.check_out(args.out)
    checkpoint = fs.normalize(args.checkpoint) if args.checkpoint else fs.join(out, "checkpoint")
    discover(args.recordings)  # a missing path: one line before Spark starts
    remote = cluster.resolve_remote(args.remote, args.master)
    master = None if remote else cluster.resolve_master(args.master)
    cluster.check_reachable(remote or master or cluster.submitted_master())
    step(f"following {', '.join(args.recordings)}; starting Spark ({remote or master or 'spark-submit'})")
    if remote:
        spark = spark_session(remote=remote, conf=args.conf)
    else:
        spark = spark_session(args.master, ui=args.ui, progress=False, conf=args.conf)
    if not args.verbose:
        cluster.set_log_level(spark, "OFF")
    try:
        query = start_query(spark, args, out, checkpoint, cluster.task_slots(spark))
    except Exception as e:  # noqa: BLE001 - a checkpoint Spark cannot reach: one line
        spark.stop()
        raise _unreachable(e, out, checkpoint) or e from None
    step(f"streaming: trigger {args.trigger:g} s, window {args.window:g} s, watermark {args.watermark:g} s")
    step(f"checkpoint {checkpoint}; live page {fs.join(out, PAGE)}")
    facts: Dict[str, Any] = {
        "following": ", ".join(args.recordings),
        "trigger": f"{args.trigger:g} s",
        "checkpoint": checkpoint,
    }
    seen, late, last_input, next_page = -1, 0, time.monotonic(), 0.0
    try:
        while True:
            ended = query.awaitTermination(min(0.5, args.trigger))  # raises the query's error
            for p in [p for p in query.recentProgress if p.batchId > seen]:
                seen = p.batchId
                dropped = _dropped(p)
                if dropped:
                    late += dropped
                    mark = (p.eventTime or {}).get("watermark", "?")
                    log.warning(
                        f"late: batch {p.batchId} had segments older than the watermark ({mark}): {dropped} "
                        f"window aggregate(s) not in {WINDOWS} (the health tables count their frames)"
                    )
                if p.numInputRows:
                    last_input = time.monotonic()
                    step(f"batch {p.batchId}: {p.numInputRows} frame(s) from new segments")
                    facts.update({"batches": p.batchId + 1, "last batch": p.timestamp, "late aggregates": late})
            if time.monotonic() >= next_page:  # the tables as they are now (written during the batch), each second
                write_page(out, facts, args.trigger)
                next_page = time.monotonic() + min(1.0, args.trigger)
            if ended:
                break
            if seen < 0 or query.status.get("isDataAvailable"):  # starting, or segments listed not committed
                last_input = time.monotonic()
            elif args.idle_timeout is not None and time.monotonic() - last_input > args.idle_timeout:
                step(f"no new segment for {args.idle_timeout:g} s: stopping")
                query.stop()
                break
    except KeyboardInterrupt:
        step("interrupted: stopping (a restart with the same --checkpoint resumes)")
        query.stop()
    except Exception as e:  # noqa: BLE001 - the query's error, raised where Spark ran it
        bad = _recording_error(str(e))
        if bad is not None:
            raise RecordingError(bad) from None
        raise _unreachable(e, out, checkpoint) or e from None
    finally:
        spark.stop()
    return 0
