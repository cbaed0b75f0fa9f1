// rmsnorm, fused_add_rmsnorm (also in SGLang's cast_x_before_out_mul rounding: fused_add_cast)
// and qknorm_across_heads over rows `[N, D]` with a row stride.
//
// Template parameters: kHidden (a hidden size the fast kernel is specialised for, or 0 for the
// generic kernel that takes D at run time) and T (fp16_t, bf16_t; fp32_t via kHidden = 0).
// A launch whose rows are not whole, aligned 16-byte vectors falls back to the generic kernel,
// so every config accepts every D.
#pragma once

#include "common.cuh"

#include <type_traits>

namespace jit_kernel::norm {

// The row kernel for a hidden size known at compile time (normalize_row, in common.cuh, holds the
// row in registers). Two shapes, both sized at compile time so that no vector index needs a
// bounds check:
// - one CTA per row: kHidden / kVecElems vectors over at most 512 threads; the plain kernel
//   over rows of 257-512 vectors (D 4096 bf16) uses 2 vectors per thread on half as many threads
//   (the fused kernel keeps one);
// - kWarpRows rows per CTA, one warp per row (warp-shuffle reduction, no barrier), for rows of at
//   most 128 vectors when there are many rows: a CTA per short row makes the CTA launch rate the
//   limit.
// The measurements behind both choices: docs/design/norm.md.
template <typename T, int64_t kHidden, bool kFused, int kRowsPerCta>
struct RowShape {
  static constexpr int64_t kN = kVecElems<T>;
  static_assert(kHidden % kN == 0, "specialised hidden sizes must be whole 16-byte vectors");
  static constexpr int64_t kVecs = kHidden / kN;
  static constexpr int64_t kMaxGroup = kRowsPerCta > 1 ? 32 : (!kFused && kVecs > 256 && kVecs <= 512 ? 256 : 512);
  static constexpr int64_t kPer = (kVecs + kMaxGroup - 1) / kMaxGroup;  // vectors per thread
  static constexpr int64_t kGroup = kRowsPerCta > 1 ? 32 : ((kVecs + kPer - 1) / kPer + 31) / 32 * 32;
  static constexpr int kThreads = static_cast<int>(kGroup * kRowsPerCta);
  // Every thread holds kPer whole vectors: no bounds check needed (see row_kernel for the one
  // place that keeps it).
  static constexpr bool kExact = kPer * kGroup == kVecs;
};

// Warp rows: 16 rows per CTA, for rows of at most 128 vectors, from 2048 rows (fewer rows: one CTA
// per row; see docs/design/norm.md).
inline constexpr int kWarpRows = 16;
inline constexpr int64_t kWarpRowsMaxVecs = 128;
inline constexpr int64_t kWarpRowsMinRows = 2048;

// kCast: the fused kernel of SGLang's cast_x_before_out_mul (see common.cuh), same shapes.
template <typename T, int64_t kHidden, bool kFused, bool kEarlyWeight, int kRowsPerCta, bool kCast = false>
__global__ void __launch_bounds__(RowShape<T, kHidden, kFused, kRowsPerCta>::kThreads) row_kernel(const Params p) {
  using K = RowShape<T, kHidden, kFused, kRowsPerCta>;
  __shared__ float smem[32];
  const RowSet& s = p.set[blockIdx.y];
  // Rows of [N, D] (inner == 1): the offsets are row * stride.
  const int64_t row =
      kRowsPerCta > 1 ? static_cast<int64_t>(blockIdx.x) * kRowsPerCta + threadIdx.x / K::kGroup : blockIdx.x;
  const uint32_t lane = kRowsPerCta > 1 ? threadIdx.x % K::kGroup : threadIdx.x;
  // Whole CTA (one row per CTA) or whole warp (no barrier then): the sets may differ in rows.
  if (row >= s.rows) return;
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  const auto reduce = [&](float v) {
    if constexpr (kRowsPerCta > 1) {
      return device::warp::reduce_sum(v);
    } else {
      return device::cta::all_reduce_sum(v, smem);
    }
  };
  normalize_row<T, static_cast<int>(K::kPer), RowOptions{.fused = kFused, .early_weight = kEarlyWeight, .cast = kCast}>(
      static_cast<const T*>(s.in) + row * s.in_s0,
      static_cast<T*>(s.out) + row * s.out_s0,
      kFused ? static_cast<T*>(s.residual) + row * s.res_s0 : nullptr,
      static_cast<const T*>(s.weight),
      lane,
      K::kGroup,
      K::kVecs,
      // With one vector per thread the check is one predicate, and it keeps ptxas from issuing
      // the fused kernel's early weight load after the reduction, which would put the weight's
      // round trip back on the critical path (docs/design/norm.md).
      K::kExact && !(kFused && kEarlyWeight && K::kPer == 1),
      1.f / static_cast<float>(kHidden),
      p.eps,
      reduce);
}

// Up to about two rows per SM, a launch is latency-bound (see RowOptions::early_weight). The
// fused kernel over rows of at most 128 vectors (128-thread CTAs) stays so up to 2048 rows, and
// keeps the early weight load up to there; over longer rows it keeps it up to kLatencyBoundRows
// (see docs/design/norm.md).
inline constexpr int64_t kLatencyBoundRows = 256;
inline constexpr int64_t kFusedShortRowsLatencyBoundRows = 2048;

template <typename T, int64_t kHidden, bool kFused, int kRowsPerCta, bool kCast = false>
void launch_row_kernel(const Params& p, int64_t rows, DLDevice device, bool enable_pdl) {
  const dim3 grid(static_cast<uint32_t>((rows + kRowsPerCta - 1) / kRowsPerCta), p.num_sets);
  const auto threads = static_cast<uint32_t>(RowShape<T, kHidden, kFused, kRowsPerCta>::kThreads);
  auto kernel = row_kernel<T, kHidden, kFused, false, kRowsPerCta, kCast>;
  if constexpr (kRowsPerCta == 1) {  // warp rows only run with many rows
    constexpr bool kShortFused = kFused && RowShape<T, kHidden, kFused, 1>::kVecs <= kWarpRowsMaxVecs;
    if (rows <= (kShortFused ? kFusedShortRowsLatencyBoundRows : kLatencyBoundRows)) {
      kernel = row_kernel<T, kHidden, kFused, true, 1, kCast>;
    }
  }
  host::LaunchKernel(grid, threads, device).enable_pdl(enable_pdl)(kernel, p);
}

// kCast: the fused-add launch of SGLang's cast_x_before_out_mul (16-bit T; see common.cuh).
template <typename T, int64_t kHidden, bool kCast = false>
void launch_rows(const Params& p, DLDevice device, bool enable_pdl) {
  const int64_t rows = max_rows(p);
  if (rows == 0) return;
  if constexpr (kHidden > 0) {
    bool fast = vector_aligned(p, sizeof(T));
    for (int i = 0; i < p.num_sets; ++i) fast = fast && p.set[i].dim == kHidden && p.set[i].inner == 1;
    if (fast) {
      host::RuntimeCheck(rows < (int64_t{1} << 31), "rmsnorm: at most 2^31 - 1 rows, got ", rows);
      if constexpr (kCast) {
        launch_row_kernel<T, kHidden, true, 1, true>(p, rows, device, enable_pdl);
        return;
      }
      if (p.set[0].residual != nullptr) {
        launch_row_kernel<T, kHidden, true, 1>(p, rows, device, enable_pdl);
        return;
      }
      if constexpr (RowShape<T, kHidden, false, 1>::kVecs <= kWarpRowsMaxVecs) {
        if (rows >= kWarpRowsMinRows) {
          launch_row_kernel<T, kHidden, false, kWarpRows>(p, rows, device, enable_pdl);
          return;
        }
      }
      launch_row_kernel<T, kHidden, false, 1>(p, rows, device, enable_pdl);
      return;
    }
  }
  launch_generic<T, kCast>(p, device, enable_pdl);
}

template <int64_t kHidden, typename T>
struct RMSNorm {
  // out = rmsnorm(input) * weight; out may be input (in place). Every entry takes `enable_pdl`:
  // launch with programmatic dependent launch (sm_90+; the kernels wait for their predecessor
  // before their first memory access, so it is safe whatever runs before or after).
  static void rmsnorm(
      tvm::ffi::TensorView out,
      tvm::ffi::TensorView input,
      tvm::ffi::TensorView weight,
      double eps,
      tvm::ffi::Optional<bool> enable_pdl) {
    run_rows<false>(out, input, nullptr, weight, eps, enable_pdl);
  }

