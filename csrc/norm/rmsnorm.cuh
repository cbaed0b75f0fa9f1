// rmsnorm, fused_add_rmsnorm and qknorm_across_heads over rows `[N, D]` with a row stride.
//
// Template parameters: kHidden (a hidden size the fast kernel is specialised for, or 0 for the
// generic kernel that takes D at run time) and T (fp16_t, bf16_t; fp32_t via kHidden = 0).
// A launch whose rows are not whole, aligned 16-byte vectors falls back to the generic kernel,
// so every config accepts every D.
#pragma once

#include "common.cuh"

namespace jit_kernel::norm {

// One CTA per row; the row is held in registers between the reduction and the write, so the
// input is read once. kHidden / kVecElems vectors are spread over at most 512 threads.
// kEarlyWeight loads the weight with the row: one memory round trip less on the critical path,
// which is what a launch of few rows is made of. With many rows, bandwidth needs occupancy
// instead, so the weight is loaded after the reduction and is not live across it (H100, D 8192:
// 30 instead of 47 registers, 4 instead of 3 blocks per SM, 179 instead of 224 us at 16384 rows).
template <typename T, int64_t kHidden>
struct RowKernel {
  static constexpr int64_t kN = kVecElems<T>;
  static_assert(kHidden % kN == 0, "specialised hidden sizes must be whole 16-byte vectors");
  static constexpr int64_t kVecs = kHidden / kN;
  static constexpr int64_t kPer = (kVecs + 511) / 512;
  static constexpr int64_t kThreads = ((kVecs + kPer - 1) / kPer + 31) / 32 * 32;
};

template <typename T, int64_t kHidden, bool kFused, bool kEarlyWeight>
__global__ void __launch_bounds__(RowKernel<T, kHidden>::kThreads) row_kernel(const Params p) {
  using K = RowKernel<T, kHidden>;
  using Vec = device::AlignedVector<T, K::kN>;
  __shared__ float smem[32];
  const RowSet& s = p.set[blockIdx.y];
  const int64_t row = blockIdx.x;
  if (row >= s.rows) return;  // whole block: the sets may differ in rows
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  const T* in = static_cast<const T*>(s.in) + row * s.in_s0;
  T* out = static_cast<T*>(s.out) + row * s.out_s0;
  T* res = kFused ? static_cast<T*>(s.residual) + row * s.res_s0 : nullptr;
  Vec x[K::kPer], w[K::kPer];
  float sum = 0.f;
#pragma unroll
  for (int64_t k = 0; k < K::kPer; ++k) {
    const int64_t v = threadIdx.x + k * K::kThreads;
    if (v < K::kVecs) {
      x[k].load(in, v);
      if constexpr (kEarlyWeight) w[k].load(static_cast<const T*>(s.weight), v);
      if constexpr (kFused) {
        Vec r;
        r.load(res, v);
#pragma unroll
        for (int j = 0; j < K::kN; ++j) {
          x[k][j] = dtype_trait<T>::from(dtype_trait<fp32_t>::from(x[k][j]) + dtype_trait<fp32_t>::from(r[j]));
        }
        x[k].store(res, v);
      }
#pragma unroll
      for (int j = 0; j < K::kN; ++j) {
        const float f = dtype_trait<fp32_t>::from(x[k][j]);
        sum += f * f;
      }
    }
  }
  sum = device::cta::all_reduce_sum(sum, smem);
  const float rrms = rsqrtf(sum * (1.f / static_cast<float>(kHidden)) + p.eps);
#pragma unroll
  for (int64_t k = 0; k < K::kPer; ++k) {
    const int64_t v = threadIdx.x + k * K::kThreads;
    if (v < K::kVecs) {
      if constexpr (!kEarlyWeight) w[k].load(static_cast<const T*>(s.weight), v);
      Vec y;
#pragma unroll
      for (int j = 0; j < K::kN; ++j) {
        y[j] = dtype_trait<T>::from(dtype_trait<fp32_t>::from(x[k][j]) * rrms * dtype_trait<fp32_t>::from(w[k][j]));
      }
      y.store(out, v);
    }
  }
}

// Up to about two rows per SM, a launch is latency-bound (see row_kernel's kEarlyWeight).
inline constexpr int64_t kLatencyBoundRows = 256;

template <typename T, int64_t kHidden>
void launch_rows(const Params& p, DLDevice device, bool enable_pdl) {
  const int64_t rows = max_rows(p);
  if (rows == 0) return;
  if constexpr (kHidden > 0) {
    bool fast = vector_aligned(p, sizeof(T));
    for (int i = 0; i < p.num_sets; ++i) fast = fast && p.set[i].dim == kHidden && p.set[i].inner == 1;
    if (fast) {
      host::RuntimeCheck(rows < (int64_t{1} << 31), "rmsnorm: at most 2^31 - 1 rows, got ", rows);
      const dim3 grid(static_cast<uint32_t>(rows), p.num_sets);
      const auto threads = static_cast<uint32_t>(RowKernel<T, kHidden>::kThreads);
      const bool fused = p.set[0].residual != nullptr;
      const bool few_rows = rows <= kLatencyBoundRows;
      const auto kernel = fused
                              ? (few_rows ? row_kernel<T, kHidden, true, true> : row_kernel<T, kHidden, true, false>)
                              : (few_rows ? row_kernel<T, kHidden, false, true> : row_kernel<T, kHidden, false, false>);
      host::LaunchKernel(grid, threads, device).enable_pdl(enable_pdl)(kernel, p);
      return;
    }
  }
  launch_generic<T>(p, device, enable_pdl);
}

template <int64_t kHidden, typename T>
struct RMSNorm {
  // out = rmsnorm(input) * weight; out may be input (in place). Every entry takes `enable_pdl`:
  // launch with programmatic dependent launch (sm_90+; the kernels wait for their predecessor
  // before their first memory access, so it is safe whatever runs before or after).
  static void rmsnorm(
      tvm::ffi::TensorView out, tvm::ffi::TensorView input, tvm::ffi::TensorView weight, double eps, bool enable_pdl) {
    using namespace host;
    auto N = SymbolicSize{"num_tokens"};
    auto D = SymbolicSize{"hidden_size"};
    auto device = SymbolicDevice{};
    TensorMatcher({N, D}).with_strides({-1, 1}).with_device<kDLCUDA>(device).with_dtype<T>().verify(input, "input");
    TensorMatcher({N, D}).with_strides({-1, 1}).with_device<kDLCUDA>(device).with_dtype<T>().verify(out, "out");
    TensorMatcher({D}).with_device<kDLCUDA>(device).with_dtype<T>().verify(weight, "weight");
    Params p{};
    p.num_sets = 1;
    p.eps = static_cast<float>(eps);
    p.set[0] = make_rows(out, input, weight.data_ptr());
    launch_rows<T, kHidden>(p, device.unwrap(), enable_pdl);
  }

