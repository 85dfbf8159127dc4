"""A source checkout imported without its compiled modules says what to do in one
line (issue 34, item 1: it said "cannot import name '_queues' from partially
initialized module 'msgq' (most likely due to a circular import)")."""

import shutil
import subprocess
import sys

import pytest
from repo import ROOT


@pytest.mark.parametrize("module", ["msgq", "visionipc"])
def test_an_unbuilt_checkout_says_how_to_build_it(tmp_path, module):
    for package in ("msgq", "visionipc"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    out = subprocess.run(
        [sys.executable, "-S", "-c", f"import {module}"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: msgq's compiled modules are not in"), out.stderr
    assert "bash tools/setup.sh" in last and "circular import" not in out.stderr
