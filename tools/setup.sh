#!/usr/bin/env bash
# One-time (and idempotent) set-up on a fresh Debian machine with Python 3.11:
# system packages, a virtual environment in .venv, and a build of the C++ core
# installed into it with every optional part. Safe to run again: it only adds
# what is missing and rebuilds the package.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
APT_PACKAGES=(g++ gcc cmake ninja-build python3-venv python3-dev spin)
# vipc-view's browser tests drive the system Chromium with its matching chromedriver
APT_PACKAGES+=(chromium chromium-driver)
command -v java >/dev/null || APT_PACKAGES+=(openjdk-17-jre-headless)
# the fuzz targets (cpp/fuzz) need clang and its libFuzzer runtime
APT_PACKAGES+=(clang libclang-rt-14-dev)

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
.venv/bin/python -m pip install -q --upgrade pip
echo "setup: building and installing visionipc (C++ core + Python packages)"
.venv/bin/python -m pip install -q ".[test,zmq,bench,cv,record,view,spark]"
echo "setup: done (.venv/bin/python)"
