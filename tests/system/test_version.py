"""The version is written once, in CMakeLists.txt's project(VERSION) (issue 35):
pyproject.toml reads it from there (scikit-build-core's regex provider), so the
installed distribution, msgq.__version__ and visionipc.__version__ say the same; the
public C++ header's constants must say it too."""

import re
from importlib import metadata

from repo import ROOT

import msgq
import visionipc


def _cmake_version():
    return re.search(r"project\(visionipc VERSION ([0-9]+\.[0-9]+\.[0-9]+)", (ROOT / "CMakeLists.txt").read_text())[1]


def test_the_python_packages_have_the_cmake_projects_version():
    version = _cmake_version()
    assert metadata.version("visionipc") == msgq.__version__ == visionipc.__version__ == version
    assert 'dynamic = ["version"]' in (ROOT / "pyproject.toml").read_text()


def test_the_cpp_headers_constants_match():
    header = (ROOT / "cpp" / "include" / "vipc" / "error.h").read_text()
    parts = [re.search(rf"kVersion{part} = ([0-9]+);", header)[1] for part in ("Major", "Minor", "Patch")]
    assert ".".join(parts) == _cmake_version()
