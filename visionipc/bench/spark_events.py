"""Where a Spark job's time goes, for the pipeline benchmark: Spark's own event log
(written uncompressed into a folder the benchmark chooses, read back after
``spark.stop()``) summarised per job, and the CPU time of a process (the driver's JVM).

Per job: wall time, its tasks (count, summed duration, the first and the median
task), when the first task started after the job was submitted, and how busy the
task slots were (summed task time / (slots x job wall)): 1.0 is every slot busy
from the job's start to its end; the rest is serial time (driver, scheduler,
start-up) or a slot idling at the end. Beside it the CPU the driver's JVM and the
Python workers spent (``/proc``): with the wall time, how much of two cores a run used.
"""

from __future__ import annotations

import glob
import json
import os
import statistics
from typing import Any, Dict, List, Optional, Tuple


def event_log_conf(folder: str) -> dict:
    """``spark.*`` settings that make Spark write a plain JSON event log into ``folder``."""
    os.makedirs(folder, exist_ok=True)
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": os.path.abspath(folder),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
    }


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (Linux ``/proc``), None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def descendants_cpu_s(pid: int) -> float:
    """CPU seconds of every process below ``pid`` (the driver JVM: PySpark's daemon and its
    Python workers), those still running and those their parents have reaped."""
    parent, cpu = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        parent[int(entry)] = int(fields[1])
        cpu[int(entry)] = sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    below, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in below]
        below.update(kids)
        todo += kids
    return sum(cpu[p] for p in below)


def jvm_pid(spark: Any) -> Optional[int]:
    """The driver JVM's process id where PySpark started it (None under spark-submit)."""
    proc = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
    return getattr(proc, "pid", None)


def job_summaries(folder: str, slots: int) -> list:
    """One dict per job in the event log(s) under ``folder``, in submission order; times in s,
    ``submitted_at`` as epoch seconds."""
    jobs: Dict[int, Dict[str, int]] = {}
    stage_of_job: Dict[int, int] = {}
    tasks: Dict[Optional[int], List[Tuple[int, int]]] = {}  # job id (None: unknown stage) -> (launch, finish) ms
    for path in sorted(glob.glob(os.path.join(folder, "*"))):
        if not os.path.isfile(path) or os.path.basename(path).startswith("."):
            continue
        with open(path) as f:
            for line in f:
                e = json.loads(line)
                kind = e.get("Event")
                if kind == "SparkListenerJobStart":
                    jobs[e["Job ID"]] = {"start": e["Submission Time"]}
                    for s in e.get("Stage IDs", []):
                        stage_of_job[s] = e["Job ID"]
                elif kind == "SparkListenerJobEnd" and e["Job ID"] in jobs:
                    jobs[e["Job ID"]]["end"] = e["Completion Time"]
                elif kind == "SparkListenerTaskEnd":
                    info = e["Task Info"]
                    tasks.setdefault(stage_of_job.get(e["Stage ID"]), []).append(
                        (info["Launch Time"], info["Finish Time"])
                    )
    out = []
    for job_id in sorted(jobs):
        j = jobs[job_id]
        if "end" not in j:
            continue
        ts = sorted(tasks.get(job_id, []))
        wall = (j["end"] - j["start"]) / 1e3
        durations = [(b - a) / 1e3 for a, b in ts]
        out.append(
            {
                "job": job_id,
                "submitted_at": j["start"] / 1e3,
                "wall_s": wall,
                "tasks": len(ts),
                "task_sum_s": sum(durations),
                "first_task_s": durations[0] if durations else None,
                "median_task_s": statistics.median(durations) if durations else None,
                "first_launch_s": (ts[0][0] - j["start"]) / 1e3 if ts else None,
                "slots_busy": sum(durations) / (slots * wall) if wall > 0 else None,
            }
        )
    return out
