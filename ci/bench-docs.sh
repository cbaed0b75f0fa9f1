#!/usr/bin/env bash
# Every benchmark on a GPU machine and docs/benchmarks.md generated from their JSON, as one job:
# build and install the package (ci/gpu-session.sh: .whl/ holds the apache-tvm-ffi wheel), put
# FlashInfer 0.7.2 from .peers/flashinfer-slim.tgz on the path with its prebuilt modules, run
# `python -m jit_kernel.benchmark.run_all` from /tmp (so that it imports the installed package)
# within the time the job has left (at most 480 s), then `python -m jit_kernel.benchmark.report`.
#
#   JIT_KERNEL_BENCH_COMMIT=$(git rev-parse --short HEAD) bash ci/bench-docs.sh [--only REGEX]
#
# $OUT is the output folder (default /tmp/out); CALL_S (default 540) the seconds the whole job may
# take. Writes $OUT/bench-docs.tgz holding docs/benchmarks.md, docs/benchmarks/plots/*.png and the
# JSON results in docs/benchmarks/data/ (unpack it over the checkout and commit the three together)
# and each script's log in bench-logs/; the build log is $OUT/session.log. Arguments go to run_all
# (e.g. --only 'norm|rope'): with arguments, the results already in docs/benchmarks/data are kept
# for the scripts not rerun, so a run split over two jobs ends with one complete document.
#
# FlashInfer's JIT modules take about a minute each to compile: build them once with
# ci/prebuild-flashinfer.sh (.peers/flashinfer-jit-cache.tgz; norm, rope, page, the three
# activations and sampling, the one bench_sampling's FlashInfer columns load). Its JIT is disabled
# here (FLASHINFER_DISABLE_JIT=1; BENCH_FLASHINFER_JIT=1 keeps it): a module missing from that file
# makes its FlashInfer cells read n/a instead of spending the run's time compiling.
#
# bench_sampling's CI grid is 176 medians and 11 torch.compile graphs (`python -m
# jit_kernel.benchmark.run_all --plan --only sampling` prints its estimate): beside the other scripts
# it does not fit one job's budget, so it runs as a job of its own:
#   JIT_KERNEL_BENCH_COMMIT=$(git rev-parse --short HEAD) bash ci/bench-docs.sh --only sampling
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
CALL_S=${CALL_S:-540}  # a 600 s job limit less the report, a stopped script's grace and the packing
start=$(date +%s)

bash ci/gpu-session.sh > "$OUT/session.log" 2>&1 || { tail -30 "$OUT/session.log"; exit 1; }
tail -1 "$OUT/session.log"

export PYTHONPATH=/tmp/site JIT_KERNEL_CACHE_DIR=/tmp/jit-cache CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ -f .peers/flashinfer-slim.tgz ]; then
  mkdir -p /tmp/fi && tar xzf .peers/flashinfer-slim.tgz -C /tmp/fi
  export PYTHONPATH=/tmp/site:/tmp/fi FLASHINFER_CUDA_ARCH_LIST=9.0a
  [ "${BENCH_FLASHINFER_JIT:-0}" = 1 ] || export FLASHINFER_DISABLE_JIT=1
  if [ -f .peers/flashinfer-jit-cache.tgz ]; then
    tar xzf .peers/flashinfer-jit-cache.tgz -C /tmp/fi
  else
    echo "warning: no .peers/flashinfer-jit-cache.tgz (ci/prebuild-flashinfer.sh): FlashInfer cells read n/a"
  fi
else
  echo "warning: no .peers/flashinfer-slim.tgz: the FlashInfer columns read n/a"
fi

budget=$(( CALL_S - ($(date +%s) - start) ))
[ "$budget" -gt 480 ] && budget=480
data=$OUT/docs/benchmarks/data
mkdir -p "$data"
[ $# -gt 0 ] && [ -d docs/benchmarks/data ] && cp docs/benchmarks/data/*.json "$data"/ 2>/dev/null
(cd /tmp && python3 -m jit_kernel.benchmark.run_all --json-dir "$data" --budget "$budget" \
   --log-dir "$OUT/bench-logs" "$@")
status=$?
(cd /tmp && python3 -m jit_kernel.benchmark.report --json-dir "$data" --output "$OUT/docs/benchmarks.md") || status=1
# One archive of it all, for a caller that copies back only a few files near the top of $OUT.
tar czf "$OUT/bench-docs.tgz" -C "$OUT" docs bench-logs && rm -rf "$OUT/docs" "$OUT/bench-logs"
echo "bench-docs: $(( $(date +%s) - start )) s in all"
exit $status
