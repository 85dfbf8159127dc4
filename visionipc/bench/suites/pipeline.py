"""Benchmark of the Spark pipeline (vipc-analyze), side by side with its peers.

1. health: the health job on a synthetic index of --rows frames (default 10 M) on
   local[2], timed from a fresh process starting its SparkSession to the health rows
   on the driver; beside it the same function in plain pandas (one process).
2. metrics: per-frame OpenCV metrics over >= 2,000 decoded 1280x720 NV12 frames
   (lossless FFV1 segments) on local[2], on local[1] and on a 2-process
   multiprocessing pool running the same segment function; frames/s and ratios,
   each twice: cold (the first job: Spark's Python workers start and import in
   it, the pool's processes likewise) and warm (the same job again at once).
3. pass: issue 33's fixed costs side by side in one run: the driver's checks before
   Spark starts (and as they were: every file opened on the driver); what ``vipc-analyze
   --jobs health`` runs (jobs.health_pass) on local[2] and local[1]; the whole command
   (process start to exit); one pyarrow + numpy process computing and writing the same
   numbers; --rounds times each, interleaved; the best run of each in the table, then the
   medians, local[2] / local[1] and the ratios against the targets. --breakdown: Spark's
   event log per run (tasks, first task, how busy the slots were, the driver's time
   around the job).
4. source: spark.read.format("vipc") vs Spark's Parquet reader on the same files.

Every Spark configuration runs in its own child process (a master is fixed per
JVM). Data are generated once into --data (reused when present).

    .venv/bin/python tools/bench_pipeline.py                      # both parts
    .venv/bin/python tools/bench_pipeline.py --part metrics --frames 2016
    .venv/bin/python tools/bench_pipeline.py --part pass --rows 2000000 --rounds 3 --breakdown
    .venv/bin/python tools/bench_pipeline.py --part pass --rows 2000000 --conf spark.python.daemon.module=pyspark.daemon
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from visionipc.bench.harness import add_common_flags, write_json
from visionipc.bench.stats import format_table
from visionipc.bench.workers import read_loadavg

Result = Dict[str, Any]  # one child's measurement, as JSON


def make_index(data: str, rows: int) -> str:
    from visionipc.apps.pipeline import synthetic

    root = os.path.join(data, f"index_{rows}")
    if not os.path.isdir(root):
        recordings, streams = 100, 2
        frames = -(-rows // (recordings * streams)) * 997 // 996 + 1  # one frame in 997 is dropped
        t = time.monotonic()
        synthetic.write_index(root + ".tmp", recordings=recordings, streams=streams, frames=frames, segment_frames=1800)
        os.rename(root + ".tmp", root)
        print(f"  wrote the synthetic index in {time.monotonic() - t:.0f} s: {root}", file=sys.stderr)
    return root


def make_video(data: str, frames: int, segment_frames: int = 126) -> str:
    from visionipc.apps.pipeline import synthetic

    root = os.path.join(data, f"video_{frames}")
    if not os.path.isdir(root):
        t = time.monotonic()
        synthetic.write_recording(
            root + ".tmp", {"road": dict(frames=frames, width=1280, height=720, segment_frames=segment_frames)}
        )
        os.rename(root + ".tmp", root)
        print(f"  wrote {frames} 1280x720 frames in {time.monotonic() - t:.0f} s: {root}", file=sys.stderr)
    return root


# ---------------------------------------------------------------- children (one measurement each)


def child_health_spark(root: str, master: str, from_files: bool = False) -> Result:
    t0 = time.monotonic()
    from visionipc.apps.pipeline import health
    from visionipc.apps.pipeline.read import read_index
    from visionipc.apps.pipeline.session import spark_session

    spark = spark_session(master)
    started = time.monotonic()
    rows: Any  # a pandas DataFrame
    if from_files:  # one task per stream reads its files: no shuffle
        rows = health.health_from_files(health.streams_df(spark, [root])).toPandas()
    else:  # Spark's Parquet reader, then applyInPandas over a shuffle
        rows = health.health_job(read_index(spark, [root])).toPandas()
    done = time.monotonic()
    frames = int(rows["frames"].sum())
    spark.stop()
    return {
        "total_s": done - t0,
        "session_s": started - t0,
        "job_s": done - started,
        "rows": frames,
        "streams": len(rows),
        "dropped": int(rows["dropped"].sum()),
    }


def child_health_pass(
    root: str, master: str, events: Optional[str] = None, conf: Optional[Dict[str, str]] = None
) -> Result:
    """What vipc-analyze --jobs health runs (jobs.health_pass: each task reads its streams'
    files with pyarrow, health + drops + timeline + latency + events in one pass).
    ``events``: a folder for Spark's event log, summarised per job (spark_events.py);
    ``conf``: more Spark settings (``--conf``)."""
    t0 = time.monotonic()
    from visionipc.apps.pipeline import cluster, jobs
    from visionipc.apps.pipeline.session import spark_session
    from visionipc.bench import spark_events

    _, _, _, files = _driver_checks(root)  # what vipc-analyze's driver does before Spark starts
    checked = time.monotonic()
    spark = spark_session(master, conf={**(spark_events.event_log_conf(events) if events else {}), **(conf or {})})
    slots = cluster.task_slots(spark)
    jvm = spark_events.jvm_pid(spark)
    jvm_cpu = spark_events.process_cpu_s(jvm) if jvm else None
    workers_cpu = spark_events.descendants_cpu_s(jvm) if jvm else None
    started, started_at = time.monotonic(), time.time()
    got = jobs.health_pass(spark, files, slots)
    done, done_at = time.monotonic(), time.time()
    jvm_after = spark_events.process_cpu_s(jvm) if jvm and jvm_cpu is not None else None
    if jvm and jvm_cpu is not None and jvm_after is not None and workers_cpu is not None:
        jvm_cpu, workers_cpu = jvm_after - jvm_cpu, spark_events.descendants_cpu_s(jvm) - workers_cpu
    else:
        jvm_cpu = workers_cpu = None  # not measured: no JVM of ours (spark-submit) or no /proc
    rows: Any = got["health"]  # a pandas DataFrame
    spark.stop()
    out: Result = {
        "total_s": done - t0,
        "check_s": checked - t0,
        "session_s": started - checked,
        "job_s": done - started,
        "jvm_cpu_s": jvm_cpu,  # the driver JVM's CPU during the job
        "workers_cpu_s": workers_cpu,  # PySpark's daemon and Python workers' CPU during the job
        "slots": slots,
        "rows": int(rows["frames"].sum()),
        "dropped": int(rows["dropped"].sum()),
    }
    if events:
        spark_jobs = spark_events.job_summaries(events, slots)
        out["spark_jobs"] = spark_jobs
        if spark_jobs:  # driver-side time before the first Spark job and after the last
            out["driver_before_s"] = spark_jobs[0]["submitted_at"] - started_at
            last = spark_jobs[-1]
            out["driver_after_s"] = done_at - last["submitted_at"] - last["wall_s"]
    return out


def _driver_checks(root: str, out: Optional[str] = None) -> Any:
    import argparse

    from visionipc.apps.pipeline.analysis import driver_checks

    args = argparse.Namespace(allow_partial=False, incremental=False, skip_empty=False)
    return driver_checks([root], args, out or os.path.join(root + ".out"), print)


def child_checks(root: str) -> Result:
    """The driver's checks of the inputs before Spark starts, as vipc-analyze does them
    (analysis.driver_checks: listings, recording.json, names; each file's contents are
    checked by the task that reads it), and as they were before issue 33 (every index
    file opened and checked on the driver: read.index_files(contents=True)). A fresh
    process, the files in the OS's cache (the same for both)."""
    t0 = time.monotonic()
    from visionipc.apps.pipeline import analysis  # noqa: F401 - imported before the clock starts
    from visionipc.apps.pipeline.read import find_recordings, index_files

    imported = time.monotonic()
    _, _, _, files = _driver_checks(root)
    now = time.monotonic()
    index_files(find_recordings([root]))  # the old way: every file's contents on the driver
    before = time.monotonic()
    return {"import_s": imported - t0, "checks_s": now - imported, "before_s": before - now, "files": len(files)}


