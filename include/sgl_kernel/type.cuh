/// \file type.cuh
/// \brief `dtype_trait<T>` for the CUDA float types, `packed_t<T>` and `device::cast`.
///
/// Specializations (`value` is the DLPack dtype, where one exists):
/// - `fp32_t`, `fp16_t`, `bf16_t`: `value`, `packed_t` (their x2 type), `from` (any
///   type, with intrinsics between the three), `abs sqrt rsqrt exp sin cos max min`.
/// - `fp32x2_t` (packed `fp32x4_t`), `fp16x2_t`, `bf16x2_t` (packed `void`): `from`
///   between the three, the same math, element-wise.
/// - `fp8_e4m3_t`, `fp8_e5m2_t` (`value`, packed `fp8x2_*_t`) and `fp8x2_e4m3_t`,
///   `fp8x2_e5m2_t`: storage formats, so only `from` (saturating to the finite range).
///
/// Float-to-narrow conversions round to nearest even.
/// Other types keep the primary `dtype_trait` from `dtype.h` (only `value`).

#pragma once

#include <sgl_kernel/dtype.h>
#include <sgl_kernel/utils.cuh>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace device::details {

/// \brief What every specialization has: `self_t`, `packed_t`, the lane type `unpacked_t` and
/// lane count `kVecSize` of a packed type (itself and 1 for a scalar; what `device::unpack` views),
/// and a `from` that falls back to `static_cast` for conversions without a dedicated intrinsic.
template <typename Self, typename Packed, typename Unpacked = Self, std::size_t kLanes = 1>
struct dtype_trait_base : host::dl_dtype_of<Self> {
  using self_t = Self;
  using packed_t = Packed;
  using unpacked_t = Unpacked;
  static constexpr std::size_t kVecSize = kLanes;

  template <typename S>
  SGL_DEVICE static Self from(const S& value) {
    return static_cast<Self>(value);
  }
};

}  // namespace device::details

template <>
struct dtype_trait<fp32_t> : device::details::dtype_trait_base<fp32_t, fp32x2_t> {
  static constexpr float kFloatMax = 3.40282347e38f;  // largest finite value (sglang 0.5.23)
  using dtype_trait_base::from;
  SGL_DEVICE static fp32_t from(const fp16_t& x) {
    return __half2float(x);
  }
  SGL_DEVICE static fp32_t from(const bf16_t& x) {
    return __bfloat162float(x);
  }
  SGL_DEVICE static fp32_t abs(fp32_t x) {
    return fabsf(x);
  }
  SGL_DEVICE static fp32_t sqrt(fp32_t x) {
    return sqrtf(x);
  }
  SGL_DEVICE static fp32_t rsqrt(fp32_t x) {
    return rsqrtf(x);
  }
  SGL_DEVICE static fp32_t exp(fp32_t x) {
    return expf(x);
  }
  SGL_DEVICE static fp32_t sin(fp32_t x) {
    return sinf(x);
  }
  SGL_DEVICE static fp32_t cos(fp32_t x) {
    return cosf(x);
  }
  SGL_DEVICE static fp32_t max(fp32_t x, fp32_t y) {
    return fmaxf(x, y);
  }
  SGL_DEVICE static fp32_t min(fp32_t x, fp32_t y) {
    return fminf(x, y);
  }
};

