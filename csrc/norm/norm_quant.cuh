// RMSNorm (optionally after a residual add) fused with fp8 quantization of its output, and the
// row kernels with an epilogue that gemma.cuh also uses.
//
// Ops (one launch each; `residual` given: residual = T(input + residual) is stored in place and
// normalised, as fused_add_rmsnorm does; `input` itself is only read):
// - RMSNormQuantFp8::run, a static per-tensor scale: q = fp8(clamp(y * (1 / scale), -max, max)),
//   max = 448 (e4m3) or 57344 (e5m2, by the dtype of `out`); the scale is a one-element float32
//   tensor read on the device, or a value;
// - RMSNormPerTokenQuantFp8::run, dynamic per row: s = absmax(y) / 448, q = fp8(y * (1 / s));
// - RMSNormPerTokenGroupQuantFp8::run, dynamic per group of 64 or 128 elements of a row:
//   s = max(absmax, quant_eps) / 448 (rounded up to a power of two with scale_ue8m0), row- or
//   column-major float32 scales, or DeepGEMM's packed UE8M0 layout (an int32 output_s).
// Here y = T(x * rrms * w) is the normalised row rounded to the activation dtype T, as rmsnorm and
// fused_add_rmsnorm store it, and optionally stored to `normed_out` as well.
//
// Bit for bit the two-launch composition (rmsnorm or fused_add_rmsnorm, then per_tensor_quant_fp8
// static / per_token_quant_fp8 / per_token_group_quant_fp8): the quantisation is the quantisers'
// own device code (quant/*.cuh) on the same y, and y is the same because every row is reduced by
// the same threads in the same order as the rmsnorm launch of that row shape does (`Mapping`
// below): the sum of squares in fp32 is order-dependent, and one last bit of rrms moves a rounding
// of y now and then. Row shapes (as rmsnorm.cuh, whose RowShape and tuning constants this file uses):
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
#pragma once

#include "../quant/per_tensor_fp8.cuh"
#include "../quant/per_token_group_fp8.cuh"
#include "rmsnorm.cuh"

#include <sgl_kernel/cluster.cuh>
#include <sgl_kernel/cta.cuh>
#include <sgl_kernel/warp.cuh>

#include <cmath>
#include <cstdint>
#include <cuda_fp8.h>
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

inline constexpr float kFp8E5m2Max = 57344.f;

// Static per-tensor quantisation of one vector (quant::quantise_vec's expression, e4m3 or e5m2),
// at vector v of q, or element by element where q is not kN-byte aligned.
template <typename T, std::size_t kN>
SGL_DEVICE void quantise_static(
    uint8_t* q, int64_t v, const device::AlignedVector<T, kN>& y, float inv, const EpiArgs& a) {
  if (a.q_aligned) {
    if (a.e5m2) {
      quant::quantise_vec<false, __NV_E5M2>(q, v, y, inv, kFp8E5m2Max);
    } else {
      quant::quantise_vec(q, v, y, inv);
    }
    return;
  }
#pragma unroll
  for (std::size_t j = 0; j < kN; ++j) {
    const float x = dtype_trait<fp32_t>::from(y[j]);
    if (a.e5m2) {
      reinterpret_cast<fp8_e5m2_t*>(q)[v * kN + j] = fp8_e5m2_t(quant::clamp_below(x, inv, kFp8E5m2Max));
    } else {
      reinterpret_cast<fp8_e4m3_t*>(q)[v * kN + j] = quant::to_fp8(x, inv);
    }
  }
}

// y * inv as fp8 e4m3 at vector v of q (the per-token and group quantisers' store_fp8).
template <typename T, std::size_t kN>
SGL_DEVICE void quantise_dynamic(
    uint8_t* q, int64_t v, const device::AlignedVector<T, kN>& y, float inv, bool aligned) {
  float f[kN];
  device::to_floats(y, f);
#pragma unroll
  for (std::size_t j = 0; j < kN; ++j) f[j] *= inv;
  fp8::store_fp8<static_cast<int>(kN)>(reinterpret_cast<fp8_e4m3_t*>(q) + v * static_cast<int64_t>(kN), f, aligned);
}

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

