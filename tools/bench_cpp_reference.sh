#!/usr/bin/env bash
# C++ numbers of visionipc beside the reference (commaai/msgq) in one run: the
# same program, cpp/tests/compat/bench_compat.cc (64 B one-way over msgq, 4K
# frame handoff over VisionIPC), built against our installed library and
# against the reference's own sources (compiled straight with g++: no scons,
# nothing vendored). Needs tools/setup.sh's build (build/dev).
#   bash tools/bench_cpp_reference.sh [--iters 20000] [--frames 300]
# VIPC_REFERENCE_MSGQ: a commaai/msgq checkout (default /work/ref/msgq).
set -euo pipefail
cd "$(dirname "$0")/.."
REF=${VIPC_REFERENCE_MSGQ:-/work/ref/msgq}
OUT=build/bench-cpp
mkdir -p "$OUT"
cmake --build build/dev --target visionipc >/dev/null
cmake --install build/dev --prefix "$OUT/prefix" >/dev/null
cmake -S cpp/tests/compat -B "$OUT/ours" -G Ninja -DCMAKE_PREFIX_PATH="$PWD/$OUT/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$OUT/ours" --target bench_compat >/dev/null
g++ -O2 -std=c++17 -I"$REF" -o "$OUT/bench_reference" cpp/tests/compat/bench_compat.cc \
  "$REF"/msgq/{ipc,event,impl_msgq,impl_fake,msgq}.cc \
  "$REF"/msgq/visionipc/{visionipc,visionipc_server,visionipc_client,visionbuf}.cc -lpthread
TAG=cppbench$$
# the reference leaves its segments and socket behind: remove this run's
trap 'rm -f /dev/shm/msgq_${TAG}_ping /dev/shm/msgq_${TAG}_pong /dev/shm/msgq_visionipc_${TAG}_0 /tmp/visionipc_${TAG}' EXIT
echo "# visionipc ($(uname -r), $(nproc) cpus, load $(cut -d' ' -f1 /proc/loadavg))"
"$OUT/ours/bench_compat" --tag "$TAG" "$@"
echo "# commaai/msgq $(git -C "$REF" rev-parse --short HEAD 2>/dev/null || echo '(no git)')"
"$OUT/bench_reference" --tag "$TAG" "$@" 2>/dev/null
