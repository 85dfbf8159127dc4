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

import math
import multiprocessing
import multiprocessing.connection
import os
import sys
import time
import traceback

# From the repository root, the source tree's msgq (no compiled extension)
# would shadow the installed package: benchmarks importing this module first
# never see the root on sys.path.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:
    _built_in_place = any(f.startswith("_msgq") for f in os.listdir(os.path.join(_REPO, "msgq")))
except OSError:
    _built_in_place = False
if not _built_in_place:
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _REPO]

# --------------------------------------------------------------------------- statistics


def percentile(sorted_values, p):
    """Nearest-rank percentile ``p`` (0-100) of an already sorted sequence."""
    n = len(sorted_values)
    if n == 0:
        return float("nan")
    k = max(0, min(n - 1, int(math.ceil(p / 100.0 * n)) - 1))
    return sorted_values[k]


def latency_stats(samples_ns):
    """Percentiles of latency samples given in ns, reported in µs."""
    s = sorted(samples_ns)
    n = len(s)
    if n == 0:
        return {"n": 0}
    us = 1e-3
    return {
        "n": n,
        "min": s[0] * us,
        "p50": percentile(s, 50) * us,
        "p90": percentile(s, 90) * us,
        "p99": percentile(s, 99) * us,
        "p99.9": percentile(s, 99.9) * us,
        "max": s[-1] * us,
        "mean": sum(s) / n * us,
    }


def median(values):
    v = sorted(x for x in values if x is not None and not (isinstance(x, float) and math.isnan(x)))
    if not v:
        return float("nan")
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


# --------------------------------------------------------------------------- CPUs


def usable_cpus():
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def pin_to(cpu):
    """Pin the calling thread (and the threads it starts later) to ``cpu``."""
    if cpu is None:
        return False
    try:
        os.sched_setaffinity(0, {cpu})
        return True
    except (AttributeError, OSError):
        return False


def read_loadavg():
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[:3]
    except OSError:
        return None


# --------------------------------------------------------------------------- workers


class BenchError(RuntimeError):
    pass


class Control:
    """What a task function gets to synchronise with the other workers."""

    def __init__(self, conn, index):
        self._conn = conn
        self.index = index

    def barrier(self, tag):
        self._conn.send(("barrier", tag))
        msg = self._conn.recv()
        if msg != ("go", tag):
            raise BenchError(f"worker {self.index}: expected go for barrier {tag!r}, got {msg!r}")


def _worker_main(conn, index, cpu, setup, teardown):
    pinned = pin_to(cpu)
    state = {"index": index, "cpu": cpu if pinned else None}
    if setup is not None:
        setup(state)
    ctl = Control(conn, index)
    try:
        while True:
            try:
                msg = conn.recv()
            except EOFError:
                break
            if msg[0] == "stop":
                break
            _, fn, kwargs = msg
            try:
                result = fn(ctl, state, **kwargs)
            except BaseException:  # report everything, the parent decides
                conn.send(("error", traceback.format_exc()))
            else:
                conn.send(("result", result))
    finally:
        if teardown is not None:
            teardown(state)


class WorkerPool:
    """``count`` persistent worker processes (multiprocessing 'spawn'), worker
    ``i`` pinned to ``cpus[i]`` (or unpinned if ``cpus[i]`` is None)."""

    def __init__(self, cpus, setup=None, teardown=None):
        self._cpus = list(cpus)
        self._setup, self._teardown = setup, teardown
        self._ctx = multiprocessing.get_context("spawn")
        self._procs = []
        self._conns = []
        self._start()

    def _start(self):
        for i, cpu in enumerate(self._cpus):
            parent, child = self._ctx.Pipe()
            p = self._ctx.Process(
                target=_worker_main, args=(child, i, cpu, self._setup, self._teardown), name=f"bench-worker-{i}", daemon=True
            )
            p.start()
            child.close()
            self._procs.append(p)
            self._conns.append(parent)

    @property
    def pids(self):
        return [p.pid for p in self._procs]

    def run(self, tasks, timeout):
        """Run ``tasks[i] = (fn, kwargs)`` on worker ``i`` (None: idle) and
        return their results. Raises BenchError (after restarting the pool) on
        an error in a task or when the whole thing takes over ``timeout`` s."""
        active = [i for i, t in enumerate(tasks) if t is not None]
        for i in active:
            fn, kwargs = tasks[i]
            self._conns[i].send(("run", fn, kwargs))
        results = {}
        waiting = {}
        deadline = time.monotonic() + timeout
        try:
            while len(results) < len(active):
                left = deadline - time.monotonic()
                pending = [self._conns[i] for i in active if i not in results]
                ready = multiprocessing.connection.wait(pending, timeout=max(0.0, left))
                if not ready:
                    raise BenchError(f"task timed out after {timeout:.0f} s (barriers reached: {waiting})")
                for conn in ready:
                    i = self._conns.index(conn)
                    try:
                        kind, payload = conn.recv()
                    except EOFError:
                        raise BenchError(f"worker {i} died (exit code {self._procs[i].exitcode})") from None
                    if kind == "error":
                        raise BenchError(f"worker {i} failed:\n{payload}")
                    if kind == "result":
                        results[i] = payload
                        waiting.pop(i, None)
                    elif kind == "barrier":
                        waiting[i] = payload
                    live = [j for j in active if j not in results]
                    if live and all(j in waiting for j in live):
                        tags = {waiting[j] for j in live}
                        if len(tags) != 1:
                            raise BenchError(f"workers at different barriers: {waiting}")
                        tag = tags.pop()
                        for j in live:
                            self._conns[j].send(("go", tag))
                        waiting.clear()
        except BaseException:
            self.restart()
            raise
        return [results.get(i) for i in range(len(tasks))]

    def restart(self):
        self.close(graceful=False)
        self._procs, self._conns = [], []
        self._start()

    def close(self, graceful=True):
        for conn, p in zip(self._conns, self._procs):
            if graceful and p.is_alive():
                try:
                    conn.send(("stop",))
                except (BrokenPipeError, OSError):
                    pass
        for conn, p in zip(self._conns, self._procs):
            p.join(timeout=5 if graceful else 0.2)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
            conn.close()
        self._procs, self._conns = [], []


# --------------------------------------------------------------------------- tables


def format_table(headers, rows, aligns=None):
    """Plain-text table; ``aligns`` is a string of 'l'/'r' per column."""
    cols = len(headers)
    aligns = aligns or ("l" + "r" * (cols - 1))
    cells = [[str(c) for c in headers]] + [[("" if c is None else str(c)) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(cols)]

    def line(r):
        out = []
        for i, c in enumerate(r):
            out.append(c.ljust(widths[i]) if aligns[i] == "l" else c.rjust(widths[i]))
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])


def fmt_rate(per_s):
    if per_s is None or (isinstance(per_s, float) and math.isnan(per_s)):
        return "-"
    if per_s >= 1e6:
        return f"{per_s / 1e6:.2f} M/s"
    if per_s >= 1e3:
        return f"{per_s / 1e3:.1f} k/s"
    return f"{per_s:.0f} /s"


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
    start = f"msgq@{prefix}@"
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