// A group's scale: per_token_group_fp8.cuh's formula.
SGL_DEVICE float group_scale(float absmax, const EpiArgs& a) {
  const float scale = fmaxf(absmax, a.quant_eps) / token_quant::kFp8Max;
  return a.ue8m0 ? token_quant::round_up_pow2(scale) : scale;
}

// Group g's scale of `row` into output_s. Packed (DeepGEMM's UE8M0 layout for sm_100): output_s is
// int32 [rows, ceil(groups / 4)] (column-major: s_row = 1, s_col >= rows), and group g is byte
// g % 4 (little-endian) of int32 [row, g / 4]: the biased exponent of the power-of-two scale
// (scale = 2^(byte - 127)). The bytes after the last group of a row are zeroed.
SGL_DEVICE void store_group_scale(const EpiArgs& a, int64_t row, int64_t g, float scale) {
  if (!a.packed) {
    a.s[row * a.s_row + g * a.s_col] = scale;
    return;
  }
  uint8_t* word = reinterpret_cast<uint8_t*>(a.s) + (row * a.s_row + (g >> 2) * a.s_col) * 4;
  word[g & 3] = static_cast<uint8_t>(__float_as_uint(scale) >> 23);
  if (g == a.groups - 1) {
    for (int64_t b = (g & 3) + 1; b < 4; ++b) word[b] = 0;
  }
}

// ---------------------------------------------------------------------------------------------
// The epilogue policies normalize_row calls (common.cuh's StoreRow interface), one per kind. A
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

template <typename T, int kPer, int kSlotVecs>
struct Policy<Epi::kTensor, T, kPer, kSlotVecs> {
  static constexpr bool kWeightPlusOne = false;
  const EpiArgs& a;
  uint8_t* q;
  float scale;  // loaded with the row, inverted at first use: the inverse branches on the value,
                // which would hold the row's loads behind this one
  SGL_DEVICE Policy(const EpiArgs& args, int64_t row, int64_t dim, uint32_t)
      : a(args), q(args.q + row * dim), scale(args.scale_value) {}
  SGL_DEVICE void load_with_row() {
    if (a.scale != nullptr) scale = *a.scale;
  }
  template <typename Vec>
  SGL_DEVICE void operator()(T* out, const Vec& y, int64_t v, int) const {
    store_normed(out, v, y, a.normed_aligned);
    quantise_static(q, v, y, quant::inverse(scale), a);
  }
  template <typename RowMax>
  SGL_DEVICE void finish(RowMax) const {}
};

// Per-token and group quantisers keep the row's vectors for the reduction that sizes their scale:
// slot k holds vector at[k] (-1: none). The index is 32-bit, which keeps the epilogue's address
// arithmetic short: these kernels take rows of at most 2048 vectors, longer ones the two-pass kernel.
template <typename T, int kPer>
struct Held {
  using Vec = device::AlignedVector<T, kVecElems<T>>;
  Vec held[kPer];
  int32_t at[kPer];
  SGL_DEVICE Held() {
#pragma unroll
    for (int k = 0; k < kPer; ++k) at[k] = -1;
  }
};

template <typename T, int kPer, int kSlotVecs>
struct Policy<Epi::kToken, T, kPer, kSlotVecs> : Held<T, kPer> {
  static constexpr bool kWeightPlusOne = false;
  const EpiArgs& a;
  uint8_t* q;
  float* s;
  bool writer;
  float m = 0.f;
  SGL_DEVICE Policy(const EpiArgs& args, int64_t row, int64_t dim, uint32_t lane)
      : a(args), q(args.q + row * dim), s(args.s + row * args.s_row), writer(lane == 0) {}
  template <typename Vec>
  SGL_DEVICE void operator()(T* out, const Vec& y, int64_t v, int k) {
    store_normed(out, v, y, a.normed_aligned);
    this->held[k] = y;
    this->at[k] = static_cast<int32_t>(v);
    m = token_quant::absmax_vec(m, y);
  }
  template <typename RowMax>
  SGL_DEVICE void finish(RowMax row_max) {
    const float scale = row_max(m) / token_quant::kFp8Max;
    if (writer) *s = scale;
    const float inv = token_quant::inverse(scale);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      if (this->at[k] >= 0) quantise_dynamic(q, this->at[k], this->held[k], inv, a.q_aligned);
    }
  }
};

