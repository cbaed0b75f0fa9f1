// Gated activations: out[t, c] = act(input[t, c]) * input[t, d + c] over rows `[N, 2d] -> [N, d]`
// (gate = first half of a row, up = second half), with act one of
//   silu:       x * sigmoid(x)
//   gelu:       x * Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))            (exact GELU)
//   gelu_tanh:  0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3)
// computed in fp32 and rounded once to T (fp16_t, bf16_t, fp32_t). Rows may be strided (unit last
// stride); the three activations are three exports of one translation unit per dtype.
//
// Work split: one thread per 16-byte vector of out (kN elements: 2 loads of 16 bytes, 1 store) when
// d, both row strides and both pointers allow it, else one thread per element. A block is 128
// threads shaped tx x ty (tx = min(128, pow2 >= vectors per row)): a row of d = 14336 bf16 (1792
// vectors) spreads over 14 blocks, so a decode step (1-16 tokens) is one short launch over many
// SMs rather than one block per token; short rows put several tokens in one block. A capped grid
// loops over tokens, two per iteration with both loads issued before either store. Data beyond the
// L2 cache: silu and gelu_tanh take one token per thread (one block row per token group), gelu (the
// most arithmetic) two, in one iteration (Act::kTokensPerThread). Data that fit in L2 (an [N, 2d]
// input the previous GEMM just wrote): one wave of at most two tokens per thread, every activation;
// block turnover, not DRAM, bounds these. Plain loads, no evict_first hint. Up to kDecodeTokens
// tokens: 8-byte vectors (below). The measurements behind these rules: docs/design/activation.md.
#pragma once

#include "act_math.cuh"

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
#include <cstddef>
#include <cstdint>