  // residual = T(input + residual); input = rmsnorm(residual) * weight.
  static void fused_add(
      tvm::ffi::TensorView input,
      tvm::ffi::TensorView residual,
      tvm::ffi::TensorView weight,
      double eps,
      bool enable_pdl) {
    using namespace host;
    auto N = SymbolicSize{"num_tokens"};
    auto D = SymbolicSize{"hidden_size"};
    auto device = SymbolicDevice{};
    TensorMatcher({N, D}).with_strides({-1, 1}).with_device<kDLCUDA>(device).with_dtype<T>().verify(input, "input");
    TensorMatcher({N, D}).with_strides({-1, 1}).with_device<kDLCUDA>(device).with_dtype<T>().verify(
        residual, "residual");
    TensorMatcher({D}).with_device<kDLCUDA>(device).with_dtype<T>().verify(weight, "weight");
    Params p{};
    p.num_sets = 1;
    p.eps = static_cast<float>(eps);
    p.set[0] = make_rows(input, input, weight.data_ptr());
    p.set[0].residual = residual.data_ptr();
    p.set[0].res_s0 = residual.stride(0);
    launch_rows<T, kHidden>(p, device.unwrap(), enable_pdl);
  }

  // q = rmsnorm(q) * q_weight and k = rmsnorm(k) * k_weight over whole rows, in one launch.
  static void across_heads(
      tvm::ffi::TensorView q,
      tvm::ffi::TensorView k,
      tvm::ffi::TensorView q_weight,
      tvm::ffi::TensorView k_weight,
      double eps,
      bool enable_pdl) {
    using namespace host;
    auto N = SymbolicSize{"num_tokens"};
    auto Dq = SymbolicSize{"q_hidden"};
    auto Dk = SymbolicSize{"k_hidden"};
    auto device = SymbolicDevice{};
    TensorMatcher({N, Dq}).with_strides({-1, 1}).with_device<kDLCUDA>(device).with_dtype<T>().verify(q, "q");
    TensorMatcher({N, Dk}).with_strides({-1, 1}).with_device<kDLCUDA>(device).with_dtype<T>().verify(k, "k");
    TensorMatcher({Dq}).with_device<kDLCUDA>(device).with_dtype<T>().verify(q_weight, "q_weight");
    TensorMatcher({Dk}).with_device<kDLCUDA>(device).with_dtype<T>().verify(k_weight, "k_weight");
    Params p{};
    p.num_sets = 2;
    p.eps = static_cast<float>(eps);
    p.set[0] = make_rows(q, q, q_weight.data_ptr());
    p.set[1] = make_rows(k, k, k_weight.data_ptr());
    launch_rows<T, kHidden>(p, device.unwrap(), enable_pdl);
  }
};

}  // namespace jit_kernel::norm
