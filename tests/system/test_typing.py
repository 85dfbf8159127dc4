"""The typed public API: every public function of the libraries and of their command-line
tools declares its types (tools/typing_coverage.py --missing, --missing-apps); msgq and
visionipc pass mypy (pyproject.toml's [tool.mypy]); the stubs of the compiled modules agree with the
modules (mypy's stubtest, with tests/system/stubtest_allowlist.txt for what it cannot
judge, and the pybind11 signatures stubtest cannot see: tests/stub_signatures.py);
the Python blocks of README.md and docs/ (tests/readme_blocks.py) and
tests/system/typed_usage.py pass ``mypy --strict`` as a user's code would; the packages
export no typing names."""

import importlib
import subprocess
import sys
import typing

import pytest
from readme_blocks import page_blocks
from repo import ROOT, TOOLS
from stub_signatures import mismatches

COMPILED = ["msgq._msgq", "msgq._queues", "visionipc._visionipc"]  # each with its .pyi beside it
CACHE = ROOT / "build" / "mypy-cache"  # kept between runs: a warm check takes seconds
# the packages' own check has other options than the strict one: a cache of its own, not rewritten by each
PACKAGES_CACHE = ROOT / "build" / "mypy-cache-packages"
ALLOWLIST = ROOT / "tests" / "system" / "stubtest_allowlist.txt"


def _mypy(module, *args, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


# the libraries; and msgq/apps, visionipc/apps; and everything, the benchmarks (visionipc/bench) too
@pytest.mark.parametrize("scope", ["--missing", "--missing-apps", "--missing-all"])
def test_public_functions_declare_their_types(scope):
    proc = subprocess.run(
        [sys.executable, str(TOOLS / "typing_coverage.py"), scope], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, "public functions without annotations:\n" + proc.stdout + proc.stderr


def test_packages_pass_mypy():
    # msgq and visionipc whole (the apps and benchmarks too), as pyproject.toml's [tool.mypy] sets it up
    proc = _mypy("mypy", "--cache-dir", str(PACKAGES_CACHE), "-p", "msgq", "-p", "visionipc")
    assert proc.returncode == 0 and "Success: no issues found" in proc.stdout, proc.stdout + proc.stderr


def test_stubs_match_the_compiled_modules():
    # --mypy-config-file: stubtest runs mypy on the stubs; a config keeps it from searching for one
    proc = _mypy(
        "mypy.stubtest",
        "--concise",
        "--allowlist",
        str(ALLOWLIST),
        "--mypy-config-file",
        str(ROOT / "pyproject.toml"),
        *COMPILED,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("module", COMPILED)
def test_stub_parameters_match_the_pybind11_signatures(module):
    stub = ROOT.joinpath(*module.split(".")).with_suffix(".pyi")
    assert mismatches(module, stub) == []


def test_readme_python_blocks_and_typed_usage_pass_mypy_strict(tmp_path):
    files = [ROOT / "tests" / "system" / "typed_usage.py"]  # the call forms the docs show, with their types
    for block in page_blocks(ROOT):
        if block.lang == "python":
            files.append(tmp_path / f"{block.page.replace('/', '_').replace('.md', '')}_line_{block.line}.py")
            files[-1].write_text(block.code)
    assert len(files) > 1, "README.md and docs/ have no python block"
    # follow-imports=silent: the library's own modules are read for their types, but
    # only the pages' code is judged
    proc = _mypy("mypy", "--strict", "--follow-imports=silent", "--cache-dir", str(CACHE), *map(str, files))
    assert proc.returncode == 0 and "Success: no issues found" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("package", ["msgq", "visionipc"])
def test_packages_export_no_typing_names(package):
    module = importlib.import_module(package)
    leaked = [n for n in dir(module) if not n.startswith("_") and getattr(module, n) is getattr(typing, n, None)]
    assert not leaked, f"{package} exports typing's {leaked}"
    assert all(hasattr(module, n) for n in module.__all__)  # from msgq import * still gives every real name
