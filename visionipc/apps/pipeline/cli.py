"""Analyse recordings on Apache Spark: stream health (fps, drops, latency, jitter,
stalls), per-frame image metrics and frame export, written as Parquet results plus
an HTML report with plots."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

JOBS = ("health", "metrics", "export")
EPILOG = """\
examples:
  vipc-analyze rec1 rec2 --out results                   # health + metrics, local[*]
  vipc-analyze 'fleet/**/2026-11-*' --out r --jobs health
  vipc-analyze fleet/ --out r --jobs health,export --export drops:3
  vipc-analyze fleet/ --out r --jobs metrics,export --export sharp:500 --image-format png
  vipc-analyze fleet/ --out r --master spark://head:7077  # a cluster (paths must be shared)

RECORDINGS are recording folders, globs, or folders searched for recordings.
Results in --out: health.parquet, drops.parquet, fps_timeline.parquet,
metrics.parquet, export/ (images + manifest.parquet), report.html + plots/.
"""


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="vipc-analyze", description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("recordings", nargs="+", metavar="RECORDINGS", help="recording folders, globs or parent folders")
    p.add_argument("--out", required=True, metavar="DIR", help="results folder (created; files in it are replaced)")
    p.add_argument("--master", default=None, metavar="URL", help="Spark master (default local[*])")
    p.add_argument(
        "--jobs", default="health,metrics", help=f"comma-separated, of {','.join(JOBS)} (default health,metrics)"
    )
    p.add_argument(
        "--export",
        default="drops:2",
        metavar="FILTER",
        help="frames the export job writes: drops:W (W frames each side of every gap, default drops:2), "
        "every:N (frame ids divisible by N), sharp:S (sharpness >= S; needs the metrics job)",
    )
    p.add_argument("--image-format", choices=("jpg", "png"), default="jpg")
    p.add_argument(
        "--skip-empty", action="store_true", help="skip recordings without complete segments instead of failing"
    )
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting (repeatable)")
    p.add_argument("--no-progress", action="store_true", help="no Spark progress bar on stderr")
    p.add_argument("-q", "--quiet", action="store_true", help="no step messages")
    p.add_argument("-v", "--verbose", action="store_true", help="Spark's own warnings and errors too")
    args = p.parse_args(argv)
    args.jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    bad = [j for j in args.jobs if j not in JOBS]
    if bad or not args.jobs:
        p.error(f"unknown job(s) {bad} (choose from {', '.join(JOBS)})" if bad else "--jobs is empty")
    kind, _, value = args.export.partition(":")
    try:
        args.export = (kind, float(value) if kind == "sharp" else int(value or 2))
    except ValueError:
        p.error(f"--export {args.export!r}: the value after ':' must be a number")
    if kind not in ("drops", "every", "sharp") or (
        kind == "sharp" and "metrics" not in args.jobs and "export" in args.jobs
    ):
        p.error(f"--export {kind!r}: use drops:W, every:N or sharp:S (sharp needs --jobs with metrics)")
    try:
        args.conf = dict(kv.split("=", 1) for kv in args.conf)
    except ValueError:
        p.error("--conf takes KEY=VALUE")
    return args


class Steps:
    def __init__(self, quiet: bool):
        self.quiet, self.t0 = quiet, time.monotonic()

    def __call__(self, msg: str):
        if not self.quiet:
            print(f"vipc-analyze [{time.monotonic() - self.t0:6.1f} s] {msg}", file=sys.stderr, flush=True)


def _write_small(df, path):
    import pandas as pd

    df.coalesce(1).write.mode("overwrite").parquet(path)
    return pd.read_parquet(path)


def run(args, step) -> int:
    from pyspark.sql import functions as F

    from visionipc.apps.pipeline import export, health, metrics, report
    from visionipc.apps.pipeline.frames import segments_df
    from visionipc.apps.pipeline.read import find_recordings, index_files, read_index
    from visionipc.apps.pipeline.session import spark_session

    recs = find_recordings(args.recordings)
    index_files(recs, skip_empty=args.skip_empty)  # every file checked before Spark starts (exit 2)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    step(f"{len(recs)} recording(s); starting Spark ({args.master or 'local[*]'})")
    from pyspark.sql import SparkSession

    reused = SparkSession.getActiveSession()  # a caller's session (tests, notebooks) is used, not stopped
    spark = reused or spark_session(args.master, progress=not args.no_progress and sys.stderr.isatty(), conf=args.conf)
    if not args.verbose:  # failures are reported once, by main(), not as JVM stack traces
        spark.sparkContext.setLogLevel("OFF")
    try:
        index = read_index(spark, recs, skip_empty=args.skip_empty, validate=False)
        streams = health.streams_df(
            spark, recs, skip_empty=args.skip_empty, validate=False
        ).cache()  # no shuffle of the index
        res = {}
        need_index_jobs = "health" in args.jobs or ("export" in args.jobs and args.export[0] == "drops")
        if need_index_jobs:
            step("health: fps, drops, latency, jitter, stalls per recording x stream")
            res["health"] = _write_small(health.health_from_files(streams), os.path.join(out, "health.parquet"))
            res["drops"] = _write_small(health.drops_from_files(streams), os.path.join(out, "drops.parquet"))
        if "health" in args.jobs:
            res["timeline"] = _write_small(
                health.timeline_from_files(streams), os.path.join(out, "fps_timeline.parquet")
            )
            top = float(res["health"]["latency_p99_ms"].max()) if len(res["health"]) else 1.0
            res["latency_hist"] = report.latency_histogram(index, max(1.0, 2 * top))
            step(f"health: {len(res['health'])} streams, {int(res['health']['dropped'].sum())} dropped frames")
        if "metrics" in args.jobs:
            step("metrics: decoding every frame in the executors")
            path = os.path.join(out, "metrics.parquet")
            metrics.metrics_job(segments_df(spark, recs, skip_empty=args.skip_empty, validate=False)).write.mode(
                "overwrite"
            ).parquet(path)
            m = spark.read.parquet(path)
            res["metrics_summary"] = (
                m.groupBy("recording_id", "stream")
                .agg(
                    F.count("*").alias("frames"),
                    F.mean("brightness").alias("brightness_mean"),
                    F.mean("contrast").alias("contrast_mean"),
                    F.mean("sharpness").alias("sharpness_mean"),
                    F.mean("motion").alias("motion_mean"),
                    F.sum(F.col("black").cast("int")).alias("black_frames"),
                    F.sum(F.col("frozen").cast("int")).alias("frozen_frames"),
                )
                .orderBy("recording_id", "stream")
                .toPandas()
            )
            total = int(res["metrics_summary"]["frames"].sum())
            res["metrics_sample"] = (
                m.sample(fraction=min(1.0, 50_000 / max(1, total)), seed=1)
                .select("stream", "brightness", "contrast", "sharpness", "motion")
                .toPandas()
            )
            step(f"metrics: {total} frames")
        if "export" in args.jobs:
            kind, value = args.export
            if kind == "drops":
                selection = export.select_around_drops(index, health.drops_from_files(streams), int(value))
            elif kind == "every":
                selection = export.select_every_nth(index, int(value))
            else:
                selection = export.select_sharp(spark.read.parquet(os.path.join(out, "metrics.parquet")), value)
            step(f"export: frames selected by {kind}:{value:g} -> {os.path.join(out, 'export')}")
            res["manifest"] = export.export_job(selection, os.path.join(out, "export"), args.image_format)
            step(f"export: {len(res['manifest'])} frames written")
        path = report.write_report(
            out,
            health=res.get("health") if "health" in args.jobs else None,
            drops=res.get("drops"),
            timeline=res.get("timeline"),
            latency_hist=res.get("latency_hist"),
            metrics_summary=res.get("metrics_summary"),
            metrics_sample=res.get("metrics_sample"),
            manifest=res.get("manifest"),
        )
        step(f"report: {path}")
    finally:
        if reused is None:
            spark.stop()
        else:
            spark.sparkContext.setLogLevel("WARN")
    return 0


def _spark_message(exc) -> str:
    """The useful line of a Spark error (a Python exception raised in an executor keeps its text)."""
    text = str(exc)
    raised = re.findall(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception)): (.+)$", text, re.M)
    if raised:
        return f"{raised[-1][0]}: {raised[-1][1].strip()}"
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def main(argv=None) -> int:
    """Exit status 0; 2 for bad input (a missing or hostile recording); 1 for a failure
    (in Spark or writing the results): one line on stderr, never a traceback."""
    from msgq._printable import printable

    args = parse_args(argv)
    step = Steps(args.quiet)
    from visionipc.apps.pipeline.read import RecordingError

    def fail(message: str, status: int) -> int:
        print(f"vipc-analyze: error: {printable(message)}", file=sys.stderr)
        return status

    try:
        return run(args, step)
    except (FileNotFoundError, RecordingError, ImportError) as e:
        return fail(str(e), 2)
    except Exception as e:  # errors raised inside Spark tasks arrive wrapped
        try:
            from py4j.protocol import Py4JJavaError
            from pyspark.errors import PySparkException
        except ImportError:
            PySparkException = Py4JJavaError = ()
        if isinstance(e, (PySparkException, Py4JJavaError)):
            return fail(_spark_message(e), 1)
        return fail(f"{type(e).__name__}: {e}", 1)


if __name__ == "__main__":
    sys.exit(main())
