"""What one ``vipc-analyze`` run does, between choosing its recordings and publishing
its run folder: the jobs (jobs.py) in the executors, the small tables written once by
the driver (with a ``date`` column from recording.json's wall clock), the report.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from visionipc.apps.pipeline import cluster, fs, jobs, runs

IN_PROGRESS = "recording"  # recording.json status while vipc-record still writes


def recording_date(info: dict):
    """``YYYY-MM-DD`` of the recording's start (UTC wall clock), None when unknown."""
    start = info.get("start")
    wall = start.get("wall_time") if isinstance(start, dict) else None
    return wall[:10] if isinstance(wall, str) and len(wall) >= 10 else None


def select_recordings(recs, args, out, warn):
    """Drop recordings still being recorded (unless ``--allow-partial``) and, with
    ``--incremental``, those a published run in ``out`` analysed; returns (recordings,
    {recording_id: recording.json}). A broken recording.json is a RecordingError."""
    from visionipc.apps.pipeline.read import recording_info

    infos = {r.recording_id: recording_info(r) for r in recs}
    partial = [r for r in recs if infos[r.recording_id].get("status") == IN_PROGRESS]
    if partial and not args.allow_partial:
        warn(
            f"skipping {len(partial)} recording(s) still being recorded (--allow-partial analyses them): "
            + ", ".join(r.path for r in partial)
        )
        recs = [r for r in recs if r not in partial]
    if args.incremental:
        done = runs.analysed_recordings(out)
        recs = [r for r in recs if r.path not in done]
    return recs, infos


def unmeasured_lossy_streams(recs, infos) -> list:
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


def analyse(spark, recs, infos, args, run, slots, step, files=None) -> dict:
    """Run the jobs of ``args`` over ``recs`` into ``run`` (runs.Run); returns the small tables.
    ``files``: their ``index_files`` rows when the caller has checked them already."""
    from visionipc.apps.pipeline import report
    from visionipc.apps.pipeline.frames import segment_rows
    from visionipc.apps.pipeline.read import index_files

    dates = {rid: recording_date(info) for rid, info in infos.items()}
    if files is None:
        files = index_files(recs, skip_empty=args.skip_empty)
    segments = segment_rows(files)
    res = {}
    kind, value = args.export
    if "health" in args.jobs or ("export" in args.jobs and kind == "drops"):
        step("health: fps, drops, latency, jitter, stalls per recording x stream")
        got = jobs.health_pass(spark, files, slots)
        res.update(got)
        if "health" in args.jobs:
            for name, table in (
                ("health", "health"),
                ("drops", "drops"),
                ("fps_timeline", "timeline"),
                ("latency_histogram", "latency"),
                ("events", "events"),
            ):
                _write_table(res[table], run.path(f"{name}.parquet"), dates)
            step(f"health: {len(res['health'])} streams, {int(res['health']['dropped'].sum())} dropped frames")
    if "metrics" in args.jobs:
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
    if "export" in args.jobs:
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
    local = tempfile.mkdtemp(prefix="vipc-report-")
    try:
        report.write_report(
            local,
            health=res.get("health") if "health" in args.jobs else None,
            drops=res.get("drops") if "health" in args.jobs else None,
            timeline=res.get("timeline"),
            latency_hist=res.get("latency"),
            metrics_summary=res.get("metrics_summary"),
            metrics_sample=res.get("metrics_sample"),
            manifest=res.get("manifest"),
            events=res.get("events") if "health" in args.jobs else None,
            header={"run": run.name, "master": cluster.master_of(spark), "recordings": len(recs), "jobs": args.jobs},
        )
        fs.upload_dir(local, run.stage)
    finally:
        shutil.rmtree(local, ignore_errors=True)
    step(f"report: {os.path.join(run.final, 'report.html') if fs.is_local(run.final) else run.final + '/report.html'}")
    return res