def child_command(root: str, master: str, out: str) -> Result:
    """The whole ``vipc-analyze --jobs health`` command, process start to exit (driver checks,
    Spark's start, the job, the run folder's Parquet files, the tables, the report)."""
    import shutil

    cmd = [sys.executable, "-m", "visionipc.apps.pipeline.cli", root, "--out", out, "--jobs", "health"]
    cmd += ["--master", master, "--no-progress", "-q"]
    t = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    elapsed = time.monotonic() - t
    shutil.rmtree(out, ignore_errors=True)
    return {"total_s": elapsed}


def child_same_numbers(root: str, out: str) -> Result:
    """One pyarrow + numpy process computing the same numbers as ``vipc-analyze --jobs
    health`` (health, drops, fps timeline, latency histogram, events: jobs.health_of_streams
    over the index read by pyarrow's threads) and writing them as Parquet files; no checks,
    no Spark."""
    t0 = time.monotonic()
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from visionipc.apps.pipeline import health, jobs
    from visionipc.apps.pipeline.read import read_index_pandas

    index = read_index_pandas([root], validate=False, columns=health._NEEDED)
    read = time.monotonic()
    got = dict(jobs.health_of_streams(health._streams(index)))
    os.makedirs(out, exist_ok=True)
    for kind, frame in got.items():
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), os.path.join(out, f"{kind}.parquet"))
    done = time.monotonic()
    shutil.rmtree(out, ignore_errors=True)
    h = got["health"]
    rows, dropped = int(h["frames"].sum()), int(h["dropped"].sum())
    return {"total_s": done - t0, "read_s": read - t0, "rows": rows, "dropped": dropped}


