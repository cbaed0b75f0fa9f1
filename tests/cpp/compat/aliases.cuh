// Fixture: a kernel written the way sglang.jit_kernel's own kernels (releases 0.5.12-0.5.16) spell
// the header names, using every upstream alias this library provides. It must build unchanged.
//
// Functions (namespace compat_aliases):
//   group_sums, check_sizes

#include <sgl_kernel/tensor.h>
#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>
#include <sgl_kernel/vec.cuh>
#include <sgl_kernel/warp.cuh>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>
#include <type_traits>

namespace compat_aliases {

using tvm::ffi::TensorView;

// sglang's kernels compare devices with `==` after `using namespace host;` (0.5.12's NVFP4 quant).
namespace device_equality {
using namespace host;
static_assert(DLDevice{kDLCUDA, 1} == DLDevice{kDLCUDA, 1});
static_assert(DLDevice{kDLCUDA, 0} != DLDevice{kDLCUDA, 1} && DLDevice{kDLCUDA, 0} != DLDevice{kDLCPU, 0});
}  // namespace device_equality

// Upstream passes -DSGL_CUDA_ARCH; ours derives it, the same in both passes.
static_assert(SGL_CUDA_ARCH >= 800, "SGL_CUDA_ARCH is the build's arch");
#if SGL_ARCH_HOPPER_OR_GREATER
inline constexpr bool kHopper = true;
#else
inline constexpr bool kHopper = false;
#endif
static_assert(device::kMaxVecBytes == (SGL_ARCH_BLACKWELL_OR_GREATER ? 32 : 16));
static_assert(device::kWarpSize == device::kWarpThreads);
static_assert(kFP8E4M3Max == 448.0f);

template <typename T>
SGL_DEVICE_HOST constexpr auto bytes_of() -> int {
  if constexpr (std::is_same_v<T, float>) {
    return 4;
  } else if constexpr (sizeof(T) == 2) {
    return 2;
  } else {
    static_assert(host::dependent_false_v<T>, "unsupported");
  }
}

// out[i] = {sum of x over the 16-lane group of i (width first), the warp's max (width first),
//           the warp's sum (type first, our order), the sum over the lanes of i's warp at the same
//           position mod 8 (width first, kInner = false)}: every spelling must agree with torch.
template <typename T>
__global__ void group_sums_kernel(const T* __restrict__ x, float* __restrict__ out, int64_t n) {
  using namespace device;
  enable_smem_spilling();
  constexpr auto kVec = kMaxVecBytes / sizeof(T);  // one widest load per thread
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const float v = i < n ? DTypeTrait<fp32_t>::from(SGLANG_LDG(x + i)) : 0.0f;
  const warp::mask_t mask = warp::kFullMask;
  const float group = warp::reduce_sum<16>(v, mask);
  const float max = warp::reduce_max<kWarpThreads>(v);
  const float sum = warp::reduce_sum<float, kWarpThreads>(v);
  const float across = warp::reduce_sum<8, false>(v);
  static_assert(kVec * sizeof(T) == kMaxVecBytes);
  if (i < n) {
    out[i * 4 + 0] = group;
    out[i * 4 + 1] = max;
    out[i * 4 + 2] = sum + 0.0f * div_ceil(n, int64_t{bytes_of<T>()});
    out[i * 4 + 3] = across;
  }
}

template <typename T>
void group_sums(TensorView x, TensorView out) {
  using namespace host;
  auto N = SymbolicSize{"n"};
  auto device = SymbolicDevice{};
  TensorMatcher({N}).with_device<kDLGPU>(device).with_dtype<T>().verify(x);
  TensorMatcher({N, 4}).with_dtype<float>().with_device<kDLGPU>(device).verify(out);
  const auto n = N.unwrap();
  CHECK_HOST(n % 32 == 0) << "n must be a multiple of 32, got " << n;
  if (n == 0) return;
  for (const auto step : stdv::iota(0, 1)) (void)step;  // the ranges short names exist
  LaunchKernel(div_ceil(n, 256), 256, device.unwrap())(
      group_sums_kernel<T>, static_cast<const T*>(x.data_ptr()), static_cast<float*>(out.data_ptr()), n);
}

// Host-memory device names and host::Error: throws "Panic at aliases.cuh:<line>: too small: <n>".
inline auto check_sizes(TensorView pinned, int64_t minimum) -> int64_t {
  using namespace host;
  TensorMatcher({-1}).with_device<kDLCPU, kDLGPUHost>().verify(pinned);
  if (pinned.size(0) < minimum) SGL_PANIC << "too small: " << pinned.size(0);  // @line:check_sizes
  if (stdr::empty(stdv::iota(0, 0)) && kHopper) return pinned.size(0);
  return pinned.size(0);
}

}  // namespace compat_aliases
