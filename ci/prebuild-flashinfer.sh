#!/usr/bin/env bash
# Pre-build FlashInfer 0.7.2's JIT modules for sm_90a once, so that benchmark runs on a GPU load
# them instead of compiling them (minutes) on every fresh machine.
#
#   PYTHONPATH=/tmp/site PYTHON=python3 MAX_JOBS=8 bash ci/prebuild-flashinfer.sh   # repository root
#
# No GPU is used: any machine with nvcc 13.0 builds all eight modules (sampling, the largest, is
# the last to finish on a small machine). Three of them include headers of CUDA libraries that a
# compiler-only toolkit lacks: norm includes cublasLt.h, cublas_v2.h and curand_kernel.h, sampling
# curand_kernel.h, dsv3_fused_routing (DeepSeek-V3's grouped top-k, in bench_moe and bench_dispatch)
# cublasLt.h and curand_kernel.h.
# Where $CUDA_HOME/include lacks them, the script takes the headers (only the headers: nothing is
# linked against those libraries) from NVIDIA's wheels for CUDA 13.0, fetched with `pip download`
# (nvidia-cublas==13.0.2.14, about 420 MB; nvidia-curand==10.4.0.35, about 60 MB; pip's cache keeps
# them), or from folders given as CUBLAS_INCLUDE / CURAND_INCLUDE, and passes them to nvcc with
# FLASHINFER_EXTRA_CUDAFLAGS=-I... . On a machine without the driver, the link's -lcuda finds an
# empty stub made here (the modules do not end up needing libcuda).
#
# Writes .peers/flashinfer-jit-cache.tgz (.peers/ holds inputs, not sources). Needs: .peers/flashinfer-slim.tgz
# (an archive of FlashInfer 0.7.2.post1's `flashinfer/` package folder; the kv-cache append module,
# `page`, needs its csrc/page.cu and csrc/flashinfer_page_binding.cu; sampling its csrc/sampling.cu,
# renorm.cu and flashinfer_sampling_binding.cu), nvcc 13.0 at $CUDA_HOME (default /usr/local/cuda),
# ninja, and a Python with pip and torch (any build, CPU is fine), apache-tvm-ffi 0.1.15.post2 (the
# version ci/gpu-session.sh installs from .whl/; any CPython), jinja2, filelock and packaging.
#
# How it works: FlashInfer's JitSpec.build_and_load() first calls try_load(), which asks
# jit/env.py get_aot_artifacts(name); that returns <package>/data/aot/<name>/<name>.so as soon as the
# file exists (checked before any provider or architecture logic) and tvm_ffi.load_module() loads it
# directly: no build.ninja is written, ninja never runs, no nvcc. So this script runs FlashInfer's own
# build (gen_*_module() specs -> build_jit_specs(), the same flags as a JIT build on a GPU machine
# with FLASHINFER_CUDA_ARCH_LIST=9.0a, plus the library header folders above) in a private temporary
# workspace, and packs only the final .so files (objects, build.ninja, generated sources are not
# needed to load) as
#   flashinfer/data/aot/<name>/<name>.so      for norm rope page silu_and_mul gelu_and_mul gelu_tanh_and_mul sampling
#                                             dsv3_fused_routing
# plus flashinfer/data/aot/PREBUILT.txt (provenance, checksums). The AOT path does not depend on
# absolute paths, on the Python version, or on the tvm-ffi install location. It then checks, in a
# fresh process, that FlashInfer's own lookup picks each module up as AOT with ninja disabled.
#
# To use the modules on a GPU machine, unpack this archive over FlashInfer's copy (the second tar;
# ci/gpu-session.sh's `peers` step does the same):
#
#   mkdir -p /tmp/fi && tar xzf .peers/flashinfer-slim.tgz -C /tmp/fi \
#     && tar xzf .peers/flashinfer-jit-cache.tgz -C /tmp/fi \
#     && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
#     && export PYTHONPATH=/tmp/site:/tmp/fi FLASHINFER_CUDA_ARCH_LIST=9.0a CUDA_HOME=/usr/local/cuda &&
#
# Optional: add FLASHINFER_DISABLE_JIT=1 to make a missing module an error (MissingJITCacheError)
# instead of a silent multi-minute compile. Modules not listed above still JIT-compile.
#
# FI_MODULES (default: all eight) picks modules by name, e.g. from an archive without page's sources
# (the script stops naming a selected module whose sources the archive lacks):
# FI_MODULES="norm rope silu_and_mul gelu_and_mul gelu_tanh_and_mul sampling"; a module left out
# compiles in the GPU run that first uses it, where JIT is enabled.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
PYTHON=${PYTHON:-python3}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
slim=.peers/flashinfer-slim.tgz
out_tgz=.peers/flashinfer-jit-cache.tgz
[ -f "$slim" ] || { echo "missing $slim: an archive of FlashInfer 0.7.2.post1's flashinfer/ package folder" >&2; exit 1; }
"$PYTHON" -c 'import torch, tvm_ffi, jinja2, filelock, packaging' \
  || { echo "set PYTHON to a Python with torch, apache-tvm-ffi, jinja2, filelock, packaging" >&2; exit 1; }

