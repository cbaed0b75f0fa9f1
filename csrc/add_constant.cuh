// add_constant, CUDA version: dst[i] = src[i] + kConstant on CUDA int32 tensors.
#pragma once

#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <cstddef>
#include <cstdint>

namespace jit_kernel::add_constant {

inline constexpr std::size_t kBlockSize = 256;

template <int32_t kConstant>
__global__ void add_constant_kernel(int32_t* __restrict__ dst, const int32_t* __restrict__ src, std::size_t n) {
  const auto i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i] + kConstant;
}

template <int32_t kConstant>
void run_cuda(tvm::ffi::TensorView dst, tvm::ffi::TensorView src) {
  using namespace host;
  auto num_elements = SymbolicSize{"num_elements"};
  auto device = SymbolicDevice{};
  TensorMatcher({num_elements})  //
      .with_dtype<int32_t>()
      .with_device<kDLCUDA>(device)
      .verify(dst, "out")
      .verify(src, "src");
  const auto n = static_cast<std::size_t>(num_elements.unwrap());
  if (n == 0) return;
  LaunchKernel(div_ceil(n, kBlockSize), kBlockSize, device.unwrap())(
      add_constant_kernel<kConstant>, static_cast<int32_t*>(dst.data_ptr()),
      static_cast<const int32_t*>(src.data_ptr()), n);
}

}  // namespace jit_kernel::add_constant
