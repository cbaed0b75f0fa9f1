// RMSNorm's row kernels with an epilogue: each normalised vector y goes to the launch kind's
// epilogue policy instead of a plain store. The kinds are Gemma's RMSNorm (the weight applied as
// (1 + w), y stored; gemma.cuh) and the fused fp8 quantisers (norm_quant.cuh); each kind's Policy
// and TwoPassEpilogue specialisations live with it, Gemma's here. Here y = T(x * rrms * w) (Gemma:
// T(x * rrms * (1 + w))) is the normalised row rounded to the activation dtype T.
//
// Every row is reduced by the same threads in the same order as the rmsnorm launch of that row
// shape does (`Mapping` below), so that y is rmsnorm's bit for bit: the sum of squares in fp32 is
// order-dependent, and one last bit of rrms moves a rounding of y now and then. Row shapes (as
// rmsnorm.cuh, whose RowShape and tuning constants this file uses):
// - a config specialised for a hidden size (kHidden > 0, 16-bit T): RowShape kernels, the row
//   in registers, no bounds checks; up to 16 rows of 12 or more warps on sm_90+, each row over a
//   cluster of CTAs that reduces it in the same order (epilogue_cluster_kernel); up to 256 rows of
//   12 or more warps of one vector a thread, two vectors a thread on half the threads, again in the
//   same order (epilogue_paired_kernel);
// - the generic config (kHidden = 0): the same kernels with the shape chosen at run time, for the
//   sizes rmsnorm specialises (kRmsnormHiddenSizes) the RowShape one, else bounded_row_kernel's;
// - rows that are not whole aligned 16-byte vectors (input, residual, weight), or longer than 2048
//   vectors: the two-pass kernel of common.cuh's generic_kernel (three passes for per-token).
// Misaligned outputs (q, normed_out) are written element by element and do not change the shape.
// What each kernel is for, and the measurements behind the rules between them:
// docs/design/norm-quant.md.
#pragma once

#include "rmsnorm.cuh"

#include <sgl_kernel/cluster.cuh>
#include <sgl_kernel/cta.cuh>
#include <sgl_kernel/warp.cuh>

#include <cstdint>
#include <type_traits>

