// Fixture: RMSNorm kernels built on <sgl_kernel/impl/norm.cuh> the way sglang.jit_kernel's
// rmsnorm/qknorm use it: one warp per row up to 256 elements, one CTA per row above.
//
// Functions (namespace compat_norm): rmsnorm (template <typename T, int64_t kDim>)

#include <sgl_kernel/impl/norm.cuh>
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>

namespace compat_norm {

using tvm::ffi::TensorView;

inline constexpr uint32_t kRowsPerWarpBlock = 4;

template <typename T, int64_t kDim>
__global__ void rmsnorm_warp_kernel(const T* x, const T* w, T* y, int64_t rows, float eps) {
  using namespace device;
  using Storage = norm::StorageType<T, kDim>;
  const int64_t row = blockIdx.x * static_cast<int64_t>(kRowsPerWarpBlock) + threadIdx.x / kWarpThreads;
  if (row >= rows) return;  // whole warps leave together
  const auto lane = threadIdx.x % kWarpThreads;
  Storage in, weight;
  in.load(x + row * kDim, lane);
  weight.load(w, lane);
  norm::apply_norm_warp<kDim>(in, weight, eps).store(y + row * kDim, lane);
}

// Each block normalises rows blockIdx.x, blockIdx.x + gridDim.x, ...: back-to-back calls with the
// same shared buffer, as upstream's persistent kernels make them.
template <typename T, int64_t kDim>
__global__ void rmsnorm_cta_kernel(const T* x, const T* w, T* y, int64_t rows, float eps) {
  using namespace device;
  using Storage = norm::StorageType<T, kDim>;
  constexpr auto kThreads = host::norm::get_cta_threads<T, kDim>();
  __shared__ float smem[norm::kSmemBufferSize];
  Storage weight;
  weight.load(w, threadIdx.x);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    Storage in;
    in.load(x + row * kDim, threadIdx.x);
    norm::apply_norm_cta<kDim>(in, weight, eps, smem, kThreads / kWarpThreads).store(y + row * kDim, threadIdx.x);
  }
}

template <typename T, int64_t kDim>
void rmsnorm(TensorView x, TensorView w, TensorView y, double eps) {
  using namespace host;
  static_assert(norm::is_config_supported<T, kDim>());
  auto N = SymbolicSize{"rows"};
  auto device = SymbolicDevice{};
  TensorMatcher({N, kDim}).with_device<kDLCUDA>(device).with_dtype<T>().verify(x).verify(y);
  TensorMatcher({kDim}).with_device<kDLCUDA>(device).with_dtype<T>().verify(w);
  const auto rows = N.unwrap();
  if (rows == 0) return;
  const auto args = std::make_tuple(
      static_cast<const T*>(x.data_ptr()),
      static_cast<const T*>(w.data_ptr()),
      static_cast<T*>(y.data_ptr()),
      rows,
      static_cast<float>(eps));
  if constexpr (norm::should_use_cta<T, kDim>()) {
    const auto blocks = std::min<int64_t>(rows, 7);  // several rows per block
    std::apply(
        [&](auto... a) {
          LaunchKernel(blocks, norm::get_cta_threads<T, kDim>(), device.unwrap())(rmsnorm_cta_kernel<T, kDim>, a...);
        },
        args);
  } else {
    std::apply(
        [&](auto... a) {
          LaunchKernel(div_ceil(rows, kRowsPerWarpBlock), kRowsPerWarpBlock * device::kWarpThreads, device.unwrap())(
              rmsnorm_warp_kernel<T, kDim>, a...);
        },
        args);
  }
}

}  // namespace compat_norm
