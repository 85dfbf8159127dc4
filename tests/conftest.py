"""Every test runs under its own MSGQ_PREFIX and must leave no segment behind;
the whole session must leave nothing new in /dev/shm or /tmp (checked at the end:
a leftover fails the run and is named). Every test gets its tier markers here
(pytest_collection_modifyitems), not in the test files; tests/ is on sys.path through
pyproject.toml's ``pythonpath``, so the helpers (camera_helpers, mp_helpers, ...) import."""

import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from msgq.testing import isolated_prefix

WATCHED = ("/dev/shm", "/tmp")
# Not ours to clean: pytest's own temporary folders (tools/test.sh puts them under
# build/ instead) and the JVM's per-user performance-data folder, which every Java
# process shares and which the JVM keeps on purpose.
IGNORED = ("/tmp/pytest-of-", "/tmp/hsperfdata_")


# -- tiers (markers registered in pyproject.toml; tools/test.sh --quick selects by them) --

UNIT_FOLDERS = ("msgq", "visionipc")  # the library, in-process and across processes
SYSTEM_FOLDERS = ("apps", "system", "hostile", "bench")  # whole programs, builds, campaigns
SPARK_FIXTURES = {"spark", "cluster"}  # tests/pipeline_helpers.py's session-wide Spark
# A Spark test's limit (pyproject's 300 s for the rest) only catches a hang: its JVMs'
# start and jobs slow with the load (one took 163 s quiet, over 300 s beside stress-ng).
SPARK_TIMEOUT = 900
BROWSER_FIXTURES = {"browser"}  # tests/apps/test_view.py's headless Chromium
SANITIZER_FILES = {"system/test_fuzz.py"}  # libFuzzer + AddressSanitizer builds
SANITIZER_VARIANTS = {"asan", "tsan"}  # system/test_cpp.py's sanitizer builds
# Slow: every test of these folders and files (builds, lint and typing, soak, stress, model
# checking, benchmark runs, hostile peers and inputs, the applications' multi-process
# scenarios of several seconds each). The whole suite runs them, --quick does not: a new
# test file whose tests take seconds belongs here (pytest --durations shows them).
SLOW_FOLDERS = ("system/", "bench/", "hostile/")
SLOW_FILES = {
    "apps/test_bridge.py",
    "apps/test_camera.py",
    "apps/test_record.py",
    "apps/test_record_decoding.py",
    "apps/test_view.py",
    "apps/test_view_replay.py",
    "apps/test_web_limits.py",
    "apps/test_web_surfaces.py",
}


def _tiers(item, where):
    """The tier markers of one collected test (``where``: its path under tests/)."""
    folder = where.split("/", 1)[0]
    tiers = ["unit"] if folder in UNIT_FOLDERS else ["system"] if folder in SYSTEM_FOLDERS else []
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & SPARK_FIXTURES or where.startswith("apps/test_pipeline_"):
        tiers.append("spark")
    if fixtures & BROWSER_FIXTURES:
        tiers.append("browser")
    callspec = getattr(item, "callspec", None)
    if where in SANITIZER_FILES or (callspec and callspec.params.get("variant") in SANITIZER_VARIANTS):
        tiers.append("sanitizer")
    if where.startswith(SLOW_FOLDERS) or where in SLOW_FILES:
        tiers.append("slow")
    return tiers


def pytest_collection_modifyitems(config, items):
    tests = Path(__file__).parent
    for item in items:
        if not Path(item.path).is_relative_to(tests):
            continue
        where = Path(item.path).relative_to(tests).as_posix()
        tiers = _tiers(item, where)
        for tier in tiers:
            item.add_marker(tier)
        if "spark" in tiers and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SPARK_TIMEOUT))
    items[:] = _longest_first(items)