namespace jit_kernel::activation {

inline constexpr uint32_t kThreads = 128;
// Data that fit in the L2 cache: the grid is capped at one wave (runtime::max_threads_per_sm /
// kThreads blocks per SM), at most kMaxL2TokensPerThread tokens per thread. Beyond:
// Act::kTokensPerThread tokens per thread. See docs/design/activation.md.
inline constexpr int64_t kMaxGridY = 65535;
inline constexpr int64_t kMaxL2TokensPerThread = 2;
// Up to kDecodeTokens tokens a thread takes 8-byte vectors, not 16-byte ones: twice the threads,
// half the serial work each, for a launch that latency bounds (docs/design/activation.md).
inline constexpr int64_t kDecodeTokens = 16;

// act_math.cuh: shared with the fused silu + group quant, which must match it bit for bit.
struct Silu {
  static constexpr int64_t kTokensPerThread = 1;
  static constexpr int kMinBlocksDecode = 1, kMinBlocks = 1;  // see act_and_mul_kernel
  SGL_DEVICE static float apply(float x) {
    return silu(x);
  }
};

// gelu(x) = x Phi(x), Phi(x) = 1 - q for x >= 0 and q for x < 0, where q = 0.5 erfc(|x| / sqrt 2) by
// Abramowitz & Stegun 7.1.26 (|error of erf| <= 1.5e-7, below an fp32 ulp of values near 1):
// q = 0.5 t P(t) exp(-x^2 / 2), t = 1 / (1 + p |x| / sqrt 2), with the 0.5, 1 / sqrt 2 and log2(e)
// folded into the constants. Branch-free: one fast reciprocal, one exponential, where erff
// branches over two polynomials; q directly (not 1 + erf) saves four operations an element.
// x Phi(x) as max(x, 0) - |x| q, one FMA (x - x q for x >= 0, x q below), with |x| clamped to 16
// (q is 0 from 13.3 on, so gelu(inf) = inf and gelu(-inf) = 0, where x q would give NaN) and NaN
// kept by max.NaN / min.NaN; t by rcp.approx (act_math.cuh): fewer instructions an element than a
// select between the two signs. See docs/design/activation.md.
SGL_DEVICE float gelu(float x) {
  constexpr float kP = 0.3275911f * 0.70710678118654752440f;
  constexpr float kE = -0.5f * device::math::log2e;
  const float a = min_nan(fabsf(x), 16.f);
  const float t = rcp_ftz(fmaf(kP, a, 1.f));
  // A&S's a1..a5, halved.
  constexpr float kA1 = 0.5f * 0.254829592f, kA2 = 0.5f * -0.284496736f, kA3 = 0.5f * 1.421413741f;
  constexpr float kA4 = 0.5f * -1.453152027f, kA5 = 0.5f * 1.061405429f;
  const float poly = t * fmaf(t, fmaf(t, fmaf(t, fmaf(t, kA5, kA4), kA3), kA2), kA1);
  const float q = poly * exp2_ftz(a * a * kE);
  return fmaf(-a, q, max_nan(x, 0.f));
}

// Two tokens per thread beyond the L2 cache: gelu has the most arithmetic of the three
// (docs/design/activation.md).
struct Gelu {
  static constexpr int64_t kTokensPerThread = 2;
  static constexpr int kMinBlocksDecode = 12, kMinBlocks = 1;
  SGL_DEVICE static float apply(float x) {
    return gelu(x);
  }
};

// 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = beta (x + kappa x^3): the form of silu, no tanh and no
// cancellation; x / (1 + 2^(x (c + c kappa x^2))) with c = -2 beta log2(e) folded. Not a
// tanh.approx.f32 form (FlashInfer's): it errs by up to 2^-11 of tanh near -1, where 1 + tanh(u)
// cancels (x below about -1). See docs/design/activation.md.
struct GeluTanh {
  static constexpr int64_t kTokensPerThread = 1;
  static constexpr int kMinBlocksDecode = 1, kMinBlocks = 1;
  SGL_DEVICE static float apply(float x) {
    constexpr float kC = -2.f * 0.79788456080286535588f * device::math::log2e;  // sqrt(2 / pi)
    constexpr float kCKappa = kC * 0.044715f;
    return x * rcp_ftz(1.f + exp2_ftz(x * fmaf(kCKappa, x * x, kC)));
  }
};

template <typename Act, typename T, std::size_t kN>
SGL_DEVICE device::AlignedVector<T, kN> act_mul(
    const device::AlignedVector<T, kN>& gate, const device::AlignedVector<T, kN>& up) {
  device::AlignedVector<T, kN> y;
#pragma unroll
  for (std::size_t j = 0; j < kN; ++j) {
    const float g = dtype_trait<fp32_t>::from(gate[j]);
    const float u = dtype_trait<fp32_t>::from(up[j]);
    y[j] = dtype_trait<T>::from(Act::apply(g) * u);
  }
  return y;
}

// `cols`: vectors of kN elements per output row (d / kN); the up half of an input row starts
// `cols` vectors after its gate half. Strides count elements (multiples of kN).
// Blocks per SM for __launch_bounds__: Act::kMinBlocksDecode on 8-byte vectors, Act::kMinBlocks
// otherwise. They steer ptxas's schedule more than the occupancy: without them it keeps these
// kernels at 32 registers by issuing loads late (gelu on 8-byte vectors: the up half's load after
// the gate's math; two tokens per thread: the second token's loads after the first's store) and
// serialising the exponentials. 1 lifts the cap; gelu's 12 (at most 42 registers) keeps its loads
// up front on 8-byte vectors. How the values were chosen: docs/design/activation.md.
template <typename Act, typename T, int kN>
__global__ void __launch_bounds__(kThreads, kN * sizeof(T) == 8 ? Act::kMinBlocksDecode : Act::kMinBlocks)
    act_and_mul_kernel(
        T* __restrict__ out,
        const T* __restrict__ in,
        int64_t out_stride,
        int64_t in_stride,
        int64_t tokens,
        int64_t cols) {
  using Vec = device::AlignedVector<T, kN>;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  if (col >= cols) return;
  for (int64_t t = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; t < tokens; t += 2 * step) {
    const bool second = t + step < tokens;
    const T* row0 = in + t * in_stride;
    const T* row1 = in + (t + step) * in_stride;
    Vec g0, u0, g1, u1;
    g0.load(row0, col);
    u0.load(row0, cols + col);
    if (second) {
      g1.load(row1, col);
      u1.load(row1, cols + col);
    }
    act_mul<Act>(g0, u0).store(out + t * out_stride, col);
    if (second) act_mul<Act>(g1, u1).store(out + (t + step) * out_stride, col);
  }
}

inline int64_t pow2_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

template <typename T>
struct Activation {
  static constexpr int kVec = 16 / sizeof(T);
  static constexpr int kDecodeVec = 8 / sizeof(T);

  static void silu_and_mul(tvm::ffi::TensorView out, tvm::ffi::TensorView input, tvm::ffi::Optional<bool> enable_pdl) {
    run<Silu>(out, input, enable_pdl);
  }

