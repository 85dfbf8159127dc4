"""What one ``vipc-analyze`` run does, between choosing its recordings and publishing
its run folder: the jobs (jobs.py) in the executors, the small tables written once by
the driver (with a ``date`` column from recording.json's wall clock), the report.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from visionipc.apps.pipeline import cluster, fs, jobs, runs, tables
from visionipc.apps.pipeline.choices import DROPS, EXPORT, HEALTH, METRICS
from visionipc.apps.record import layout
from visionipc.apps.record.checks import RecordingError

if TYPE_CHECKING:
    import argparse

    from pyspark.sql import SparkSession

    from visionipc.apps.pipeline.read import IndexFile, Recording, StrPath

Infos = Dict[str, Dict[str, Any]]  # recording name -> its recording.json
Keys = Dict[str, Tuple[str, Optional[str]]]  # recording name -> (stable id, fingerprint)
Say = Callable[[str], None]  # the run's step or warning lines


def recording_date(info: Dict[str, Any]) -> Optional[str]:
    """``YYYY-MM-DD`` of the recording's start (UTC wall clock), None when unknown."""
    start = info.get("start")
    wall = start.get("wall_time") if isinstance(start, dict) else None
    return wall[:10] if isinstance(wall, str) and len(wall) >= 10 else None


def select_recordings(
    recs: List[Recording], args: argparse.Namespace, out: str, warn: Say
) -> Tuple[List[Recording], Infos, Keys]:
    """Drop recordings still being recorded (unless ``--allow-partial``) and, with
    ``--incremental``, those a published run in ``out`` analysed as they are now (same id,
    same segments: tables.fingerprint); returns (recordings, {name: recording.json},
    {name: (stable id, fingerprint)}). A broken recording.json is a RecordingError."""
    from visionipc.apps.pipeline.read import each, recording_infos

    infos = {r.recording_id: info for r, info in zip(recs, recording_infos(recs))}
    partial = [r for r in recs if infos[r.recording_id].get("status") == layout.RECORDING]
    if partial and not args.allow_partial:
        warn(
            f"skipping {len(partial)} recording(s) still being recorded (--allow-partial analyses them): "
            + ", ".join(r.path for r in partial)
        )
        recs = [r for r in recs if r not in partial]

    def key(r: Recording) -> Tuple[str, Optional[str]]:
        rid = tables.stable_id(r, infos[r.recording_id])
        return rid, tables.fingerprint(r, rid)

    keys: Keys = dict(zip((r.recording_id for r in recs), each(key, recs)))  # a listing per recording
    seen: Dict[str, Recording] = {}
    for r in recs:
        other = seen.setdefault(keys[r.recording_id][0], r)
        if other is not r:
            raise RecordingError(
                f"{other.path} and {r.path} are the same recording (recording_id {keys[r.recording_id][0]}): "
                "analyse one of them"
            )
    if args.incremental:
        done = runs.analysed_recordings(out)
        recs = [r for r in recs if keys[r.recording_id] not in done]
    return recs, infos, keys


def driver_checks(
    inputs: Sequence[StrPath], args: argparse.Namespace, out: str, warn: Say
) -> Tuple[List[Recording], Infos, Keys, List[IndexFile]]:
    """What the driver does before Spark starts: find the recordings, read and check their
    recording.json, choose them (``select_recordings``), list their complete segments and
    check the names. The files' contents are checked by the tasks that read them
    (read.read_index_file), so there is no per-file I/O here beyond the listings.
    Returns (recordings, infos, keys, index_files rows)."""
    from visionipc.apps.pipeline.read import find_recordings, index_files

    recs, infos, keys = select_recordings(find_recordings(inputs), args, out, warn)
    return recs, infos, keys, index_files(recs, skip_empty=args.skip_empty, contents=False)