namespace jit_kernel::norm {

// The hidden sizes ops/norm.py specialises rmsnorm for in fp16 and bf16 (families.py's
// NORM_HIDDEN_SIZES; tests/test_norm_quant.py checks that the two lists agree): their rows are
// reduced in RowShape's order.
inline constexpr int64_t kRmsnormHiddenSizes[] = {1024, 2048, 4096, 5120, 7168, 8192, 16384};

inline constexpr bool rmsnorm_specialises(int64_t dim) {
  for (const int64_t d : kRmsnormHiddenSizes) {
    if (d == dim) return true;
  }
  return false;
}

// What a launch does with the normalised rows (the epilogue's kind).
enum class Epi : int {
  kGemma,   // stored to `out` as T, the weight applied as (1 + w)
  kTensor,  // static per-tensor fp8
  kToken,   // dynamic per-row fp8
  kGroup,   // dynamic per-group fp8
};

// The epilogue's arguments (those of kinds that do not use them are left zero).
struct EpiArgs {
  uint8_t* q;            // fp8 rows of `dim` bytes, contiguous
  float* s;              // scales: row r's at s + r * s_row (+ g * s_col for group g)
  int64_t s_row, s_col;  // element strides of the scales (packed: int32 elements)
  const float* scale;    // static scale (nullptr: scale_value)
  float scale_value;
  float quant_eps;      // the group scale's floor
  int32_t group_vecs;   // group size in 16-byte vectors (power of two, <= 32)
  int32_t group_size;   // in elements
  int32_t groups;       // per row
  bool q_aligned;       // q is kN-byte aligned (rows of whole vectors follow)
  bool normed_aligned;  // the normed output's rows are 16-byte aligned
  bool e5m2;            // static q in float8_e5m2 (else e4m3)
  bool ue8m0;           // group scales rounded up to powers of two
  bool packed;          // group scales as UE8M0 bytes, 4 per int32 (see store_group_scale)
};

// The normalised vector y at vector v of `out` (nullptr: no normed output).
template <typename T, std::size_t kN>
SGL_DEVICE void store_normed(T* out, int64_t v, const device::AlignedVector<T, kN>& y, bool aligned) {
  if (out == nullptr) return;
  if (aligned) {
    y.store(out, v);
  } else {
#pragma unroll
    for (std::size_t j = 0; j < kN; ++j) out[v * static_cast<int64_t>(kN) + j] = y[j];
  }
}

// ---------------------------------------------------------------------------------------------
// The epilogue policies normalize_row calls (common.cuh's StoreRow interface), one per kind (Gemma's
// here, the fp8 kinds' in norm_quant.cuh). A
// thread builds one per row after its PDL wait (the static scale may come from the previous
// kernel); `finish`, called by every thread of the row after normalize_row, runs what needs the
// whole row or group: `row_max` is the maximum over the row's threads.

// kSlotVecs: how many vectors apart a thread's slots are, where that is less than a group
// (epilogue_paired_kernel); 0: slots are whole warps apart.
template <Epi kEpi, typename T, int kPer, int kSlotVecs = 0>
struct Policy;

template <typename T, int kPer, int kSlotVecs>
struct Policy<Epi::kGemma, T, kPer, kSlotVecs> {
  static constexpr bool kWeightPlusOne = true;
  bool aligned;
  SGL_DEVICE Policy(const EpiArgs& a, int64_t, int64_t, uint32_t) : aligned(a.normed_aligned) {}
  template <typename Vec>
  SGL_DEVICE void operator()(T* out, const Vec& y, int64_t v, int) const {
    store_normed(out, v, y, aligned);
  }
  template <typename RowMax>
  SGL_DEVICE void finish(RowMax) const {}
};

// ---------------------------------------------------------------------------------------------
// Kernels

// Row `row` of p.set[0] in RowShape K, as this thread's share `lane` of it (K::kGroup threads a row):
// normalize_row with the kind's epilogue, then the epilogue's finish. `reduce` sums over the row's
// threads, `row_max` takes their maximum.
template <Epi kEpi, typename T, typename K, bool kFused, bool kEarlyWeight, typename Reduce, typename RowMax>
SGL_DEVICE void shaped_row(
    const Params& p, const EpiArgs& a, int64_t row, uint32_t lane, Reduce reduce, RowMax row_max) {
  const RowSet& s = p.set[0];
  Policy<kEpi, T, static_cast<int>(K::kPer)> epilogue(a, row, K::kVecs * K::kN, lane);
  normalize_row<
      T,
      static_cast<int>(K::kPer),
      RowOptions{.fused = kFused, .early_weight = kEarlyWeight, .paired = true}>(
      static_cast<const T*>(s.in) + row * s.in_s0,
      s.out == nullptr ? nullptr : static_cast<T*>(s.out) + row * s.out_s0,
      kFused ? static_cast<T*>(s.residual) + row * s.res_s0 : nullptr,
      static_cast<const T*>(s.weight),
      lane,
      K::kGroup,
      K::kVecs,
      K::kExact && !(kFused && kEarlyWeight && K::kPer == 1),  // as row_kernel
      1.f / static_cast<float>(K::kVecs * K::kN),
      p.eps,
      reduce,
      epilogue);
  epilogue.finish(row_max);
}

// One row per CTA (or kRowsPerCta rows, one warp each) of a hidden size known at compile time:
// rmsnorm.cuh's row_kernel with an epilogue.
template <Epi kEpi, typename T, int64_t kHidden, bool kFused, bool kEarlyWeight, int kRowsPerCta>
__global__ void __launch_bounds__(RowShape<T, kHidden, kFused, kRowsPerCta>::kThreads)
    epilogue_row_kernel(const Params p, const EpiArgs a) {
  using K = RowShape<T, kHidden, kFused, kRowsPerCta>;
  alignas(16) __shared__ float smem[32];
  __shared__ float smem_max[32];
  const RowSet& s = p.set[0];
  const int64_t row =
      kRowsPerCta > 1 ? static_cast<int64_t>(blockIdx.x) * kRowsPerCta + threadIdx.x / K::kGroup : blockIdx.x;
  const uint32_t lane = kRowsPerCta > 1 ? threadIdx.x % K::kGroup : threadIdx.x;
  if (row >= s.rows) return;  // whole CTA, or whole warp
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  const auto reduce = [&](float v) {
    if constexpr (kRowsPerCta > 1) {
      return device::warp::reduce_sum(v);
    } else {
      v = device::warp::reduce_sum(v);  // cta::all_reduce_sum's, its second butterfly from smem
      if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = v;
      __syncthreads();
      return sum_warp_partials<K::kThreads / 32>(smem);
    }
  };
  const auto row_max = [&](float v) {
    if constexpr (kRowsPerCta > 1) {
      return device::warp::reduce_max_nonneg(v);
    } else {
      return device::cta::all_reduce_max_nonneg(v, smem_max);
    }
  };
  shaped_row<kEpi, T, K, kFused, kEarlyWeight>(p, a, row, lane, reduce, row_max);
}

// Few rows: a row over a cluster of kCluster CTAs (sm_90+), RowShape's threads split among them in
// rank order, so that each row is reduced bit for bit as epilogue_row_kernel (and rmsnorm) reduce it
// (cluster::WarpExchange). At few rows the launch is issue-bound: after the reduction every warp of
// the row runs the epilogue at once, and one CTA per row leaves all of them to one SM's four
// schedulers; a cluster spreads them over kCluster SMs for one exchange through distributed shared
// memory per reduction. (rmsnorm's own kernels, whose epilogue is one store, stay one CTA a row.)
template <Epi kEpi, typename T, int64_t kHidden, bool kFused, int kCluster>
__global__ void __launch_bounds__(RowShape<T, kHidden, kFused, 1>::kThreads / kCluster)
    epilogue_cluster_kernel(const Params p, const EpiArgs a) {
  using K = RowShape<T, kHidden, kFused, 1>;
  constexpr int kThreads = K::kThreads / kCluster;
  static_assert(kThreads % 32 == 0 && K::kThreads / 32 <= 32, "whole warps, at most 32 per row");
  __shared__ device::cluster::WarpExchange<kCluster, kThreads / 32, kEpi == Epi::kToken ? 2 : 1> exchange;
  const int64_t row = blockIdx.x / kCluster;  // the grid is rows * kCluster CTAs
  const uint32_t lane = device::cluster::block_rank() * kThreads + threadIdx.x;
  exchange.init();
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  const auto reduce = [&](float v) { return exchange.template all_reduce_sum<0>(v); };
  const auto row_max = [&](float v) {
    if constexpr (kEpi == Epi::kToken) {
      return exchange.template all_reduce_max_nonneg<1>(v);
    } else {
      return v;  // only the per-token epilogue takes the row's maximum
    }
  };
  shaped_row<kEpi, T, K, kFused, true>(p, a, row, lane, reduce, row_max);
}

// The cluster kernel runs for rows of at least kClusterMinWarps warps, at most kClusterMaxRows rows,
// in clusters of 4 blocks (2 where 4 does not divide the warps): a launch of few long rows is bound by
// the issue of its instructions, and a cluster spreads each row's epilogue over 4 SMs for one
// exchange per reduction; more rows keep one CTA a row. The sizes and the alternatives:
// docs/design/norm-quant.md.
inline constexpr int64_t kClusterMaxRows = 16;
inline constexpr int kClusterMinWarps = 12;
template <typename K>
inline constexpr int kClusterFor = [] {
  constexpr int warps = K::kThreads / 32;
  if (warps < kClusterMinWarps) return 1;
  return warps % 4 == 0 ? 4 : warps % 2 == 0 ? 2 : 1;
}();

// Rows of at least kClusterMinWarps warps of one vector a thread (RowShape's kPer == 1: D 4096 with
// the fused add) on half the threads, two vectors of one group each, reduced bit for bit as
// epilogue_row_kernel (and rmsnorm) reduce them. Each 16 threads stand for one warp of the row
// shape: thread j holds that warp's lanes l and l + 8 (l = j / 8 * 16 + j % 8). The warp's butterfly
// over distances 16, 8, 4, 2, 1 becomes: each of the thread's two sums plus the same one of thread
// j ^ 8, then the two added (distance 8 is within the thread), then threads j ^ 4, ^ 2, ^ 1; the
// warps' partials are added as cta::all_reduce_sum adds them. A group of 16 vectors (128 elements of
// 16-bit T) is then 8 adjacent threads, and a thread takes one maximum and one scale for its two
// vectors (groups of 64: one a slot, as in the row kernel). What a thread does once a row (addresses,
// reductions, scales) is done once for two vectors: with a row or two to an SM the launch is bound
// by the issue of its instructions.
template <typename K>
inline constexpr bool kPairable = K::kPer == 1 && K::kExact && K::kThreads % 64 == 0 &&
                                  K::kThreads / 32 >= kClusterMinWarps && K::kThreads / 32 <= 32;

template <Epi kEpi, typename T, int64_t kHidden, bool kFused>
__global__ void __launch_bounds__(RowShape<T, kHidden, kFused, 1>::kThreads / 2)
    epilogue_paired_kernel(const Params p, const EpiArgs a) {
  using K = RowShape<T, kHidden, kFused, 1>;
  static_assert(kPairable<K>);
  constexpr int kWarps = K::kThreads / 32;  // of the row shape
  alignas(16) __shared__ float smem[kWarps];
  __shared__ float smem_max[kWarps / 2];
  const RowSet& s = p.set[0];
  const int64_t row = blockIdx.x;
  const uint32_t j = threadIdx.x % 16;
  const uint32_t warp = threadIdx.x / 16;  // the row shape's warp of this thread
  const uint32_t lane = warp * 32 + j / 8 * 16 + j % 8;
  if (row >= s.rows) return;
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  const auto reduce = [&](float sum, float sum_plus_8) {
    sum = sum + __shfl_xor_sync(0xffffffffu, sum, 8);
    sum_plus_8 = sum_plus_8 + __shfl_xor_sync(0xffffffffu, sum_plus_8, 8);
    const float v = device::warp::reduce_sum<float, 8>(sum + sum_plus_8);
    if (j == 0) smem[warp] = v;
    __syncthreads();
    return sum_warp_partials<kWarps>(smem);
  };
  const auto row_max = [&](float v) { return device::cta::all_reduce_max_nonneg(v, smem_max); };
  Policy<kEpi, T, 2, 8> epilogue(a, row, K::kVecs * K::kN, lane);
  normalize_row<T, 2, RowOptions{.fused = kFused, .early_weight = true, .slot_sums = true, .paired = true}>(
      static_cast<const T*>(s.in) + row * s.in_s0,
      s.out == nullptr ? nullptr : static_cast<T*>(s.out) + row * s.out_s0,
      kFused ? static_cast<T*>(s.residual) + row * s.res_s0 : nullptr,
      static_cast<const T*>(s.weight),
      lane,
      8,
      K::kVecs,
      true,
      1.f / static_cast<float>(K::kVecs * K::kN),
      p.eps,
      reduce,
      epilogue);
  epilogue.finish(row_max);
}

// The paired kernel runs above the cluster kernel's rows up to kPairedMaxRows rows, where the launch
// is bound by the issue of its instructions (above); more rows take epilogue_row_kernel (see
// docs/design/norm-quant.md).
inline constexpr int64_t kPairedMaxRows = 256;

// The static kind loads the weight with the row at any row count (rmsnorm's kernels only up to
// kLatencyBoundRows): it holds nothing past the row's stores, so the weight's registers cost no
// occupancy, and a weight load after the reduction leaves the row's CTA idle. The dynamic kinds hold
// the row for their maximum and keep rmsnorm's rule (measurements: docs/design/norm-quant.md).
template <Epi kEpi>
inline constexpr bool kEarlyWeightAtAnyRows = kEpi == Epi::kTensor;

// The same for a hidden size known at run time: kPer vectors per thread, the row over blockDim.x
// threads (or one warp per row), weight loaded with the row (bounded_row_kernel's shape).
template <Epi kEpi, typename T, int kPer, bool kFused, int kRowsPerCta>
__global__ void __launch_bounds__(512) epilogue_bounded_kernel(const Params p, const EpiArgs a) {
  __shared__ float smem[32];
  __shared__ float smem_max[32];
  const RowSet& s = p.set[0];
  const int64_t row = kRowsPerCta > 1 ? static_cast<int64_t>(blockIdx.x) * kRowsPerCta + threadIdx.x / 32 : blockIdx.x;
  const uint32_t lane = kRowsPerCta > 1 ? threadIdx.x % 32 : threadIdx.x;
  const int64_t group = kRowsPerCta > 1 ? 32 : blockDim.x;
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
  const auto row_max = [&](float v) {
    if constexpr (kRowsPerCta > 1) {
      return device::warp::reduce_max_nonneg(v);
    } else {
      return device::cta::all_reduce_max_nonneg(v, smem_max);
    }
  };
  Policy<kEpi, T, kPer> epilogue(a, row, s.dim, lane);
  normalize_row<T, kPer, RowOptions{.fused = kFused, .early_weight = true, .paired = true}>(
      static_cast<const T*>(s.in) + row * s.in_s0,
      s.out == nullptr ? nullptr : static_cast<T*>(s.out) + row * s.out_s0,
      kFused ? static_cast<T*>(s.residual) + row * s.res_s0 : nullptr,
      static_cast<const T*>(s.weight),
      lane,
      group,
      s.dim / kVecElems<T>,
      false,
      1.f / static_cast<float>(s.dim),
      p.eps,
      reduce,
      epilogue);
  epilogue.finish(row_max);
}

// Any row: one CTA per row (grid-stride), kN = 1 (scalar) or a 16-byte vector, common.cuh's
// generic_kernel's first pass and reduction (the same sum), then per kind: one pass (gemma,
// static), two (per-token: absmax, then quantise) or one per group, a warp per group (group).
// The passes of epilogue_generic_kernel after a row's reduction, one specialisation per kind
// (Gemma's below, the fp8 kinds' in norm_quant.cuh). A thread builds one after its PDL wait (the
// static scale may come from the previous kernel); row() runs the passes of one row: `normed(v)`
// recomputes vector v of y from the input (or the stored residual), which L1/L2 still hold, and
// `smem_max` (32 floats) serves a block-wide maximum.
template <Epi kEpi, typename T, int kN>
struct TwoPassEpilogue;

template <typename T, int kN>
struct TwoPassEpilogue<Epi::kGemma, T, kN> {
  SGL_DEVICE explicit TwoPassEpilogue(const EpiArgs&) {}
  template <typename Normed>
  SGL_DEVICE void row(const EpiArgs& a, int64_t, int64_t nvec, T* out, uint8_t*, float*, Normed normed) const {
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) store_normed(out, v, normed(v), a.normed_aligned);
  }
};

