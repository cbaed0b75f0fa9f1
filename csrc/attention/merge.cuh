// merge_attn_states: two attention results over disjoint key sets, merged into the result over
// their union (vLLM's merge_attn_states, FlashInfer's merge_state, in natural-log LSEs):
//
//   m   = max(lse_a, lse_b)
//   out = (out_a * exp(lse_a - m) + out_b * exp(lse_b - m)) / (exp(lse_a - m) + exp(lse_b - m))
//   lse = m + log(exp(lse_a - m) + exp(lse_b - m))
//
//   out_a, out_b, out [N, H, D]  T (fp32, bf16 or fp16), unit last stride, any other strides
//   lse_a, lse_b, lse [N, H]     float32, any strides
//
// An LSE of -inf is an empty key set: the other part is the result exactly (its values, not a
// product with weights, so whatever the empty part's values hold does not reach the output); both
// -inf give out 0 and lse -inf. A NaN or +inf LSE on either side gives NaN (out and lse).
//
// One pass, memory bound: one thread per 16 bytes of a row (a scalar per thread where the rows are
// not 16-byte vectors), reading each input row once and its two LSEs.
#pragma once

#include "common.cuh"

#include <sgl_kernel/runtime.cuh>
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>
#include <sgl_kernel/vec.cuh>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace jit_kernel::attention {

inline constexpr uint32_t kMergeThreads = 256;

struct MergeParams {
  const void* a;
  const void* b;
  void* out;
  int64_t a_stride_n, a_stride_h, b_stride_n, b_stride_h, out_stride_n, out_stride_h;  // elements
  const float* lse_a;
  const float* lse_b;
  float* lse;
  int64_t lse_a_stride_n, lse_a_stride_h, lse_b_stride_n, lse_b_stride_h, lse_stride_n, lse_stride_h;
  int64_t heads;
  int64_t vectors;  // vectors per row: D / kVec
  int64_t total;    // N * H * vectors
};

namespace detail {

// What a row's merge takes from each side.
enum class Merge : int { kZero, kOnlyA, kOnlyB, kBoth, kNaN };

}  // namespace detail

namespace detail {

// The (token, head, vector) of flat index i, in 32-bit arithmetic where the grid's indices fit it
// (64-bit division is a long instruction sequence on the GPU, and every thread does two).
template <typename I>
SGL_DEVICE void merge_position(const MergeParams& p, int64_t i, int64_t& n, int64_t& h, int64_t& vector) {
  const I row = static_cast<I>(i) / static_cast<I>(p.vectors);
  vector = static_cast<int64_t>(static_cast<I>(i) - row * static_cast<I>(p.vectors));
  const I token = row / static_cast<I>(p.heads);
  n = static_cast<int64_t>(token);
  h = static_cast<int64_t>(row - token * static_cast<I>(p.heads));
}

}  // namespace detail

template <typename T, int kVec>
__global__ __launch_bounds__(kMergeThreads) void merge_states_kernel(const __grid_constant__ MergeParams p) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kMergeThreads + threadIdx.x;
  device::PDLWaitPrimary();  // launched with PDL: wait for the previous kernel's writes
  device::PDLTriggerSecondary();
  if (i >= p.total) return;
  int64_t n, h, vector;
  if (p.total <= int64_t{0xffffffff}) {
    detail::merge_position<uint32_t>(p, i, n, h, vector);
  } else {
    detail::merge_position<uint64_t>(p, i, n, h, vector);
  }
  // Both rows are loaded with the LSEs, before the LSEs decide what the merge takes: a load that
  // waited for them would put a second memory round trip on every thread's path. Each byte is read
  // once (evict-first); a row an empty part's LSE discards is read but never used.
  const T* a_row = static_cast<const T*>(p.a) + n * p.a_stride_n + h * p.a_stride_h;
  const T* b_row = static_cast<const T*>(p.b) + n * p.b_stride_n + h * p.b_stride_h;
  device::AlignedVector<T, kVec> va, vb, vo;
  va.load_evict_first(a_row, vector);
  vb.load_evict_first(b_row, vector);
  const float la = p.lse_a[n * p.lse_a_stride_n + h * p.lse_a_stride_h];
  const float lb = p.lse_b[n * p.lse_b_stride_n + h * p.lse_b_stride_h];

  detail::Merge merge = detail::Merge::kBoth;
  float wa = 0.0f, wb = 0.0f, lse = kNegInf;
  if (isnan(la) || isnan(lb) || la == -kNegInf || lb == -kNegInf) {
    merge = detail::Merge::kNaN;
    lse = std::numeric_limits<float>::quiet_NaN();
  } else if (la == kNegInf && lb == kNegInf) {
    merge = detail::Merge::kZero;
  } else if (lb == kNegInf) {
    merge = detail::Merge::kOnlyA;
    lse = la;
  } else if (la == kNegInf) {
    merge = detail::Merge::kOnlyB;
    lse = lb;
  } else {
    const float m = fmaxf(la, lb);
    const float ea = exp2f((la - m) * kLog2e), eb = exp2f((lb - m) * kLog2e);
    const float sum = ea + eb;  // in [1, 2]
    wa = ea / sum;
    wb = eb / sum;
    lse = m + logf(sum);
  }

  T* out_row = static_cast<T*>(p.out) + n * p.out_stride_n + h * p.out_stride_h;
  if (merge == detail::Merge::kOnlyA) {
    va.store(out_row, vector);
  } else if (merge == detail::Merge::kOnlyB) {
    vb.store(out_row, vector);
  } else {
    float o[kVec];
    if (merge == detail::Merge::kBoth) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        o[e] = dtype_trait<fp32_t>::from(va[e]) * wa + dtype_trait<fp32_t>::from(vb[e]) * wb;
      }
    } else {
      const float fill = merge == detail::Merge::kZero ? 0.0f : std::numeric_limits<float>::quiet_NaN();
#pragma unroll
      for (int e = 0; e < kVec; ++e) o[e] = fill;
    }