def child_source(root: str, master: str) -> Result:
    """spark.read.format("vipc") vs Spark's own Parquet reader on the same files: a full
    count, and a pruned + filtered query (one stream, a frame-id range)."""
    from visionipc.apps.pipeline.read import INDEX_SPARK_SCHEMA, find_recordings, index_files
    from visionipc.apps.pipeline.session import spark_session

    spark = spark_session(master)
    files = [p for _, _, _, p in index_files(find_recordings([root]), validate=False)]
    out: Result = {}
    for name, df in (
        ("vipc", lambda: spark.read.format("vipc").load(root)),
        ("parquet", lambda: spark.read.schema(INDEX_SPARK_SCHEMA).parquet(*files)),
    ):
        df().count()  # warm: workers started, files cached by the OS
        t = time.monotonic()
        n = df().count()
        out[f"{name}_count_s"] = time.monotonic() - t
        t = time.monotonic()
        q = df().where("stream = 'cam0' AND frame_id >= 1000 AND frame_id < 2000").select("frame_id").count()
        out[f"{name}_query_s"] = time.monotonic() - t
        out[f"{name}_rows"], out[f"{name}_query_rows"] = n, q
    spark.stop()
    return out


def child_health_pandas(root: str) -> Result:
    """The same statistics in one process, lean: the columns they need, no checks."""
    t0 = time.monotonic()
    from visionipc.apps.pipeline import health
    from visionipc.apps.pipeline.read import read_index_pandas

    index = read_index_pandas([root], validate=False, columns=health._NEEDED)
    read = time.monotonic()
    rows = health.health_pandas(index)
    done = time.monotonic()
    return {"total_s": done - t0, "read_s": read - t0, "job_s": done - read, "rows": int(rows["frames"].sum())}