// Any row: one CTA per row (grid-stride), kN = 1 (scalar) or a 16-byte vector, common.cuh's
// generic_kernel's first pass and reduction (the same sum), then the kind's TwoPassEpilogue: one
// pass (gemma, static), two (per-token: absmax, then quantise) or one per group (group).
template <Epi kEpi, typename T, int kN, bool kFused>
__global__ void __launch_bounds__(512) epilogue_generic_kernel(const Params p, const EpiArgs a) {
  using Vec = device::AlignedVector<T, kN>;
  __shared__ float smem[32];
  __shared__ float smem_max[32];
  const RowSet& s = p.set[0];
  const int64_t nvec = s.dim / kN;
  const auto* weight = static_cast<const T*>(s.weight);
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  const TwoPassEpilogue<kEpi, T, kN> epilogue(a);
  for (int64_t row = blockIdx.x; row < s.rows; row += gridDim.x) {
    const T* in = static_cast<const T*>(s.in) + row * s.in_s0;
    T* out = s.out == nullptr ? nullptr : static_cast<T*>(s.out) + row * s.out_s0;
    T* res = kFused ? static_cast<T*>(s.residual) + row * s.res_s0 : nullptr;
    [[maybe_unused]] uint8_t* q = nullptr;
    if constexpr (kEpi != Epi::kGemma) q = a.q + row * s.dim;
    float sum = 0.f;
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
      Vec x;
      x.load(in, v);
      if constexpr (kFused) {
        Vec r;
        r.load(res, v);
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          x[j] = dtype_trait<T>::from(dtype_trait<fp32_t>::from(x[j]) + dtype_trait<fp32_t>::from(r[j]));
        }
        x.store(res, v);
      }
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        const float f = dtype_trait<fp32_t>::from(x[j]);
        sum += f * f;
      }
    }
    device::cta::reduce_sum(sum, smem);
    __syncthreads();  // also makes this row's residual stores visible to the CTA (group kind)
    const float rrms = rsqrtf(smem[0] / static_cast<float>(s.dim) + p.eps);
    const T* src = kFused ? res : in;
    const auto normed = [&](int64_t v) {
      Vec x, w, y;
      x.load(src, v);
      w.load(weight, v);
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        if constexpr (kEpi == Epi::kGemma) {
          const float scale = 1.f + dtype_trait<fp32_t>::from(w[j]);
          y[j] = dtype_trait<T>::from(dtype_trait<fp32_t>::from(x[j]) * rrms * scale);
        } else {
          y[j] = dtype_trait<T>::from(dtype_trait<fp32_t>::from(x[j]) * rrms * dtype_trait<fp32_t>::from(w[j]));
        }
      }
      return y;
    };
    epilogue.row(a, row, nvec, out, q, smem_max, normed);
    __syncthreads();  // smem and smem_max are reused by the next row
  }
}

