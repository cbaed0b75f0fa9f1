#!/usr/bin/env bash
# On a machine with a CUDA GPU: install apache-tvm-ffi from the wheel in .whl/ (no package index
# needed) into /tmp/site, build and install the package there with its prebuilt library (9.0a unless
# JIT_KERNEL_AOT_ARCHS says otherwise), then run the requested steps in order. Logs go to $OUT, the
# output folder (default /tmp/out): build.log, summary.txt, device.txt and one log per step.
#
#   bash ci/gpu-session.sh [peers] [doctor] [tests] [sanitize] [bench] [custom "<command>"]
#
# Run from the repository root. `peers` puts FlashInfer 0.7.2 on the path for the steps after it,
# from .peers/flashinfer-slim.tgz (an archive of FlashInfer's `flashinfer/` package folder), with
# its prebuilt modules when .peers/flashinfer-jit-cache.tgz is there (ci/prebuild-flashinfer.sh).
# `tests` honours PYTEST_MARK and PYTEST_ARGS, `sanitize` SANITIZE_ARGS, `bench` BENCHES.
#
# PREBUILT_FROM=<folder> skips the build: the folder holds a libjit_kernel_prebuilt.so and its
# prebuilt_manifest.json built elsewhere from the same sources (a CPU machine's `pip install .`
# leaves both in build/<wheel tag>/), copied into python/jit_kernel/lib/ with python/ put on the
# path. Each symbol whose translation unit's digest no longer matches the sources takes the JIT path,
# so a library older than the tree costs compiles, never wrong code.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
export JIT_KERNEL_AOT_ARCHS=${JIT_KERNEL_AOT_ARCHS:-9.0a} CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
export JIT_KERNEL_CACHE_DIR=/tmp/jit-cache
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader | tee "$OUT/device.txt"

start=$(date +%s)
if [ -n "${PREBUILT_FROM:-}" ]; then
  mkdir -p python/jit_kernel/lib
  cp "$PREBUILT_FROM/libjit_kernel_prebuilt.so" "$PREBUILT_FROM/prebuilt_manifest.json" python/jit_kernel/lib/ || exit 1
  export PYTHONPATH=$PYTHONPATH:$PWD/python
  echo "no build: the source tree with the prebuilt library from $PREBUILT_FROM" | tee -a "$OUT/summary.txt"
else
  python3 -m pip install -q --no-build-isolation --no-deps . > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
  echo "build+install: $(( $(date +%s) - start )) s (archs $JIT_KERNEL_AOT_ARCHS)" | tee -a "$OUT/summary.txt"
fi

status=0
while [ $# -gt 0 ]; do
  step=$1; shift
  case $step in
    peers)
      mkdir -p /tmp/fi && tar xzf .peers/flashinfer-slim.tgz -C /tmp/fi || status=1
      [ -f .peers/flashinfer-jit-cache.tgz ] && tar xzf .peers/flashinfer-jit-cache.tgz -C /tmp/fi
      export PYTHONPATH=$PYTHONPATH:/tmp/fi FLASHINFER_CUDA_ARCH_LIST=9.0a ;;
    doctor) (cd /tmp && python3 -m jit_kernel doctor) 2>&1 | tee "$OUT/doctor.log" || status=1 ;;
    tests) python3 -m pytest -q -p no:cacheprovider -m "${PYTEST_MARK:-gpu or not gpu}" ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/tests.log" | tail -40 || status=1 ;;
    sanitize)
      compute-sanitizer --tool memcheck --error-exitcode 3 python3 -m pytest -q -x -p no:cacheprovider -m gpu ${SANITIZE_ARGS:-} \
        2>&1 | tee "$OUT/sanitize.log" | tail -20 || status=1 ;;
    bench)
      for bench in ${BENCHES:-bench_first_call bench_dispatch}; do
        (cd /tmp && python3 -m "jit_kernel.benchmark.$bench") 2>&1 | tee "$OUT/$bench.log" | tail -30 || status=1
      done ;;
    custom) bash -c "$1" 2>&1 | tee -a "$OUT/custom.log" || status=1; shift ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
exit $status
