"""The wheel people install (issue 34, item 1), built the way a release builds it.

Once per module: ``bash tools/build_wheels.sh`` makes the sdist, builds the wheel from that sdist
alone in a fresh folder and has auditwheel repair it (a manylinux tag); then a fresh virtual
environment under build/ installs the repaired wheel. The tests read the wheel's contents, run
README.md's Python blocks with that environment from a folder outside the checkout
(tools/wheel_smoke.py) and build C++ programs against the installed library as its docs say.
Where pyenv has CPython 3.10 (the oldest the wheels are for: requires-python's floor), its own
wheel is built, checked and tested the same way (``build_wheels.sh --python``).

Where ``ccache`` is installed (tools/setup.sh installs it) the builds compile through it, its
cache in build/ccache: a compiler output is reused only for the same compiler, flags and
preprocessed input, so each build still compiles from its sdist alone (a file the sdist lacks
fails it as before), but the C++ sources are compiled once for both wheels and once across
runs. The link (LTO of the Python modules) and everything after it run every time.
"""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from repo import BUILD_TIMEOUT, ROOT, TOOLS

OUT = ROOT / "build" / "wheel-test"
VENV = ROOT / "build" / "wheel-test-venv"
OLDEST_OUT = ROOT / "build" / "wheel-test-oldest"  # build_wheels.sh --python: its build venv is kept there


def _pyenv_python(series):
    """pyenv's newest CPython ``series`` ("3.10"), or None."""
    pyenv = shutil.which("pyenv")
    if not pyenv:
        return None
    root = Path(subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=30).stdout.strip())
    releases = [p for p in root.glob(f"versions/{series}.*/bin/python3") if p.parts[-3].replace(".", "").isdigit()]
    found = sorted(releases, key=lambda p: [int(x) for x in p.parts[-3].split(".")])  # 3.10.13, not 3.10-dev
    return found[-1] if found else None


def _build_env():
    """build_wheels.sh's environment: this interpreter, and ccache where it is installed
    (CMake's standard launcher variables; the base folder makes the two wheels' builds, under
    different folders, share the library's objects)."""
    env = dict(os.environ, PYTHON=sys.executable)
    if shutil.which("ccache"):
        env.update(
            CMAKE_C_COMPILER_LAUNCHER="ccache",
            CMAKE_CXX_COMPILER_LAUNCHER="ccache",
            CCACHE_DIR=str(ROOT / "build" / "ccache"),
            CCACHE_BASEDIR=str(ROOT / "build"),
            CCACHE_MAXSIZE="1G",
        )
    return env


def _run(cmd, timeout=600, **kw):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def built():
    """tools/build_wheels.sh's output folder and its log (stdout: auditwheel show's report last)."""
    log = _run(["bash", TOOLS / "build_wheels.sh", "--out", OUT], timeout=BUILD_TIMEOUT, env=_build_env())
    return OUT, log