// ---------------------------------------------------------------------------------------------
// Launching

// How rmsnorm reduces a row of `dim` (the launch whose sums the fused kernels reproduce): `per`
// vectors per thread over `threads` threads (one row per CTA) or one warp per row (`warp_rows`);
// per = 0: the two-pass kernel.
struct Mapping {
  int per;
  uint32_t threads;
  bool warp_rows;
};

// `aligned`: input, residual and weight are rows of whole, aligned 16-byte vectors.
template <typename T>
inline Mapping rmsnorm_mapping(int64_t dim, int64_t rows, bool fused, bool aligned) {
  const auto round32 = [](int64_t n) { return static_cast<uint32_t>((n + 31) / 32 * 32); };
  if (!aligned || rows >= (int64_t{1} << 31)) return {0, 0, false};
  const int64_t vecs = dim / kVecElems<T>;
  if (sizeof(T) == 2 && rmsnorm_specialises(dim)) {  // RowShape, and launch_rows' warp rows
    if (!fused && vecs <= kWarpRowsMaxVecs && rows >= kWarpRowsMinRows) {
      return {static_cast<int>((vecs + 31) / 32), 32, true};
    }
    const int64_t max_group = !fused && vecs > 256 && vecs <= 512 ? 256 : 512;
    const int64_t per = (vecs + max_group - 1) / max_group;
    return {static_cast<int>(per), round32((vecs + per - 1) / per), false};
  }
  if (vecs > 4 * kBoundedMaxThreads) return {0, 0, false};  // launch_generic's choice
  const int per = vecs <= kBoundedMaxThreads ? 1 : vecs <= 2 * kBoundedMaxThreads ? 2 : 4;
  return {per, round32((vecs + per - 1) / per), false};
}