// The absolute maximum of a vector (absmax_vec's value): 16-bit T compared in pairs (a maximum is
// exact in any type; NaN is skipped as fmaxf skips it, by the last fmaxf where both of a pair are NaN).
template <typename T, std::size_t kN>
SGL_DEVICE float absmax_of(const device::AlignedVector<T, kN>& y) {
  if constexpr (sizeof(T) == 2 && kN % 2 == 0) {
    using T2 = packed_t<T>;
    const auto* pairs = reinterpret_cast<const T2*>(&y);
    T2 m = dtype_trait<T2>::abs(pairs[0]);
#pragma unroll
    for (std::size_t j = 1; j < kN / 2; ++j) m = dtype_trait<T2>::max(m, dtype_trait<T2>::abs(pairs[j]));
    const auto f = dtype_trait<fp32x2_t>::from(m);
    return fmaxf(0.f, fmaxf(f.x, f.y));
  } else {
    return token_quant::absmax_vec(0.f, y);
  }
}

// The maximum of a nonnegative float over each group of kLanes adjacent lanes, to the group's lanes:
// one redux.sync per group of the warp, all independent (a shuffle tree is log2(kLanes) dependent
// round trips).
template <int kLanes>
SGL_DEVICE float group_max_nonneg(float m) {
  const uint32_t bits = __float_as_uint(m);
  if constexpr (kLanes == 32) {
    return __uint_as_float(__reduce_max_sync(0xffffffffu, bits));
  } else {
    const uint32_t mine = (threadIdx.x % 32) / kLanes;
    uint32_t result = 0;
#pragma unroll
    for (uint32_t g = 0; g < 32 / kLanes; ++g) {
      const uint32_t r = __reduce_max_sync(0xffffffffu, mine == g ? bits : 0u);
      result = mine == g ? r : result;
    }
    return __uint_as_float(result);
  }
}

