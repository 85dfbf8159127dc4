"""The code passes the linter and is formatted as the formatter writes it
(ruff, configured in pyproject.toml; `ruff check --fix . && ruff format .` fixes most)."""

import subprocess
import sys

from repo import ROOT


def _ruff(*args):
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_ruff_check_passes():
    proc = _ruff("check", "--no-cache", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format_leaves_every_file_as_it_is():
    proc = _ruff("format", "--no-cache", "--check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr
