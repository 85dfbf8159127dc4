"""Every fenced python and sh block of README.md and of the docs pages it links
(tests/readme_blocks.py, ``PAGES``), run as written from a user's shell (the
venv's commands on PATH), one test per block: it must exit 0, stop on Ctrl-C
where it runs until stopped, and leave no process and no shared memory behind.
How a block that needs more than one terminal, a device or inputs is run is
written above it on its page (tests/readme_blocks.py)."""

import os
import signal
import subprocess
import sys
import time

import pytest
from readme_blocks import PAGES, page_blocks
from repo import ROOT

from msgq.names import segment_dir

BLOCKS = page_blocks(ROOT)
# blocks that start Spark's JVM (vipc-analyze, the pipeline's Python API) are in the spark tier too
PARAMS = [
    pytest.param(b, id=b.id, marks=[pytest.mark.spark] if "analyze" in b.code or "apps.pipeline" in b.code else [])
    for b in BLOCKS
]


def _env(prefix):
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["MSGQ_PREFIX"] = prefix
    env.pop("PYTHONPATH", None)
    return env


def _stop(proc, why, timeout=20):
    """Ctrl-C to the command's process group; it must exit by itself."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            pytest.fail(f"{why}: did not stop within {timeout} s of Ctrl-C")
    return proc.returncode


def _group_gone(proc, grace=15):
    """No process of the command's group is left once it has exited (children get
    ``grace`` seconds to finish: Spark's JVM shuts down after its Python driver)."""
    deadline = time.monotonic() + grace
    while True:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            return False
        time.sleep(0.1)


def _run_sh(block, cwd, env):
    background, report = [], []
    try:
        for command, in_background, reason in block.commands():
            if reason:
                report.append(f"not run ({reason}): {command}")
                continue
            proc = subprocess.Popen(
                ["bash", "-c", command],
                cwd=cwd,
                env=env,
                start_new_session=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            if in_background:
                background.append((command, proc))
                continue
            stop_after = block.stop_after_for(command)
            limit = stop_after if stop_after is not None else block.timeout
            try:
                out, _ = proc.communicate(timeout=limit)
                stopped = False
            except subprocess.TimeoutExpired:
                if stop_after is None:
                    _stop(proc, command)
                    pytest.fail(f"{command!r} ran past {limit} s")
                rc = _stop(proc, command)
                out, stopped = proc.stdout.read(), True
                assert rc in (0, 130, -signal.SIGINT), f"{command!r} exited {rc} on Ctrl-C:\n{out}"
            if not stopped:
                assert proc.returncode == 0, f"{command!r} exited {proc.returncode}:\n{out}"
            assert _group_gone(proc), f"{command!r} left processes behind"
            report.append(f"ok{' (stopped with Ctrl-C)' if stopped else ''}: {command}")
    finally:
        for command, proc in reversed(background):
            rc = _stop(proc, command)
            out = proc.stdout.read()
            assert rc in (0, 130, -signal.SIGINT), f"background {command!r} exited {rc}:\n{out}"
            assert _group_gone(proc), f"background {command!r} left processes behind"
    return report


@pytest.mark.timeout(900)
@pytest.mark.parametrize("block", PARAMS)
def test_readme_block(block, tmp_path, msgq_prefix):
    # each block under a prefix of its own (the autouse fixture's is for this process)
    prefix = f"{msgq_prefix}-readme"
    env = _env(prefix)
    cwd = ROOT if block.cwd == "root" else tmp_path
    shm_before = set(os.listdir(segment_dir()))
    if block.setup:
        # setup commands find the repository (its tests/readme_inputs.py) as $README_REPO
        subprocess.run(
            ["bash", "-c", block.setup], cwd=cwd, env={**env, "README_REPO": str(ROOT)}, check=True, timeout=300
        )
    if block.lang == "python":
        if block.runner == "pytest":
            test_file = tmp_path / "test_readme_example.py"
            test_file.write_text(block.code)
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)]
        else:
            cmd = [sys.executable, "-"]  # stdin: sys.path[0] is the working folder, as for a user
        start = time.monotonic()
        proc = subprocess.run(
            cmd,
            input=block.code if block.runner == "python" else None,
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=block.timeout,
        )
        assert proc.returncode == 0, (
            f"{block.page} line {block.line}, after {time.monotonic() - start:.1f} s:\n{proc.stdout}\n{proc.stderr}"
        )
    else:
        print("\n".join(_run_sh(block, cwd, env)))
    left = sorted(n for n in set(os.listdir(segment_dir())) - shm_before if prefix in n)
    assert not left, f"{block.page} line {block.line} left shared memory behind: {left}"


def test_the_readme_and_docs_have_their_blocks_and_annotations_parse():
    assert len(BLOCKS) >= 15
    assert {b.lang for b in BLOCKS} == {"python", "sh"}
    assert {"python", "sh"} <= {b.lang for b in BLOCKS if b.page == "README.md"}  # the quick start runs
    assert all((ROOT / page).is_file() for page in PAGES)