  // residual = T(input + residual); input = rmsnorm(residual) * weight.
  static void fused_add(
      tvm::ffi::TensorView input,
      tvm::ffi::TensorView residual,
      tvm::ffi::TensorView weight,
      double eps,
      tvm::ffi::Optional<bool> enable_pdl) {
    run_rows<false>(input, input, &residual, weight, eps, enable_pdl);
  }

  // SGLang's fused_add_rmsnorm(..., cast_x_before_out_mul=True), Hugging Face's rounding order:
  // with s = float(input) + float(residual) kept unrounded, residual = T(s) and
  // input = T(float(T(s * rsqrt(mean(s^2) + eps))) * float(weight)). A separate export, so that
  // fused_add keeps its signature and its kernels. In fp32 both roundings are the identity, and
  // fused_add's kernels compute the same bits: no second set of fp32 kernels.
  static void fused_add_cast(
      tvm::ffi::TensorView input,
      tvm::ffi::TensorView residual,
      tvm::ffi::TensorView weight,
      double eps,
      tvm::ffi::Optional<bool> enable_pdl) {
    run_rows<!std::is_same_v<T, fp32_t>>(input, input, &residual, weight, eps, enable_pdl);
  }

  // q = rmsnorm(q) * q_weight and k = rmsnorm(k) * k_weight over whole rows, in one launch.
  static void across_heads(
      tvm::ffi::TensorView q,
      tvm::ffi::TensorView k,
      tvm::ffi::TensorView q_weight,
      tvm::ffi::TensorView k_weight,
      double eps,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    auto N = SymbolicSize{"num_tokens"};
    auto Dq = SymbolicSize{"q_hidden"};
    auto Dk = SymbolicSize{"k_hidden"};
    auto device = SymbolicDevice{};
    TensorMatcher::cuda_rows<T>({N, Dq}, device).verify(q, "q");
    TensorMatcher::cuda_rows<T>({N, Dk}, device).verify(k, "k");
    TensorMatcher({Dq}).with_device<kDLCUDA>(device).with_dtype<T>().verify(q_weight, "q_weight");
    TensorMatcher({Dk}).with_device<kDLCUDA>(device).with_dtype<T>().verify(k_weight, "k_weight");
    check_eps_and_dim(eps, Dq.unwrap(), "q");
    check_eps_and_dim(eps, Dk.unwrap(), "k");
    if (has_no_data(q)) return;
    Params p{};
    p.num_sets = 2;
    p.eps = static_cast<float>(eps);
    p.set[0] = make_rows(q, q, q_weight.data_ptr());
    p.set[1] = make_rows(k, k, k_weight.data_ptr());
    const auto dev = device.unwrap();
    launch_rows<T, kHidden>(p, dev, runtime::resolve_pdl(enable_pdl, dev.device_id));
  }

