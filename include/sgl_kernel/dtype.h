/// \file dtype.h
/// \brief C++ types to DLPack dtypes (`host::dl_dtype_of`), PyTorch-style dtype
/// names, and the primary `dtype_trait`. Plain C++20; the CUDA float types are
/// added when compiled by nvcc. `tensor.h` and `type.cuh` both build on it.
///
/// Why `dtype_trait` derives from a separate helper: `type.cuh` gives CUDA types
/// full specializations (`template <> struct dtype_trait<fp16_t>` with device
/// math). A specialization must come before the first use that instantiates the
/// template, so the library's own host code (the matcher) only ever names
/// `dl_dtype_of`, never `dtype_trait`: including `tensor.h` first can then
/// never break `type.cuh`. User code should likewise include `type.cuh` before
/// it first uses `dtype_trait` (all includes at the top of the file do that).

#pragma once

#include <dlpack/dlpack.h>

#include <concepts>
#include <cstdint>
#include <string>
#include <type_traits>

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace host {

/// \brief `dl_dtype_of<T>::value` is the DLPack dtype of `T`; types without one have no `value`.
template <typename T>
struct dl_dtype_of {};

template <std::integral T>
struct dl_dtype_of<T> {
  static constexpr DLDataType value = {
      .code = static_cast<uint8_t>(std::is_signed_v<T> ? kDLInt : kDLUInt),
      .bits = static_cast<uint8_t>(sizeof(T) * 8),
      .lanes = 1};
};

// PyTorch exports bool as an 8-bit kDLBool, not as an unsigned integer.
template <>
struct dl_dtype_of<bool> {
  static constexpr DLDataType value = {.code = kDLBool, .bits = 8, .lanes = 1};
};

template <>
struct dl_dtype_of<float> {
  static constexpr DLDataType value = {.code = kDLFloat, .bits = 32, .lanes = 1};
};

template <>
struct dl_dtype_of<double> {
  static constexpr DLDataType value = {.code = kDLFloat, .bits = 64, .lanes = 1};
};

#ifdef __CUDACC__
template <>
struct dl_dtype_of<__half> {
  static constexpr DLDataType value = {.code = kDLFloat, .bits = 16, .lanes = 1};
};

template <>
struct dl_dtype_of<__nv_bfloat16> {
  static constexpr DLDataType value = {.code = kDLBfloat, .bits = 16, .lanes = 1};
};

template <>
struct dl_dtype_of<__nv_fp8_e4m3> {
  static constexpr DLDataType value = {.code = kDLFloat8_e4m3fn, .bits = 8, .lanes = 1};
};

template <>
struct dl_dtype_of<__nv_fp8_e5m2> {
  static constexpr DLDataType value = {.code = kDLFloat8_e5m2, .bits = 8, .lanes = 1};
};
#endif

template <typename T>
concept has_dl_dtype = requires { dl_dtype_of<T>::value; };

template <has_dl_dtype T>
inline constexpr DLDataType dl_dtype_v = dl_dtype_of<T>::value;

namespace details {

inline constexpr auto same_dtype(DLDataType a, DLDataType b) -> bool {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

/// \brief A dtype name as PyTorch spells it: `float16`, `bfloat16`, `int32`, `bool`, `float8_e4m3fn`.
inline auto dtype_name(DLDataType dtype) -> std::string {
  const auto bits = std::to_string(dtype.bits);
  std::string name;
  switch (dtype.code) {
    case kDLInt: name = "int" + bits; break;
    case kDLUInt: name = "uint" + bits; break;
    case kDLFloat: name = "float" + bits; break;
    case kDLBfloat: name = "bfloat" + bits; break;
    case kDLBool: name = dtype.bits == 8 ? "bool" : "bool" + bits; break;
    case kDLComplex: name = "complex" + bits; break;
    case kDLOpaqueHandle: name = "handle" + bits; break;
    case kDLFloat8_e3m4: name = "float8_e3m4"; break;
    case kDLFloat8_e4m3: name = "float8_e4m3"; break;
    case kDLFloat8_e4m3b11fnuz: name = "float8_e4m3b11fnuz"; break;
    case kDLFloat8_e4m3fn: name = "float8_e4m3fn"; break;
    case kDLFloat8_e4m3fnuz: name = "float8_e4m3fnuz"; break;
    case kDLFloat8_e5m2: name = "float8_e5m2"; break;
    case kDLFloat8_e5m2fnuz: name = "float8_e5m2fnuz"; break;
    case kDLFloat8_e8m0fnu: name = "float8_e8m0fnu"; break;
    case kDLFloat6_e2m3fn: name = "float6_e2m3fn"; break;
    case kDLFloat6_e3m2fn: name = "float6_e3m2fn"; break;
    case kDLFloat4_e2m1fn: name = "float4_e2m1fn"; break;
    default: name = "dtype(code=" + std::to_string(dtype.code) + ", bits=" + bits + ")"; break;
  }
  if (dtype.lanes != 1) name += "x" + std::to_string(dtype.lanes);
  return name;
}

}  // namespace details

/// \brief True when `dtype` is exactly the dtype of `T` (same code, bits, lanes).
template <has_dl_dtype T>
inline constexpr auto is_type(DLDataType dtype) -> bool {
  return details::same_dtype(dtype, dl_dtype_v<T>);
}

}  // namespace host

/// \brief Per-type trait, global like the `fp16_t` aliases. Here it only
/// carries the DLPack dtype (`dtype_trait<int32_t>::value`); `type.cuh` gives
/// the CUDA float types full specializations with conversions and math.
template <typename T>
struct dtype_trait : host::dl_dtype_of<T> {};
