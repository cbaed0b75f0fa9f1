// fused_inplace_qknorm: per-head RMSNorm of q `[N, Hq, D]` and k `[N, Hk, D]` in place, one launch.
//
// Template parameters: kHeadDim (64, 128, 256, ... whole 16-byte vectors; 0 = generic, D at run
// time) and T. The fast kernel gives each head kHeadDim / kVecElems lanes (8, 16 or 32 for
// 16-bit types), one 16-byte vector per lane, reduced with warp shuffles; anything else
// (other D, misaligned or odd strides) falls back to the generic one-block-per-head kernel.
#pragma once

#include "common.cuh"

namespace jit_kernel::norm {

template <typename T, int64_t kHeadDim>
struct HeadKernel {
  static constexpr int64_t kN = kVecElems<T>;
  static_assert(kHeadDim % kN == 0, "specialised head dims must be whole 16-byte vectors");
  static constexpr uint32_t kLanes = static_cast<uint32_t>(kHeadDim / kN);
  static_assert(kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "a head must fit one warp, in a power of two lanes");
  static constexpr uint32_t kThreads = 256;
  static constexpr uint32_t kHeadsPerBlock = kThreads / kLanes;
};

template <typename T, int64_t kHeadDim>
__global__ void __launch_bounds__(256) head_kernel(const Params p) {
  using K = HeadKernel<T, kHeadDim>;
  using Vec = device::AlignedVector<T, K::kN>;
  const int64_t head = static_cast<int64_t>(blockIdx.x) * K::kHeadsPerBlock + threadIdx.x / K::kLanes;
  const uint32_t lane = threadIdx.x % K::kLanes;
  const bool is_q = head < p.set[0].rows;
  const RowSet& s = p.set[is_q ? 0 : 1];
  const int64_t row = is_q ? head : head - p.set[0].rows;
  const bool active = is_q || (p.num_sets > 1 && row < s.rows);
  // The offsets (a 64-bit division by the heads) read only parameters: before the wait, so that
  // under PDL they overlap the previous kernel.
  int64_t in_off = 0, out_off = 0, res_off = 0;
  if (active) row_offsets(s, row, in_off, out_off, res_off);
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  Vec x, w;
  float sum = 0.f;
  if (active) {
    x.load(static_cast<const T*>(s.in) + in_off, lane);
    w.load(static_cast<const T*>(s.weight), lane);  // before the reduction: off the critical path
#pragma unroll
    for (int j = 0; j < K::kN; ++j) {
      const float f = dtype_trait<fp32_t>::from(x[j]);
      sum += f * f;
    }
  }
  // Inactive groups are whole groups of kLanes lanes, so every shuffle partner is present.
  sum = device::warp::reduce_sum<float, K::kLanes>(sum);
  if (!active) return;
  const float rrms = rsqrtf(sum * (1.f / static_cast<float>(kHeadDim)) + p.eps);
  Vec y;
#pragma unroll
  for (int j = 0; j < K::kN; ++j) {
    y[j] = dtype_trait<T>::from(dtype_trait<fp32_t>::from(x[j]) * rrms * dtype_trait<fp32_t>::from(w[j]));
  }
  y.store(static_cast<T*>(s.out) + out_off, lane);
}

template <int64_t kHeadDim, typename T>
struct QKNorm {
  static void run(
      tvm::ffi::TensorView q,
      tvm::ffi::TensorView k,
      tvm::ffi::TensorView q_weight,
      tvm::ffi::TensorView k_weight,
      double eps,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    auto N = SymbolicSize{"num_tokens"};
    auto D = SymbolicSize{"head_dim"};
    auto device = SymbolicDevice{};
    TensorMatcher::cuda_rows<T>({N, -1, D}, device).verify(q, "q");
    TensorMatcher::cuda_rows<T>({N, -1, D}, device).verify(k, "k");
    TensorMatcher({D}).with_device<kDLCUDA>(device).with_dtype<T>().verify(q_weight, "q_weight");
    TensorMatcher({D}).with_device<kDLCUDA>(device).with_dtype<T>().verify(k_weight, "k_weight");
    check_eps_and_dim(eps, D.unwrap(), "q");
    if (has_no_data(q)) return;
    const auto dev = device.unwrap();
    const bool pdl = runtime::resolve_pdl(enable_pdl, dev.device_id);
    Params p{};
    p.num_sets = 2;
    p.eps = static_cast<float>(eps);
    p.set[0] = make_rows(q, q, q_weight.data_ptr());
    p.set[1] = make_rows(k, k, k_weight.data_ptr());
    const int64_t heads = p.set[0].rows + p.set[1].rows;
    if (heads == 0) return;
    if constexpr (kHeadDim > 0) {
      if (D.unwrap() == kHeadDim && vector_aligned(p, sizeof(T))) {
        using K = HeadKernel<T, kHeadDim>;
        const int64_t blocks = div_ceil(heads, static_cast<int64_t>(K::kHeadsPerBlock));
        RuntimeCheck(blocks < (int64_t{1} << 31), "qknorm: too many heads: ", heads);
        LaunchKernel(static_cast<uint32_t>(blocks), K::kThreads, dev).enable_pdl(pdl)(head_kernel<T, kHeadDim>, p);
        return;
      }
    }
    launch_generic<T>(p, dev, pdl);
  }
};

}  // namespace jit_kernel::norm
