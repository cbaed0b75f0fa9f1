// add_constant, host version: dst[i] = src[i] + kConstant on CPU int32 tensors.
// The self-test family: it lets the dispatcher, `doctor` and CI exercise both the prebuilt and
// the JIT path on a machine without a GPU.
#pragma once

#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>

namespace jit_kernel::add_constant {

template <int32_t kConstant>
void run_host(tvm::ffi::TensorView dst, tvm::ffi::TensorView src) {
  using namespace host;
  TensorMatcher::same_shape_as(src)  // any shape, contiguous
      .with_dtype<int32_t>()
      .with_device<kDLCPU>()
      .verify(src, "src")
      .verify(dst, "out");
  auto* out = static_cast<int32_t*>(dst.data_ptr());
  const auto* in = static_cast<const int32_t*>(src.data_ptr());
  for (const auto i : irange(src.numel())) {
    out[i] = in[i] + kConstant;
  }
}

}  // namespace jit_kernel::add_constant
