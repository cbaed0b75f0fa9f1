/// \file math.cuh
/// \brief `device::math`: type-dispatched math (through `dtype_trait`) and constants.
///
/// `max`, `min` and `abs` also accept plain integers and other types with
/// ordinary operators; the rest need a `dtype_trait` with that function
/// (`fp32_t`, `fp16_t`, `bf16_t` and their packed pairs, see `type.cuh`).

#pragma once

#include <sgl_kernel/type.cuh>

#include <cstdint>
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

// fp32 activations on `__expf` (ex2.approx, about 2 ulp): the accuracy activations need, at a
// fraction of `expf`'s cost (sglang 0.5.23's names).

/// \brief 1 / (1 + e^-x); 0 and 1 at the far ends (no NaN: `__expf` saturates to 0 or inf).
SGL_DEVICE float sigmoid_fast(float x) {
  return __frcp_rn(1.0f + __expf(-x));
}

/// \brief x * sigmoid(x).
SGL_DEVICE float silu_fast(float x) {
  return x * sigmoid_fast(x);
}

/// \brief log(1 + e^x), and x itself above 20 (torch's threshold), where e^x would only lose
/// the result in rounding (and overflow from 88 on).
SGL_DEVICE float softplus_fast(float x) {
  return x > 20.0f ? x : log1pf(__expf(x));
}

/// \brief `a * b + acc` in fp32 with one rounding; bf16 to fp32 is exact.
SGL_DEVICE float fma_f32_bf16(bf16_t a, bf16_t b, float acc) {
  return fmaf(__bfloat162float(a), __bfloat162float(b), acc);
}
SGL_DEVICE float fma_f32_bf16(bf16_t a, float b, float acc) {
  return fmaf(__bfloat162float(a), b, acc);
}

/**
 * \brief Division and remainder of unsigned 32-bit numbers by a divisor fixed at launch, without
 *        the ~20-instruction integer division: `n / d` is a multiply-high, an add and a shift.
 *
 * Build it on the host (`fast_mod_div_u32_t{num_cols}`), pass it as a kernel argument, then
 * `row = i / d; col = i % d;` or `auto [row, col] = math::div(i, d);`. Exact for every `n` and
 * every divisor `d >= 1` of 32 bits (Granlund & Montgomery's round-up method with the 33-bit
 * intermediate kept in 64 bits); `d == 0` is undefined, as for `/`. Host and device.
 */
struct fast_mod_div_u32_t {
 public:
  constexpr fast_mod_div_u32_t() = default;
  explicit constexpr fast_mod_div_u32_t(uint32_t d) : m_divisor(d) {
    // shift = ceil(log2(d)); magic = floor(2^32 * (2^shift - d) / d) + 1, which is below 2^32.
    while (m_shift < 32 && (uint64_t{1} << m_shift) < d) ++m_shift;
    if (d != 0) m_magic = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << m_shift) - d)) / d + 1);
  }

  template <typename T>
  SGL_HOST_DEVICE friend constexpr uint32_t operator/(T n, const fast_mod_div_u32_t& d) {
    static_assert(std::is_unsigned_v<T> && sizeof(T) <= sizeof(uint32_t), "fast_mod_div_u32_t divides u32 only");
    // floor((hi(n * magic) + n) / 2^shift); the sum needs 33 bits. nvcc emits mul.hi for the product.
    const auto high = static_cast<uint32_t>((static_cast<uint64_t>(n) * d.m_magic) >> 32);
    return static_cast<uint32_t>((static_cast<uint64_t>(high) + n) >> d.m_shift);
  }

  template <typename T>
  SGL_HOST_DEVICE friend constexpr uint32_t operator%(T n, const fast_mod_div_u32_t& d) {
    return static_cast<uint32_t>(n) - (n / d) * d.m_divisor;
  }

  /// \brief The divisor.
  SGL_HOST_DEVICE constexpr operator uint32_t() const {
    return m_divisor;
  }

 private:
  uint32_t m_divisor = 1;
  uint32_t m_magic = 0;
  uint32_t m_shift = 0;
};

/// \brief `{n / d, n % d}` with one division.
template <typename T>
SGL_HOST_DEVICE constexpr uint2 div(T n, const fast_mod_div_u32_t& d) {
  const uint32_t quotient = n / d;
  return {quotient, static_cast<uint32_t>(n) - quotient * static_cast<uint32_t>(d)};
}

}  // namespace device::math
