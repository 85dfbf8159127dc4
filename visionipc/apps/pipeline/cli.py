"""Analyse recordings on Apache Spark: stream health (fps, drops, latency, jitter,
stalls), per-frame image metrics and frame export, written as Parquet results plus
an HTML report with plots."""

from __future__ import annotations

import argparse
import logging
import re
import sys
import threading
import time
from typing import Callable, Optional, Sequence, Tuple, Type

from msgq import add_version_flag, cli
from visionipc.apps.pipeline import follow
from visionipc.apps.pipeline.choices import DROPS, EVERY, EXPORT, EXPORT_RULES, IMAGE_FORMATS, JOBS, METRICS, SHARP

EPILOG = """\
examples:
  vipc-analyze rec1 rec2 --out results                   # health + metrics
  vipc-analyze 'fleet/**/2026-11-*' --out r --jobs health
  vipc-analyze fleet/ --out r --jobs health,export --export drops:3
  vipc-analyze fleet/ --out r --jobs metrics,export --export sharp:500 --image-format png
  vipc-analyze s3://bucket/fleet --out s3://bucket/results --incremental
  vipc-analyze fleet/ --out r --master spark://head:7077 --ui
  vipc-analyze fleet/ --out r --remote sc://spark-connect:15002     # on a Spark Connect server
  vipc-analyze fleet/ --out r --follow        # live: tables + r/live.html as segments complete
  spark-submit --master spark://head:7077 $(vipc-analyze --submit-app) s3://bucket/fleet --out s3://bucket/r

master: --master, else what spark-submit / SPARK_MASTER / spark-defaults.conf chose, else local[*].
Spark Connect: --remote sc://host:port, else SPARK_REMOTE (when no master was chosen); the
server's Python needs visionipc installed. spark-submit runs a .py file, not this console
script: --submit-app prints the file to give it.
RECORDINGS are recording folders, globs, or folders searched for recordings; local paths or
URIs (s3:// or s3a://, gs://, hdfs://, file://: read by pyarrow in the executors).
Each run writes a new folder OUT/run-<time>-<id>/ (published with _SUCCESS and run.json;
OUT/LATEST names the newest): health.parquet, drops.parquet, fps_timeline.parquet,
latency_histogram.parquet, metrics/ (partitioned by recording_id, stream), metrics_summary.parquet,
export/ (images + manifest.parquet), report.html + plots/.
Tables that grow with the fleet: OUT/tables/<table>/date=D/recording_id=R/ (Hive-style;
a run replaces exactly its recordings' partitions; one file per recording); --table NAME
registers them in the Spark catalog.
"""

INTERRUPTED = 130

log = logging.getLogger("vipc-analyze")


def _export_filter(p, text: str):
    kind, _, value = text.partition(":")
    try:
        number = float(value) if kind == SHARP else int(value or 2)
    except ValueError:
        p.error(f"--export {text!r}: the value after ':' must be a number")
    if kind not in EXPORT_RULES:
        p.error(f"--export {kind!r}: use drops:W, every:N or sharp:S")
    if kind in (DROPS, EVERY) and number < 1:
        p.error(f"--export {text!r}: {kind} needs a whole number >= 1")
    return kind, number