  static void gelu_and_mul(tvm::ffi::TensorView out, tvm::ffi::TensorView input, tvm::ffi::Optional<bool> enable_pdl) {
    run<Gelu>(out, input, enable_pdl);
  }

  static void gelu_tanh_and_mul(
      tvm::ffi::TensorView out, tvm::ffi::TensorView input, tvm::ffi::Optional<bool> enable_pdl) {
    run<GeluTanh>(out, input, enable_pdl);
  }

  // input [N, 2d] and out [N, d], rows strided, unit last stride, same dtype and device.
  template <typename Act>
  static void run(tvm::ffi::TensorView out, tvm::ffi::TensorView input, tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    auto N = SymbolicSize{"num_tokens"};
    auto W = SymbolicSize{"2 * d"};
    auto D = SymbolicSize{"d"};
    auto device = SymbolicDevice{};
    TensorMatcher::cuda_rows<T>({N, W}, device).verify(input, "input");
    const int64_t width = W.unwrap();
    RuntimeCheck(
        width % 2 == 0, "input: the last dimension holds the gate and up halves and must be even, got ", width);
    D.set_value(width / 2);
    TensorMatcher::cuda_rows<T>({N, D}, device).verify(out, "out");
    const int64_t tokens = N.unwrap();
    const int64_t d = D.unwrap();
    const int64_t out_stride = out.stride(0);
    const int64_t in_stride = input.stride(0);
    RuntimeCheck(
        tokens <= 1 || out_stride >= d,
        "out: rows must not overlap (row stride >= d = ",
        d,
        "), got row stride ",
        out_stride);
    // Nothing to do, or FakeTensors (no data: torch.compile's fake implementations may call the
    // launcher for its checks alone): return after the checks, before any CUDA call.
    if (tokens == 0 || d == 0 || out.data_ptr() == nullptr) return;
    const DLDevice dev = device.unwrap();
    const bool pdl = runtime::resolve_pdl(enable_pdl, dev.device_id);
    auto* o = static_cast<T*>(out.data_ptr());
    const auto* x = static_cast<const T*>(input.data_ptr());
    const bool vec = reinterpret_cast<uint64_t>(o) % 16 == 0 && reinterpret_cast<uint64_t>(x) % 16 == 0 &&
                     d % kVec == 0 && (tokens == 1 || (out_stride % kVec == 0 && in_stride % kVec == 0));
    const bool decode = tokens <= kDecodeTokens;
    const int64_t cols = vec ? d / (decode ? kDecodeVec : kVec) : d;
    const int64_t tx = std::min<int64_t>(kThreads, pow2_at_least(cols));
    const int64_t ty = kThreads / tx;
    const int64_t grid_x = div_ceil(cols, tx);
    RuntimeCheck(grid_x < (int64_t{1} << 31), "input: last dimension too large, got ", width);
    const int64_t groups = div_ceil(tokens, ty);
    const auto bytes = static_cast<std::size_t>(tokens) * static_cast<std::size_t>(3 * d) * sizeof(T);
    const int64_t one_wave = std::clamp<int64_t>(
        int64_t{runtime::sm_count(dev.device_id)} * (runtime::max_threads_per_sm(dev.device_id) / kThreads) / grid_x,
        1,
        kMaxGridY);
    const int64_t per_thread = bytes <= runtime::l2_cache_bytes(dev.device_id)
                                   ? std::min(div_ceil(groups, one_wave), kMaxL2TokensPerThread)
                                   : std::min(Act::kTokensPerThread, groups);
    const int64_t iterations = std::max(per_thread, div_ceil(groups, kMaxGridY));
    const int64_t grid_y = div_ceil(groups, iterations);
    const dim3 grid(static_cast<uint32_t>(grid_x), static_cast<uint32_t>(grid_y));
    const dim3 block(static_cast<uint32_t>(tx), static_cast<uint32_t>(ty));
    LaunchKernel(grid, block, dev)
        .enable_pdl(pdl)(
            !vec     ? act_and_mul_kernel<Act, T, 1>
            : decode ? act_and_mul_kernel<Act, T, kDecodeVec>
                     : act_and_mul_kernel<Act, T, kVec>,
            o,
            x,
            out_stride,
            in_stride,
            tokens,
            cols);
  }
};

}  // namespace jit_kernel::activation
