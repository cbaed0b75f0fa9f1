// RMSNorm (optionally after a residual add) fused with fp8 quantization of its output: the fp8
// kinds of epilogue_row.cuh's row kernels.
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
// own device code (quant/*.cuh) on the same y, and y is the same because epilogue_row.cuh's kernels
// reduce every row as the rmsnorm launch of that row shape does.
#pragma once

#include "../quant/per_tensor_fp8.cuh"
#include "../quant/per_token_group_fp8.cuh"
#include "epilogue_row.cuh"

#include <sgl_kernel/cta.cuh>
#include <sgl_kernel/warp.cuh>

#include <cmath>
#include <cstdint>
#include <cuda_fp8.h>

namespace jit_kernel::norm {

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
// The fp8 kinds' epilogue policies (epilogue_row.cuh's Policy).

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
// The two-pass kernel's passes per kind (epilogue_row.cuh's TwoPassEpilogue).

template <typename T, int kN>
struct TwoPassEpilogue<Epi::kTensor, T, kN> {
  float inv;  // the static scale's inverse, once per thread
  SGL_DEVICE explicit TwoPassEpilogue(const EpiArgs& a)
      : inv(quant::inverse(a.scale != nullptr ? *a.scale : a.scale_value)) {}
  template <typename Normed>
  SGL_DEVICE void row(const EpiArgs& a, int64_t, int64_t nvec, T* out, uint8_t* q, float*, Normed normed) const {
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
      const auto y = normed(v);
      store_normed(out, v, y, a.normed_aligned);
      quantise_static(q, v, y, inv, a);
    }
  }
};

// The row's absmax in one pass, then the quantisation in a second.
template <typename T, int kN>
struct TwoPassEpilogue<Epi::kToken, T, kN> {
  SGL_DEVICE explicit TwoPassEpilogue(const EpiArgs&) {}
  template <typename Normed>
  SGL_DEVICE void row(
      const EpiArgs& a, int64_t row, int64_t nvec, T* out, uint8_t* q, float* smem_max, Normed normed) const {
    float m = 0.f;
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) m = token_quant::absmax_vec(m, normed(v));
    const float scale = device::cta::all_reduce_max_nonneg(m, smem_max) / token_quant::kFp8Max;
    if (threadIdx.x == 0) a.s[row * a.s_row] = scale;
    const float inv = token_quant::inverse(scale);
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
      const auto y = normed(v);
      store_normed(out, v, y, a.normed_aligned);
      quantise_dynamic(q, v, y, inv, a.q_aligned);
    }
  }
};

// A warp per group: lane l holds units l, l + 32, ... of its group (at most 4: 128 scalars).
template <typename T, int kN>
struct TwoPassEpilogue<Epi::kGroup, T, kN> {
  SGL_DEVICE explicit TwoPassEpilogue(const EpiArgs&) {}
  template <typename Normed>
  SGL_DEVICE void row(const EpiArgs& a, int64_t row, int64_t, T* out, uint8_t* q, float*, Normed normed) const {
    using Vec = device::AlignedVector<T, kN>;
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
};

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

// The group kind's rules for group_size, quant_eps and output_s (float32 [N, groups] row- or
// column-major, or int32 [N, ceil(groups / 4)] column-major for the packed UE8M0 exponents, which
// need scale_ue8m0), checked once N (the rows) is bound, and the EpiArgs they give (all but q and
// the normed output's). `op` names the call and `input` the tensor whose last dimension `dim` the
// groups split, in the messages. RMSNormPerTokenGroupQuantFp8 and the all-reduce's fused group form
// (csrc/allreduce/allreduce.cuh) both take their scales through it.
template <typename T>
void group_scale_args(
    const char* op,
    const char* input,
    tvm::ffi::TensorView output_s,
    host::SymbolicSize& N,
    host::SymbolicDevice& device,
    int64_t dim,
    int64_t group_size,
    double quant_eps,
    bool scale_ue8m0,
    EpiArgs& a) {
  using namespace host;
  auto G = SymbolicSize{"num_groups"};
  auto S0 = SymbolicSize{"scale_stride_0"};
  auto S1 = SymbolicSize{"scale_stride_1"};
  RuntimeCheck(group_size == 64 || group_size == 128, op, ": group_size must be 64 or 128, got ", group_size);
  RuntimeCheck(
      dim % group_size == 0,
      op,
      ": the last dimension of ",
      input,
      " (",
      dim,
      ") must be a multiple of group_size (",
      group_size,
      ")");
  RuntimeCheck(std::isfinite(quant_eps) && quant_eps >= 0, op, ": quant_eps must be finite and >= 0, got ", quant_eps);
  const int64_t groups = dim / group_size;
  const bool packed = output_s.dtype().code == kDLInt;
  G.set_value(packed ? (groups + 3) / 4 : groups);
  TensorMatcher({N, G}).with_strides({S0, S1}).with_device<kDLCUDA>(device).with_dtype<fp32_t, int32_t>().verify(
      output_s, "output_s");
  const token_quant::ScaleStrides strides{N.unwrap(), G.unwrap(), S0.unwrap(), S1.unwrap()};
  if (packed) {
    RuntimeCheck(scale_ue8m0, op, ": an int32 output_s holds packed UE8M0 exponents, which needs scale_ue8m0=True");
    RuntimeCheck(
        strides.col_major(),
        op,
        ": a packed (int32) output_s must be column-major (strides (1, >= num_tokens)), got strides (",
        strides.s0,
        ", ",
        strides.s1,
        ")");
  } else {
    token_quant::check_scale_strides(op, strides);
  }
  a.s = static_cast<float*>(output_s.data_ptr());
  a.s_row = strides.s0;
  a.s_col = strides.s1;
  a.quant_eps = static_cast<float>(quant_eps);
  a.group_size = static_cast<int32_t>(group_size);
  a.group_vecs = static_cast<int32_t>(group_size / kVecElems<T>);
  a.groups = static_cast<int32_t>(groups);
  a.ue8m0 = scale_ue8m0;
  a.packed = packed;
}

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
    auto device = SymbolicDevice{};
    NormRows<T> r(input, residual, normed_out, "normed_out", weight, eps, N, D, device);
    TensorMatcher({N, D}).with_device<kDLCUDA>(device).with_dtype<fp8_e4m3_t>().verify(output_q, "output_q");
    EpiArgs a{};
    group_scale_args<T>(op, "input", output_s, N, device, r.dim, group_size, quant_eps, scale_ue8m0, a);
    check_rows(op, r.rows);
    if (r.rows == 0 || has_no_data(output_q)) return;
    r.finish(a, output_q);
    launch_fused_or_not<Epi::kGroup, T, kHidden>(r.p, a, device.unwrap(), enable_pdl);
  }
};

}  // namespace jit_kernel::norm
