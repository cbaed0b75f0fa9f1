/// \file ffi.h
/// \brief Making `tvm::ffi::Tensor`s in a launcher: new tensors from the caller's allocator
/// (`empty`, `empty_like`) and views of memory the kernel library owns (`from_blob`).
///
/// \code
///   using namespace host;
///   auto out = ffi::empty({n, d}, dl_dtype_v<fp16_t>, device);   // returned to Python
///   auto scratch = ffi::alloc_workspace_tensor(bytes, device);      // uint8 [bytes], or null for 0
///   auto view = ffi::from_blob(ptr, {n}, dl_dtype_v<int32_t>, device, [](void* p) { cudaFree(p); });
/// \endcode
///
/// `empty` allocates through `TVMFFIEnvTensorAlloc`, i.e. with the framework that called the
/// function: under PyTorch, its caching allocator, so the memory is ordered on PyTorch's stream
/// and returns to its pool. Only call it from inside an exported function.
///
/// `from_blob` wraps memory without copying: the tensor's shape and strides are its own (the
/// arguments may be temporaries), and `deleter(data)` runs when the last reference goes away.
/// The default deleter does nothing: the caller keeps ownership and must outlive the tensor.

#pragma once

#include <sgl_kernel/dtype.h>
#include <sgl_kernel/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/object.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>

namespace host::ffi {

using tvm::ffi::Shape;
using tvm::ffi::ShapeView;
using tvm::ffi::Tensor;
using tvm::ffi::TensorView;

/// \brief A new contiguous tensor from the calling framework's allocator (uninitialised).
inline auto empty(ShapeView shape, DLDataType dtype, DLDevice device) -> Tensor {
  return Tensor::FromEnvAlloc(::TVMFFIEnvTensorAlloc, shape, dtype, device);
}

/// \brief `empty` with the dtype of `T`: `ffi::empty<float>({n}, device)`.
template <has_dl_dtype T>
inline auto empty(ShapeView shape, DLDevice device) -> Tensor {
  return empty(shape, dl_dtype_v<T>, device);
}

/// \brief A new contiguous tensor of `like`'s shape, dtype and device (its strides are not copied).
inline auto empty_like(TensorView like) -> Tensor {
  return empty(like.shape(), like.dtype(), like.device());
}

/// \brief `bytes` of uint8 scratch memory on `device`; a null `Tensor` (no allocation) for 0.
inline auto alloc_workspace_tensor(std::size_t bytes, DLDevice device) -> Tensor {
  if (bytes == 0) return Tensor{};
  const int64_t size = static_cast<int64_t>(bytes);
  return empty(ShapeView(&size, 1), dl_dtype_v<uint8_t>, device);
}

/// \brief The default `from_blob` deleter: the memory stays the caller's.
struct NoDelete {
  void operator()(void*) const noexcept {}
};

namespace details {

/// \brief tvm-ffi's NDAllocator protocol over borrowed memory: "allocating" points the tensor at
/// the blob, "freeing" hands it to the user's deleter. tvm-ffi stores this object inside the
/// tensor and lays shape and strides out after it, so nothing else needs managing.
template <typename Deleter>
struct BlobAlloc {
  void* data;
  uint64_t byte_offset;
  [[no_unique_address]] Deleter deleter;

  void AllocData(DLTensor* tensor) {
    tensor->data = data;
    tensor->byte_offset = byte_offset;
  }
  void FreeData(DLTensor* tensor) {
    deleter(tensor->data);
  }
};

}  // namespace details

/**
 * \brief A tensor over existing memory `data` (+ `byte_offset`), without copying it.
 * \param strides in elements; contiguous when not given. Must have `shape`'s rank.
 * \param deleter called as `deleter(data)` when the tensor dies; by default nothing happens.
 */
template <typename Deleter = NoDelete>
inline auto from_blob(
    void* data,
    ShapeView shape,
    DLDataType dtype,
    DLDevice device,
    Deleter&& deleter = {},
    std::optional<ShapeView> strides = std::nullopt,
    uint64_t byte_offset = 0,
    DebugInfo where = {}) -> Tensor {
  using Alloc = details::BlobAlloc<std::decay_t<Deleter>>;
  auto alloc = Alloc{data, byte_offset, std::forward<Deleter>(deleter)};
  if (!strides.has_value()) return Tensor::FromNDAlloc(std::move(alloc), shape, dtype, device);
  RuntimeCheck(
      where,
      strides->size() == shape.size(),
      "from_blob: ",
      strides->size(),
      " strides for a rank-",
      shape.size(),
      " shape");
  return Tensor::FromNDAllocStrided(std::move(alloc), shape, *strides, dtype, device);
}

/// \brief `from_blob` with `like`'s shape, dtype, device and (unless `contiguous`) strides.
template <typename Deleter = NoDelete>
inline auto from_blob_like(
    void* data, TensorView like, Deleter&& deleter = {}, bool contiguous = false, uint64_t byte_offset = 0) -> Tensor {
  const auto strides = contiguous ? std::nullopt : std::optional<ShapeView>{like.strides()};
  return from_blob(
      data, like.shape(), like.dtype(), like.device(), std::forward<Deleter>(deleter), strides, byte_offset);
}

}  // namespace host::ffi

/// \brief Declares `REF`, the non-nullable `tvm::ffi::ObjectRef` handle of the object class `OBJ`
/// (sglang 0.5.23's spelling of tvm-ffi's `TVM_FFI_DEFINE_OBJECT_REF_METHODS_NOTNULLABLE`).
#define SGLANG_REGISTER_FFI_REFERENCE_CLASS(REF, OBJ)                               \
  struct REF : public ::tvm::ffi::ObjectRef {                                       \
    TVM_FFI_DEFINE_OBJECT_REF_METHODS_NOTNULLABLE(REF, ::tvm::ffi::ObjectRef, OBJ); \
  }