 private:
  // out = rmsnorm(input) * weight, or with `residual` residual = T(input + residual) and
  // out = rmsnorm(residual) * weight (out is input then); kCast: fused_add_cast's rounding.
  template <bool kCast>
  static void run_rows(
      tvm::ffi::TensorView out,
      tvm::ffi::TensorView input,
      const tvm::ffi::TensorView* residual,
      tvm::ffi::TensorView weight,
      double eps,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    auto N = SymbolicSize{"num_tokens"};
    auto D = SymbolicSize{"hidden_size"};
    auto device = SymbolicDevice{};
    TensorMatcher::cuda_rows<T>({N, D}, device).verify(input, "input");
    if (residual != nullptr) {
      TensorMatcher::cuda_rows<T>({N, D}, device).verify(*residual, "residual");
    } else {
      TensorMatcher::cuda_rows<T>({N, D}, device).verify(out, "out");
    }
    TensorMatcher({D}).with_device<kDLCUDA>(device).with_dtype<T>().verify(weight, "weight");
    check_eps_and_dim(eps, D.unwrap(), "input");
    if (has_no_data(out)) return;
    Params p{};
    p.num_sets = 1;
    p.eps = static_cast<float>(eps);
    p.set[0] = make_rows(out, input, weight.data_ptr());
    if (residual != nullptr) {
      p.set[0].residual = residual->data_ptr();
      p.set[0].res_s0 = residual->stride(0);
    }
    const auto dev = device.unwrap();
    launch_rows<T, kHidden, kCast>(p, dev, runtime::resolve_pdl(enable_pdl, dev.device_id));
  }
};

}  // namespace jit_kernel::norm