class _SubmitApp(argparse.Action):
    """--submit-app: print the Python file spark-submit runs for vipc-analyze, and exit."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        from visionipc.apps.pipeline import submit

        print(submit.__file__)
        parser.exit()


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="vipc-analyze", description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_version_flag(p)
    p.add_argument(
        "--submit-app",
        action=_SubmitApp,
        help="print the file to give spark-submit (spark-submit [options] FILE RECORDINGS --out DIR), and exit",
    )
    p.add_argument("recordings", nargs="+", metavar="RECORDINGS", help="recording folders, globs, parent folders, URIs")
    p.add_argument("--out", required=True, metavar="DIR", help="results folder or URI (each run adds a run folder)")
    p.add_argument(
        "--master", default=None, metavar="URL", help="Spark master (default: spark-submit's / SPARK_MASTER / local[*])"
    )
    p.add_argument(
        "--remote",
        default=None,
        metavar="sc://HOST:PORT",
        help="run on a Spark Connect server (default: SPARK_REMOTE, when no master is chosen)",
    )
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
    p.add_argument("--image-format", choices=IMAGE_FORMATS, default=IMAGE_FORMATS[0])
    p.add_argument(
        "--skip-empty", action="store_true", help="skip recordings without complete segments instead of failing"
    )
    p.add_argument(
        "--allow-partial", action="store_true", help="analyse recordings still being recorded (skipped by default)"
    )
    p.add_argument(
        "--incremental",
        action="store_true",
        help="analyse only recordings new or changed since a run in --out analysed them (by their id and "
        "segments, not their location); the run folder's tables then hold every recording analysed",
    )
    p.add_argument(
        "--table",
        default=None,
        metavar="NAME",
        help="register the tables in the Spark catalog as NAME_health, NAME_metrics, ... (NAME or db.NAME)",
    )
    p.add_argument("--ui", action="store_true", help="start Spark's web UI (its address is printed)")
    follow.add_arguments(p)
    p.add_argument(
        "--starved-after",
        type=float,
        default=30.0,
        metavar="S",
        help="warn when no executor has started after S seconds (default 30)",
    )
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting (repeatable)")
    p.add_argument("--no-progress", action="store_true", help="no Spark progress bar on stderr")
    p.add_argument("-q", "--quiet", action="store_true", help="no step messages")
    p.add_argument("-v", "--verbose", action="store_true", help="Spark's own warnings and errors too")
    args = cli.parse_args(p, argv, config=True)
    args.jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    bad = [j for j in args.jobs if j not in JOBS]
    if bad or not args.jobs:
        p.error(f"unknown job(s) {bad} (choose from {', '.join(JOBS)})" if bad else "--jobs is empty")
    args.export = _export_filter(p, args.export)
    if args.export[0] == SHARP and METRICS not in args.jobs and EXPORT in args.jobs:
        p.error("--export sharp:S needs the metrics job (--jobs metrics,export)")
    if args.remote and args.master:
        p.error("--remote and --master: choose one (a Spark Connect server has its own master)")
    if args.table is not None and not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)?", args.table):
        p.error(f"--table {args.table!r}: a name of letters, digits and '_' (or db.name)")
    if args.starved_after <= 0:
        p.error("--starved-after must be > 0")
    follow.check_args(p, args)
    try:
        args.conf = dict(kv.split("=", 1) for kv in args.conf)
    except ValueError:
        p.error("--conf takes KEY=VALUE")
    return args


class Steps:
    def __init__(self, quiet: bool) -> None:
        self.quiet, self.t0 = quiet, time.monotonic()

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            log.info(f"[{time.monotonic() - self.t0:6.1f} s] {msg}")


def warn(msg: str) -> None:
    log.warning(msg)


def run(args: argparse.Namespace, step: Callable[[str], None]) -> int:
    if args.follow:
        return follow.run(args, step)
    from visionipc.apps.pipeline import cluster, fs, runs
    from visionipc.apps.pipeline.analysis import analyse, driver_checks

    out = runs.check_out(args.out)
    # names and recording.json checked before Spark starts; each file's contents by the task
    # that reads it (read.read_index_file), a bad one still refused with one line (exit 2)
    recs, infos, keys, files = driver_checks(args.recordings, args, out, warn)
    if not recs:
        step(f"nothing to analyse (every recording given is still being recorded or already in {out})")
        return 0
    remote = cluster.resolve_remote(args.remote, args.master)
    master = None if remote else cluster.resolve_master(args.master)
    cluster.check_reachable(remote or master or cluster.submitted_master())
    where = f"Spark Connect server {remote}" if remote else master or "the master spark-submit chose"
    step(f"{len(recs)} recording(s); starting Spark ({where})")
    from visionipc.apps.pipeline.session import spark_session

    if remote:  # a session of its own on the server, closed at the end
        reused, spark = None, spark_session(remote=remote, conf=args.conf)
    else:
        from pyspark.sql import SparkSession

        reused = SparkSession.getActiveSession()  # a caller's session (tests, notebooks) is used, not stopped
        spark = reused or spark_session(
            args.master, ui=args.ui, progress=not args.no_progress and sys.stderr.isatty(), conf=args.conf
        )
    if not args.verbose:  # failures are reported once, by main(), not as JVM stack traces
        cluster.set_log_level(spark, "OFF")
    run_dir = runs.Run(out)
    previous_handler = _on_ctrl_c(spark)
    try:
        with cluster.StarvationWatch(spark, args.starved_after):
            facts = {"master": cluster.master_of(spark), "application_id": cluster.application_id(spark)}
            if remote:
                facts["remote"] = remote
            step(f"Spark {spark.version}, master {facts['master']}, application {facts['application_id']}")
            if args.ui:
                url = cluster.ui_url(spark)
                step(f"Spark UI: {url}" if url else "Spark UI: the Spark Connect server's own")
            slots = cluster.task_slots(spark)
            step(f"{slots} task slot(s) in the executors")
            run_dir.begin()
            analyse(spark, recs, infos, args, run_dir, slots, step, files, keys)
        final = run_dir.publish(
            inputs=[
                {"recording_id": r.recording_id, "path": r.path, "id": keys[r.recording_id][0], "fingerprint": fp}
                for r in recs
                for fp in [keys[r.recording_id][1]]
            ],
            jobs=args.jobs,
            tables=fs.join(out, "tables"),
            **facts,
        )
        step(f"published {final}")
    except BaseException:
        run_dir.abandon()
        raise
    finally:
        _restore(previous_handler)
        try:
            if reused is None:
                spark.stop()
            else:
                cluster.set_log_level(spark, "WARN")
        except Exception:  # noqa: BLE001 - the JVM went first (Ctrl-C reaches both); the run's error matters
            if not INTERRUPT.is_set():
                raise
    return 0


INTERRUPT = threading.Event()


def _on_ctrl_c(spark):
    """Ctrl-C: cancel the Spark jobs (best effort: the JVM may be stopping too) and raise
    KeyboardInterrupt in the driver, which main() turns into one line and exit 130."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        INTERRUPT.set()
        # py4j logs every call the interrupt cuts short (or that finds the connection busy,
        # as cancelAllJobs does from this handler) with a traceback: the run ends with one line
        logging.disable(logging.CRITICAL)
        try:
            from visionipc.apps.pipeline.cluster import cancel_all

            cancel_all(spark)
        except Exception:  # noqa: BLE001
            pass
        raise KeyboardInterrupt

    return signal.signal(signal.SIGINT, handler)