tmp=$(mktemp -d /tmp/fi-prebuild.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/fi" "$tmp/ws" "$tmp/out"
tar xzf "$slim" -C "$tmp/fi"

# A machine without the driver has no libcuda.so for FlashInfer's `-lcuda`: link against an empty
# stub with the driver's soname (unused symbols only; the modules link with --as-needed).
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so ' && [ ! -e "$CUDA_HOME/lib64/stubs/libcuda.so" ]; then
  mkdir -p "$tmp/stubs" && echo > "$tmp/stubs/empty.c"
  cc -shared -o "$tmp/stubs/libcuda.so" -Wl,-soname,libcuda.so.1 "$tmp/stubs/empty.c"
  export LIBRARY_PATH=$tmp/stubs${LIBRARY_PATH:+:$LIBRARY_PATH}
fi

# Private workspace; one compile job at a time unless MAX_JOBS says more (a small or shared machine).
export FLASHINFER_WORKSPACE_BASE=$tmp/ws FLASHINFER_CUDA_ARCH_LIST=9.0a
export MAX_JOBS=${MAX_JOBS:-1} FLASHINFER_JIT_PREBUILD_MAX_JOBS=${MAX_JOBS:-1} FLASHINFER_NVCC_THREADS=1
unset FLASHINFER_DISABLE_JIT FLASHINFER_EXTRA_CFLAGS FLASHINFER_EXTRA_CUDAFLAGS FLASHINFER_EXTRA_LDFLAGS \
  FLASHINFER_NVCC FLASHINFER_JIT_DEBUG FLASHINFER_JIT_VERBOSE FLASHINFER_JIT_LINEINFO CC CXX

# Headers of CUDA libraries the selected modules include, where the toolkit lacks them: a folder given
# by the caller, else the include folder of NVIDIA's wheel for CUDA 13.0 (headers only are unpacked).
wanted=" ${FI_MODULES:-norm rope page silu_and_mul gelu_and_mul gelu_tanh_and_mul sampling dsv3_fused_routing} "
extra_includes=() header_sources=()
library_headers() {  # <module> <header> <folder variable> <wheel requirement>
  local module=$1 header=$2 given=${!3:-} requirement=$4
  [[ $wanted == *" $module "* ]] || return 0
  [ -f "$CUDA_HOME/include/$header" ] && return 0
  if [ -n "$given" ]; then
    [ -f "$given/$header" ] || { echo "$3=$given has no $header" >&2; exit 1; }
    extra_includes+=("-I$given") header_sources+=("$header from $3")
    return 0
  fi
  local dir=$tmp/headers/${requirement%%=*}
  [ -f "$dir/$header" ] && return 0  # unpacked for an earlier module, its folder already passed
  mkdir -p "$dir"
  echo "$module: $CUDA_HOME/include has no $header; taking the headers of $requirement"
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: -d "$tmp/wheels" "$requirement" \
    || { echo "pip download $requirement failed: set $3 to a folder holding $header, or leave $module out of FI_MODULES" >&2; exit 1; }
  "$PYTHON" - "$tmp/wheels" "${requirement%%=*}" "$dir" <<'PY'
import sys, zipfile
from pathlib import Path
wheels, name, dest = Path(sys.argv[1]), sys.argv[2].replace("-", "_"), Path(sys.argv[3])
[wheel] = wheels.glob(f"{name}-*.whl")
with zipfile.ZipFile(wheel) as archive:
    headers = [n for n in archive.namelist() if "/include/" in n and not n.endswith("/")]
    for member in headers:
        target = dest / member.split("/include/", 1)[1]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(archive.read(member))
print(f"{len(headers)} headers of {wheel.name} -> {dest}")
PY
  [ -f "$dir/$header" ] || { echo "$requirement holds no include/$header" >&2; exit 1; }
  extra_includes+=("-I$dir") header_sources+=("$header from $requirement")
}
library_headers norm cublasLt.h CUBLAS_INCLUDE nvidia-cublas==13.0.2.14
library_headers norm curand_kernel.h CURAND_INCLUDE nvidia-curand==10.4.0.35  # via trtllm's reduceKernelUtils.cuh
library_headers sampling curand_kernel.h CURAND_INCLUDE nvidia-curand==10.4.0.35
library_headers dsv3_fused_routing cublasLt.h CUBLAS_INCLUDE nvidia-cublas==13.0.2.14  # via trtllm's cudaUtils.h
library_headers dsv3_fused_routing curand_kernel.h CURAND_INCLUDE nvidia-curand==10.4.0.35
if [ ${#extra_includes[@]} -gt 0 ]; then
  # the host compiler's too: dsv3_fused_routing's .cpp sources include cudaUtils.h (cublasLt.h)
  export FLASHINFER_EXTRA_CUDAFLAGS="${extra_includes[*]}" FLASHINFER_EXTRA_CFLAGS="${extra_includes[*]}"
  echo "FLASHINFER_EXTRA_CUDAFLAGS=$FLASHINFER_EXTRA_CUDAFLAGS (and FLASHINFER_EXTRA_CFLAGS)"
fi

# Import flashinfer.jit's submodules without running flashinfer/__init__.py and flashinfer/jit/
# __init__.py: those import the whole package (requests, numpy, CUDA queries), none of it needed here.
cat > "$tmp/fi_stub.py" <<'EOF'
import sys, types
def install(root):
    for name, path in (("flashinfer", f"{root}/flashinfer"), ("flashinfer.jit", f"{root}/flashinfer/jit")):
        mod = types.ModuleType(name)
        mod.__path__ = [path]
        sys.modules[name] = mod
    from flashinfer.jit.norm import gen_norm_module
    from flashinfer.jit.rope import gen_rope_module
    from flashinfer.jit.page import gen_page_module
    from flashinfer.jit.activation import gen_act_and_mul_module
    from flashinfer.jit.sampling import gen_sampling_module
    from flashinfer.jit.dsv3_optimizations import gen_dsv3_fused_routing_module
    import os
    specs = [gen_norm_module(), gen_rope_module(), gen_page_module()] + [
        gen_act_and_mul_module(a) for a in ("silu", "gelu", "gelu_tanh")] + [
        gen_sampling_module(), gen_dsv3_fused_routing_module()]
    wanted = os.environ.get("FI_MODULES", "").split()
    unknown = set(wanted) - {s.name for s in specs}
    assert not unknown, f"FI_MODULES: no module named {sorted(unknown)}"
    specs = [s for s in specs if not wanted or s.name in wanted]
    for spec in specs:
        missing = [str(p) for p in getattr(spec, "sources", []) if not os.path.exists(p)]
        if missing:
            raise SystemExit(f"module {spec.name}: the FlashInfer archive lacks {missing}; "
                             "leave it out of FI_MODULES or use an archive that has them")
    return specs
EOF

start=$(date +%s)
PYTHONPATH=$tmp${PYTHONPATH:+:$PYTHONPATH} "$PYTHON" - "$tmp" <<'EOF'
import shutil, sys
from pathlib import Path
tmp = Path(sys.argv[1])
import fi_stub
specs = fi_stub.install(tmp / "fi")
from flashinfer.jit.core import build_jit_specs
from flashinfer.jit import env
assert env.flashinfer_version == "0.7.2.post1", env.flashinfer_version
build_jit_specs(specs, verbose=True, skip_prebuilt=False)
for spec in specs:
    dst = tmp / "out/flashinfer/data/aot" / spec.name / f"{spec.name}.so"
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(spec.jit_library_path, dst)
    print("built", spec.name, dst.stat().st_size, "bytes")
EOF
build_s=$(( $(date +%s) - start ))

aot=$tmp/out/flashinfer/data/aot
{
  echo "FlashInfer 0.7.2.post1 modules prebuilt for sm_90a by ci/prebuild-flashinfer.sh"
  echo "date: $(date -u +%FT%TZ)   build time: ${build_s} s   host: $(uname -m), $(ldd --version | head -1)"
  echo "nvcc: $("$CUDA_HOME/bin/nvcc" --version | grep release)   cxx: $(c++ --version | head -1)"
  echo "tvm-ffi: $("$PYTHON" -c 'import tvm_ffi; print(tvm_ffi.__version__)')"
  echo "library headers not in the toolkit: ${header_sources[*]:-none}"
  echo "slim sha256: $(sha256sum "$slim" | cut -d' ' -f1)"
  (cd "$aot" && sha256sum */*.so)
} > "$aot/PREBUILT.txt"
cat "$aot/PREBUILT.txt"

# Check: unpack exactly as a GPU run does (slim, then this tarball on top), and ask FlashInfer's
# own lookup in a fresh process, with JIT disabled and ninja made to fail.
tar czf "$out_tgz" -C "$tmp/out" flashinfer
tar xzf "$out_tgz" -C "$tmp/fi"
rm -rf "$tmp/ws"; mkdir -p "$tmp/ws"
FLASHINFER_DISABLE_JIT=1 PYTHONPATH=$tmp${PYTHONPATH:+:$PYTHONPATH} "$PYTHON" - "$tmp" <<'EOF'
import sys
from pathlib import Path
tmp = Path(sys.argv[1])
import fi_stub
specs = fi_stub.install(tmp / "fi")
import flashinfer.jit.cpp_ext as cpp_ext, flashinfer.jit.core as core
def no_ninja(*a, **k):
    raise SystemExit("ninja would run")
cpp_ext.run_ninja = core.run_ninja = no_ninja
for spec in specs:
    arts = spec.aot_artifacts
    assert spec.is_aot and len(arts) == 1 and arts[0].cuda_architectures is None, (spec.name, arts)
    assert arts[0].path == tmp / "fi/flashinfer/data/aot" / spec.name / f"{spec.name}.so", arts
    assert not spec.ninja_path.exists()
    print(f"AOT ok: {spec.name} -> {arts[0].path.relative_to(tmp / 'fi')}")
EOF
ls -la "$out_tgz"
echo "build ${build_s} s"