template <>
struct dtype_trait<fp16_t> : device::details::dtype_trait_base<fp16_t, fp16x2_t> {
  static constexpr float kFloatMax = 65504.0f;  // largest finite value
  using dtype_trait_base::from;
  SGL_DEVICE static fp16_t from(const fp32_t& x) {
    return __float2half_rn(x);
  }
  SGL_DEVICE static fp16_t from(const bf16_t& x) {
    return __float2half_rn(__bfloat162float(x));
  }
  SGL_DEVICE static fp16_t abs(fp16_t x) {
    return __habs(x);
  }
  SGL_DEVICE static fp16_t sqrt(fp16_t x) {
    return hsqrt(x);
  }
  SGL_DEVICE static fp16_t rsqrt(fp16_t x) {
    return hrsqrt(x);
  }
  SGL_DEVICE static fp16_t exp(fp16_t x) {
    return hexp(x);
  }
  SGL_DEVICE static fp16_t sin(fp16_t x) {
    return hsin(x);
  }
  SGL_DEVICE static fp16_t cos(fp16_t x) {
    return hcos(x);
  }
  SGL_DEVICE static fp16_t max(fp16_t x, fp16_t y) {
    return __hmax(x, y);
  }
  SGL_DEVICE static fp16_t min(fp16_t x, fp16_t y) {
    return __hmin(x, y);
  }
};

template <>
struct dtype_trait<bf16_t> : device::details::dtype_trait_base<bf16_t, bf16x2_t> {
  static constexpr float kFloatMax = 3.38953139e38f;  // largest finite value
  using dtype_trait_base::from;
  SGL_DEVICE static bf16_t from(const fp32_t& x) {
    return __float2bfloat16_rn(x);
  }
  SGL_DEVICE static bf16_t from(const fp16_t& x) {
    return __float2bfloat16_rn(__half2float(x));
  }
  SGL_DEVICE static bf16_t abs(bf16_t x) {
    return __habs(x);
  }
  SGL_DEVICE static bf16_t sqrt(bf16_t x) {
    return hsqrt(x);
  }
  SGL_DEVICE static bf16_t rsqrt(bf16_t x) {
    return hrsqrt(x);
  }
  SGL_DEVICE static bf16_t exp(bf16_t x) {
    return hexp(x);
  }
  SGL_DEVICE static bf16_t sin(bf16_t x) {
    return hsin(x);
  }
  SGL_DEVICE static bf16_t cos(bf16_t x) {
    return hcos(x);
  }
  SGL_DEVICE static bf16_t max(bf16_t x, bf16_t y) {
    return __hmax(x, y);
  }
  SGL_DEVICE static bf16_t min(bf16_t x, bf16_t y) {
    return __hmin(x, y);
  }
};

template <>
struct dtype_trait<fp32x2_t> : device::details::dtype_trait_base<fp32x2_t, fp32x4_t, fp32_t, 2> {
  using dtype_trait_base::from;
  SGL_DEVICE static fp32x2_t from(const fp16x2_t& x) {
    return __half22float2(x);
  }
  // By bits (bf16 is the upper half of an fp32): a shift and a mask, where __bfloat1622float2
  // compiles to a byte permute and a shift for the upper lane.
  SGL_DEVICE static fp32x2_t from(const bf16x2_t& x) {
    uint32_t w;
    __builtin_memcpy(&w, &x, sizeof(w));
    return {__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u)};
  }
  SGL_DEVICE static fp32x2_t abs(fp32x2_t x) {
    return {fabsf(x.x), fabsf(x.y)};
  }
  SGL_DEVICE static fp32x2_t sqrt(fp32x2_t x) {
    return {sqrtf(x.x), sqrtf(x.y)};
  }
  SGL_DEVICE static fp32x2_t rsqrt(fp32x2_t x) {
    return {rsqrtf(x.x), rsqrtf(x.y)};
  }
  SGL_DEVICE static fp32x2_t exp(fp32x2_t x) {
    return {expf(x.x), expf(x.y)};
  }
  SGL_DEVICE static fp32x2_t sin(fp32x2_t x) {
    return {sinf(x.x), sinf(x.y)};
  }
  SGL_DEVICE static fp32x2_t cos(fp32x2_t x) {
    return {cosf(x.x), cosf(x.y)};
  }
  SGL_DEVICE static fp32x2_t max(fp32x2_t x, fp32x2_t y) {
    return {fmaxf(x.x, y.x), fmaxf(x.y, y.y)};
  }
  SGL_DEVICE static fp32x2_t min(fp32x2_t x, fp32x2_t y) {
    return {fminf(x.x, y.x), fminf(x.y, y.y)};
  }
};

