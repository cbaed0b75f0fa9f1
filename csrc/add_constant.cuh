// add_constant, CUDA version: dst[i] = src[i] + kConstant on CUDA int32 tensors.
#pragma once

#include <sgl_kernel/runtime.cuh>
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>
#include <sgl_kernel/vec.cuh>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace jit_kernel::add_constant {

inline constexpr std::size_t kBlockSize = 256;
inline constexpr std::size_t kVecThreshold = 4096;  // below it one element per thread is as fast

template <int32_t kConstant>
__global__ void add_constant_kernel(int32_t* __restrict__ dst, const int32_t* __restrict__ src, std::size_t n) {
  const auto i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  device::PDLWaitPrimary();  // launched with PDL on sm_90+: wait for the previous kernel's writes
  device::PDLTriggerSecondary();
  if (i < n) dst[i] = src[i] + kConstant;
}

// Vectorized path: 16-byte loads and stores (4 int32 per thread, grid-stride), with the last
// n % 4 elements done by the first threads. Used when both pointers are 16-byte aligned.
template <int32_t kConstant>
__global__ void add_constant_vec_kernel(int32_t* __restrict__ dst, const int32_t* __restrict__ src, std::size_t n) {
  using Vec = device::AlignedVector<int32_t, 4>;
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t nvec = n / 4;
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  for (std::size_t v = first; v < nvec; v += step) {
    Vec x;
    x.load(src, v);
#pragma unroll
    for (int j = 0; j < 4; ++j) x[j] += kConstant;
    x.store(dst, v);
  }
  const std::size_t tail = nvec * 4 + first;
  if (tail < n) dst[tail] = src[tail] + kConstant;
}

template <int32_t kConstant>
void run_cuda(tvm::ffi::TensorView dst, tvm::ffi::TensorView src) {
  using namespace host;
  auto device = SymbolicDevice{};
  TensorMatcher::same_shape_as(src)  // any shape, contiguous
      .with_dtype<int32_t>()
      .with_device<kDLCUDA>(device)
      .verify(src, "src")
      .verify(dst, "out");
  const auto n = static_cast<std::size_t>(src.numel());
  if (n == 0) return;
  const bool aligned = reinterpret_cast<std::uintptr_t>(dst.data_ptr()) % 16 == 0 &&
                       reinterpret_cast<std::uintptr_t>(src.data_ptr()) % 16 == 0;
  // Programmatic dependent launch where the device has it (sm_90+): the launch overlaps the tail
  // of the previous kernel (see docs/benchmarks.md).
  const bool pdl = runtime::supports_pdl(device.unwrap().device_id);
  if (aligned && n >= kVecThreshold) {
    const uint32_t num_sm = runtime::sm_count(device.unwrap().device_id);
    const auto blocks = std::min<std::size_t>(div_ceil(n / 4, kBlockSize), std::size_t{num_sm} * 32);
    LaunchKernel(blocks, kBlockSize, device.unwrap())
        .enable_pdl(pdl)(
            add_constant_vec_kernel<kConstant>,
            static_cast<int32_t*>(dst.data_ptr()),
            static_cast<const int32_t*>(src.data_ptr()),
            n);
    return;
  }
  LaunchKernel(div_ceil(n, kBlockSize), kBlockSize, device.unwrap())
      .enable_pdl(pdl)(
          add_constant_kernel<kConstant>,
          static_cast<int32_t*>(dst.data_ptr()),
          static_cast<const int32_t*>(src.data_ptr()),
          n);
}

}  // namespace jit_kernel::add_constant
