"""Results as tables that grow with the fleet: ``OUT/tables/<name>/date=D/recording_id=R/``.

Hive-style partitions by the recording's start date (UTC) and its stable id, written by
Spark's own Parquet writer with dynamic partition overwrite: a run replaces exactly the
partitions of the recordings it analysed (all of their rows, whatever an earlier run of
a shorter copy of them wrote) and leaves every other recording's. One file per recording
and table (rows hashed by partition before the write), so a fleet gives a file per
recording, not per segment. Plain DataFrame API: the same on a classic session and on
Spark Connect. ``recording_id`` is the stable id (recording.json, or derived from its
content: ``stable_id``); ``recording`` the name the run gave it (read.find_recordings).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import uuid
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional

from visionipc.apps.pipeline import fs
from visionipc.apps.record import layout
from visionipc.apps.record.checks import RecordingError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from visionipc.apps.pipeline.read import Recording

ROOT = "tables"
HEALTH_TABLES = ("health", "drops", "fps_timeline", "latency_histogram", "events")
METRICS_TABLES = ("metrics", "metrics_summary")
ORDER = {  # the columns that order a partition's rows
    "health": ["stream"],
    "drops": ["stream", "after_frame_id"],
    "fps_timeline": ["stream", "second"],
    "latency_histogram": ["stream", "bin"],
    "events": ["stream", "event", "frame_id"],
    "metrics": ["stream", "segment", "position"],
    "metrics_summary": ["stream"],
    "health_windows": ["stream", "window_start"],  # vipc-analyze --follow (follow.py)
}
PARTITIONS = ("date", "recording_id")
# ids derived from a recording's content (recordings made before vipc-record wrote one)
NAMESPACE = uuid.UUID("6f0a3c52-3d1e-4c5b-9e0e-7a1d2b9c4e10")
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def stable_id(recording: Recording, info: Dict[str, Any]) -> str:
    """The recording's id: recording.json's ``recording_id`` (vipc-record writes a UUID when
    recording starts), else a UUID derived from what recording.json fixes at the start
    (name, start, streams' names, sizes and formats), else from its first index file's bytes.
    The same whichever set of recordings is analysed, and after the recording grew."""
    given = info.get("recording_id")
    if given is not None:
        if not isinstance(given, str) or not _ID.fullmatch(given):
            raise RecordingError(
                f"{fs.join(recording.path, layout.MANIFEST)}: 'recording_id' must be 1-64 letters, digits, "
                f"'.', '_' or '-' (got {str(given)[:40]!r})"
            )
        return given
    if info:
        streams = info.get("streams") or {}
        basis = json.dumps(
            {
                "name": info.get("name"),
                "start": info.get("start"),
                "streams": {s: [v.get("width"), v.get("height"), v.get("format")] for s, v in streams.items()},
            },
            sort_keys=True,
        )
    else:
        files = recording.index_files()  # an empty recording is refused (or skipped) by read.index_files
        basis = hashlib.sha256(fs.read_bytes(files[0][2]) if files else recording.path.encode()).hexdigest()
    return str(uuid.uuid5(NAMESPACE, basis))


def fingerprint(recording: Recording, rid: str) -> str:
    """What decides whether ``--incremental`` analyses a recording again: its id and the
    name, size and modification time of each complete segment's index file (written when
    the segment completes), wherever the recording lies."""
    stats = fs.file_stats(fs.join(recording.path, layout.INDEX))  # one listing, no request per file
    h = hashlib.sha256(rid.encode())
    for stream, segment, rel in layout.complete_segments(stats):  # Recording.index_files' segments
        size, mtime_ns = stats[rel]
        h.update(f"{stream}/{segment}\0{size}\0{mtime_ns}\n".encode())
    return h.hexdigest()


def location(out: str, name: str) -> str:
    return fs.join(out, ROOT, name)


def _spark_path(where: str) -> str:
    """A location as Spark's own reader and writer take it (Hadoop's S3 connector is s3a)."""
    return "s3a://" + where[len("s3://") :] if where.startswith("s3://") else where


def unreachable(error: BaseException) -> str:
    """Why Spark's own writer cannot reach a location (a storage whose Hadoop connector,
    such as hadoop-aws for s3a://, the cluster lacks), '' for any other error."""
    found = re.search(r"No FileSystem for scheme \"?\w+\"?|Class org\.apache\.hadoop\.fs\.\S+ not found", str(error))
    return found.group(0) if found else ""


@contextlib.contextmanager
def _strings(spark):
    """Partition values read as strings (a recording named 2026-11-03 or a stream named 0
    stays a string), the session's own setting restored after."""
    key = "spark.sql.sources.partitionColumnTypeInference.enabled"
    before = spark.conf.get(key, "true")
    spark.conf.set(key, "false")
    try:
        yield
    finally:
        spark.conf.set(key, before)


def _write(df, where: str, order: list, recordings: int) -> None:
    """``df`` into its table, one file per recording: rows hashed by partition into as many
    tasks as there are recordings, at most ``spark.sql.shuffle.partitions`` (an explicit
    count: adaptive execution would coalesce a small table into one task, which then
    writes every recording's file alone while the other slots idle)."""
    tasks = max(1, min(recordings, int(df.sparkSession.conf.get("spark.sql.shuffle.partitions", "200"))))
    (
        df.repartition(tasks, *PARTITIONS)
        .sortWithinPartitions(*order)
        .write.mode("overwrite")
        .option("partitionOverwriteMode", "dynamic")
        .partitionBy(*PARTITIONS)
        .parquet(_spark_path(where))
    )