// The two-pass kernel's launch (launch_generic's threads and grid).
template <Epi kEpi, typename T, bool kFused>
void launch_two_pass(const Params& p, const EpiArgs& a, bool vec, DLDevice device, bool pdl) {
  const int64_t rows = p.set[0].rows;
  const int64_t units = vec ? p.set[0].dim / kVecElems<T> : p.set[0].dim;
  const auto threads = static_cast<uint32_t>(std::clamp<int64_t>(host::div_ceil(units, int64_t{32}) * 32, 32, 512));
  const auto grid = static_cast<uint32_t>(std::min<int64_t>(rows, int64_t{1} << 30));
  if (vec) {
    host::LaunchKernel(grid, threads, device)
        .enable_pdl(pdl)(epilogue_generic_kernel<kEpi, T, static_cast<int>(kVecElems<T>), kFused>, p, a);
  } else {
    host::LaunchKernel(grid, threads, device).enable_pdl(pdl)(epilogue_generic_kernel<kEpi, T, 1, kFused>, p, a);
  }
}

template <Epi kEpi, typename T, bool kFused>
void launch_run_time_shape(const Params& p, const EpiArgs& a, const Mapping& m, DLDevice device, bool pdl) {
  const int64_t rows = p.set[0].rows;
  if (m.warp_rows) {  // rmsnorm_mapping: plain rows of 16-bit T only
    host::RuntimeCheck(m.per == 4, "norm epilogue: warp rows of ", m.per, " vectors per lane are not instantiated");
    if constexpr (!kFused && sizeof(T) == 2) {
      const auto grid = static_cast<uint32_t>(host::div_ceil(rows, int64_t{kWarpRows}));
      host::LaunchKernel(grid, 32 * kWarpRows, device)
          .enable_pdl(pdl)(epilogue_bounded_kernel<kEpi, T, 4, false, kWarpRows>, p, a);
    } else {
      host::RuntimeCheck(false, "norm epilogue: warp rows are for plain rows of 16-bit types");
    }
    return;
  }
  const auto launch = [&]<int kPer>() {
    host::LaunchKernel(static_cast<uint32_t>(rows), m.threads, device)
        .enable_pdl(pdl)(epilogue_bounded_kernel<kEpi, T, kPer, kFused, 1>, p, a);
  };
  switch (m.per) {
    case 1: launch.template operator()<1>(); break;
    case 2: launch.template operator()<2>(); break;
    case 4: launch.template operator()<4>(); break;
    default: host::RuntimeCheck(false, "norm epilogue: ", m.per, " vectors per thread are not instantiated");
  }
}