// Slot k of the row's lanes holds consecutive vectors (lane + k * group, group a multiple of 32),
// so a group is group_vecs adjacent lanes of one warp (the cluster kernel splits rows at warps).
// With kSlotVecs < group_vecs (epilogue_paired_kernel), a thread's kPer slots are vectors of one
// group and the group is group_vecs / kPer adjacent lanes: one maximum and one scale a thread.
template <typename T, int kPer, int kSlotVecs>
struct Policy<Epi::kGroup, T, kPer, kSlotVecs> : Held<T, kPer> {
  static constexpr bool kWeightPlusOne = false;
  const EpiArgs& a;
  int64_t row;
  uint8_t* q;
  float absmax[kPer] = {};  // of each held vector (0 for none), taken as it is normalised
  SGL_DEVICE Policy(const EpiArgs& args, int64_t r, int64_t dim, uint32_t) : a(args), row(r), q(args.q + r * dim) {}
  template <typename Vec>
  SGL_DEVICE void operator()(T* out, const Vec& y, int64_t v, int k) {
    store_normed(out, v, y, a.normed_aligned);
    this->held[k] = y;
    this->at[k] = static_cast<int32_t>(v);
    absmax[k] = absmax_of(y);
  }
  template <typename RowMax>
  SGL_DEVICE void finish(RowMax) {
    switch (a.group_vecs) {  // 64 or 128 elements: 8 or 16 vectors of 16-bit T, 16 or 32 of fp32
      case 8: finish_groups<8>(); break;
      case 16: finish_groups<16>(); break;
      default:
        if constexpr (sizeof(T) == 4) finish_groups<32>();
        break;
    }
  }
  template <int kGroupVecs>
  SGL_DEVICE void finish_groups() {
    if constexpr (kSlotVecs > 0 && kSlotVecs < kGroupVecs) {
      static_assert(kSlotVecs * kPer == kGroupVecs, "the slots of a thread are one whole group's");
      float m = absmax[0];
#pragma unroll
      for (int k = 1; k < kPer; ++k) m = fmaxf(m, absmax[k]);
      const float scale = group_scale(group_max_nonneg<kSlotVecs>(m), a);
      if (this->at[0] % kGroupVecs == 0) store_group_scale(a, row, this->at[0] / kGroupVecs, scale);
      const float inv = token_quant::inverse(scale);
#pragma unroll
      for (int k = 0; k < kPer; ++k) quantise_dynamic(q, this->at[k], this->held[k], inv, a.q_aligned);
    } else {
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int32_t v = this->at[k];
        const float m = group_max_nonneg<kGroupVecs>(absmax[k]);
        if (v < 0) continue;
        const float scale = group_scale(m, a);
        if (v % kGroupVecs == 0) store_group_scale(a, row, v / kGroupVecs, scale);
        quantise_dynamic(q, v, this->held[k], token_quant::inverse(scale), a.q_aligned);
      }
    }
  }
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
  normalize_row<T, static_cast<int>(K::kPer), kFused, kEarlyWeight, false>(
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
// in clusters of 4 blocks (2 where 4 does not divide the warps): there the spread epilogue gains more
// than the exchanges cost; with more rows the dynamic kinds lose it (more CTAs than SMs). The sizes
// and the alternatives measured: see docs/design/norm-quant.md.
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
  normalize_row<T, 2, kFused, true, false, true>(
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

// The paired kernel runs above the cluster kernel's rows up to kPairedMaxRows rows; at 512 rows
// epilogue_row_kernel is faster for every kind (see docs/design/norm-quant.md).
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
  normalize_row<T, kPer, kFused, true, false>(
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
// Later passes recompute y from the input (or the stored residual), which L1/L2 still hold.
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
  [[maybe_unused]] float static_inv = 0.f;
  if constexpr (kEpi == Epi::kTensor) static_inv = quant::inverse(a.scale != nullptr ? *a.scale : a.scale_value);
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
    if constexpr (kEpi == Epi::kGemma || kEpi == Epi::kTensor) {
      for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
        const Vec y = normed(v);
        store_normed(out, v, y, a.normed_aligned);
        if constexpr (kEpi == Epi::kTensor) quantise_static(q, v, y, static_inv, a);
      }
    } else if constexpr (kEpi == Epi::kToken) {
      float m = 0.f;
      for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) m = token_quant::absmax_vec(m, normed(v));
      const float scale = device::cta::all_reduce_max_nonneg(m, smem_max) / token_quant::kFp8Max;
      if (threadIdx.x == 0) a.s[row * a.s_row] = scale;
      const float inv = token_quant::inverse(scale);
      for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
        const Vec y = normed(v);
        store_normed(out, v, y, a.normed_aligned);
        quantise_dynamic(q, v, y, inv, a.q_aligned);
      }
    } else {
      // A warp per group: lane l holds units l, l + 32, ... of its group (at most 4: 128 scalars).
      constexpr int kMaxUnits = 128 / kN < 32 ? 1 : 128 / kN / 32;
      const int64_t units = a.group_size / kN;
      const uint32_t lane = threadIdx.x % 32;
      for (int64_t g = threadIdx.x / 32; g < a.groups; g += blockDim.x / 32) {
        Vec y[kMaxUnits];
        float m = 0.f;
#pragma unroll
        for (int i = 0; i < kMaxUnits; ++i) {
          const int64_t u = lane + 32 * i;
          if (u < units) {
            y[i] = normed(g * units + u);
            store_normed(out, g * units + u, y[i], a.normed_aligned);
            m = token_quant::absmax_vec(m, y[i]);
          }
        }
        m = device::warp::reduce_max_nonneg(m);
        const float scale = group_scale(m, a);
        if (lane == 0) store_group_scale(a, row, g, scale);
        const float inv = token_quant::inverse(scale);
#pragma unroll
        for (int i = 0; i < kMaxUnits; ++i) {
          const int64_t u = lane + 32 * i;
          if (u < units) quantise_dynamic(q, g * units + u, y[i], inv, a.q_aligned);
        }
      }
    }
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

