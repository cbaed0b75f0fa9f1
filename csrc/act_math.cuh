// The activations' fp32 math, shared by silu_and_mul / gelu_and_mul / gelu_tanh_and_mul
// (activation.cuh) and the fused silu + group quant (quant/per_token_group_fp8.cuh), which must
// agree with silu_and_mul bit for bit.
//
// exp2_ftz(x) = 2^x by ex2.approx.ftz, exp_ftz(x) = 2^(x log2 e): without ftz (__expf), ptxas guards
// each exp2 against a subnormal result (a compare and two predicated multiplies per element). silu
// and gelu_tanh add the result to 1, which rounds a subnormal away: the same bits as __expf's for
// every input. gelu's tail (x < 0) uses it unrounded: a value below 2^-126 |x| becomes 0.
#pragma once

#include <sgl_kernel/math.cuh>
#include <sgl_kernel/utils.cuh>

namespace jit_kernel {

SGL_DEVICE float exp2_ftz(float x) {
  float e;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(x));
  return e;
}

SGL_DEVICE float exp_ftz(float x) {
  return exp2_ftz(x * device::math::log2e);
}

// 1 / x by rcp.approx.ftz (one MUFU.RCP): __fdividef adds a compare, a select and two multiplies an
// element to rescale divisors above 2^126, which here are only ever 1 + (an overflowed exponential)
// = inf, whose reciprocal is 0 either way.
SGL_DEVICE float rcp_ftz(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

// fmaxf / fminf that return NaN when either input is NaN (max.NaN / min.NaN, sm_80): gelu's
// max(x, 0) and clamp must not turn a NaN input into a number.
SGL_DEVICE float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

SGL_DEVICE float min_nan(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// silu(x) = x * sigmoid(x) = x / (1 + e^-x). x < -88: e^-x overflows to inf, its reciprocal is 0
// and the result -0 (the exact value is below 1e-36 in magnitude). NaN stays NaN. exp_ftz, not
// __expf: no subnormal guard, the same bits (the top of this file; docs/design/activation.md).
SGL_DEVICE float silu(float x) {
  return x * rcp_ftz(1.f + exp_ftz(-x));
}

}  // namespace jit_kernel