def child_metrics_spark(root: str, master: str) -> Result:
    """The metrics job twice in one session: cold (its Python workers start and
    import during the job) and warm (the same job again, workers running)."""
    from pyspark.sql import functions as F

    from visionipc.apps.pipeline import metrics
    from visionipc.apps.pipeline.frames import segments_df
    from visionipc.apps.pipeline.session import spark_session

    spark = spark_session(master)
    segments = segments_df(spark, [root]).cache()
    segments.count()
    out: Result = {}
    for run in ("cold", "warm"):
        t = time.monotonic()
        agg = metrics.metrics_job(segments).agg(F.count("*").alias("n"), F.sum("sharpness").alias("s")).first()
        assert agg is not None  # an aggregate has one row
        elapsed = time.monotonic() - t
        out[run] = {"frames": int(agg["n"]), "seconds": elapsed, "fps": agg["n"] / elapsed, "sharpness_sum": agg["s"]}
    spark.stop()
    return out


def child_metrics_pool(root: str, processes: int) -> Result:
    """The same twice on one spawn pool: cold (pool start and imports included) and warm."""
    import multiprocessing

    from visionipc.apps.pipeline import metrics

    out: Result = {}
    t = time.monotonic()
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        for run in ("cold", "warm"):
            m = metrics.metrics_pandas([root], pool=pool)
            elapsed = time.monotonic() - t
            out[run] = {
                "frames": len(m),
                "seconds": elapsed,
                "fps": len(m) / elapsed,
                "sharpness_sum": float(m["sharpness"].sum()),
            }
            t = time.monotonic()
    return out


CHILDREN: Dict[str, Callable[..., Result]] = {
    "health_spark": child_health_spark,
    "health_pandas": child_health_pandas,
    "health_pass": child_health_pass,
    "checks": child_checks,
    "command": child_command,
    "same_numbers": child_same_numbers,
    "source": child_source,
    "metrics_spark": child_metrics_spark,
    "metrics_pool": child_metrics_pool,
}


def in_child(name: str, *args: Any) -> Result:
    """Run one measurement in a fresh interpreter; returns its JSON result."""
    cmd = [sys.executable, "-m", "visionipc.bench.suites.pipeline", "--child", json.dumps([name, *args])]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _describe(run: Result) -> str:
    """One line: a health_pass run's job time and, with --breakdown, where it went."""
    text = f"job {run['job_s']:.1f} s"
    if run.get("jvm_cpu_s") is not None:
        text += f", CPU: driver JVM {run['jvm_cpu_s']:.1f} s, Python workers {run['workers_cpu_s']:.1f} s"
    for j in run.get("spark_jobs", []):
        text += (
            f"; Spark job {j['job']}: {j['wall_s']:.1f} s, {j['tasks']} tasks, first task starts "
            f"+{j['first_launch_s']:.1f} s and takes {j['first_task_s']:.1f} s, median task "
            f"{j['median_task_s']:.1f} s, slots busy {j['slots_busy']:.0%}"
        )
    if "driver_before_s" in run:
        text += f"; driver before {run['driver_before_s']:.1f} s, after {run['driver_after_s']:.1f} s"
    return text


def pass_runs(
    root: str, rounds: int, data: str, events: Optional[str] = None, conf: Optional[Dict[str, str]] = None
) -> Dict[str, List[Any]]:
    """Per round, interleaved so that all see the same spread of load: health_pass on
    local[2] and local[1], the whole command on local[2] and the one-process baseline
    computing the same numbers; each run with the load average before it."""
    import shutil

    runs: Dict[str, List[Any]] = {"local[2]": [], "local[1]": [], "command": [], "same_numbers": []}
    for i in range(rounds):
        for slots, master in zip((2, 1), ("local[2]", "local[1]")):
            folder = os.path.join(events, f"round{i}-local{slots}") if events else None
            load = read_loadavg()
            r = in_child("health_pass", root, master, folder, conf)
            if folder:
                shutil.rmtree(folder, ignore_errors=True)
            r["loadavg_before"] = load
            runs[master].append(r)
            print(
                f"  {master} run {i + 1}: {_describe(r)}; load average before {' '.join(load or [])}", file=sys.stderr
            )
        for name, args in (
            ("command", (root, "local[2]", os.path.join(data, "command-out"))),
            ("same_numbers", (root, os.path.join(data, "same-numbers-out"))),
        ):
            load = read_loadavg()
            r = in_child(name, *args)
            r["loadavg_before"] = load
            runs[name].append(r)
            print(
                f"  {name} run {i + 1}: {r['total_s']:.1f} s; load average before {' '.join(load or [])}",
                file=sys.stderr,
            )
    return runs


