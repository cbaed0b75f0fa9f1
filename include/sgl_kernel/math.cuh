/// \file math.cuh
/// \brief `device::math`: type-dispatched math (through `dtype_trait`) and constants.
///
/// `max`, `min` and `abs` also accept plain integers and other types with
/// ordinary operators; the rest need a `dtype_trait` with that function
/// (`fp32_t`, `fp16_t`, `bf16_t` and their packed pairs, see `type.cuh`).

#pragma once

#include <sgl_kernel/type.cuh>

#include <type_traits>

namespace device::math {

/// \brief log2(e): `exp(x) == exp2(x * log2e)`.
inline constexpr float log2e = 1.44269504088896340736f;
/// \brief ln(2).
inline constexpr float loge2 = 0.693147180559945309417f;
inline constexpr float pi = 3.14159265358979323846f;
/// \brief Largest finite FP8 values (what quantizers scale to).
inline constexpr float FP8_E4M3_MAX = 448.0f;
inline constexpr float FP8_E5M2_MAX = 57344.0f;

template <typename T>
SGL_DEVICE T max(T a, T b) {
  if constexpr (requires { dtype_trait<T>::max(a, b); }) {
    return dtype_trait<T>::max(a, b);
  } else {
    return a < b ? b : a;
  }
}

template <typename T>
SGL_DEVICE T min(T a, T b) {
  if constexpr (requires { dtype_trait<T>::min(a, b); }) {
    return dtype_trait<T>::min(a, b);
  } else {
    return b < a ? b : a;
  }
}

template <typename T>
SGL_DEVICE T abs(T a) {
  if constexpr (requires { dtype_trait<T>::abs(a); }) {
    return dtype_trait<T>::abs(a);
  } else if constexpr (std::is_unsigned_v<T>) {
    return a;
  } else {
    return a < T{} ? -a : a;
  }
}

template <typename T>
SGL_DEVICE T sqrt(T a) {
  return dtype_trait<T>::sqrt(a);
}

/// \brief 1 / sqrt(a).
template <typename T>
SGL_DEVICE T rsqrt(T a) {
  return dtype_trait<T>::rsqrt(a);
}

template <typename T>
SGL_DEVICE T exp(T a) {
  return dtype_trait<T>::exp(a);
}

template <typename T>
SGL_DEVICE T sin(T a) {
  return dtype_trait<T>::sin(a);
}

template <typename T>
SGL_DEVICE T cos(T a) {
  return dtype_trait<T>::cos(a);
}

}  // namespace device::math