def _longest_first(items):
    """The files with Spark first, then the other slow ones, then the rest, each file's
    tests together and in their order. pytest-xdist hands whole files to the workers in
    this order, so the longest files start first and the many short ones fill in around
    them, instead of one Spark file running alone at the end while the other core idles."""
    rank = {}
    for item in items:
        names = {m.name for m in item.iter_markers()}
        here = 0 if "spark" in names else 1 if "slow" in names else 2
        rank[item.path] = min(rank.get(item.path, here), here)
    return sorted(items, key=lambda item: rank[item.path])  # stable: files keep their order


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """tools/test.sh's ``--dist loadfile``, with one file queued per worker, not several."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class OneFileAhead(LoadFileScheduling):
        """pytest-xdist's loadfile hands a worker its next file while it has up to 2 tests
        left, so a file of one or two long tests (a Spark streaming test of 5 minutes) gets
        the next long file queued behind it while other workers go idle: 5 workers took as
        long as 4 (15:58). Here a worker gets its next file only at its last test. That
        test is held until then (a worker runs a test only once it knows the next one),
        so a file goes out exactly when its worker needs it and the queue is never stuck:
        after every call a worker has 2 tests or more, or the queue is empty. (xdist's
        private scheduler state, 3.x: an upgrade that changes it fails the run loudly.)"""

        def _reschedule(self, node):
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) <= 1:
                self._assign_work_unit(node)

    return OneFileAhead(config, log)


def _entries():
    found = set()
    for folder in WATCHED:
        try:
            found.update(os.path.join(folder, name) for name in os.listdir(folder))
        except FileNotFoundError:
            pass
    return found


def _is_worker(config):
    """A pytest-xdist worker (tools/test.sh runs the suite on every core): the files a
    worker sees appear meanwhile may be another worker's, so only the controller, which
    ends after every worker, checks what the whole session left behind."""
    return hasattr(config, "workerinput")


def pytest_sessionstart(session):
    if _is_worker(session.config):
        return  # the controller did both for the workers it starts
    session.config._vipc_entries_before = _entries()
    # Spark's JVMs unpack native libraries (lz4-java) into java.io.tmpdir and
    # leave them there: the suite's JVMs (the workers' too) use a folder under pytest's basetemp.
    java_tmp = session.config._tmp_path_factory.getbasetemp() / "java-tmpdir"
    java_tmp.mkdir(exist_ok=True)
    option = f"-Djava.io.tmpdir={java_tmp}"
    os.environ["SPARK_SUBMIT_OPTS"] = f"{os.environ.get('SPARK_SUBMIT_OPTS', '')} {option}".strip()


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_vipc_entries_before", None)  # None on a worker
    if before is None or getattr(session.config.option, "collectonly", False):
        return
    new = sorted(p for p in _entries() - before if not p.startswith(IGNORED))
    if new:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = ["the test session left files behind:"] + [f"  {p}" for p in new]
        if reporter is not None:
            reporter.write_line("\n".join(lines), red=True)
        else:
            print("\n".join(lines), file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def msgq_prefix():
    with isolated_prefix() as prefix:
        yield prefix


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _inherited_state():
    """What of this thread's state every child started from it inherits (fork and exec
    keep all of it), and that can make a child ignore Ctrl-C or starve beside busy
    processes: SIGINT/SIGTERM ignored or blocked, the CPUs it may run on, a non-real-time
    policy (SCHED_BATCH, SCHED_IDLE: the real-time ones are ``ordinary_scheduling``'s) and
    the nice value."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    state = {
        sig.name: ("ignored" if signal.getsignal(sig) == signal.SIG_IGN else "")
        + (" blocked" if sig in blocked else "")
        for sig in _STOP_SIGNALS
    }
    policy = os.sched_getscheduler(0)
    state["cpus"] = sorted(os.sched_getaffinity(0))
    state["policy"] = None if policy in (os.SCHED_FIFO, os.SCHED_RR) else policy
    state["nice"] = os.getpriority(os.PRIO_PROCESS, 0)
    return state


def _put_back(before, after):
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [s for s in _STOP_SIGNALS if "blocked" not in before[s.name]])
    for sig in _STOP_SIGNALS:
        if "ignored" in after[sig.name] and "ignored" not in before[sig.name]:
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    for undo in (
        lambda: os.sched_setaffinity(0, before["cpus"]),
        lambda: before["policy"] is None or os.sched_setscheduler(0, before["policy"], os.sched_param(0)),
        lambda: os.setpriority(os.PRIO_PROCESS, 0, before["nice"]),
    ):
        try:
            undo()
        except OSError:  # not allowed here: the failure below still names the test
            pass


@pytest.fixture(autouse=True)
def inherited_state_kept():
    """A test that leaves the worker's main thread with Ctrl-C ignored or blocked, fewer
    CPUs, another policy or nice value fails, named, and the state is put back: otherwise
    every child started after it inherits that (beside stress-ng, four Ctrl-C tests of one
    worker hung in a row: their children never reported)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = _inherited_state()
    yield
    after = _inherited_state()
    if after != before:
        _put_back(before, after)
        changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
        pytest.fail(f"the test left the worker's main thread changed (before, after): {changed}")


_REALTIME = (os.SCHED_FIFO, os.SCHED_RR)
_POLICY_NAMES = {os.SCHED_FIFO: "SCHED_FIFO", os.SCHED_RR: "SCHED_RR"}


def _realtime_threads():
    """{tid: "name (policy priority)"} of this process's real-time threads."""
    found = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            policy = os.sched_getscheduler(int(tid))
            if policy in _REALTIME:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    comm = f.read().strip()
                priority = os.sched_getparam(int(tid)).sched_priority
                found[int(tid)] = f"{tid} {comm} ({_POLICY_NAMES[policy]} {priority})"
        except OSError:  # ended meanwhile
            pass
    return found


def _back_to_ordinary(found):
    for tid in found:
        try:
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            pass


@pytest.fixture(autouse=True)
def ordinary_scheduling():
    """No test may leave the test process real-time (a library that makes its threads
    SCHED_FIFO, as SVT-AV1 does for root): every process and thread started afterwards
    would inherit it, and a pinned, spinning benchmark would then starve its CPU. Checked
    before each test too, for what a wider fixture (module, session) did."""
    before = _realtime_threads()
    if before:
        _back_to_ordinary(before)
        pytest.fail(f"the test process has real-time threads before this test: {', '.join(before.values())}")
    yield
    after = _realtime_threads()
    _back_to_ordinary(after)
    if after:
        pytest.fail(f"the test left threads of the test process real-time: {', '.join(after.values())}")
