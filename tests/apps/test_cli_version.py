"""Every command the package installs answers ``--version`` with its name and the
installed version (issue 34, item 4), as the field's tools do."""

import os
import subprocess
import sys

import pytest
from repo import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SCRIPTS = sorted(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])


def test_every_console_script_is_covered():
    assert len(SCRIPTS) == 9 and "vipc-foxglove" in SCRIPTS and "msgq-top" in SCRIPTS


@pytest.mark.parametrize("tool", SCRIPTS)
def test_version(tool):
    import msgq

    path = os.path.join(os.path.dirname(sys.executable), tool)
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{tool} {msgq.__version__}"
    assert msgq.__version__[0].isdigit()