template <>
struct dtype_trait<fp16x2_t> : device::details::dtype_trait_base<fp16x2_t, void, fp16_t, 2> {
  using dtype_trait_base::from;
  SGL_DEVICE static fp16x2_t from(const fp32x2_t& x) {
    return __float22half2_rn(x);
  }
  SGL_DEVICE static fp16x2_t from(const bf16x2_t& x) {
    return __float22half2_rn(__bfloat1622float2(x));
  }
  SGL_DEVICE static fp16x2_t abs(fp16x2_t x) {
    return __habs2(x);
  }
  SGL_DEVICE static fp16x2_t sqrt(fp16x2_t x) {
    return h2sqrt(x);
  }
  SGL_DEVICE static fp16x2_t rsqrt(fp16x2_t x) {
    return h2rsqrt(x);
  }
  SGL_DEVICE static fp16x2_t exp(fp16x2_t x) {
    return h2exp(x);
  }
  SGL_DEVICE static fp16x2_t sin(fp16x2_t x) {
    return h2sin(x);
  }
  SGL_DEVICE static fp16x2_t cos(fp16x2_t x) {
    return h2cos(x);
  }
  SGL_DEVICE static fp16x2_t max(fp16x2_t x, fp16x2_t y) {
    return __hmax2(x, y);
  }
  SGL_DEVICE static fp16x2_t min(fp16x2_t x, fp16x2_t y) {
    return __hmin2(x, y);
  }
};

template <>
struct dtype_trait<bf16x2_t> : device::details::dtype_trait_base<bf16x2_t, void, bf16_t, 2> {
  using dtype_trait_base::from;
  SGL_DEVICE static bf16x2_t from(const fp32x2_t& x) {
    return __float22bfloat162_rn(x);
  }
  SGL_DEVICE static bf16x2_t from(const fp16x2_t& x) {
    return __float22bfloat162_rn(__half22float2(x));
  }
  SGL_DEVICE static bf16x2_t abs(bf16x2_t x) {
    return __habs2(x);
  }
  SGL_DEVICE static bf16x2_t sqrt(bf16x2_t x) {
    return h2sqrt(x);
  }
  SGL_DEVICE static bf16x2_t rsqrt(bf16x2_t x) {
    return h2rsqrt(x);
  }
  SGL_DEVICE static bf16x2_t exp(bf16x2_t x) {
    return h2exp(x);
  }
  SGL_DEVICE static bf16x2_t sin(bf16x2_t x) {
    return h2sin(x);
  }
  SGL_DEVICE static bf16x2_t cos(bf16x2_t x) {
    return h2cos(x);
  }
  SGL_DEVICE static bf16x2_t max(bf16x2_t x, bf16x2_t y) {
    return __hmax2(x, y);
  }
  SGL_DEVICE static bf16x2_t min(bf16x2_t x, bf16x2_t y) {
    return __hmin2(x, y);
  }
};

// FP8 types are storage formats: conversions only (the constructors saturate to the finite range).
template <>
struct dtype_trait<fp8_e4m3_t> : device::details::dtype_trait_base<fp8_e4m3_t, fp8x2_e4m3_t> {
  static constexpr float kFloatMax = 448.0f;  // largest finite value, the quantisation clamp
};

template <>
struct dtype_trait<fp8_e5m2_t> : device::details::dtype_trait_base<fp8_e5m2_t, fp8x2_e5m2_t> {
  static constexpr float kFloatMax = 57344.0f;  // largest finite value
};

template <>
struct dtype_trait<fp8x2_e4m3_t> : device::details::dtype_trait_base<fp8x2_e4m3_t, void, fp8_e4m3_t, 2> {};

template <>
struct dtype_trait<fp8x2_e5m2_t> : device::details::dtype_trait_base<fp8x2_e5m2_t, void, fp8_e5m2_t, 2> {};

