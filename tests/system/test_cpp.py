"""Build the C++ tests (cpp/tests) three ways and run them.

Variants: ``plain`` (Release), ``asan`` (AddressSanitizer + UBSan) and
``tsan`` (ThreadSanitizer), each configured once per session into
``build/cpp-tests-<variant>``. Any sanitizer report fails the test. The
multi-process stress runs in plain and asan only: ThreadSanitizer does not
follow fork(); the threaded stress, which shares one mapping between threads,
is the one that must pass under it.

A missing cmake or compiler is a failure, not a skip: these tests are the
only check of the ring under sanitizers.
"""

import fcntl
import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest
from repo import BUILD_TIMEOUT, ROOT

STRESS_SECONDS = "2"

VARIANTS = {"plain": "", "asan": "address,undefined", "tsan": "thread"}  # -> VIPC_SANITIZE
TARGETS = {
    "plain": ["test_ring_protocol", "test_stress", "bench_ring", "test_visionipc", "test_queues"],
    "asan": ["test_ring_protocol", "test_stress", "test_visionipc", "test_queues"],
    "tsan": ["test_ring_protocol", "test_stress", "test_visionipc", "test_queues"],
}

# Halt at the first report with a distinctive exit status; the output is
# scanned as well, in case a report comes from a path that does not exit.
SANITIZER_ENV = {
    "ASAN_OPTIONS": "halt_on_error=1:abort_on_error=0:exitcode=66:detect_leaks=1:strict_string_checks=1",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=67",
    "TSAN_OPTIONS": "halt_on_error=1:exitcode=68:second_deadlock_stack=1",
}
SANITIZER_REPORT = re.compile(r"ERROR: (Address|Leak)Sanitizer|WARNING: ThreadSanitizer|runtime error:")


def _require_toolchain():
    missing = [tool for tool in ("cmake",) if shutil.which(tool) is None]
    if shutil.which("c++") is None and shutil.which("g++") is None:
        missing.append("a C++ compiler (g++)")
    if missing:
        pytest.fail("the C++ tests need " + " and ".join(missing) + " on PATH")


def _run(cmd, timeout, env=None):
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
    )
    return proc.returncode, proc.stdout


def _configure(variant, build_dir):
    cmd = [
        "cmake",
        "-S",
        str(ROOT),
        "-B",
        str(build_dir),
        "-DCMAKE_BUILD_TYPE=Release",
        "-DVIPC_BUILD_TESTS=ON",
        "-DVIPC_BUILD_PYTHON=OFF",
        "-DVIPC_WERROR=ON",  # a new compiler warning fails the suite
        f"-DVIPC_SANITIZE={VARIANTS[variant]}",
    ]
    if VARIANTS[variant]:
        # -O1, the sanitizers' own advice: full reports at half the compile time of -O3
        # (105 s -> 53 s for the AddressSanitizer build on 2 cores); the plain build
        # keeps Release's -O3, the one users get.
        cmd.append("-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG")
    if shutil.which("ninja"):
        cmd += ["-G", "Ninja"]
    return _run(cmd, timeout=120)


def _build(variant):
    _require_toolchain()
    build_dir = ROOT / "build" / f"cpp-tests-{variant}"
    build_dir.mkdir(parents=True, exist_ok=True)
    # Parallel pytest workers build the same variant one at a time; the
    # second finds it up to date.
    with open(build_dir.parent / f".cpp-tests-{variant}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # Configure every session (cheap when cached) so the options always
        # hold; a cache that cannot be reused (another generator) is rebuilt.
        rc, out = _configure(variant, build_dir)
        if rc != 0:
            shutil.rmtree(build_dir, ignore_errors=True)
            rc, out = _configure(variant, build_dir)
        if rc != 0:
            pytest.fail(f"cmake configure ({variant}) failed:\n{out}")
        rc, out = _run(
            ["cmake", "--build", str(build_dir), "-j2", "--target", *TARGETS[variant]], timeout=BUILD_TIMEOUT
        )
        if rc != 0:
            pytest.fail(f"C++ build ({variant}) failed:\n{out[-8000:]}")
    return build_dir / "cpp" / "tests"


@pytest.fixture(scope="session")
def cpp_build():
    """build(variant) -> directory of that variant's test executables, built once per session."""
    built = {}

    def build(variant):
        if variant not in built:
            built[variant] = _build(variant)
        return built[variant]

    return build


def run_checked(exe, *args, timeout=120):
    # Segment files go to a private tmpfs directory that is removed even when
    # a C++ check aborts before its own clean-up.
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="vipc-cpp-", dir=shm) as segment_dir:
        env = dict(os.environ, VIPC_TEST_TMPDIR=segment_dir, **SANITIZER_ENV)
        rc, out = _run([str(exe), *args], timeout=timeout, env=env)
    report = SANITIZER_REPORT.search(out)
    assert rc == 0 and report is None, f"{exe.name} {' '.join(args)} exited {rc}:\n{out[-12000:]}"
    return out


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_ring_protocol_steps_and_segment_lifecycle(cpp_build, variant):
    out = run_checked(cpp_build(variant) / "test_ring_protocol")
    assert "test(s) passed" in out


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_visionipc_core_formats_handshake_leases_and_restart(cpp_build, variant):
    out = run_checked(cpp_build(variant) / "test_visionipc")
    assert "test(s) passed" in out


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_ordered_topic_cas_stress_and_broadcast_queue_threads(cpp_build, variant):
    """The availability word's CAS loops under many producer threads, ordered
    topics and the lossless broadcast queue on real segment files (cpp/tests/test_queues.cc)."""
    out = run_checked(cpp_build(variant) / "test_queues", timeout=240)
    assert "test(s) passed" in out


@pytest.mark.parametrize("variant", ["plain", "asan", "tsan"])
def test_threads_sharing_one_ring_never_see_a_torn_message(cpp_build, variant):
    out = run_checked(cpp_build(variant) / "test_stress", "threads", "--seconds", STRESS_SECONDS)
    assert "stress passed" in out


@pytest.mark.parametrize("variant", ["plain", "asan"])
def test_processes_on_a_segment_file_never_see_a_torn_message(cpp_build, variant):
    out = run_checked(cpp_build(variant) / "test_stress", "processes", "--seconds", STRESS_SECONDS)
    assert "stress passed" in out


def _numbers(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value


def test_bench_ring_runs_and_reports_positive_numbers(cpp_build):
    """A smoke run only: timings are for reading, never asserted."""
    exe = cpp_build("plain") / "bench_ring"
    result = json.loads(run_checked(exe, "--iters", "200", "--json"))
    for key in ("cacheline_oneway_ns", "msgq_64B_oneway_ns", "throughput_1MiB", "latency_ratio_p50"):
        assert key in result
    assert set(result["msgq_64B_oneway_ns"]) == {"p50", "p99", "p999"}
    assert set(result["throughput_1MiB"]) >= {"msgq_GBps", "memcpy_GBps", "ratio"}
    numbers = list(_numbers(result))
    assert numbers and all(n > 0 for n in numbers), result
    assert "ratio msgq / memcpy" in run_checked(exe, "--iters", "200")