def unmeasured_lossy_streams(recs: Sequence[Recording], infos: Infos) -> List[str]:
    """``recording/stream`` of the lossy streams whose recorder kept no frame metrics (made
    before vipc-record measured frames, or with --frame-metrics none): their metrics are
    measured on the decoded picture, which the codec changed."""
    out = []
    for r in recs:
        for stream, info in (infos.get(r.recording_id, {}).get("streams") or {}).items():
            if isinstance(info, dict) and info.get("lossless") is False and not info.get("frame_metrics"):
                out.append(f"{r.recording_id}/{stream}")
    return out


def _write_table(df, location: str, dates: dict | None = None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if dates is not None:
        df = df.assign(date=df["recording_id"].map(dates))
    filesystem, path = fs.resolve(location)
    filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path, filesystem=filesystem)


def analyse(
    spark: SparkSession,
    recs: List[Recording],
    infos: Infos,
    args: argparse.Namespace,
    run: runs.Run,
    slots: int,
    step: Say,
    files: Optional[List[IndexFile]] = None,
    keys: Optional[Keys] = None,
) -> Dict[str, Any]:
    """Run the jobs of ``args`` over ``recs`` into ``run`` (runs.Run) and the tables of its
    ``--out`` (tables.py); returns the small tables. ``files``: their ``index_files`` rows
    when the caller has checked them already; ``keys``: select_recordings' third value."""
    from visionipc.apps.pipeline import report
    from visionipc.apps.pipeline.frames import segment_rows
    from visionipc.apps.pipeline.read import index_files

    dates = {rid: recording_date(info) for rid, info in infos.items()}
    if files is None:
        files = index_files(recs, skip_empty=args.skip_empty, contents=False)  # the tasks check the contents
    segments = segment_rows(files)
    res: Dict[str, Any] = {}  # table name -> its rows (pandas)
    kind, value = args.export
    if HEALTH in args.jobs or (EXPORT in args.jobs and kind == DROPS):
        step("health: fps, drops, latency, jitter, stalls per recording x stream")
        got = jobs.health_pass(spark, files, slots)
        res.update(got)
        if HEALTH in args.jobs:
            for name, table in (
                ("health", "health"),
                ("drops", "drops"),
                ("fps_timeline", "timeline"),
                ("latency_histogram", "latency"),
                ("events", "events"),
            ):
                _write_table(res[table], run.path(f"{name}.parquet"), dates)
            step(f"health: {len(res['health'])} streams, {int(res['health']['dropped'].sum())} dropped frames")
    if METRICS in args.jobs:
        step("metrics: in the executors (read from the index where the recorder measured the frames, else decoded)")
        decoded = unmeasured_lossy_streams(recs, infos)
        if decoded:
            step(
                f"metrics: note: {len(decoded)} lossy stream(s) recorded without frame metrics are measured "
                "decoded, with the codec's loss (sharpness a few % lower at default quality; docs/pipeline.md): "
                + ", ".join(decoded[:5])
                + (" ..." if len(decoded) > 5 else "")
            )
        got = jobs.metrics_pass(spark, segments, slots, run.path("metrics"), dates)
        res["metrics_summary"], res["metrics_sample"] = got["summary"], got["sample"]
        if got["summary"] is not None:
            _write_table(got["summary"], run.path("metrics_summary.parquet"), dates)
            step(f"metrics: {int(got['summary']['frames'].sum())} frames")
    if EXPORT in args.jobs:
        step(f"export: frames selected by {kind}:{value:g}")
        res["manifest"] = jobs.export_pass(
            spark,
            segments,
            slots,
            run.path("export"),
            (kind, value),
            drops=res.get("drops"),
            metrics_root=run.path("metrics"),
            image_format=args.image_format,
        )
        _write_table(res["manifest"], run.path("export", "manifest.parquet"))
        step(f"export: {len(res['manifest'])} frames written")
    if METRICS in args.jobs:  # after the export job, which reads the per-segment files
        tables.compact_run_metrics(spark, run.path("metrics"))
    write_tables(spark, recs, infos, args, run, res, step, keys)
    shown = {k: _named(v) for k, v in res.items()} if args.incremental else res
    local = tempfile.mkdtemp(prefix="vipc-report-")
    try:
        report.write_report(
            local,
            health=shown.get("health") if HEALTH in args.jobs else None,
            drops=shown.get("drops") if HEALTH in args.jobs else None,
            timeline=shown.get("timeline"),
            latency_hist=shown.get("latency"),
            metrics_summary=shown.get("metrics_summary"),
            metrics_sample=shown.get("metrics_sample"),
            manifest=shown.get("manifest"),
            events=shown.get("events") if HEALTH in args.jobs else None,
            header={"run": run.name, "master": cluster.master_of(spark), "recordings": len(recs), "jobs": args.jobs},
        )
        fs.upload_dir(local, run.stage)
    finally:
        shutil.rmtree(local, ignore_errors=True)
    step(f"report: {os.path.join(run.final, 'report.html') if fs.is_local(run.final) else run.final + '/report.html'}")
    return res


