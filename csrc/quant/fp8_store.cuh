// store_fp8: kN scaled floats as kN float8_e4m3 values, shared by the per-token quant kernels
// and the KV-cache store; inverse: the scale's reciprocal every fp8 quantiser multiplies by.
#pragma once

#include <sgl_kernel/type.cuh>
#include <sgl_kernel/vec.cuh>

#include <cstdint>
#include <cuda_fp8.h>

namespace jit_kernel::fp8 {

// 1 / scale, and 0 for a zero scale (a zero row, or a zero static scale): q is then 0, not NaN.
// The reciprocal (rcp.rn, the correctly rounded 1 / scale) is taken whatever the scale and then
// selected, which leaves no branch around it.
SGL_DEVICE float inverse(float scale) {
  const float r = __frcp_rn(scale);
  return scale > 0.f ? r : 0.f;
}

// y[0..kN) (already scaled, kN even) as kN fp8 values, in pairs (cvt.rn.satfinite.e4m3x2.f32, or
// e5m2x2). SATFINITE: values beyond the largest finite one (448, e5m2 57344) saturate, NaN stays NaN.
template <int kN, __nv_fp8_interpretation_t kKind = __NV_E4M3>
SGL_DEVICE auto pack_fp8(const float (&y)[kN]) {
  static_assert(kN % 2 == 0, "pack_fp8: an even number of values");
  device::AlignedVector<__nv_fp8x2_storage_t, kN / 2> packed;
#pragma unroll
  for (int j = 0; j < kN / 2; ++j) {
    packed[j] = __nv_cvt_float2_to_fp8x2(make_float2(y[2 * j], y[2 * j + 1]), __NV_SATFINITE, kKind);
  }
  return packed;
}

// Stores y[0..kN) (already scaled) as kN fp8 values at out[0..kN): one kN-byte store when
// `aligned`, else byte by byte.
template <int kN>
SGL_DEVICE void store_fp8(fp8_e4m3_t* out, const float (&y)[kN], bool aligned = true) {
  if constexpr (kN == 1) {
    *reinterpret_cast<__nv_fp8_storage_t*>(out) = __nv_cvt_float_to_fp8(y[0], __NV_SATFINITE, __NV_E4M3);
  } else {
    const auto packed = pack_fp8(y);
    if (aligned) {
      packed.store(out);
    } else {
      auto* bytes = reinterpret_cast<uint8_t*>(out);
#pragma unroll
      for (int j = 0; j < kN / 2; ++j) {
        bytes[2 * j] = static_cast<uint8_t>(packed[j] & 0xff);
        bytes[2 * j + 1] = static_cast<uint8_t>(packed[j] >> 8);
      }
    }
  }
}

}  // namespace jit_kernel::fp8