def pass_medians(runs: Dict[str, List[Result]]) -> str:
    """Medians over the runs: job times, local[2] / local[1] (of the medians, and of each
    interleaved pair), the 1-minute load average seen before the runs."""
    import statistics

    two = [r["job_s"] for r in runs["local[2]"]]
    one = [r["job_s"] for r in runs["local[1]"]]
    loads = [float(r["loadavg_before"][0]) for rs in runs.values() for r in rs if r.get("loadavg_before")]
    pairs = ", ".join(f"{b / a:.2f}x" for a, b in zip(two, one))
    ratio = statistics.median(one) / statistics.median(two)
    return (
        f"median of {len(two)} interleaved runs: local[2] job {statistics.median(two):.1f} s, local[1] job "
        f"{statistics.median(one):.1f} s -> local[2] speed-up {ratio:.2f}x (target >= 1.6x: "
        f"{'met' if ratio >= 1.6 else 'MISSED'}; per pair: {pairs}); "
        f"1-min load average before the runs {min(loads, default=0):.2f}-{max(loads, default=0):.2f}"
    )


def pass_targets(
    two: Result, one: Result, command: Result, same: Result, checks: Result, runs: Dict[str, List[Result]]
) -> str:
    """Issue 33's targets side by side (best runs; the speed-up of the medians: pass_medians)."""
    import statistics

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    ratios = {
        "command": command["total_s"] / same["total_s"],
        "job": two["job_s"] / same["total_s"],
        "speedup": statistics.median(r["job_s"] for r in runs["local[1]"])
        / statistics.median(r["job_s"] for r in runs["local[2]"]),
    }
    return "\n".join(
        [
            f"targets ({checks['files']} index files):",
            f"  driver checks {checks['checks_s']:.2f} s (<= 2 s: {verdict(checks['checks_s'] <= 2)}); "
            f"every file's contents on the driver as before issue 33 (today's one-parse check) "
            f"{checks['before_s']:.2f} s "
            f"(load average before {' '.join(checks.get('loadavg_before') or [])})",
            f"  whole command / 1 process {ratios['command']:.2f}x (<= 2.5x: {verdict(ratios['command'] <= 2.5)})",
            f"  job alone (local[2]) / 1 process {ratios['job']:.2f}x (<= 1.2x: {verdict(ratios['job'] <= 1.2)})",
            f"  local[2] / local[1] job {ratios['speedup']:.2f}x (>= 1.6x: {verdict(ratios['speedup'] >= 1.6)})",
        ]
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("health", "pass", "source", "metrics", "all"), default="all")
    p.add_argument("--rows", type=int, default=10_000_000, help="index rows for the health part")
    p.add_argument("--frames", type=int, default=2016, help="decoded 1280x720 frames for the metrics part")
    p.add_argument(
        "--data",
        default=os.path.join(tempfile.gettempdir(), "vipc-bench-pipeline"),
        help="where the synthetic inputs are kept (made once, reused)",
    )
    add_common_flags(p, rounds=(1, "repeat each measurement, report the best"), json="write the results here too")
    p.add_argument(
        "--breakdown",
        action="store_true",
        help="pass part: also record Spark's event log and say where each run's job time went",
    )
    p.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="pass part: a Spark setting for its sessions (repeatable), e.g. "
        "spark.python.daemon.module=pyspark.daemon for PySpark's own worker daemon",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        name, *rest = json.loads(args.child)
        print(json.dumps(CHILDREN[name](*rest)))
        return 0
    os.makedirs(args.data, exist_ok=True)
    results: Result = {"loadavg_start": read_loadavg(), "cpus": os.cpu_count(), "python": sys.version.split()[0]}

    def best(key: str, *a: Any) -> Result:
        runs = [in_child(*a) for _ in range(args.rounds)]
        return min(runs, key=lambda r: r[key]) if key == "total_s" else max(runs, key=lambda r: r[key])

    if args.part in ("health", "all"):
        root = make_index(args.data, args.rows)
        s = best("total_s", "health_spark", root, "local[2]")
        f = best("total_s", "health_spark", root, "local[2]", True)
        pd_ = best("total_s", "health_pandas", root)
        results["health"] = {"spark_local2": s, "spark_local2_from_files": f, "pandas": pd_}
        print(
            format_table(
                ["health job", "index rows", "total s", "session start s", "job s", "target"],
                [
                    [
                        "Spark local[2], health_job (index DataFrame)",
                        s["rows"],
                        f"{s['total_s']:.1f}",
                        f"{s['session_s']:.1f}",
                        f"{s['job_s']:.1f}",
                        "< 30 s: " + ("met" if s["total_s"] < 30 else "MISSED"),
                    ],
                    [
                        "Spark local[2], health_from_files",
                        f["rows"],
                        f"{f['total_s']:.1f}",
                        f"{f['session_s']:.1f}",
                        f"{f['job_s']:.1f}",
                        "< 30 s: " + ("met" if f["total_s"] < 30 else "MISSED"),
                    ],
                    [
                        "pandas, 1 process",
                        pd_["rows"],
                        f"{pd_['total_s']:.1f}",
                        "-",
                        f"{pd_['job_s']:.1f} (+{pd_['read_s']:.1f} read)",
                        "",
                    ],
                ],
            )
        )
        print()
    if args.part in ("pass", "all"):
        root = make_index(args.data, args.rows)
        conf = dict(kv.split("=", 1) for kv in args.conf)
        load = read_loadavg()
        checks = dict(in_child("checks", root), loadavg_before=load)
        events = os.path.join(args.data, "spark-events") if args.breakdown else None
        runs = pass_runs(root, args.rounds, args.data, events, conf)
        two, one = (min(runs[m], key=lambda r: r["total_s"]) for m in ("local[2]", "local[1]"))
        command = min(runs["command"], key=lambda r: r["total_s"])
        same = min(runs["same_numbers"], key=lambda r: r["total_s"])
        alone = best("total_s", "health_pandas", root)
        results["pass"] = {
            "local2": two,
            "local1": one,
            "command": command,
            "same_numbers": same,
            "pyarrow_numpy": alone,
            "checks": checks,
            "runs": runs,
        }
        if len({two["rows"], one["rows"], same["rows"], alone["rows"]}) != 1 or two["dropped"] != same["dropped"]:
            print(f"WARNING: the runs disagree: rows {two['rows']} {one['rows']} {same['rows']} {alone['rows']}")
        print(
            format_table(
                [
                    "vipc-analyze --jobs health (jobs.health_pass)",
                    "index rows",
                    "total s",
                    "checks s",
                    "session s",
                    "job s",
                    "ratio",
                ],
                [
                    [
                        "Spark local[2]",
                        two["rows"],
                        f"{two['total_s']:.1f}",
                        f"{two['check_s']:.1f}",
                        f"{two['session_s']:.1f}",
                        f"{two['job_s']:.1f}",
                        f"job {two['job_s'] / same['total_s']:.2f}x of 1 process (same numbers)",
                    ],
                    [
                        "Spark local[1]",
                        one["rows"],
                        f"{one['total_s']:.1f}",
                        f"{one['check_s']:.1f}",
                        f"{one['session_s']:.1f}",
                        f"{one['job_s']:.1f}",
                        f"local[2] speed-up {one['job_s'] / two['job_s']:.2f}x",
                    ],
                    [
                        "whole command, local[2] (process start to exit)",
                        two["rows"],
                        f"{command['total_s']:.1f}",
                        "-",
                        "-",
                        "-",
                        f"{command['total_s'] / same['total_s']:.2f}x of 1 process (same numbers)",
                    ],
                    [
                        "pyarrow + numpy, 1 process, the same 5 tables written",
                        same["rows"],
                        f"{same['total_s']:.1f}",
                        "-",
                        "-",
                        f"{same['total_s'] - same['read_s']:.1f} (+{same['read_s']:.1f} read)",
                        "1.00x",
                    ],
                    [
                        "pyarrow + numpy, 1 process, health only (lean, as before)",
                        alone["rows"],
                        f"{alone['total_s']:.1f}",
                        "-",
                        "-",
                        "-",
                        f"job {two['job_s'] / alone['total_s']:.2f}x, "
                        f"command {command['total_s'] / alone['total_s']:.2f}x",
                    ],
                ],
            )
        )
        print(pass_medians(runs))
        print(pass_targets(two, one, command, same, checks, runs))
        print()
    if args.part in ("source", "all"):
        root = make_index(args.data, args.rows)
        r = in_child("source", root, "local[2]")
        results["source"] = r
        print(
            format_table(
                ["reader (local[2])", "count s", "query s (1 stream, 1000 ids)", "rows", "query rows"],
                [
                    [n, f"{r[n + '_count_s']:.2f}", f"{r[n + '_query_s']:.2f}", r[n + "_rows"], r[n + "_query_rows"]]
                    for n in ("vipc", "parquet")
                ],
            )
        )
        print()
    if args.part in ("metrics", "all"):
        root = make_video(args.data, args.frames)
        runs = {
            "spark_local2": [in_child("metrics_spark", root, "local[2]") for _ in range(args.rounds)],
            "spark_local1": [in_child("metrics_spark", root, "local[1]") for _ in range(args.rounds)],
            "pool2": [in_child("metrics_pool", root, 2) for _ in range(args.rounds)],
        }
        results["metrics"] = runs
        rows, sums, frames = [], [], set()
        for run in ("cold", "warm"):
            two, one, pool = (
                max((r[run] for r in runs[k]), key=lambda r: r["fps"])
                for k in ("spark_local2", "spark_local1", "pool2")
            )
            r1, rp = two["fps"] / one["fps"], two["fps"] / pool["fps"]
            rows += [
                [f"{run}: Spark local[2]", two["frames"], f"{two['seconds']:.1f}", f"{two['fps']:.1f}", "1.00x"],
                [
                    f"{run}: Spark local[1]",
                    one["frames"],
                    f"{one['seconds']:.1f}",
                    f"{one['fps']:.1f}",
                    f"{r1:.2f}x (target >= 1.5x: {'met' if r1 >= 1.5 else 'MISSED'})",
                ],
                [
                    f"{run}: multiprocessing pool, 2 processes",
                    pool["frames"],
                    f"{pool['seconds']:.1f}",
                    f"{pool['fps']:.1f}",
                    f"{rp:.2f}x (target >= 0.9x: {'met' if rp >= 0.9 else 'MISSED'})",
                ],
            ]
            sums += [r["sharpness_sum"] for r in (two, one, pool)]
            frames |= {two["frames"], one["frames"], pool["frames"]}
        print(
            format_table(["metrics (1280x720 NV12, FFV1)", "frames", "seconds", "frames/s", "local[2] vs this"], rows)
        )
        print(
            "cold: the first job (Spark: Python workers start and import in it; pool: process start and "
            "imports included); warm: the same job again at once"
        )
        agree = all(math.isclose(x, sums[0], rel_tol=1e-9) for x in sums) and len(frames) == 1
        print("all runs computed the same metrics" if agree else f"WARNING: the runs disagree: {sums}")
    results["loadavg_end"] = read_loadavg()
    print(f"\nload average: start {results['loadavg_start']}, end {results['loadavg_end']}")
    if args.json:
        write_json(args.json, results, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
