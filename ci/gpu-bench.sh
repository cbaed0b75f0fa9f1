#!/usr/bin/env bash
# Chosen benchmarks on a GPU machine with FlashInfer as a peer: build and install
# (ci/gpu-session.sh peers: .whl/ holds the apache-tvm-ffi wheel, .peers/ the FlashInfer archives),
# then each script on its full grid with a time limit, its log in $OUT/<script>.log ($OUT: the
# output folder, default /tmp/out) and its tables on stdout.
#
#   bash ci/gpu-bench.sh <limit_s per script> bench_rope bench_kv_store ...
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
limit=$1; shift
bash ci/gpu-session.sh peers > "$OUT/session.log" 2>&1 || { tail -20 "$OUT/session.log"; exit 1; }
mkdir -p /tmp/fi && tar xzf .peers/flashinfer-slim.tgz -C /tmp/fi && tar xzf .peers/flashinfer-jit-cache.tgz -C /tmp/fi
export PYTHONPATH=/tmp/site:/tmp/fi FLASHINFER_CUDA_ARCH_LIST=9.0a JIT_KERNEL_CACHE_DIR=/tmp/jit-cache
for b in "$@"; do
  start=$(date +%s)
  (cd /tmp && timeout "$limit" python3 -m "jit_kernel.benchmark.$b") > "$OUT/$b.log" 2>&1
  echo "$b rc=$? $(( $(date +%s) - start )) s"
  sed -n '/^device:/,$p' "$OUT/$b.log" | grep -v -- "|---"
done
