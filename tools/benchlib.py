"""Small helpers shared by the benchmarks in tools/ (not part of the package).

- statistics: :func:`percentile`, :func:`latency_stats` (nanoseconds in, µs out);
- CPU placement: :func:`usable_cpus`, :func:`pin_to`;
- a :class:`WorkerPool` of persistent ``spawn`` processes, each pinned to its
  own CPU, that run task functions in lockstep: a task calls
  ``ctl.barrier(tag)`` and continues only once every worker of the task got
  there (the parent relays the barrier over pipes; no sleeps as sync);
- :func:`format_table` for plain-text tables;
- :func:`leftover_segments` / :func:`remove_segments` to check that a run left
  nothing in /dev/shm.
"""

import os
import sys
import time

# From the repository root, the source tree's msgq (no compiled extension)
# would shadow the installed package: benchmarks importing this module first
# never see the root on sys.path.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:
    _built_in_place = any(f.startswith("_msgq") and f.endswith(".so") for f in os.listdir(os.path.join(_REPO, "msgq")))
except OSError:
    _built_in_place = False
if not _built_in_place:
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _REPO]

from msgq.names import run_segment_prefix  # noqa: E402

# Statistics, CPU placement, the worker pool and table formatting live in the
# installed package (vipc-bench uses them too); re-exported here for the scripts.
from visionipc.bench.stats import fmt_rate, format_table, latency_stats, median, percentile  # noqa: E402,F401
from visionipc.bench.workers import (  # noqa: E402,F401
    BenchError,
    Control,
    WorkerPool,
    pin_to,
    read_loadavg,
    usable_cpus,
)


def fmt_size(n):
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return f"{n >> 10} KiB"
    return f"{n} B"


def parse_size(text):
    t = text.strip().lower().replace(" ", "")
    for suffix, mult in (("mib", 1 << 20), ("m", 1 << 20), ("kib", 1 << 10), ("k", 1 << 10), ("b", 1)):
        if t.endswith(suffix):
            return int(float(t[: -len(suffix)]) * mult)
    return int(t)


# --------------------------------------------------------------------------- shared memory hygiene


def leftover_segments(prefix, shm_dir="/dev/shm"):
    start = run_segment_prefix(prefix)
    try:
        return sorted(n for n in os.listdir(shm_dir) if n.startswith(start))
    except FileNotFoundError:
        return []


def remove_segments(names, shm_dir="/dev/shm"):
    for name in names:
        try:
            os.unlink(os.path.join(shm_dir, name))
        except FileNotFoundError:
            pass


def run_meta(cpus, pinned):
    """What a results file should say about the run: versions, machine, load."""
    import platform

    import zmq

    import msgq

    return {
        "argv": sys.argv,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": cpus,
        "pinned_cpus": pinned,
        "loadavg_start": read_loadavg(),
        "msgq_file": msgq.__file__,
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
    }
