// scale: out = T(float(src) * factor) over a contiguous fp16, bf16 or fp32 tensor of any shape; factor is a run-time
// argument (one compiled kernel per dtype, not per value). 16-byte vectors when both pointers
// allow it, a scalar loop otherwise.
#pragma once

#include <sgl_kernel/runtime.cuh>
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>
#include <sgl_kernel/vec.cuh>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace jit_kernel::scale {

inline constexpr uint32_t kThreads = 256;

template <typename T, int kN>
__global__ void __launch_bounds__(kThreads)
    scale_kernel(T* __restrict__ dst, const T* __restrict__ src, float factor, int64_t n) {
  using Vec = device::AlignedVector<T, kN>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / kN;
  device::PDLWaitPrimary();  // launched with PDL on sm_90+: wait for the previous kernel's writes
  device::PDLTriggerSecondary();
  for (int64_t v = first; v < nvec; v += step) {
    Vec x;
    x.load(src, v);
#pragma unroll
    for (int j = 0; j < kN; ++j) x[j] = dtype_trait<T>::from(dtype_trait<fp32_t>::from(x[j]) * factor);
    x.store(dst, v);
  }
  for (int64_t i = nvec * kN + first; i < n; i += step) {
    dst[i] = dtype_trait<T>::from(dtype_trait<fp32_t>::from(src[i]) * factor);
  }
}

template <typename T>
void run(tvm::ffi::TensorView dst, tvm::ffi::TensorView src, double factor) {
  using namespace host;
  auto device = SymbolicDevice{};
  TensorMatcher::same_shape_as(src).with_device<kDLCUDA>(device).with_dtype<T>().verify(src, "src").verify(dst, "out");
  const int64_t num = src.numel();
  if (num == 0 || has_no_data(dst)) return;
  constexpr int kN = 16 / sizeof(T);
  const bool vec =
      reinterpret_cast<uint64_t>(dst.data_ptr()) % 16 == 0 && reinterpret_cast<uint64_t>(src.data_ptr()) % 16 == 0;
  const DLDevice dev = device.unwrap();
  const uint32_t num_sm = runtime::sm_count(dev.device_id);
  const int64_t units = vec ? num / kN : num;
  const auto blocks = static_cast<uint32_t>(std::clamp<int64_t>(div_ceil(units, int64_t{kThreads}), 1, num_sm * 32));
  // Programmatic dependent launch where the device has it (sm_90+), as add_constant: the launch
  // overlaps the tail of the previous kernel (see docs/benchmarks.md).
  const bool pdl = runtime::supports_pdl(dev.device_id);
  LaunchKernel(blocks, kThreads, dev)
      .enable_pdl(pdl)(
          vec ? scale_kernel<T, kN> : scale_kernel<T, 1>,
          static_cast<T*>(dst.data_ptr()),
          static_cast<const T*>(src.data_ptr()),
          static_cast<float>(factor),
          num);
}

}  // namespace jit_kernel::scale
