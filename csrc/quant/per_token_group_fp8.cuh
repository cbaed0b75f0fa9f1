// per_token_group_quant_fp8 and silu_and_mul_per_token_group_quant_fp8: one float32 scale per group
// of `group_size` (64 or 128) consecutive elements of a row, values in fp8 e4m3.
//
// scale = max(absmax(group), eps) / 448, rounded up to a power of two when `scale_ue8m0` (the
// scale stays a float32, whose value is a power of two); q = fp8(x * (1 / scale)). An all-zero
// group gets scale eps / 448 (0 with eps = 0) and q 0. Non-finite inputs follow
// per_token_fp8.cuh: NaN is ignored by the absmax and quantises to NaN; an inf makes the scale inf,
// the group's finite elements 0 and the infinite ones NaN.
//
// The fused export reads `[num_tokens, 2 * d]` (gate, then up), computes
// a = T(silu(gate) * up), computed in fp32 with silu_and_mul's expression (act_math.cuh) and rounded
// to the input dtype T, so that it equals silu_and_mul followed by the group quant bit for bit; then
// quantises `a` by groups: one read of the input, one write of q and the scales.
//
// Layout of the work: a group is kLanes lanes of one warp, kPer 16-byte vectors each, all loads
// issued before any use. Its absmax is a shuffle reduction across those lanes (no shared memory,
// no barrier). A CTA of kGroupThreads covers kGroupThreads / kLanes consecutive groups (fused: of
// one row), so a warp reads consecutive memory.
// - Plain: kPer = 4 (bf16 groups of 128: 4 lanes); a 1-D grid over the groups numbered row-major,
//   one row / group division per thread.
// - Fused: kPer vectors of gate and kPer of up per lane, on a 2-D grid (x: row, y: groups of the
//   row; no division). kPer = 1 (bf16 groups of 128: 16 lanes) while the launch fits in one wave
//   of the GPU: a latency-bound launch (decode) then does half the serial silu work per thread;
//   kPer = 2 above, fewer threads for the same bytes (docs/design/quant.md).
// The scales go to s[row * s_row_stride + group * s_col_stride]: row-major, column-major ([groups,
// tokens] buffer seen transposed, as DeepGEMM-style GEMMs read them) or any padded variant of either.
#pragma once

#include "../act_math.cuh"
#include "per_token_fp8.cuh"

#include <cmath>

namespace jit_kernel::token_quant {

// 128 threads: a decode launch's groups spread over twice as many CTAs as with 256 (see
// docs/design/quant.md).
inline constexpr int kGroupThreads = 128;
// The fused kernel's layouts, both on the 2-D grid: 1 vector of gate and up per lane while the
// groups fit one wave of threads, 2 vectors per lane beyond it (see docs/design/quant.md).
inline constexpr int kFusedWaveVecs = 1;
inline constexpr int kFusedVecs = 2;

struct GroupParams {
  const void* in;
  int64_t in_stride;  // elements between rows of the input
  int64_t up_offset;  // fused: elements from gate to up within a row (d)
  fp8_e4m3_t* q;
  int64_t q_stride;  // elements between rows of q (d)
  float* s;
  int64_t s_row_stride;
  int64_t s_col_stride;
  uint32_t groups_per_row;
  uint32_t total_groups;
  float eps;
  bool ue8m0;
  bool aligned;  // input rows and q are whole, aligned 16-byte (q: kN-byte) vectors
};

// kPer: 16-byte vectors per lane (fused: of gate, and as many of up).
template <typename T, int kGroup, int kPer>
struct GroupShape {
  static constexpr int kN = kVec<T>;
  static constexpr int kVecs = kGroup / kN;  // 16-byte vectors per group
  static constexpr int kLanes = kVecs / kPer;
  static_assert(kGroup % kN == 0 && kVecs % kPer == 0);
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0);
  static constexpr int kGroupsPerBlock = kGroupThreads / kLanes;
};