def _restore(previous) -> None:
    import signal

    if previous is not None:
        signal.signal(signal.SIGINT, previous)


def _spark_message(exc) -> str:
    """The useful line of a Spark error (a Python exception raised in an executor keeps its text)."""
    text = str(exc)
    raised = re.findall(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception)): (.+)$", text, re.M)
    if raised:
        return f"{raised[-1][0]}: {raised[-1][1].strip()}"
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Exit status 0; 2 for bad input (a missing or hostile recording); 1 for a failure
    (in Spark or writing the results): one line on stderr, never a traceback."""
    from msgq.tooling import printable

    args = parse_args(argv)
    step = Steps(args.quiet)
    from visionipc.apps.pipeline.cluster import MasterError
    from visionipc.apps.pipeline.fs import StorageError
    from visionipc.apps.pipeline.read import RecordingError
    from visionipc.apps.pipeline.runs import OutputError

    def fail(message: str, status: int) -> int:
        print(f"vipc-analyze: error: {printable(message)}", file=sys.stderr)
        return status

    INTERRUPT.clear()
    try:
        return run(args, step)
    except KeyboardInterrupt:
        print("vipc-analyze: interrupted (no run was published)", file=sys.stderr)
        return INTERRUPTED
    except (FileNotFoundError, RecordingError, MasterError, OutputError, StorageError, ImportError) as e:
        return fail(str(e), 2)
    except Exception as e:  # errors raised inside Spark tasks arrive wrapped
        if INTERRUPT.is_set():  # the JVM stopped under a call of ours after Ctrl-C
            print("vipc-analyze: interrupted (no run was published)", file=sys.stderr)
            return INTERRUPTED
        spark_errors: Tuple[Type[BaseException], ...]
        try:
            from py4j.protocol import Py4JJavaError
            from pyspark.errors import PySparkException

            spark_errors = (PySparkException, Py4JJavaError)
        except ImportError:
            spark_errors = ()
        if isinstance(e, spark_errors):
            message = _spark_message(e)
            kind, _, reason = message.partition(": ")
            if kind == "RecordingError":  # a task met a hostile or broken file: bad input, as on the driver
                return fail(reason, 2)
            return fail(message, 1)
        # anything else is a failure of the run, still one line (-v: the traceback too)
        if args.verbose:
            import traceback

            traceback.print_exc()
        return fail(f"{type(e).__name__}: {e}", 1)


if __name__ == "__main__":
    sys.exit(main())