// rmsnorm_quant_fp8 / fused_add_rmsnorm_quant_fp8: static per-tensor scale.
template <int64_t kHidden, typename T>
struct RMSNormQuantFp8 {
  // out [N, D] float8_e4m3fn or float8_e5m2 (contiguous) = fp8(clamp(y * (1 / scale), -max, max)),
  // y = T(rmsnorm(input [+ residual]) * weight), also stored to normed_out when given. `scale`: a
  // float32 tensor of one element (read on the device), else `scale_value`; a scale <= 0 gives q 0.
  static void run(
      tvm::ffi::TensorView out,
      tvm::ffi::Optional<tvm::ffi::TensorView> normed_out,
      tvm::ffi::TensorView input,
      tvm::ffi::TensorView weight,
      tvm::ffi::Optional<tvm::ffi::TensorView> scale,
      tvm::ffi::Optional<double> scale_value,
      double eps,
      tvm::ffi::Optional<bool> enable_pdl) {
    impl(
        out,
        normed_out,
        input,
        tvm::ffi::Optional<tvm::ffi::TensorView>(),
        weight,
        scale,
        scale_value,
        eps,
        enable_pdl);
  }

  // The same after residual = T(input + residual), stored in place (input is only read).
  static void fused_add(
      tvm::ffi::TensorView out,
      tvm::ffi::Optional<tvm::ffi::TensorView> normed_out,
      tvm::ffi::TensorView input,
      tvm::ffi::TensorView residual,
      tvm::ffi::TensorView weight,
      tvm::ffi::Optional<tvm::ffi::TensorView> scale,
      tvm::ffi::Optional<double> scale_value,
      double eps,
      tvm::ffi::Optional<bool> enable_pdl) {
    impl(out, normed_out, input, residual, weight, scale, scale_value, eps, enable_pdl);
  }

 private:
  static void impl(
      tvm::ffi::TensorView out,
      tvm::ffi::Optional<tvm::ffi::TensorView> normed_out,
      tvm::ffi::TensorView input,
      tvm::ffi::Optional<tvm::ffi::TensorView> residual,
      tvm::ffi::TensorView weight,
      tvm::ffi::Optional<tvm::ffi::TensorView> scale,
      tvm::ffi::Optional<double> scale_value,
      double eps,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    const char* op = residual.has_value() ? "fused_add_rmsnorm_quant_fp8" : "rmsnorm_quant_fp8";
    auto N = SymbolicSize{"num_tokens"};
    auto D = SymbolicSize{"hidden_size"};
    auto device = SymbolicDevice{};
    NormRows<T> r(input, residual, normed_out, "normed_out", weight, eps, N, D, device);
    TensorMatcher({N, D}).with_device<kDLCUDA>(device).with_dtype<fp8_e4m3_t, fp8_e5m2_t>().verify(out, "out");
    EpiArgs a{};
    if (scale.has_value()) {
      TensorMatcher({1}).with_device<kDLCUDA>(device).with_dtype<fp32_t>().verify(*scale, "scale");
      a.scale = static_cast<const float*>((*scale).data_ptr());
    } else {
      RuntimeCheck(scale_value.has_value(), op, ": scale is required (a float32 tensor of one element, or a float)");
      RuntimeCheck(std::isfinite(*scale_value), op, ": scale must be finite, got ", *scale_value);
      a.scale_value = static_cast<float>(*scale_value);
    }
    a.e5m2 = is_type<fp8_e5m2_t>(out.dtype());
    check_rows(op, r.rows);
    if (r.rows == 0 || has_no_data(out)) return;  // nothing to do, or a fake call's checks alone
    r.finish(a, out);
    launch_fused_or_not<Epi::kTensor, T, kHidden>(r.p, a, device.unwrap(), enable_pdl);
  }
};

// rmsnorm_per_token_quant_fp8 / fused_add_rmsnorm_per_token_quant_fp8.
template <int64_t kHidden, typename T>
struct RMSNormPerTokenQuantFp8 {
  // output_q [N, D] float8_e4m3fn (contiguous) and output_s [N, 1] float32: per_token_quant_fp8 of
  // y = T(rmsnorm(input [+ residual]) * weight), y also stored to normed_out when given.
  static void run(
      tvm::ffi::TensorView output_q,
      tvm::ffi::TensorView output_s,
      tvm::ffi::Optional<tvm::ffi::TensorView> normed_out,
      tvm::ffi::TensorView input,
      tvm::ffi::TensorView weight,
      double eps,
      tvm::ffi::Optional<bool> enable_pdl) {
    impl(output_q, output_s, normed_out, input, tvm::ffi::Optional<tvm::ffi::TensorView>(), weight, eps, enable_pdl);
  }