@pytest.fixture(scope="module")
def wheel(built):
    (found,) = built[0].glob("visionipc-*-manylinux_*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel):
    """A fresh virtual environment holding the wheel (and the extras the README blocks use: cv, zmq)."""
    shutil.rmtree(VENV, ignore_errors=True)
    _run([sys.executable, "-m", "venv", VENV])
    python = VENV / "bin" / "python"
    _run([python, "-m", "pip", "install", "-q", f"{wheel}[cv,zmq]"], env=dict(os.environ, TMPDIR=str(OUT)))
    return python


def test_auditwheel_names_a_manylinux_policy_for_the_wheel_built_from_the_sdist(built, wheel):
    out, log = built
    assert len(list(out.glob("visionipc-*.tar.gz"))) == 1, "no sdist"
    assert wheel.name.startswith("visionipc-0.1.0-cp3") and "-manylinux_2_" in wheel.name, wheel.name
    report = _run([sys.executable, "-m", "auditwheel", "show", wheel], env=dict(os.environ, TMPDIR=str(out)))
    tag = wheel.name.rsplit("-", 1)[1].removesuffix(".whl")
    assert f'is consistent with the following platform tag: "{tag}"' in " ".join(report.split()), report
    assert tag.startswith("manylinux_2_") and tag in log


def test_the_wheel_holds_one_copy_of_the_shared_library_and_no_static_one(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    libraries = [n for n in names if "libvisionipc" in n]
    assert libraries == ["visionipc/lib/libvisionipc.so.0.1"], libraries  # named by its soname
    for needed in (
        "visionipc/include/visionipc/vipc/vipc.h",
        "visionipc/include/visionipc/msgq/ipc.h",
        "visionipc/lib/cmake/visionipc/visionipc-config.cmake",
        "visionipc/lib/pkgconfig/visionipc.pc",
        "visionipc-0.1.0.dist-info/licenses/LICENSE",
    ):
        assert needed in names, needed
    assert not [n for n in names if "Static" in n or n.endswith(".a")], "the static library is for C++ installs"
    assert not [n for n in names if n.startswith("visionipc.libs/")], "auditwheel grafted a library into the wheel"
    metadata = zipfile.ZipFile(wheel).read("visionipc-0.1.0.dist-info/METADATA").decode()
    assert "Project-URL: " in metadata and "Classifier: License :: OSI Approved :: MIT License" in metadata


def test_the_installed_wheel_runs_the_readme_blocks_outside_the_checkout(venv):
    workdir = OUT / "smoke"
    workdir.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = _run([venv, TOOLS / "wheel_smoke.py", "--workdir", workdir], timeout=300, env=env)
    site = _run([venv, "-c", "import visionipc; print(visionipc.__file__)"], cwd=workdir, env=env).strip()
    assert site.startswith(str(VENV)), site
    ran = [line for line in out.splitlines() if line.startswith("ok: ")]
    assert len(ran) >= 8 and sum("README.md" in line for line in ran) >= 2, out


CHECK_CC = """
#include <cstdio>
#include <string_view>
#include <vipc/vipc.h>

int main() {
  const vipc::RunOptions run = vipc::RunOptions::from_environment();
  vipc::Subscriber sub("wheel_check", {.run = run});
  vipc::Publisher pub("wheel_check", {.run = run});
  pub.send(std::string_view("hello from the wheel"));
  std::optional<vipc::Bytes> msg = sub.receive(vipc::Timeout(5000));
  if (!msg) return 1;
  std::printf("%.*s\\n", int(msg->size()), reinterpret_cast<const char*>(msg->data()));
}
"""


def test_cpp_programs_build_against_the_installed_wheel_with_cmake_and_pkg_config(venv):
    """docs/cpp.md: -DCMAKE_PREFIX_PATH=<site-packages>, or pkg-config with an rpath; the one
    library file (libvisionipc.so.0.1) serves both, as link input and at run time."""
    site = _run([venv, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"]).strip()
    project = OUT / "cpp-check"
    shutil.rmtree(project, ignore_errors=True)
    project.mkdir(parents=True)
    (project / "check.cc").write_text(CHECK_CC)
    (project / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.20)\nproject(wheel_check LANGUAGES CXX)\n"
        "find_package(visionipc CONFIG REQUIRED)\nadd_executable(check check.cc)\n"
        "target_link_libraries(check PRIVATE visionipc::visionipc)\n"
        'if(TARGET visionipc::visionipc_static)\n  message(FATAL_ERROR "a wheel has no static library")\nendif()\n'
    )
    _run(["cmake", "-S", project, "-B", project / "out", f"-DCMAKE_PREFIX_PATH={site}"], timeout=300)
    _run(["cmake", "--build", project / "out"], timeout=BUILD_TIMEOUT)
    env = dict(os.environ, PKG_CONFIG_PATH=f"{site}/visionipc/lib/pkgconfig")
    flags = _run(["pkg-config", "--cflags", "--libs", "visionipc"], env=env).split()
    libdir = _run(["pkg-config", "--variable=libdir", "visionipc"], env=env).strip()
    by_hand = project / "check-pkg-config"
    _run(["c++", "-std=c++20", project / "check.cc", *flags, f"-Wl,-rpath,{libdir}", "-o", by_hand], timeout=300)
    for program in (project / "out" / "check", by_hand):
        assert _run([program], timeout=60) == "hello from the wheel\n"
        (line,) = [line for line in _run(["ldd", program]).splitlines() if "libvisionipc" in line]
        assert os.path.realpath(line.split()[2]) == os.path.realpath(f"{site}/visionipc/lib/libvisionipc.so.0.1"), line


@pytest.mark.skipif(_pyenv_python("3.10") is None, reason="pyenv has no CPython 3.10 here")
def test_cpython_3_10_gets_its_own_wheel_that_passes_the_docs_outside_the_checkout():
    """The multi-version mode for the oldest CPython the wheels are for: the sdist, a cp310 wheel
    built from it with a 3.10 build venv, auditwheel's manylinux tag and one libvisionipc.so
    (checked by the tool), and a fresh 3.10 venv running the documentation's Python blocks."""
    python = _pyenv_python("3.10")
    log = _run(
        ["bash", TOOLS / "build_wheels.sh", "--python", python, "--out", OLDEST_OUT],
        timeout=BUILD_TIMEOUT,
        env=_build_env(),
    )
    (wheel,) = OLDEST_OUT.glob("visionipc-*.whl")
    assert wheel.name.startswith("visionipc-0.1.0-cp310-cp310-manylinux_2_"), wheel.name
    assert [n for n in zipfile.ZipFile(wheel).namelist() if "libvisionipc" in n] == [
        "visionipc/lib/libvisionipc.so.0.1"
    ]
    assert "== CPython 3.10: built, checked and tested in" in log, log
    ran = [line for line in log.splitlines() if line.startswith("ok: ")]
    assert len(ran) >= 8 and sum("README.md" in line for line in ran) >= 2, log
    assert f"importing {OLDEST_OUT}/test-3.10/lib/python3.10/site-packages/msgq/__init__.py" in log, log


@pytest.mark.parametrize(
    ("args", "python", "said"),
    [
        (["--wheel"], sys.executable, "unknown argument '--wheel' (try --help)"),
        (["--out"], sys.executable, "--out needs a folder"),
        ([], "/no/such/python", "no Python at /no/such/python: run bash tools/setup.sh or set PYTHON"),
        (["--python"], sys.executable, "--python needs an interpreter's path"),
        (["--python", "/no/such/python"], sys.executable, "--python /no/such/python: not a Python interpreter"),
    ],
)
def test_build_wheels_refuses_bad_input_in_one_line(args, python, said):
    proc = subprocess.run(
        ["bash", TOOLS / "build_wheels.sh", *args],
        env=dict(os.environ, PYTHON=python),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (proc.returncode, proc.stderr) == (2, f"build_wheels.sh: {said}\n")


def test_build_wheels_refuses_a_python_outside_3_10_to_3_13_and_all_without_pyenv(tmp_path):
    """An interpreter outside 3.10-3.13 (a stand-in that reports 3.9) is named in one line, and
    --all says that it looks for pyenv when pyenv is not on PATH."""
    old = tmp_path / "python3.9"
    old.write_text("#!/bin/sh\necho 3.9\n")
    old.chmod(0o755)
    bare_path = os.pathsep.join(p for p in ("/usr/local/bin", "/usr/bin", "/bin") if not Path(p, "pyenv").exists())
    for args, path, said in (
        (["--python", str(old)], os.environ["PATH"], f"--python {old} is Python 3.9: wheels are for 3.10 to 3.13"),
        (
            ["--all"],
            bare_path,
            "--all finds CPython 3.10-3.13 with pyenv, which is not installed: name them with --python PATH",
        ),
    ):
        proc = subprocess.run(
            ["bash", TOOLS / "build_wheels.sh", *args],
            env=dict(os.environ, PYTHON=sys.executable, PATH=path),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert (proc.returncode, proc.stderr) == (2, f"build_wheels.sh: {said}\n")
