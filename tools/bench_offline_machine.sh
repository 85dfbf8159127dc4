#!/usr/bin/env bash
# vipc-bench's 1-vs-8-client cells (issue 19, item 3) on another machine with no network,
# e.g. a 16-core one where 8 clients do not share CPUs (BENCHMARKS.md, "8 clients on 16 cores").
# It needs python3 with numpy, pybind11, scikit-build-core, Cython, cmake and ninja, g++, and
# in $OFFLINE_DIR (default .devref): msgq-src.tar (`git archive HEAD` of commaai/msgq, the
# reference) and a scons wheel (`pip download --no-deps scons`). It builds the reference and
# visionipc (non-editable, into /tmp), then runs the benchmark; results go to $OUT (default ./out).
#   OUT=out ROUNDS=5 bash tools/bench_offline_machine.sh
export PYTHONUNBUFFERED=1
ROOT=$(pwd)
DIR=$(cd "${OFFLINE_DIR:-.devref}" && pwd)
OUT=${OUT:-$ROOT/out}
mkdir -p "$OUT"
{ nproc; lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node'; uname -r; python3 -VV; cat /proc/loadavg; } 2>&1 | tee "$OUT/machine.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$DIR"/scons*.whl || echo "scons install failed"
mkdir -p /tmp/ref && tar -xf "$DIR/msgq-src.tar" -C /tmp/ref
(cd /tmp/ref && PYTHONPATH=/tmp/site timeout 200 python3 /tmp/site/bin/scons -j"$(nproc)" --minimal) >"$OUT/ref-build.log" 2>&1
echo "reference build rc=$?"
SECONDS=0
timeout 300 python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/vipc "$ROOT" >"$OUT/build.log" 2>&1
echo "visionipc build rc=$? in ${SECONDS}s"
export PYTHONPATH=/tmp/vipc
cd /tmp || exit 1 # the source tree's packages have no compiled modules
python3 -c "from visionipc import _visionipc" || exit 1
REF=""
[ -f /tmp/ref/msgq/visionipc/visionipc_pyx.so ] && REF=",reference"
VIPC_REFERENCE_MSGQ=/tmp/ref timeout 330 python3 -m visionipc.bench --sizes 64x64,3840x2160 --clients 1,8 \
  --transports "visionipc,visionipc-handoff,msgq,futex$REF" --modes paced --rounds "${ROUNDS:-5}" --plot '' \
  --json "$OUT/bench.json" 2>"$OUT/bench.err" | tee "$OUT/bench.txt"
echo "bench rc=${PIPESTATUS[0]}"
cat /proc/loadavg