#pragma unroll
    for (int e = 0; e < kVec; ++e) vo[e] = dtype_trait<T>::from(o[e]);
    vo.store(out_row, vector);
  }
  if (vector == 0) p.lse[n * p.lse_stride_n + h * p.lse_stride_h] = lse;
}

template <typename T>
struct MergeAttnStates {
  static constexpr int kVec = static_cast<int>(16 / sizeof(T));

  // Whether `t`'s data and its row strides (dims 0 and 1, where they are used) are 16-byte aligned.
  static bool rows_aligned(const tvm::ffi::TensorView& t) {
    if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return false;
    for (int dim = 0; dim < 2; ++dim) {
      if (t.size(dim) > 1 && (t.stride(dim) * static_cast<int64_t>(sizeof(T))) % 16 != 0) return false;
    }
    return true;
  }

  static void run(
      tvm::ffi::TensorView out,
      tvm::ffi::TensorView lse,
      tvm::ffi::TensorView out_a,
      tvm::ffi::TensorView lse_a,
      tvm::ffi::TensorView out_b,
      tvm::ffi::TensorView lse_b,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    auto tokens = SymbolicSize{"num_tokens"};
    auto heads = SymbolicSize{"num_heads"};
    auto head_dim = SymbolicSize{"head_dim"};
    auto device = SymbolicDevice{};
    TensorMatcher::cuda_rows<T>({tokens, heads, head_dim}, device)
        .verify(out_a, "out_a")
        .verify(out_b, "out_b")
        .verify(out, "out");
    TensorMatcher({tokens, heads})
        .with_strides({-1, -1})
        .with_dtype<fp32_t>()
        .with_device<kDLCUDA>(device)
        .verify(lse_a, "lse_a")
        .verify(lse_b, "lse_b")
        .verify(lse, "lse");
    const int64_t n = tokens.unwrap(), h = heads.unwrap(), d = head_dim.unwrap();
    if (n * h * d == 0 || has_no_data(out)) return;  // the fake (torch.compile) call ends here: checks only

    MergeParams p{};
    p.a = out_a.data_ptr();
    p.b = out_b.data_ptr();
    p.out = out.data_ptr();
    p.a_stride_n = out_a.stride(0);
    p.a_stride_h = out_a.stride(1);
    p.b_stride_n = out_b.stride(0);
    p.b_stride_h = out_b.stride(1);
    p.out_stride_n = out.stride(0);
    p.out_stride_h = out.stride(1);
    p.lse_a = static_cast<const float*>(lse_a.data_ptr());
    p.lse_b = static_cast<const float*>(lse_b.data_ptr());
    p.lse = static_cast<float*>(lse.data_ptr());
    p.lse_a_stride_n = lse_a.stride(0);
    p.lse_a_stride_h = lse_a.stride(1);
    p.lse_b_stride_n = lse_b.stride(0);
    p.lse_b_stride_h = lse_b.stride(1);
    p.lse_stride_n = lse.stride(0);
    p.lse_stride_h = lse.stride(1);
    p.heads = h;
    const DLDevice dev = device.unwrap();
    const bool pdl = runtime::resolve_pdl(enable_pdl, dev.device_id);
    const bool vectors = d % kVec == 0 && rows_aligned(out_a) && rows_aligned(out_b) && rows_aligned(out);
    p.vectors = vectors ? d / kVec : d;
    p.total = n * h * p.vectors;
    const int64_t blocks = div_ceil(p.total, int64_t{kMergeThreads});
    RuntimeCheck(blocks <= int64_t{0x7fffffff}, "merge_attn_states: ", p.total, " elements do not fit one grid");
    const auto kernel = vectors ? merge_states_kernel<T, kVec> : merge_states_kernel<T, 1>;
    LaunchKernel(static_cast<uint32_t>(blocks), kMergeThreads, dev).enable_pdl(pdl)(kernel, p);
  }
};

}  // namespace jit_kernel::attention
