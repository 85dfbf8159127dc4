#!/usr/bin/env bash
# One-time (and idempotent) set-up on a fresh Debian machine with Python 3.11:
# system packages, a virtual environment in .venv, and an editable install of
# the package (C++ core built beside the sources) with every optional part.
# Safe to run again: a second run with nothing changed takes seconds, and a
# changed C++ file is rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."
# One set-up at a time: the suite's workers (a test that rebuilds, the demo's own set-up)
# may run it side by side, and two builds in one build folder would write the same files.
mkdir -p build
exec 9>build/.setup.lock
flock 9

PY=${PYTHON:-python3}
APT_PACKAGES=(g++ gcc cmake ninja-build python3-venv python3-dev spin)
# vipc-view's browser tests drive the system Chromium with its matching chromedriver
APT_PACKAGES+=(chromium chromium-driver)
command -v java >/dev/null || APT_PACKAGES+=(openjdk-17-jre-headless)
# the fuzz targets (cpp/fuzz) need clang and its libFuzzer runtime
APT_PACKAGES+=(clang libclang-rt-14-dev)
# tests/system/test_wheel.py compiles its wheels through ccache (cache in build/ccache)
APT_PACKAGES+=(ccache)

missing=()
command -v g++ >/dev/null || missing+=(g++)
command -v cmake >/dev/null || missing+=(cmake)
command -v ninja >/dev/null || missing+=(ninja-build)
command -v gcc >/dev/null || missing+=(gcc)
command -v spin >/dev/null || missing+=(spin)
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
# the Spark pipeline (vipc-analyze) runs PySpark on a Java 17+ runtime
command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
command -v clang++ >/dev/null || missing+=(clang)
command -v ccache >/dev/null || missing+=(ccache)
"$PY" -c "import venv, ensurepip" 2>/dev/null || missing+=(python3-venv)
"$PY" -c "import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" \
  || missing+=(python3-dev)
if ((${#missing[@]})); then
  echo "setup: installing system packages: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq -o DPkg::Lock::Timeout=600 "${APT_PACKAGES[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi

# The package is installed editable: the compiled modules are built into msgq/
# and visionipc/ beside the sources (build folder build/dev), so the repository
# root imports the same code as everywhere else. pip runs only when the
# packaging inputs changed; otherwise an incremental build (ninja: seconds, and
# nothing at all when no C++ file changed) brings the modules up to date.
EXTRAS="test,zmq,bench,cv,record,view,spark,lint,cuda,typed"
STAMP=.venv/.visionipc-setup
want="$(cat pyproject.toml CMakeLists.txt | sha256sum | cut -c1-16) $EXTRAS $(.venv/bin/python -VV | sha256sum | cut -c1-8)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -f build/dev/build.ninja ]; then
  echo "setup: up to date; building what changed in the C++ core"
  cmake --build build/dev
else
  .venv/bin/python -m pip install -q --upgrade pip
  # build requirements in the venv: the editable build is reused (no isolation)
  # (and setuptools + wheel: without isolation, sdist-only dependencies such as
  # pyspark build their wheels with the venv's own setuptools)
  .venv/bin/python -m pip install -q "scikit-build-core>=0.12" "pybind11>=2.12" setuptools wheel
  echo "setup: building and installing visionipc editable (C++ core + Python packages)"
  .venv/bin/python -m pip install -q --no-build-isolation \
    --config-settings=build-dir=build/dev --config-settings=cmake.build-type=Release \
    -e ".[$EXTRAS]"
  echo "$want" > "$STAMP"
fi
echo "setup: done (.venv/bin/python)"
