// Fixture: launchers that make tensors with <sgl_kernel/ffi.h> and return them to Python.
//
// Functions (namespace compat_ffi):
//   empty_2x3, empty_like_filled, empty_typed, workspace, blob_view, blob_like, blob_owned,
//   deleted_count, counter_twice

#include <sgl_kernel/ffi.h>
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace compat_ffi {

using tvm::ffi::Tensor;
using tvm::ffi::TensorView;

inline std::atomic<int64_t> g_deleted{0};

/// A new float32 [2, 3] tensor on `like`'s device.
inline auto empty_2x3(TensorView like) -> Tensor {
  return host::ffi::empty({2, 3}, host::dl_dtype_v<float>, like.device());
}

/// A tensor shaped like `x`; on the CPU it is filled with 7 so the test sees real memory.
inline auto empty_like_filled(TensorView x) -> Tensor {
  auto out = host::ffi::empty_like(x);
  if (x.device().device_type == kDLCPU) {
    host::RuntimeCheck(host::is_type<int32_t>(x.dtype()), "int32 please");
    auto* p = static_cast<int32_t*>(out.data_ptr());
    for (int64_t i = 0; i < out.numel(); ++i) p[i] = 7;
  }
  return out;
}

inline auto empty_typed(TensorView like, int64_t n) -> Tensor {
  return host::ffi::empty<int64_t>({n}, like.device());
}

/// `bytes` of uint8 scratch; `None` for 0.
inline auto workspace(TensorView like, int64_t bytes) -> tvm::ffi::Optional<Tensor> {
  auto t = host::ffi::alloc_workspace_tensor(static_cast<std::size_t>(bytes), like.device());
  if (!t.defined()) return std::nullopt;
  return t;
}

/// A [rows, cols] view of `x`'s memory with transposed strides (no copy, x must stay alive).
inline auto blob_view(TensorView x, int64_t rows, int64_t cols) -> Tensor {
  const int64_t shape[] = {rows, cols};
  const int64_t strides[] = {1, rows};
  return host::ffi::from_blob(
      x.data_ptr(),
      host::ffi::ShapeView(shape, 2),
      x.dtype(),
      x.device(),
      host::ffi::NoDelete{},
      host::ffi::ShapeView(strides, 2),
      x.byte_offset());
}

/// `from_blob_like` of `x` from its second element on (through byte_offset), contiguous.
inline auto blob_like(TensorView x) -> Tensor {
  return host::ffi::from_blob_like(x.data_ptr(), x, host::ffi::NoDelete{}, true, host::dtype_bytes(x.dtype()));
}

/// `n` int32 values 0..n-1 in malloc'ed host memory, freed by the deleter (counted).
inline auto blob_owned(int64_t n) -> Tensor {
  auto* data = static_cast<int32_t*>(std::malloc(sizeof(int32_t) * static_cast<std::size_t>(n)));
  for (int64_t i = 0; i < n; ++i) data[i] = static_cast<int32_t>(i);
  const auto deleter = [](void* p) {
    std::free(p);
    g_deleted.fetch_add(1);
  };
  return host::ffi::from_blob(data, {n}, host::dl_dtype_v<int32_t>, DLDevice{kDLCPU, 0}, deleter);
}

inline auto deleted_count() -> int64_t {
  return g_deleted.load();
}

/// An object type and its handle, declared the way sglang 0.5.23's kernels do.
class CounterObj : public tvm::ffi::Object {
 public:
  int64_t value = 0;
  static constexpr bool _type_mutable = true;
  TVM_FFI_DECLARE_OBJECT_INFO_FINAL("compat_ffi.Counter", CounterObj, tvm::ffi::Object);
};
SGLANG_REGISTER_FFI_REFERENCE_CLASS(Counter, CounterObj);

/// Makes a counter at `start` and bumps it twice through the handle: returns start + 2.
inline auto counter_twice(int64_t start) -> int64_t {
  auto counter = tvm::ffi::detail::ObjectUnsafe::ObjectRefFromObjectPtr<Counter>(tvm::ffi::make_object<CounterObj>());
  counter->value = start;
  ++counter->value;
  ++counter->value;
  return counter->value;
}

}  // namespace compat_ffi