// gate = T(silu(gate) * up), rounded as silu_and_mul stores it (act_mul of activation.cuh: inputs
// converted a pair at a time, 16-bit T packed in pairs; the same bits).
template <typename T, std::size_t kN>
SGL_DEVICE void silu_mul(device::AlignedVector<T, kN>& gate, const device::AlignedVector<T, kN>& up) {
  float g[kN], u[kN];
  device::to_floats(gate, g);
  device::to_floats(up, u);
  if constexpr (sizeof(T) == 2) {
#pragma unroll
    for (std::size_t j = 0; j < kN; j += 2) {
      const packed_t<T> h = dtype_trait<packed_t<T>>::from(fp32x2_t{silu(g[j]) * u[j], silu(g[j + 1]) * u[j + 1]});
      gate[j] = h.x;
      gate[j + 1] = h.y;
    }
  } else {
#pragma unroll
    for (std::size_t j = 0; j < kN; ++j) gate[j] = dtype_trait<T>::from(silu(g[j]) * u[j]);
  }
}

// The smallest power of two >= s (s >= 0, finite or inf): the exponent rounded up, mantissa 0. A
// subnormal s gives 2^-126, a value above the largest power of two gives inf.
SGL_DEVICE float round_up_pow2(float s) {
  uint32_t bits = __float_as_uint(s);
  if (bits & 0x7fffffu) bits = (bits + 0x800000u) & 0xff800000u;
  return __uint_as_float(bits);
}

template <typename Vec, typename T>
SGL_DEVICE void load_vec(Vec& v, const T* p, bool aligned) {
  if (aligned) {
    v.load(p);
  } else {
#pragma unroll
    for (std::size_t j = 0; j < Vec::size(); ++j) v[j] = p[j];
  }
}

// Lane l of a group holds its vectors l, l + kLanes, ...: each round, the group's lanes read one
// contiguous run of kLanes vectors.
template <typename T, int kGroup, bool kFused, int kPer>
__global__ void __launch_bounds__(kGroupThreads) per_token_group_kernel(const GroupParams p) {
  using K = GroupShape<T, kGroup, kPer>;
  using Vec = device::AlignedVector<T, K::kN>;
  const uint32_t lane = threadIdx.x % K::kLanes;
  uint32_t row, col;
  bool valid;
  if constexpr (kFused) {
    row = blockIdx.x;
    col = blockIdx.y * K::kGroupsPerBlock + threadIdx.x / K::kLanes;
    valid = col < p.groups_per_row;
  } else {
    const uint32_t gid = blockIdx.x * K::kGroupsPerBlock + threadIdx.x / K::kLanes;
    valid = gid < p.total_groups;
    row = gid / p.groups_per_row;
    col = gid - row * p.groups_per_row;
  }
  const T* in = static_cast<const T*>(p.in) + static_cast<int64_t>(row) * p.in_stride +
                static_cast<int64_t>(col) * kGroup + lane * K::kN;
  constexpr int kStep = K::kLanes * K::kN;  // elements between a lane's vectors

  device::PDLWaitPrimary();
  Vec x[kPer];
  [[maybe_unused]] Vec up[kPer];
  if (valid) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      load_vec(x[k], in + k * kStep, p.aligned);
      if constexpr (kFused) load_vec(up[k], in + p.up_offset + k * kStep, p.aligned);
    }
  }
  device::PDLTriggerSecondary();

  float m = 0.f;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    if constexpr (kFused) silu_mul(x[k], up[k]);  // x holds a from here on
    m = absmax_vec(m, x[k]);
  }
  if (!valid) m = 0.f;  // unloaded registers; every lane still takes part in the shuffles
#pragma unroll
  for (int offset = K::kLanes / 2; offset > 0; offset /= 2) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  }
  if (!valid) return;
  float scale = fmaxf(m, p.eps) / kFp8Max;
  if (p.ue8m0) scale = round_up_pow2(scale);
  const float inv_scale = inverse(scale);
  if (lane == 0) p.s[static_cast<int64_t>(row) * p.s_row_stride + static_cast<int64_t>(col) * p.s_col_stride] = scale;
  fp8_e4m3_t* q = p.q + static_cast<int64_t>(row) * p.q_stride + static_cast<int64_t>(col) * kGroup + lane * K::kN;
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    float y[K::kN];
    device::to_floats(x[k], y);