  // The same after residual = T(input + residual), stored in place (input is only read).
  static void fused_add(
      tvm::ffi::TensorView output_q,
      tvm::ffi::TensorView output_s,
      tvm::ffi::Optional<tvm::ffi::TensorView> normed_out,
      tvm::ffi::TensorView input,
      tvm::ffi::TensorView residual,
      tvm::ffi::TensorView weight,
      double eps,
      tvm::ffi::Optional<bool> enable_pdl) {
    impl(output_q, output_s, normed_out, input, residual, weight, eps, enable_pdl);
  }

 private:
  static void impl(
      tvm::ffi::TensorView output_q,
      tvm::ffi::TensorView output_s,
      tvm::ffi::Optional<tvm::ffi::TensorView> normed_out,
      tvm::ffi::TensorView input,
      tvm::ffi::Optional<tvm::ffi::TensorView> residual,
      tvm::ffi::TensorView weight,
      double eps,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    const char* op = residual.has_value() ? "fused_add_rmsnorm_per_token_quant_fp8" : "rmsnorm_per_token_quant_fp8";
    auto N = SymbolicSize{"num_tokens"};
    auto D = SymbolicSize{"hidden_size"};
    auto device = SymbolicDevice{};
    NormRows<T> r(input, residual, normed_out, "normed_out", weight, eps, N, D, device);
    TensorMatcher({N, D}).with_device<kDLCUDA>(device).with_dtype<fp8_e4m3_t>().verify(output_q, "output_q");
    TensorMatcher({N, 1}).with_device<kDLCUDA>(device).with_dtype<fp32_t>().verify(output_s, "output_s");
    check_rows(op, r.rows);
    if (r.rows == 0 || has_no_data(output_q)) return;
    EpiArgs a{};
    a.s = static_cast<float*>(output_s.data_ptr());
    a.s_row = 1;
    r.finish(a, output_q);
    launch_fused_or_not<Epi::kToken, T, kHidden>(r.p, a, device.unwrap(), enable_pdl);
  }
};

// rmsnorm_per_token_group_quant_fp8 / fused_add_rmsnorm_per_token_group_quant_fp8.
template <int64_t kHidden, typename T>
struct RMSNormPerTokenGroupQuantFp8 {
  // output_q [N, D] float8_e4m3fn (contiguous): per_token_group_quant_fp8 of y = T(rmsnorm(input
  // [+ residual]) * weight) by groups of group_size (64 or 128), y also stored to normed_out when
  // given. output_s: float32 [N, D / group_size], row-major (strides (>= groups, 1)) or
  // column-major (strides (1, >= N), e.g. tokens padded to 4 for TMA); or int32
  // [N, ceil(D / group_size / 4)], column-major, for the packed UE8M0 exponents (store_group_scale;
  // needs scale_ue8m0). quant_eps: the scale's floor (per_token_group_quant_fp8's eps).
  static void run(
      tvm::ffi::TensorView output_q,
      tvm::ffi::TensorView output_s,
      tvm::ffi::Optional<tvm::ffi::TensorView> normed_out,
      tvm::ffi::TensorView input,
      tvm::ffi::TensorView weight,
      int64_t group_size,
      double eps,
      double quant_eps,
      bool scale_ue8m0,
      tvm::ffi::Optional<bool> enable_pdl) {
    impl(
        output_q,
        output_s,
        normed_out,
        input,
        tvm::ffi::Optional<tvm::ffi::TensorView>(),
        weight,
        group_size,
        eps,
        quant_eps,
        scale_ue8m0,
        enable_pdl);
  }

  // The same after residual = T(input + residual), stored in place (input is only read).
  static void fused_add(
      tvm::ffi::TensorView output_q,
      tvm::ffi::TensorView output_s,
      tvm::ffi::Optional<tvm::ffi::TensorView> normed_out,
      tvm::ffi::TensorView input,
      tvm::ffi::TensorView residual,
      tvm::ffi::TensorView weight,
      int64_t group_size,
      double eps,
      double quant_eps,
      bool scale_ue8m0,
      tvm::ffi::Optional<bool> enable_pdl) {
    impl(output_q, output_s, normed_out, input, residual, weight, group_size, eps, quant_eps, scale_ue8m0, enable_pdl);
  }

