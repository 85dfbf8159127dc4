"""What every benchmark entry shares around its measurements: the common flags, the
run's environment, the pinned worker pool run, machine info, failures and the JSON
report. The measurements themselves live in their suites (``visionipc.bench.suites``)
and in the vipc-bench modules beside this one."""

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from visionipc.bench.stats import parse_size
from visionipc.bench.workers import Hook, WorkerPool, read_loadavg, usable_cpus

Log = Callable[[str], None]  # a progress line

# --------------------------------------------------------------------------- flags


def add_common_flags(ap: argparse.ArgumentParser, **helps: Any) -> None:
    """Add the flags every benchmark spells the same way, in the order given, each
    with its own help: ``quick``, ``rounds`` (a ``(default, help)`` pair), ``json``,
    ``no_pin``, ``check`` and ``quiet`` (help text, or True for the usual one)."""
    for name, spec in helps.items():
        if name == "quick":
            ap.add_argument("--quick", action="store_true", help=spec)
        elif name == "rounds":
            default, text = spec
            ap.add_argument("--rounds", type=int, default=default, help=text)
        elif name == "json":
            ap.add_argument("--json", metavar="PATH", help=spec)
        elif name == "no_pin":
            ap.add_argument("--no-pin", action="store_true", help=spec)
        elif name == "check":
            ap.add_argument("--check", action="store_true", help=spec)
        elif name == "quiet":
            ap.add_argument("-q", "--quiet", action="store_true", help="no progress lines" if spec is True else spec)
        else:
            raise ValueError(f"no common flag {name!r}")


def parse_sizes(text: str) -> List[int]:
    """Message sizes, comma separated (``64,4096,1MiB``), in bytes."""
    return [parse_size(s) for s in text.split(",") if s.strip()]


def parse_only(ap: argparse.ArgumentParser, text: str, parts: Iterable[str]) -> Set[str]:
    """The parts named by ``--only`` (a comma list); exits through ``ap.error`` on an unknown one."""
    only = {s.strip() for s in text.split(",") if s.strip()}
    unknown = only - set(parts)
    if unknown:
        ap.error(f"--only: unknown {', '.join(sorted(unknown))}")
    return only


def logger(quiet: bool) -> Log:
    """``log(msg)``: a progress line on stderr, nothing when ``quiet``."""

    def log(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    return log


# --------------------------------------------------------------------------- the run


def placement(nworkers: int, no_pin: bool) -> Tuple[List[int], List[Optional[int]]]:
    """(usable CPUs, CPU per worker): the first worker on the first CPU, the others
    spread over the rest; all None (unpinned) with ``no_pin`` or a single CPU."""
    cpus = usable_cpus()
    if no_pin or len(cpus) < 2:
        return cpus, [None] * nworkers
    pins: List[Optional[int]] = [cpus[0], *(cpus[1 + i % (len(cpus) - 1)] for i in range(nworkers - 1))]
    return cpus, pins


def run_in_pool(
    pinned: Sequence[Optional[int]],
    make_runner: Callable[[WorkerPool], Any],
    log: Log,
    setup: Hook = None,
    teardown: Hook = None,
) -> Any:
    """Start a :class:`WorkerPool` pinned to ``pinned``, run ``make_runner(pool).run_all()``
    and close the pool; returns the runner, or None when interrupted (Ctrl-C)."""
    pool = None
    try:
        pool = WorkerPool(pinned, setup=setup, teardown=teardown)
        runner = make_runner(pool)
        runner.run_all()
        return runner
    except KeyboardInterrupt:
        log("interrupted")
        return None
    finally:
        if pool is not None:
            pool.close()


def cpu_s() -> float:
    """User + system CPU seconds of this process (all its threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# --------------------------------------------------------------------------- what a report says


def run_meta(cpus: Sequence[int], pinned: Sequence[Optional[int]]) -> Dict[str, Any]:
    """What a results file should say about the run: versions, machine, load."""
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


def git_rev() -> Optional[str]:
    """The short commit of the checkout the harness runs from, or None."""
    try:
        return (
            subprocess.run(
                ["git", "-C", os.path.dirname(os.path.abspath(__file__)), "rev-parse", "--short", "HEAD"],
                capture_output=True,
                text=True,
                timeout=5,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def print_report_head(what: str, rounds: int, elapsed: float, loadavg_start: Optional[List[str]], *notes: str) -> None:
    """The lines that head a report, after a blank one: what ran, how long, the load
    before and now; then ``notes``, what the numbers are, one line each."""
    print()
    print(f"{what} {rounds} round(s), {elapsed:.0f} s; load {loadavg_start} -> {read_loadavg()}")
    for note in notes:
        print(note)


def print_failures(errors: Sequence[Dict[str, Any]], describe: Callable[[Dict[str, Any]], str]) -> None:
    """The failed measurements, one line each: ``describe(error)`` and the error's last line."""
    if errors:
        print()
        print(f"{len(errors)} measurement(s) failed:")
        for e in errors:
            print(f"  {describe(e)}: {e['error'].splitlines()[-1]}")


def write_json(path: str, report: Any, indent: Optional[int] = None) -> None:
    """Write ``report`` to ``path``, creating its folder."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=indent)
