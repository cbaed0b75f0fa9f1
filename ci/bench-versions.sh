#!/usr/bin/env bash
# Before/after on one GPU: build the current tree and an older one (OLD_DIR, a copy of the older
# sources), then time the same calls under each, interleaved, ROUNDS times
# (python/jit_kernel/benchmark/bench_versions.py, run from this tree against each build), and print
# the comparison. .whl/ holds the apache-tvm-ffi wheel; $OUT is the output folder (default /tmp/out):
# the builds' and runs' logs, each run's JSON, summary.txt and compare.md.
#
#   mkdir .bench-old && git archive <rev> | tar -x -C .bench-old    # the older sources, once
#   bash ci/bench-versions.sh .bench-old [ROUNDS]                   # on the GPU machine
#   BENCH_ONLY='gelu|silu' bash ci/bench-versions.sh .bench-old     # only the cases matching a regex
set -uo pipefail
OLD_DIR=$1 ROUNDS=${2:-2}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} JIT_KERNEL_AOT_ARCHS=9.0a
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tvm .whl/*.whl || exit 1
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader | tee "$OUT/device.txt"
start=$(date +%s)
for side in old new; do
  src=$([ $side = old ] && echo "$OLD_DIR" || echo .)
  (PYTHONPATH=/tmp/tvm CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install -q --no-build-isolation --no-deps \
     --no-compile --target /tmp/site-$side "$src" > "$OUT/build-$side.log" 2>&1 || echo "build $side failed") &
done
wait
echo "both builds: $(( $(date +%s) - start )) s" | tee "$OUT/summary.txt"
script=$PWD/python/jit_kernel/benchmark/bench_versions.py
for round in $(seq "$ROUNDS"); do
  for side in old new; do
    (cd /tmp && PYTHONPATH=/tmp/site-$side:/tmp/tvm JIT_KERNEL_CACHE_DIR=/tmp/jit-cache-$side \
       python3 "$script" --out "$OUT/$side-$round.json" ${BENCH_ONLY:+--only "$BENCH_ONLY"}) > "$OUT/run-$side-$round.log" 2>&1 \
      || { echo "run $side $round failed"; tail -5 "$OUT/run-$side-$round.log"; }
  done
done
files() { local s=$1; seq "$ROUNDS" | sed "s|.*|$OUT/$s-&.json|" | paste -sd, -; }
python3 "$script" --compare "$(files old)" "$(files new)" | tee "$OUT/compare.md"