def _drop_stale(where: str, keys: dict, written: set) -> None:
    """Remove the partitions of analysed recordings that have no rows this time (dynamic
    overwrite replaces only partitions it writes rows into)."""
    for rid, date in keys.items():
        if rid not in written:
            part = fs.join(where, f"date={date or '__HIVE_DEFAULT_PARTITION__'}", f"recording_id={rid}")
            if fs.isdir(part):
                fs.delete_dir(part)


def write_small(
    spark: SparkSession, out: str, name: str, frame: Any, ids: Dict[str, str], dates: Dict[str, Optional[str]]
) -> None:
    """A driver-side pandas table of the run (``recording_id`` = the run's names) into its table."""
    import pyarrow as pa

    frame = frame.rename(columns={"recording_id": "recording"})
    frame = frame.assign(
        recording_id=frame["recording"].map(ids).astype(object), date=frame["recording"].map(dates).astype(object)
    )
    table = pa.Table.from_pandas(frame, preserve_index=False)
    table = table.cast(pa.schema([f.with_type(pa.string()) if f.name in PARTITIONS else f for f in table.schema]))
    where = location(out, name)
    if len(frame):
        _write(spark.createDataFrame(table), where, ORDER[name], len(ids))
    _drop_stale(where, {ids[r]: dates.get(r) for r in ids}, set(frame["recording_id"]))


def write_metrics(
    spark: SparkSession, out: str, run_metrics: str, ids: Dict[str, str], dates: Dict[str, Optional[str]]
) -> None:
    """The run's per-frame metrics (``run_metrics``: one file per segment, partitioned by
    the run's names and streams) into the metrics table, one file per recording."""
    import pyarrow as pa

    where = location(out, "metrics")
    written = set()
    if fs.isdir(run_metrics):
        names = pa.table({"recording": list(ids), "_id": [ids[r] for r in ids]})
        with _strings(spark):
            m = spark.read.parquet(_spark_path(run_metrics)).withColumnRenamed("recording_id", "recording")
            m = m.join(spark.createDataFrame(names).hint("broadcast"), "recording").withColumnRenamed(
                "_id", "recording_id"
            )
            _write(m, where, ORDER["metrics"], len(ids))
        written = {ids[r] for r, _ in _partitions(run_metrics, "recording_id") if r in ids}
    _drop_stale(where, {ids[r]: dates.get(r) for r in ids}, written)


def compact_run_metrics(spark: SparkSession, run_metrics: str) -> None:
    """The run folder's per-frame metrics (the tasks write one file per segment) rewritten as
    one file per recording and stream, in the same ``recording_id=/stream=`` folders; local
    run folders only (the swap is a rename), others keep their per-segment files."""
    if not fs.is_local(run_metrics) or not fs.isdir(run_metrics):
        return
    staged = fs.join(fs.parent(run_metrics), ".metrics.compact")
    with _strings(spark):
        (
            spark.read.parquet(run_metrics)
            .repartition("recording_id", "stream")
            .sortWithinPartitions("segment", "position")
            .write.mode("overwrite")
            .partitionBy("recording_id", "stream")
            .parquet(staged)
        )
    fs.delete_dir(run_metrics)
    os.rename(staged, run_metrics)


def _partitions(where: str, key: str) -> list:
    """``[(value, folder)]`` of the ``key=value`` folders right below ``where``."""
    from urllib.parse import unquote

    return [
        (unquote(n.split("=", 1)[1]), fs.join(where, n))
        for n, is_dir, _ in fs.listdir(where)
        if is_dir and n.startswith(key + "=")
    ]


def read_whole(spark: SparkSession, out: str, name: str) -> Any:
    """Every row of a table (pandas), or None where it has none yet."""
    where = location(out, name)
    if not fs.isdir(where) or not _partitions(where, "date"):
        return None
    with _strings(spark):
        frame: Any = spark.read.parquet(_spark_path(where)).toPandas()  # (pandas has no types)
    first = ["recording_id", "recording", "stream"]
    frame = frame[first + [c for c in frame.columns if c not in first]]
    return frame.sort_values(["recording_id", *ORDER[name]], ignore_index=True)


def register(spark: SparkSession, prefix: str, out: str, names: Iterable[str]) -> List[str]:
    """Register (or refresh) each table as ``<prefix>_<name>`` in the session's catalog, an
    external Parquet table at its location; its partitions recovered from the folders."""
    made = []
    for name in names:
        where = location(out, name)
        if not fs.isdir(where):
            continue
        table = f"{prefix}_{name}"
        with _strings(spark):
            spark.sql(f"CREATE TABLE IF NOT EXISTS {table} USING parquet LOCATION '{_spark_path(where)}'")
            spark.sql(f"ALTER TABLE {table} RECOVER PARTITIONS")
            spark.sql(f"REFRESH TABLE {table}")
        made.append(table)
    return made
