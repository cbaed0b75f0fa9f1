#!/usr/bin/env bash
# The release wheel on a GPU machine (.whl/ holds the apache-tvm-ffi wheel, as for
# ci/gpu-session.sh): for each fatbin compression mode, build the wheel for the release arch list in
# a fresh build folder with every core, print the build seconds and the sizes of the wheel and of the
# library, install the wheel into its own folder and time the first call (bench_first_call) from it.
#
#   bash ci/release-wheel-bench.sh [on] [off]      # default: on off (about 4 minutes each on 16 cores)
#
# JIT_KERNEL_AOT_ARCHS (default: release) picks the archs. Logs and summary.txt go to $OUT, the
# output folder (default /tmp/out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
export JIT_KERNEL_AOT_ARCHS=${JIT_KERNEL_AOT_ARCHS:-release}
unset CMAKE_BUILD_PARALLEL_LEVEL  # ninja's default: every core
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader | tee "$OUT/device.txt"
echo "$(nproc) cores; $("$CUDA_HOME/bin/nvcc" --version | tail -1)" | tee -a "$OUT/device.txt"

first_rmsnorm='
import time, torch
x = torch.randn(16, 4096, dtype=torch.bfloat16, device="cuda")
w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
torch.cuda.synchronize()
import jit_kernel
from jit_kernel.ops import norm
start = time.perf_counter()
jit_kernel.rmsnorm(x, w)
torch.cuda.synchronize()
print(f"rmsnorm first call {1e3 * (time.perf_counter() - start):.2f} ms ({norm._RMSNORM.decisions})")
'
status=0
modes=("$@")
[ ${#modes[@]} -eq 0 ] && modes=(on off)
for mode in "${modes[@]}"; do
  case $mode in
    on) define=ON ;;
    off) define=OFF ;;
    *) echo "unknown mode $mode (on or off)"; exit 2 ;;
  esac
  build=/tmp/release-build-$mode dist=/tmp/release-dist-$mode site=/tmp/release-site-$mode
  rm -rf "$build" "$dist" "$site"
  start=$(date +%s.%N)
  python3 -m pip wheel -v --no-build-isolation --no-deps -w "$dist" \
    --config-settings=build-dir="$build" \
    --config-settings=cmake.define.JIT_KERNEL_COMPRESS_FATBIN=$define . > "$OUT/release-build-$mode.log" 2>&1 \
    || { tail -40 "$OUT/release-build-$mode.log"; status=1; continue; }
  seconds=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.0f}')" "$start" "$(date +%s.%N)")
  wheel=$(ls "$dist"/*.whl)
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheel" || { status=1; continue; }
  library=$site/jit_kernel/lib/libjit_kernel_prebuilt.so
  grep -E "jit_kernel(\.engine\.aot)?: " "$OUT/release-build-$mode.log" | head -3
  echo "compression $mode: JIT_KERNEL_AOT_ARCHS=$JIT_KERNEL_AOT_ARCHS, build ${seconds} s on $(nproc) cores," \
    "wheel $(stat -c %s "$wheel") bytes, library $(stat -c %s "$library") bytes" | tee -a "$OUT/summary.txt"
  (cd /tmp && PYTHONPATH="$site:/tmp/site" JIT_KERNEL_CACHE_DIR=/tmp/jit-cache-$mode \
    python3 -m jit_kernel.benchmark.bench_first_call --device cuda) 2>&1 | tee "$OUT/first-call-$mode.log" | tail -12 \
    || status=1
  # A larger unit than add_constant's: rmsnorm bf16 x 4096 (prebuilt), first call in 5 fresh processes.
  for _ in 1 2 3 4 5; do
    (cd /tmp && PYTHONPATH="$site:/tmp/site" JIT_KERNEL_CACHE_DIR=/tmp/jit-cache-$mode python3 -c "$first_rmsnorm")
  done 2>&1 | tee "$OUT/first-rmsnorm-$mode.log" || status=1
done
exit $status