/// \brief sglang 0.5.16's name for `dtype_trait` (`DTypeTrait<T>::from(x)`). An alias: specialize
/// `dtype_trait` itself.
template <typename T>
using DTypeTrait = dtype_trait<T>;

/// \brief The packed (x2) type of `T`: `packed_t<fp16_t>` is `fp16x2_t`.
template <typename T>
using packed_t = typename dtype_trait<T>::packed_t;

namespace device {

/**
 * \brief Converts between the CUDA number types with the right intrinsic:
 *        `cast<fp32x2_t>(half2_value)`, `cast<bf16_t, float>(x)`.
 *        Types without a `dtype_trait::from` fall back to `static_cast`.
 */
template <typename To, typename From>
SGL_DEVICE To cast(const From& value) {
  if constexpr (requires { dtype_trait<To>::from(value); }) {
    return dtype_trait<To>::from(value);
  } else {
    return static_cast<To>(value);
  }
}

/**
 * \brief The lanes of a packed value as an array: `unpack(h2)[1]` is the second `fp16_t` of an
 *        `fp16x2_t` (sglang 0.5.16). A reference into `value`, so writes go through; a const value
 *        gives const lanes. A scalar is an array of one.
 */
template <typename T>
SGL_DEVICE auto unpack(T& value) -> auto& {
  using Trait = dtype_trait<std::remove_const_t<T>>;
  using Lane = typename Trait::unpacked_t;
  static_assert(sizeof(T) == sizeof(Lane) * Trait::kVecSize, "unpack: the packed type is not its lanes back to back");
  using Array = std::conditional_t<std::is_const_v<T>, const Lane[Trait::kVecSize], Lane[Trait::kVecSize]>;
  return reinterpret_cast<Array&>(value);
}

/// \brief The reductions `ReductionTrait` (and sglang's `warp::inclusive_reduce`) combine with.
enum class ReductionOp : uint8_t { SUM, MAX, MIN };

/**
 * \brief `ReductionTrait<Op, T>::reduce(x, y)`: `x + y`, `max(x, y)` or `min(x, y)` for any type
 *        with a `dtype_trait` or ordinary operators. Packed types use their paired instruction
 *        where one exists (`__hadd2`, `__hmax2`, ...), otherwise lane by lane (`fp32x2_t` has no `+`).
 */
template <ReductionOp Op, typename T>
struct ReductionTrait {
  SGL_DEVICE static T reduce(const T& x, const T& y) {
    if constexpr (Op == ReductionOp::SUM && requires { x + y; }) {
      return static_cast<T>(x + y);
    } else if constexpr (Op == ReductionOp::MAX && requires { dtype_trait<T>::max(x, y); }) {
      return dtype_trait<T>::max(x, y);
    } else if constexpr (Op == ReductionOp::MIN && requires { dtype_trait<T>::min(x, y); }) {
      return dtype_trait<T>::min(x, y);
    } else if constexpr (Op != ReductionOp::SUM && requires { x < y; }) {
      return (Op == ReductionOp::MAX) == (x < y) ? y : x;
    } else {
      static_assert(dtype_trait<T>::kVecSize > 1, "ReductionTrait: T has no such operation");
      T result;
      auto& out = unpack(result);
#pragma unroll
      for (std::size_t i = 0; i < dtype_trait<T>::kVecSize; ++i) {
        out[i] = ReductionTrait<Op, typename dtype_trait<T>::unpacked_t>::reduce(unpack(x)[i], unpack(y)[i]);
      }
      return result;
    }
  }
};

}  // namespace device

/// \brief Largest finite `fp8_e4m3_t` (448), the global name sglang.jit_kernel kernels use;
/// `device::math::FP8_E4M3_MAX` is the same value.
inline constexpr float kFP8E4M3Max = 448.0f;

/// `namespace sglang` layout (see `utils.h`).
namespace sglang {
using ::dtype_trait;
using ::DTypeTrait;
using ::kFP8E4M3Max;
using ::packed_t;
}  // namespace sglang
