// moe_sum_reduce: out[t, h] = routed_scaling_factor * sum_k weights[t, k] * expert_out[t, k, h], summed in
// fp32 in slot order and rounded once to the activation dtype. Without weights every weight is 1.
//
// Memory-bound: each thread owns one 16-byte vector of a token's row and reads the k slots' vectors
// (AlignedVector), a grid of (tokens, vectors of a row / threads). Rows that are not whole aligned
// 16-byte vectors take the scalar kernel (kN = 1).
#pragma once

#include <sgl_kernel/runtime.cuh>
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>
#include <sgl_kernel/vec.cuh>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>

#include <algorithm>
#include <cstdint>

namespace jit_kernel::moe_sum {

inline constexpr int kMaxThreads = 256;

template <typename T, int kN>
__global__ void __launch_bounds__(kMaxThreads) sum_kernel(
    T* __restrict__ out,
    const T* __restrict__ x,
    const void* __restrict__ weights,
    bool weights_fp32,
    int64_t out_stride,
    int64_t x_stride_t,
    int64_t x_stride_k,
    int64_t w_stride,
    int topk,
    int64_t hidden,
    float scale) {
  const int64_t token = blockIdx.x;
  const int64_t v = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  if (v * kN >= hidden) return;
  float acc[kN];
#pragma unroll
  for (int j = 0; j < kN; ++j) acc[j] = 0.f;
  const T* base = x + token * x_stride_t + v * kN;
#pragma unroll 8
  for (int k = 0; k < topk; ++k) {
    float w = 1.f;
    if (weights != nullptr) {
      w = weights_fp32 ? static_cast<const float*>(weights)[token * w_stride + k]
                       : dtype_trait<fp32_t>::from(static_cast<const T*>(weights)[token * w_stride + k]);
    }
    device::AlignedVector<T, kN> in;
    in.load(base + k * x_stride_k);
    float f[kN];
    device::to_floats(in, f);
#pragma unroll
    for (int j = 0; j < kN; ++j) acc[j] = fmaf(w, f[j], acc[j]);
  }
  device::AlignedVector<T, kN> o;
#pragma unroll
  for (int j = 0; j < kN; ++j) o[j] = dtype_trait<T>::from(acc[j] * scale);
  o.store(out + token * out_stride + v * kN);
}

template <typename T>
struct MoeSumReduce {
  static void run(
      tvm::ffi::TensorView out,
      tvm::ffi::TensorView expert_out,
      tvm::ffi::Optional<tvm::ffi::TensorView> weights,
      double routed_scaling_factor,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    auto N = SymbolicSize{"num_tokens"};
    auto K = SymbolicSize{"topk"};
    auto H = SymbolicSize{"hidden_size"};
    auto device = SymbolicDevice{};
    TensorMatcher({N, K, H})
        .with_strides({-1, -1, 1})
        .with_device<kDLCUDA>(device)
        .with_dtype<T>()
        .verify(expert_out, "expert_out");
    TensorMatcher::cuda_rows<T>({N, H}, device).verify(out, "out");
    const void* w = nullptr;
    bool w_fp32 = true;
    int64_t w_stride = 0;
    if (weights.has_value()) {
      TensorMatcher({N, K}).with_strides({-1, 1}).with_device<kDLCUDA>(device).with_dtype<fp32_t, T>().verify(
          *weights, "weights");
      w = (*weights).data_ptr();
      w_fp32 = is_type<fp32_t>((*weights).dtype());
      w_stride = (*weights).stride(0);
    }
    RuntimeCheck(
        std::isfinite(routed_scaling_factor),
        "moe_sum_reduce: routed_scaling_factor must be finite, got ",
        routed_scaling_factor);
    const int64_t n = N.unwrap();
    const int64_t h = H.unwrap();
    RuntimeCheck(n < (int64_t{1} << 31), "moe_sum_reduce: too many tokens: ", n);
    if (n == 0 || h == 0 || has_no_data(out)) return;  // nothing to do, or a fake call's checks alone
    const DLDevice dev = device.unwrap();
    const bool pdl = runtime::resolve_pdl(enable_pdl, dev.device_id);
    auto* o = static_cast<T*>(out.data_ptr());
    const auto* x = static_cast<const T*>(expert_out.data_ptr());
    const int64_t st = expert_out.stride(0), sk = expert_out.stride(1), so = out.stride(0);
    constexpr int kN = 16 / static_cast<int>(sizeof(T));
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool vec = aligned(o) && aligned(x) && h % kN == 0 && st % kN == 0 && sk % kN == 0 && so % kN == 0;
    const float scale = static_cast<float>(routed_scaling_factor);
    const int topk = static_cast<int>(K.unwrap());
    auto go = [&](auto kernel, int64_t width) {
      const auto threads = static_cast<uint32_t>(std::min<int64_t>(kMaxThreads, div_ceil(width, int64_t{32}) * 32));
      const dim3 grid(static_cast<uint32_t>(n), static_cast<uint32_t>(div_ceil(width, int64_t{threads})));
      LaunchKernel(grid, threads, dev).enable_pdl(pdl)(kernel, o, x, w, w_fp32, so, st, sk, w_stride, topk, h, scale);
    };
    if (vec) {
      go(sum_kernel<T, kN>, h / kN);
    } else {
      go(sum_kernel<T, 1>, h);
    }
  }
};

}  // namespace jit_kernel::moe_sum
