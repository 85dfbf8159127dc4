"""tools/setup.sh: an editable install whose compiled modules sit beside the
sources. Run again with nothing changed it does no packaging work and rebuilds
nothing; a changed C++ file is rebuilt into the package; the repository root
imports the same package as everywhere else."""

import glob
import os
import subprocess
import sys

from repo import ROOT


def _setup():
    proc = subprocess.run(["bash", "tools/setup.sh"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _module(package, name):
    found = glob.glob(str(ROOT / package / f"{name}.*.so"))
    assert len(found) == 1, f"{package}/{name}: {found} (run bash tools/setup.sh)"
    return found[0]


def test_the_repository_root_imports_the_working_tree():
    code = (
        "import msgq, visionipc, msgq._msgq, msgq._queues, visionipc._visionipc; "
        "print(msgq.__file__); print(visionipc._visionipc.__file__)"
    )
    for cwd in (ROOT, ROOT / "tests"):
        proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        init, native = proc.stdout.split()
        assert init == str(ROOT / "msgq" / "__init__.py")
        assert native == _module("visionipc", "_visionipc")


def test_a_second_setup_changes_nothing_and_a_changed_cpp_file_is_rebuilt():
    modules = [_module("msgq", "_msgq"), _module("msgq", "_queues"), _module("visionipc", "_visionipc")]
    _setup()  # whatever an earlier test changed
    before = {m: os.stat(m).st_mtime_ns for m in modules}
    out = _setup()
    assert "up to date" in out and "installing" not in out, out
    assert {m: os.stat(m).st_mtime_ns for m in modules} == before

    source = ROOT / "cpp" / "visionipc" / "format.cc"
    os.utime(source)  # "changed": newer than the build's outputs
    out = _setup()
    after = {m: os.stat(m).st_mtime_ns for m in modules}
    assert after[_module("visionipc", "_visionipc")] > before[_module("visionipc", "_visionipc")], out
