"""The code passes the linter and is formatted as the formatter writes it
(ruff, configured in pyproject.toml; `ruff check --fix . && ruff format .` fixes most)."""

import os
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


def _cpp_sources():
    listed = subprocess.run(
        ["git", "ls-files", "cpp/*.cc", "cpp/*.h", "cpp/*.cpp", "examples/*.cc", "examples/*.cpp", "examples/*.h"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return listed.stdout.split()


def test_clang_format_leaves_every_cpp_file_as_it_is():
    """The C++ is formatted as clang-format writes it (.clang-format: Google style, 120
    columns; `clang-format -i FILE` fixes it). clang-format comes from the lint extra."""
    tool = os.path.join(os.path.dirname(sys.executable), "clang-format")
    files = _cpp_sources()
    assert len(files) > 50
    check = [tool, "--dry-run", "--Werror", *files]
    proc = subprocess.run(check, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