template <Epi kEpi, typename T, int64_t kHidden, bool kFused, int kRowsPerCta>
void launch_specialised(const Params& p, const EpiArgs& a, DLDevice device, bool pdl) {
  using K = RowShape<T, kHidden, kFused, kRowsPerCta>;
  const int64_t rows = p.set[0].rows;
  if constexpr (kRowsPerCta == 1 && kClusterFor<K> > 1) {
    constexpr int kCluster = kClusterFor<K>;
    if (rows <= kClusterMaxRows && host::runtime::has_clusters(device.device_id)) {
      host::LaunchKernel(static_cast<uint32_t>(rows * kCluster), static_cast<uint32_t>(K::kThreads / kCluster), device)
          .enable_pdl(pdl)
          .enable_cluster(kCluster)(epilogue_cluster_kernel<kEpi, T, kHidden, kFused, kCluster>, p, a);
      return;
    }
  }
  if constexpr (kRowsPerCta == 1 && kPairable<K>) {
    if (rows <= kPairedMaxRows) {
      host::LaunchKernel(static_cast<uint32_t>(rows), static_cast<uint32_t>(K::kThreads / 2), device)
          .enable_pdl(pdl)(epilogue_paired_kernel<kEpi, T, kHidden, kFused>, p, a);
      return;
    }
  }
  const dim3 grid(static_cast<uint32_t>((rows + kRowsPerCta - 1) / kRowsPerCta));
  constexpr bool kAlwaysEarly = kRowsPerCta == 1 && kEarlyWeightAtAnyRows<kEpi>;
  auto kernel = epilogue_row_kernel<kEpi, T, kHidden, kFused, kAlwaysEarly, kRowsPerCta>;
  if constexpr (kRowsPerCta == 1 && !kAlwaysEarly) {  // launch_row_kernel's choice of the early weight load
    constexpr bool kShortFused = kFused && K::kVecs <= kWarpRowsMaxVecs;
    if (rows <= (kShortFused ? kFusedShortRowsLatencyBoundRows : kLatencyBoundRows)) {
      kernel = epilogue_row_kernel<kEpi, T, kHidden, kFused, true, 1>;
    }
  }
  host::LaunchKernel(grid, static_cast<uint32_t>(K::kThreads), device).enable_pdl(pdl)(kernel, p, a);
}