# the run's small tables (analysis results keyed as jobs.HEALTH_KINDS) -> their table names
SMALL = {
    "health": "health",
    "drops": "drops",
    "timeline": "fps_timeline",
    "latency": "latency_histogram",
    "events": "events",
    "metrics_summary": "metrics_summary",
}


def write_tables(
    spark: SparkSession,
    recs: List[Recording],
    infos: Infos,
    args: argparse.Namespace,
    run: runs.Run,
    res: Dict[str, Any],
    step: Say,
    keys: Optional[Keys] = None,
) -> None:
    """The run's results into ``OUT/tables`` (replacing exactly its recordings' partitions);
    with ``--incremental`` the run folder's small tables become the whole tables (every
    recording analysed so far, as last analysed) and ``res`` with them."""
    if keys is None:
        keys = {r.recording_id: (tables.stable_id(r, infos[r.recording_id]), None) for r in recs}
    ids = {name: key[0] for name, key in keys.items() if name in {r.recording_id for r in recs}}
    dates = {name: recording_date(infos[name]) for name in ids}
    names = [t for t in tables.HEALTH_TABLES if HEALTH in args.jobs]
    if METRICS in args.jobs and res.get("metrics_summary") is not None:
        names += list(tables.METRICS_TABLES)
    if not names:
        return
    step(f"tables: {', '.join(names)} -> {tables.location(run.out, '')}")
    try:
        from concurrent.futures import ThreadPoolExecutor

        small = [(kind, name) for kind, name in SMALL.items() if name in names]
        # one Spark job per table, all at once: the driver's part of one (the frame sent to
        # the JVM, planning) overlaps the others' tasks instead of idling the slots
        with ThreadPoolExecutor(max_workers=max(1, len(small))) as pool:
            list(pool.map(lambda kn: tables.write_small(spark, run.out, kn[1], res[kn[0]], ids, dates), small))
        if "metrics" in names:
            tables.write_metrics(spark, run.out, run.path("metrics"), ids, dates)
    except Exception as e:  # noqa: BLE001 - only a storage Spark's own writer cannot reach is let pass
        if not tables.unreachable(e):
            raise
        step(f"tables: not written: Spark's writer cannot reach {run.out} ({tables.unreachable(e)}; docs/pipeline.md)")
        return
    if args.incremental:
        for kind, name in SMALL.items():
            if name in names:
                res[kind] = tables.read_whole(spark, run.out, name)
                _write_table(res[kind], run.path(f"{name}.parquet"))
    if getattr(args, "table", None):
        made = tables.register(spark, args.table, run.out, names)
        step(f"tables: registered {', '.join(made)} in the session's catalog")


def _named(frame):
    """A whole table as the report shows it: recordings by their names."""
    if frame is None or "recording" not in getattr(frame, "columns", ()):
        return frame
    return frame.assign(recording_id=frame["recording"])