#pragma unroll
    for (int j = 0; j < K::kN; ++j) y[j] *= inv_scale;
    store_fp8<K::kN>(q + k * kStep, y, p.aligned);
  }
}

/// \brief The strides (s0, s1) of a scale tensor of n tokens by g groups, and the layouts
/// they make: row-major (>= g, 1) or column-major (1, >= n); a dimension of one takes any stride.
struct ScaleStrides {
  int64_t n, g, s0, s1;
  bool row_major() const {
    return (g <= 1 || s1 == 1) && (n <= 1 || s0 >= g);
  }
  bool col_major() const {
    return (n <= 1 || s0 == 1) && (g <= 1 || s1 >= n);
  }
};

/// \brief output_s must be row- or column-major (`op` names the call in the message).
inline void check_scale_strides(const char* op, const ScaleStrides& s) {
  host::RuntimeCheck(
      s.row_major() || s.col_major(),
      op,
      ": output_s must be row-major (strides (>= num_groups, 1)) or column-major (strides (1, >= num_tokens)), "
      "got strides (",
      s.s0,
      ", ",
      s.s1,
      ")");
}

template <typename T>
struct PerTokenGroupQuantFp8 {
  // output_q [N, D] fp8, output_s [N, D / group_size] fp32 (row- or column-major strides), input [N, D].
  static void quant(
      tvm::ffi::TensorView output_q,
      tvm::ffi::TensorView output_s,
      tvm::ffi::TensorView input,
      int64_t group_size,
      double eps,
      bool scale_ue8m0,
      tvm::ffi::Optional<bool> enable_pdl) {
    run<false>("per_token_group_quant_fp8", output_q, output_s, input, group_size, eps, scale_ue8m0, enable_pdl);
  }

  // output_q [N, d] fp8 = group quant of T(silu(input[:, :d]) * input[:, d:]), input [N, 2d].
  static void silu_and_mul_quant(
      tvm::ffi::TensorView output_q,
      tvm::ffi::TensorView output_s,
      tvm::ffi::TensorView input,
      int64_t group_size,
      double eps,
      bool scale_ue8m0,
      tvm::ffi::Optional<bool> enable_pdl) {
    run<true>(
        "silu_and_mul_per_token_group_quant_fp8", output_q, output_s, input, group_size, eps, scale_ue8m0, enable_pdl);
  }

