"""Fuzz the code that trusts another process's shared memory or messages.

Builds the libFuzzer targets of cpp/fuzz with clang (AddressSanitizer +
UndefinedBehaviorSanitizer) into ``build/fuzz`` and runs each one for a
bounded time, starting from its committed seed corpus (copied, so the
repository never changes); two targets run at a time (one per core of the
CI machine: each still gets its whole time on a core of its own). Any crash, sanitizer report, timeout (an input
that runs over 10 s: a hang) or leak fails the test, with the reproducer's
path in the message. Missing clang is a failure, not a skip: tools/setup.sh
installs it.

Longer runs: ``build/fuzz/cpp/fuzz/fuzz_ring -max_total_time=600 cpp/fuzz/corpus/fuzz_ring``
(see RELIABILITY.md).
"""

import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from repo import ROOT

TARGETS = ["fuzz_ring", "fuzz_segment", "fuzz_vipc_handshake", "fuzz_vipc_request", "fuzz_vipc_packet"]
SECONDS_EACH = int(os.environ.get("VIPC_FUZZ_SECONDS", "15"))
REPORT = re.compile(r"ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer)|runtime error:|SUMMARY: ")
ENV = {
    "ASAN_OPTIONS": "halt_on_error=1:detect_leaks=1:allocator_may_return_null=1",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
}


@pytest.fixture(scope="session")
def fuzz_build():
    clang = shutil.which("clang++")
    if clang is None:
        pytest.fail("the fuzz targets need clang++ (apt-get install clang libclang-rt-14-dev; tools/setup.sh does it)")
    build = ROOT / "build" / "fuzz"
    configure = [
        "cmake",
        "-S",
        str(ROOT),
        "-B",
        str(build),
        f"-DCMAKE_CXX_COMPILER={clang}",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DVIPC_BUILD_FUZZ=ON",
        "-DVIPC_BUILD_PYTHON=OFF",
        "-DVIPC_SANITIZE=address,undefined,fuzzer-no-link",
    ]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    for cmd in (configure, ["cmake", "--build", str(build), "-j2"]):
        proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        if proc.returncode != 0 and cmd is configure:  # a cache from another generator: start over
            shutil.rmtree(build, ignore_errors=True)
            proc = subprocess.run(
                cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600
            )
        assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-8000:]}"
    return build / "cpp" / "fuzz"


def run_target(exe: Path, seconds: int, workdir: Path, extra=()):
    """Run one target from a copy of its seed corpus; returns (exit code, output, runs)."""
    corpus = workdir / "corpus"
    shutil.copytree(ROOT / "cpp" / "fuzz" / "corpus" / exe.name, corpus)
    env = dict(os.environ, VIPC_TEST_TMPDIR=str(workdir), **ENV)
    cmd = [
        str(exe),
        f"-max_total_time={seconds}",
        "-timeout=10",
        "-rss_limit_mb=2048",
        "-max_len=4096",
        f"-artifact_prefix={workdir}/",
        *extra,
        str(corpus),
    ]
    proc = subprocess.run(
        cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=seconds + 120
    )
    done = re.search(r"Done (\d+) runs", proc.stdout)
    return proc.returncode, proc.stdout, int(done.group(1)) if done else 0


def _fuzz_one(exe: Path, parent: Path):
    workdir = parent / exe.name
    workdir.mkdir()
    rc, out, runs = run_target(exe, SECONDS_EACH, workdir)
    artifacts = [p.name for p in workdir.iterdir() if p.name.startswith(("crash-", "timeout-", "leak-", "oom-"))]
    return rc, out, runs, artifacts


@pytest.fixture(scope="module")
def fuzz_results(fuzz_build):
    """Every target's (exit code, output, runs, reproducers), two targets at a time."""
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="vipc-fuzz-", dir=shm) as tmp:
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = {t: pool.submit(_fuzz_one, fuzz_build / t, Path(tmp)) for t in TARGETS}
            return {t: f.result() for t, f in futures.items()}


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target_survives_hostile_input(fuzz_results, target):
    rc, out, runs, artifacts = fuzz_results[target]
    report = REPORT.search(out)
    assert rc == 0 and report is None and not artifacts, (
        f"{target} found a problem (exit {rc}, reproducers {artifacts}):\n{out[-10000:]}"
    )
    assert runs > 100, f"{target} hardly ran ({runs} inputs):\n{out[-3000:]}"
    print(f"{target}: {runs} inputs in {SECONDS_EACH} s, no crash")
