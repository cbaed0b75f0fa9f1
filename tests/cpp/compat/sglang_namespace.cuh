// Fixture: the layout of sglang 0.5.23, where kernels live inside `namespace sglang` and name the
// library as `host::`, `device::`, `sglang::host::...`, reopen `sglang::device::<family>` and are
// exported from inside `namespace sglang` (its loader wraps the exports). It must build unchanged.
//
// Functions (namespace sglang): scale_rows

#include <sgl_kernel/tensor.h>
#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>
#include <sgl_kernel/vec.cuh>
#include <sgl_kernel/warp.cuh>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>

namespace sglang {

namespace device::compat_scale {

// A family namespace of its own inside sglang::device: the library's names stay visible.
template <typename T>
SGL_DEVICE auto twice(T v) -> T {
  return cast<T>(cast<fp32_t>(v) * 2.0f);
}

}  // namespace device::compat_scale

template <typename T>
__global__ void scale_rows_kernel(const T* src, T* dst, int64_t n) {
  using namespace device;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) dst[i] = compat_scale::twice(src[i]);
  (void)warp::reduce_sum<kWarpThreads>(0.0f);
}

template <typename T>
struct ScaleRows {
  static void run(tvm::ffi::TensorView src, tvm::ffi::TensorView dst) {
    using namespace sglang::host;
    auto N = SymbolicSize{"n"};
    auto dev = SymbolicDevice{};
    TensorMatcher({N}).with_device<kDLGPU>(dev).with_dtype<T>().verify(src).verify(dst);
    const int64_t n = N.unwrap();
    sglang::host::RuntimeCheck(n >= 0, "n = ", n);
    CHECK_CUDA(cudaPeekAtLastError()) << "before scale_rows";
    if (n == 0) return;
    host::LaunchKernel(host::div_ceil(n, 128), 128, dev.unwrap())
        .config({.use_pdl = false})
        .launch(scale_rows_kernel<T>, static_cast<const T*>(src.data_ptr()), static_cast<T*>(dst.data_ptr()), n);
  }
};

// sglang::fp16_t and friends are the library's types.
static_assert(std::is_same_v<sglang::bf16_t, ::bf16_t> && std::is_same_v<packed_t<fp16_t>, fp16x2_t>);

}  // namespace sglang