 private:
  template <bool kFused>
  static void run(
      const char* op,
      tvm::ffi::TensorView output_q,
      tvm::ffi::TensorView output_s,
      tvm::ffi::TensorView input,
      int64_t group_size,
      double eps,
      bool scale_ue8m0,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    auto N = SymbolicSize{"num_tokens"};
    auto D = SymbolicSize{"input_size"};
    auto IS = SymbolicSize{"input_row_stride"};
    auto H = SymbolicSize{"hidden_size"};
    auto G = SymbolicSize{"num_groups"};
    auto S0 = SymbolicSize{"scale_stride_0"};
    auto S1 = SymbolicSize{"scale_stride_1"};
    auto device = SymbolicDevice{};
    TensorMatcher({N, D}).with_strides({IS, 1}).with_device<kDLCUDA>(device).with_dtype<T>().verify(input, "input");
    RuntimeCheck(group_size == 64 || group_size == 128, op, ": group_size must be 64 or 128, got ", group_size);
    const int64_t d_in = D.unwrap();
    if constexpr (kFused) {
      RuntimeCheck(
          d_in % 2 == 0,
          op,
          ": the last dimension of input (",
          d_in,
          ") must be even: [num_tokens, 2 * d], gate then up");
    }
    const int64_t hidden = kFused ? d_in / 2 : d_in;
    RuntimeCheck(
        hidden % group_size == 0,
        op,
        ": the last dimension of ",
        kFused ? "input / 2" : "input",
        " (",
        hidden,
        ") must be a multiple of group_size (",
        group_size,
        ")");
    RuntimeCheck(std::isfinite(eps) && eps >= 0, op, ": eps must be finite and >= 0, got ", eps);
    H.set_value(hidden);
    G.set_value(hidden / group_size);
    TensorMatcher({N, H}).with_device<kDLCUDA>(device).with_dtype<fp8_e4m3_t>().verify(output_q, "output_q");
    TensorMatcher({N, G}).with_strides({S0, S1}).with_device<kDLCUDA>(device).with_dtype<fp32_t>().verify(
        output_s, "output_s");
    const int64_t n = N.unwrap();
    const int64_t g = G.unwrap();
    const int64_t s0 = S0.unwrap();
    const int64_t s1 = S1.unwrap();
    check_scale_strides(op, ScaleStrides{n, g, s0, s1});
    RuntimeCheck(n * g < (int64_t{1} << 31), op, ": at most 2^31 - 1 groups, got ", n * g);
    if (n * g == 0 || has_no_data(output_q)) return;  // nothing to do, or a fake call's checks alone
    const DLDevice dev = device.unwrap();
    const bool pdl = runtime::resolve_pdl(enable_pdl, dev.device_id);

    GroupParams p{};
    p.in = input.data_ptr();
    p.in_stride = IS.unwrap();
    p.up_offset = kFused ? hidden : 0;
    p.q = static_cast<fp8_e4m3_t*>(output_q.data_ptr());
    p.q_stride = hidden;
    p.s = static_cast<float*>(output_s.data_ptr());
    p.s_row_stride = s0;
    p.s_col_stride = s1;
    p.groups_per_row = static_cast<uint32_t>(g);
    p.total_groups = static_cast<uint32_t>(n * g);
    p.eps = static_cast<float>(eps);
    p.ue8m0 = scale_ue8m0;
    constexpr int kN = kVec<T>;
    p.aligned = reinterpret_cast<uintptr_t>(p.in) % 16 == 0 && reinterpret_cast<uintptr_t>(p.q) % kN == 0 &&
                (n == 1 || (p.in_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0);
    if (group_size == 64) {
      launch<64, kFused>(p, dev, pdl);
    } else {
      launch<128, kFused>(p, dev, pdl);
    }
  }

  template <int kGroup, bool kFused>
  static void launch(const GroupParams& p, DLDevice dev, bool pdl) {
    using namespace host;
    if constexpr (kFused) {
      const int64_t wave_threads =
          int64_t{runtime::sm_count(dev.device_id)} * runtime::max_threads_per_sm(dev.device_id);
      if (int64_t{p.total_groups} * GroupShape<T, kGroup, kFusedWaveVecs>::kLanes <= wave_threads) {
        launch_fused<kGroup, kFusedWaveVecs>(p, dev, pdl);
      } else {
        launch_fused<kGroup, kFusedVecs>(p, dev, pdl);
      }
    } else {
      using K = GroupShape<T, kGroup, 4>;
      const auto blocks = static_cast<uint32_t>(div_ceil(int64_t{p.total_groups}, int64_t{K::kGroupsPerBlock}));
      LaunchKernel(blocks, kGroupThreads, dev).enable_pdl(pdl)(per_token_group_kernel<T, kGroup, false, 4>, p);
    }
  }

  template <int kGroup, int kPer>
  static void launch_fused(const GroupParams& p, DLDevice dev, bool pdl) {
    using namespace host;
    using K = GroupShape<T, kGroup, kPer>;
    const int64_t rows = p.total_groups / p.groups_per_row;
    const int64_t row_blocks = div_ceil(int64_t{p.groups_per_row}, int64_t{K::kGroupsPerBlock});
    RuntimeCheck(
        row_blocks <= 65535,
        "silu_and_mul_per_token_group_quant_fp8: at most ",
        65535 * K::kGroupsPerBlock,
        " groups per row, got ",
        p.groups_per_row);
    const dim3 grid(static_cast<uint32_t>(rows), static_cast<uint32_t>(row_blocks));
    LaunchKernel(grid, kGroupThreads, dev).enable_pdl(pdl)(per_token_group_kernel<T, kGroup, true, kPer>, p);
  }
};

}  // namespace jit_kernel::token_quant