// One launch of kind kEpi over p.set[0] (rows > 0). kHidden > 0: the rows are expected to be of
// that width (anything else takes the two-pass kernel).
// fp32 rows take the run-time shapes whatever kHidden says (rmsnorm specialises 16-bit rows only).
template <Epi kEpi, typename T, int64_t kHidden, bool kFused>
void launch_epilogue(const Params& p, const EpiArgs& a, DLDevice device, bool pdl) {
  const RowSet& s = p.set[0];
  Params shape = p;  // the mapping depends on input, residual and weight only: out := in
  shape.set[0].out = const_cast<void*>(s.in);
  shape.set[0].out_s0 = s.in_s0;
  const bool aligned = vector_aligned(shape, sizeof(T));
  const Mapping m = rmsnorm_mapping<T>(s.dim, s.rows, kFused, aligned);
  if (m.per == 0) {
    launch_two_pass<kEpi, T, kFused>(p, a, aligned, device, pdl);
    return;
  }
  if constexpr (kHidden > 0 && sizeof(T) == 2) {
    if (s.dim == kHidden) {
      if (m.warp_rows) {  // rmsnorm_mapping: plain rows of at most kWarpRowsMaxVecs vectors only
        if constexpr (!kFused && RowShape<T, kHidden, false, 1>::kVecs <= kWarpRowsMaxVecs) {
          launch_specialised<kEpi, T, kHidden, false, kWarpRows>(p, a, device, pdl);
        } else {
          host::RuntimeCheck(false, "norm epilogue: no warp-row kernel for this shape");
        }
        return;
      }
      launch_specialised<kEpi, T, kHidden, kFused, 1>(p, a, device, pdl);
      return;
    }
    launch_two_pass<kEpi, T, kFused>(p, a, aligned, device, pdl);
  } else {
    launch_run_time_shape<kEpi, T, kFused>(p, a, m, device, pdl);
  }
}

