"""Benchmark of the Spark pipeline (vipc-analyze), side by side with its peers.

1. health: the health job on a synthetic index of --rows frames (default 10 M) on
   local[2], timed from a fresh process starting its SparkSession to the health rows
   on the driver; beside it the same function in plain pandas (one process).
2. metrics: per-frame OpenCV metrics over >= 2,000 decoded 1280x720 NV12 frames
   (lossless FFV1 segments) on local[2], on local[1] and on a 2-process
   multiprocessing pool running the same segment function; frames/s and ratios,
   each twice: cold (the first job: Spark's Python workers start and import in
   it, the pool's processes likewise) and warm (the same job again at once).

Every Spark configuration runs in its own child process (a master is fixed per
JVM). Data are generated once into --data (reused when present).

    .venv/bin/python tools/bench_pipeline.py                      # both parts
    .venv/bin/python tools/bench_pipeline.py --part metrics --frames 2016
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

from visionipc.bench.harness import add_common_flags, write_json
from visionipc.bench.stats import format_table
from visionipc.bench.workers import read_loadavg


def make_index(data, rows):
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


def make_video(data, frames, segment_frames=126):
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


def child_health_spark(root, master, from_files=False):
    t0 = time.monotonic()
    from visionipc.apps.pipeline import health
    from visionipc.apps.pipeline.read import read_index
    from visionipc.apps.pipeline.session import spark_session

    spark = spark_session(master)
    started = time.monotonic()
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


def child_health_pass(root, master):
    """What vipc-analyze --jobs health runs (jobs.health_pass: each task reads its streams'
    files with pyarrow, health + drops + timeline + latency + events in one pass)."""
    t0 = time.monotonic()
    from visionipc.apps.pipeline import cluster, jobs
    from visionipc.apps.pipeline.read import find_recordings, index_files
    from visionipc.apps.pipeline.session import spark_session

    files = index_files(find_recordings([root]))  # the driver's checks of every file, as vipc-analyze does
    checked = time.monotonic()
    spark = spark_session(master)
    slots = cluster.task_slots(spark)
    started = time.monotonic()
    got = jobs.health_pass(spark, files, slots)
    done = time.monotonic()
    rows = got["health"]
    spark.stop()
    return {
        "total_s": done - t0,
        "check_s": checked - t0,
        "session_s": started - checked,
        "job_s": done - started,
        "rows": int(rows["frames"].sum()),
        "dropped": int(rows["dropped"].sum()),
    }


def child_source(root, master):
    """spark.read.format("vipc") vs Spark's own Parquet reader on the same files: a full
    count, and a pruned + filtered query (one stream, a frame-id range)."""
    from visionipc.apps.pipeline.read import INDEX_SPARK_SCHEMA, find_recordings, index_files
    from visionipc.apps.pipeline.session import spark_session

    spark = spark_session(master)
    files = [p for _, _, _, p in index_files(find_recordings([root]), validate=False)]
    out = {}
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


def child_health_pandas(root):
    """The same statistics in one process, lean: the columns they need, no checks."""
    t0 = time.monotonic()
    from visionipc.apps.pipeline import health
    from visionipc.apps.pipeline.read import read_index_pandas

    index = read_index_pandas([root], validate=False, columns=health._NEEDED)
    read = time.monotonic()
    rows = health.health_pandas(index)
    done = time.monotonic()
    return {"total_s": done - t0, "read_s": read - t0, "job_s": done - read, "rows": int(rows["frames"].sum())}


def child_metrics_spark(root, master):
    """The metrics job twice in one session: cold (its Python workers start and
    import during the job) and warm (the same job again, workers running)."""
    from pyspark.sql import functions as F

    from visionipc.apps.pipeline import metrics
    from visionipc.apps.pipeline.frames import segments_df
    from visionipc.apps.pipeline.session import spark_session

    spark = spark_session(master)
    segments = segments_df(spark, [root]).cache()
    segments.count()
    out = {}
    for run in ("cold", "warm"):
        t = time.monotonic()
        agg = metrics.metrics_job(segments).agg(F.count("*").alias("n"), F.sum("sharpness").alias("s")).first()
        elapsed = time.monotonic() - t
        out[run] = {"frames": int(agg["n"]), "seconds": elapsed, "fps": agg["n"] / elapsed, "sharpness_sum": agg["s"]}
    spark.stop()
    return out


def child_metrics_pool(root, processes):
    """The same twice on one spawn pool: cold (pool start and imports included) and warm."""
    import multiprocessing

    from visionipc.apps.pipeline import metrics

    out = {}
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


CHILDREN = {
    "health_spark": child_health_spark,
    "health_pandas": child_health_pandas,
    "health_pass": child_health_pass,
    "source": child_source,
    "metrics_spark": child_metrics_spark,
    "metrics_pool": child_metrics_pool,
}


def in_child(name, *args):
    """Run one measurement in a fresh interpreter; returns its JSON result."""
    cmd = [sys.executable, "-m", "visionipc.bench.suites.pipeline", "--child", json.dumps([name, *args])]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None):
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
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        name, *rest = json.loads(args.child)
        print(json.dumps(CHILDREN[name](*rest)))
        return 0
    os.makedirs(args.data, exist_ok=True)
    results = {"loadavg_start": read_loadavg(), "cpus": os.cpu_count(), "python": sys.version.split()[0]}

    def best(key, *a):
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
        two = best("total_s", "health_pass", root, "local[2]")
        one = best("total_s", "health_pass", root, "local[1]")
        alone = best("total_s", "health_pandas", root)
        results["pass"] = {"local2": two, "local1": one, "pyarrow_numpy": alone}
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
                        f"job {two['job_s'] / alone['total_s']:.2f}x, total {two['total_s'] / alone['total_s']:.2f}x "
                        "of 1 process",
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
                    ["pyarrow + numpy, 1 process", alone["rows"], f"{alone['total_s']:.1f}", "-", "-", "-", "1.00x"],
                ],
            )
        )
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
