#!/usr/bin/env bash
# The GPU check of issue 32, for a fresh machine with an NVIDIA GPU and no network
# (the device tool's: Python 3.12 with numpy, CuPy, PyTorch, cuda-bindings, pybind11,
# scikit-build-core, CMake and ninja). It builds visionipc non-editable into /tmp, runs
# the CUDA tests (pytest -m cuda) and the GPU benchmark rows, and writes everything
# under $OUT (default ./out): machine.txt, build.log, tests.txt, bench_gpu.txt/json (with
# tools/gpu_paced_probe.py's per-call times),
# vipc_bench.txt/json. pytest comes from the machine or from wheels in $OFFLINE_DIR
# (default .devref: `pip download --no-deps -d .devref pytest pluggy iniconfig packaging`,
# carried to the machine). Under 6 minutes; each step has its own time limit.
#   OUT=out bash tools/gpu_check.sh
export PYTHONUNBUFFERED=1
ROOT=$(pwd)
OUT=${OUT:-$ROOT/out}
DIR=${OFFLINE_DIR:-$ROOT/.devref}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
{
  date -u
  nproc
  lscpu | grep -E 'Model name|^CPU\(s\)'
  uname -r
  "$PY" -VV
  nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current,pcie.link.gen.max --format=csv
  "$PY" -c "import cuda.bindings, numpy; print('cuda-bindings', cuda.bindings.__version__, 'numpy', numpy.__version__)"
  "$PY" -c "import cupy; print('cupy', cupy.__version__)" 2>&1
  "$PY" -c "import torch; print('torch', torch.__version__, torch.version.cuda)" 2>&1
  cat /proc/loadavg
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

rm -rf /tmp/vipc /tmp/vipc-site  # a warm machine keeps /tmp: start from fresh folders
SECONDS=0
timeout 240 "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/vipc "$ROOT" >"$OUT/build.log" 2>&1
echo "build rc=$? in ${SECONDS}s"
export PYTHONPATH=/tmp/vipc
if ! "$PY" -c "import pytest" 2>/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --target /tmp/vipc-site "$DIR"/*.whl >>"$OUT/build.log" 2>&1
  export PYTHONPATH=/tmp/vipc:/tmp/vipc-site
fi
cd /tmp || exit 1  # the source tree's packages have no compiled modules: import the build
"$PY" -c "import visionipc; from visionipc import cuda; print(visionipc.__file__, 'cuda available:', cuda.available())" \
  2>&1 | tee -a "$OUT/machine.txt"

timeout 150 "$PY" -m pytest -p no:cacheprovider -o addopts= -q -rs -m cuda --rootdir "$ROOT" \
  "$ROOT/tests/visionipc/test_cuda.py" "$ROOT/tests/visionipc/test_cuda_pool.py" 2>&1 | tee "$OUT/tests.txt" | tail -15
echo "tests rc=${PIPESTATUS[0]}"

timeout 120 "$PY" "$ROOT/tools/bench_gpu.py" --sizes 640x480,1920x1080,3840x2160 --rounds 3 --iters 30 \
  --race 10000 --json "$OUT/bench_gpu.json" 2>&1 | tee "$OUT/bench_gpu.txt"
echo "bench_gpu rc=${PIPESTATUS[0]}"

# where a paced frame's time goes, call by call (appended to bench_gpu.txt)
timeout 40 "$PY" "$ROOT/tools/gpu_paced_probe.py" --sizes 64x64,3840x2160 --frames 40 2>&1 | tee -a "$OUT/bench_gpu.txt"

# the paced rows: the CPU handoff, a frame copied to the device, a pool in device memory
# (naive-cuda and pinned-staging: add them with VIPC_GPU_PEERS=1; recorded in BENCHMARKS.md)
PEERS=${VIPC_GPU_PEERS:+,naive-cuda,pinned-staging}
timeout 260 "$PY" -m visionipc.bench --sizes 64x64,3840x2160,7680x4320 --clients 1 \
  --transports "visionipc,visionipc-cuda,visionipc-cuda-pool$PEERS" --modes paced --rounds 3 --frames 150 --plot '' \
  --json "$OUT/vipc_bench.json" 2>"$OUT/vipc_bench.err" | tee "$OUT/vipc_bench.txt"
echo "vipc-bench rc=${PIPESTATUS[0]}"
cat /proc/loadavg