// ---------------------------------------------------------------------------------------------
// Launchers: the tensor rules, then one launch.

// The row tensors every op takes: input [N, D], residual (fused), normed output and weight [D];
// fills p (normed rows as p.set[0].out) and the normed output's alignment.
template <typename T>
struct NormRows {
  Params p{};
  DLDevice device{};
  int64_t rows = 0;
  int64_t dim = 0;
  bool normed_aligned = true;

  NormRows(
      tvm::ffi::TensorView input,
      const tvm::ffi::Optional<tvm::ffi::TensorView>& residual,
      const tvm::ffi::Optional<tvm::ffi::TensorView>& normed_out,
      const char* normed_name,
      tvm::ffi::TensorView weight,
      double eps,
      host::SymbolicSize& N,
      host::SymbolicSize& D,
      host::SymbolicDevice& dev) {
    using namespace host;
    TensorMatcher::cuda_rows<T>({N, D}, dev).verify(input, "input");
    if (residual.has_value()) TensorMatcher::cuda_rows<T>({N, D}, dev).verify(*residual, "residual");
    if (normed_out.has_value()) TensorMatcher::cuda_rows<T>({N, D}, dev).verify(*normed_out, normed_name);
    TensorMatcher({D}).with_device<kDLCUDA>(dev).with_dtype<T>().verify(weight, "weight");
    check_eps_and_dim(eps, D.unwrap(), "input");
    rows = N.unwrap();
    dim = D.unwrap();
    p.num_sets = 1;
    p.eps = static_cast<float>(eps);
    RowSet& s = p.set[0];
    s.in = input.data_ptr();
    s.weight = weight.data_ptr();
    s.rows = rows;
    s.inner = 1;
    s.dim = dim;
    s.in_s0 = input.stride(0);
    if (residual.has_value()) {
      s.residual = (*residual).data_ptr();
      s.res_s0 = (*residual).stride(0);
    }
    if (normed_out.has_value()) {
      s.out = (*normed_out).data_ptr();
      s.out_s0 = (*normed_out).stride(0);
      normed_aligned = reinterpret_cast<uint64_t>(s.out) % 16 == 0 && (rows <= 1 || (s.out_s0 * sizeof(T)) % 16 == 0);
    }
  }

  void finish(EpiArgs& a, tvm::ffi::TensorView q) {
    a.q = static_cast<uint8_t*>(q.data_ptr());
    a.q_aligned = reinterpret_cast<uint64_t>(a.q) % kVecElems<T> == 0;
    a.normed_aligned = normed_aligned;
  }
};

template <Epi kEpi, typename T, int64_t kHidden>
void launch_fused_or_not(const Params& p, const EpiArgs& a, DLDevice device, tvm::ffi::Optional<bool> enable_pdl) {
  const bool pdl = host::runtime::resolve_pdl(enable_pdl, device.device_id);
  if (p.set[0].residual != nullptr) {
    launch_epilogue<kEpi, T, kHidden, true>(p, a, device, pdl);
  } else {
    launch_epilogue<kEpi, T, kHidden, false>(p, a, device, pdl);
  }
}

inline void check_rows(const char* op, int64_t rows) {
  host::RuntimeCheck(rows < (int64_t{1} << 31), op, ": at most 2^31 - 1 rows, got ", rows);
}

}  // namespace jit_kernel::norm