 private:
  static void impl(
      tvm::ffi::TensorView output_q,
      tvm::ffi::TensorView output_s,
      tvm::ffi::Optional<tvm::ffi::TensorView> normed_out,
      tvm::ffi::TensorView input,
      tvm::ffi::Optional<tvm::ffi::TensorView> residual,
      tvm::ffi::TensorView weight,
      int64_t group_size,
      double eps,
      double quant_eps,
      bool scale_ue8m0,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    const char* op =
        residual.has_value() ? "fused_add_rmsnorm_per_token_group_quant_fp8" : "rmsnorm_per_token_group_quant_fp8";
    auto N = SymbolicSize{"num_tokens"};
    auto D = SymbolicSize{"hidden_size"};
    auto G = SymbolicSize{"num_groups"};
    auto S0 = SymbolicSize{"scale_stride_0"};
    auto S1 = SymbolicSize{"scale_stride_1"};
    auto device = SymbolicDevice{};
    NormRows<T> r(input, residual, normed_out, "normed_out", weight, eps, N, D, device);
    TensorMatcher({N, D}).with_device<kDLCUDA>(device).with_dtype<fp8_e4m3_t>().verify(output_q, "output_q");
    RuntimeCheck(group_size == 64 || group_size == 128, op, ": group_size must be 64 or 128, got ", group_size);
    RuntimeCheck(
        r.dim % group_size == 0,
        op,
        ": the last dimension of input (",
        r.dim,
        ") must be a multiple of group_size (",
        group_size,
        ")");
    RuntimeCheck(
        std::isfinite(quant_eps) && quant_eps >= 0, op, ": quant_eps must be finite and >= 0, got ", quant_eps);
    const int64_t groups = r.dim / group_size;
    const bool packed = output_s.dtype().code == kDLInt;
    G.set_value(packed ? (groups + 3) / 4 : groups);
    TensorMatcher({N, G}).with_strides({S0, S1}).with_device<kDLCUDA>(device).with_dtype<fp32_t, int32_t>().verify(
        output_s, "output_s");
    const int64_t n = r.rows;
    const int64_t g = G.unwrap();
    const int64_t s0 = S0.unwrap();
    const int64_t s1 = S1.unwrap();
    const bool row_major = (g <= 1 || s1 == 1) && (n <= 1 || s0 >= g);
    const bool col_major = (n <= 1 || s0 == 1) && (g <= 1 || s1 >= n);
    if (packed) {
      RuntimeCheck(scale_ue8m0, op, ": an int32 output_s holds packed UE8M0 exponents, which needs scale_ue8m0=True");
      RuntimeCheck(
          col_major,
          op,
          ": a packed (int32) output_s must be column-major (strides (1, >= num_tokens)), got strides (",
          s0,
          ", ",
          s1,
          ")");
    } else {
      RuntimeCheck(
          row_major || col_major,
          op,
          ": output_s must be row-major (strides (>= num_groups, 1)) or column-major (strides (1, >= num_tokens)), "
          "got strides (",
          s0,
          ", ",
          s1,
          ")");
    }
    check_rows(op, r.rows);
    if (r.rows == 0 || has_no_data(output_q)) return;
    EpiArgs a{};
    a.s = static_cast<float*>(output_s.data_ptr());
    a.s_row = s0;
    a.s_col = s1;
    a.quant_eps = static_cast<float>(quant_eps);
    a.group_size = static_cast<int32_t>(group_size);
    a.group_vecs = static_cast<int32_t>(group_size / kVecElems<T>);
    a.groups = static_cast<int32_t>(groups);
    a.ue8m0 = scale_ue8m0;
    a.packed = packed;
    r.finish(a, output_q);
    launch_fused_or_not<Epi::kGroup, T, kHidden>(r.p, a, device.unwrap(), enable_pdl);
  }
};

}  // namespace jit_kernel::norm
