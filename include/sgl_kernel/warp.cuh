/// \file warp.cuh
/// \brief Warp-level primitives: butterfly reductions and streaming
/// (evict-first, `.cs`) copies of a contiguous block by all lanes together.

#pragma once

#include <sgl_kernel/math.cuh>
#include <sgl_kernel/tile.cuh>  // sglang's warp.cuh provides tile:: and AlignedVector (0.5.23)
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/vec.cuh>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace device::warp {

/// \brief All 32 lanes; `device::kFullMask`, also reachable as `warp::kFullMask`.
using ::device::kFullMask;
/// \brief The type of a lane mask (sglang's name).
using mask_t = uint32_t;

/**
 * \brief Sum of `value` over groups of `kThreads` consecutive lanes (the whole
 *        warp by default); every lane of a group gets the result.
 * \param active_mask the lanes taking part; all of them must call this.
 */
template <typename T, uint32_t kThreads = kWarpThreads>
SGL_DEVICE T reduce_sum(T value, uint32_t active_mask = kFullMask) {
  static_assert(kThreads > 0 && kThreads <= kWarpThreads && (kThreads & (kThreads - 1)) == 0);
#pragma unroll
  for (uint32_t offset = kThreads / 2; offset > 0; offset /= 2) {
    value = value + __shfl_xor_sync(active_mask, value, offset);
  }
  return value;
}

/// \brief Maximum of `value` over groups of `kThreads` lanes (see `reduce_sum`).
template <typename T, uint32_t kThreads = kWarpThreads>
SGL_DEVICE T reduce_max(T value, uint32_t active_mask = kFullMask) {
  static_assert(kThreads > 0 && kThreads <= kWarpThreads && (kThreads & (kThreads - 1)) == 0);
#pragma unroll
  for (uint32_t offset = kThreads / 2; offset > 0; offset /= 2) {
    value = math::max(value, __shfl_xor_sync(active_mask, value, offset));
  }
  return value;
}

/// \brief Minimum of `value` over groups of `kThreads` lanes (see `reduce_sum`).
template <typename T, uint32_t kThreads = kWarpThreads>
SGL_DEVICE T reduce_min(T value, uint32_t active_mask = kFullMask) {
  static_assert(kThreads > 0 && kThreads <= kWarpThreads && (kThreads & (kThreads - 1)) == 0);
#pragma unroll
  for (uint32_t offset = kThreads / 2; offset > 0; offset /= 2) {
    value = math::min(value, __shfl_xor_sync(active_mask, value, offset));
  }
  return value;
}

// The same reductions with the group width first, as sglang.jit_kernel writes them:
// `warp::reduce_sum<16>(x)` (ours: `reduce_sum<float, 16>(x)`, or just `reduce_sum(x)`). Overloads
// rather than a changed order: a width is never a valid type argument and a type never a valid
// width, so each call matches exactly one form. The width has no default here, so a call without
// template arguments stays unambiguous.
//
// `kInner = false` (sglang 0.5.16) reduces across the groups instead: every lane gets the total of
// the lanes at its own position in each group of `kThreads` (lanes `l`, `l ^ kThreads`, ...).

namespace details {

template <uint32_t kThreads, bool kInner, typename T, typename Op>
SGL_DEVICE T butterfly(T value, uint32_t active_mask, Op op) {
  static_assert(kThreads > 0 && kThreads <= kWarpThreads && (kThreads & (kThreads - 1)) == 0);
  if constexpr (kInner) {
#pragma unroll
    for (uint32_t offset = kThreads / 2; offset > 0; offset /= 2) {
      value = op(value, __shfl_xor_sync(active_mask, value, offset));
    }
  } else {
#pragma unroll
    for (uint32_t offset = kThreads; offset < kWarpThreads; offset *= 2) {
      value = op(value, __shfl_xor_sync(active_mask, value, offset));
    }
  }
  return value;
}

}  // namespace details

template <uint32_t kThreads, bool kInner = true, typename T>
SGL_DEVICE T reduce_sum(T value, uint32_t active_mask = kFullMask) {
  return details::butterfly<kThreads, kInner>(value, active_mask, [](T a, T b) { return a + b; });
}

template <uint32_t kThreads, bool kInner = true, typename T>
SGL_DEVICE T reduce_max(T value, uint32_t active_mask = kFullMask) {
  return details::butterfly<kThreads, kInner>(value, active_mask, [](T a, T b) { return math::max(a, b); });
}

template <uint32_t kThreads, bool kInner = true, typename T>
SGL_DEVICE T reduce_min(T value, uint32_t active_mask = kFullMask) {
  return details::butterfly<kThreads, kInner>(value, active_mask, [](T a, T b) { return math::min(a, b); });
}

namespace details {

/// \brief The register type one lane moves per instruction: 4, 8 or 16 bytes.
template <std::size_t kUnit>
struct package {
  static_assert(kUnit == 4 || kUnit == 8 || kUnit == 16, "streaming copies move 4, 8 or 16 bytes per lane");
};
template <>
struct package<4> {
  using type = uint1;
};
template <>
struct package<8> {
  using type = uint2;
};
template <>
struct package<16> {
  using type = uint4;
};

template <std::size_t kUnit>
using package_t = typename package<kUnit>::type;

/// \brief Widest unit that lets 32 lanes split `bytes` evenly.
inline constexpr auto default_unit(std::size_t bytes) -> std::size_t {
  if (bytes % (16 * kWarpThreads) == 0) return 16;
  if (bytes % (8 * kWarpThreads) == 0) return 8;
  return 4;
}

// `.cs` (cache streaming): the line is likely touched once, so evict it first
// instead of displacing data other warps still use.
SGL_DEVICE auto load_cs(const uint1* src) -> uint1 {
  uint1 v;
  asm volatile("ld.global.cs.b32 %0, [%1];" : "=r"(v.x) : "l"(src) : "memory");
  return v;
}
SGL_DEVICE auto load_cs(const uint2* src) -> uint2 {
  uint2 v;
  asm volatile("ld.global.cs.v2.b32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(src) : "memory");
  return v;
}
SGL_DEVICE auto load_cs(const uint4* src) -> uint4 {
  uint4 v;
  asm volatile("ld.global.cs.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(src)
               : "memory");
  return v;
}
SGL_DEVICE void store_cs(uint1* dst, const uint1& v) {
  asm volatile("st.global.cs.b32 [%0], %1;" ::"l"(dst), "r"(v.x) : "memory");
}
SGL_DEVICE void store_cs(uint2* dst, const uint2& v) {
  asm volatile("st.global.cs.v2.b32 [%0], {%1, %2};" ::"l"(dst), "r"(v.x), "r"(v.y) : "memory");
}
SGL_DEVICE void store_cs(uint4* dst, const uint4& v) {
  asm volatile("st.global.cs.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

template <std::size_t kBytes, std::size_t kUnit, std::size_t kThreads>
inline constexpr std::size_t kRounds = [] {
  static_assert(kBytes % (kUnit * kThreads) == 0, "kBytes must be a multiple of kUnit * kThreads");
  return kBytes / (kUnit * kThreads);
}();

}  // namespace details

/**
 * \brief The `kThreads` lanes of a (sub-)warp read `kBytes` contiguous bytes
 *        of global memory together, `kUnit` bytes per lane per round, with
 *        streaming loads. Each lane keeps its share in registers.
 *
 * Lane `l` holds units `l, l + kThreads, l + 2 * kThreads, ...`, so every round
 * is one coalesced `kUnit * kThreads`-byte transaction. `src` must be
 * `kUnit`-aligned and `kBytes` a multiple of `kUnit * kThreads`.
 */
template <std::size_t kBytes, std::size_t kUnit = details::default_unit(kBytes), std::size_t kThreads = kWarpThreads>
SGL_DEVICE auto load_vec(const void* __restrict__ src) {
  using Package = details::package_t<kUnit>;
  constexpr auto kRounds = details::kRounds<kBytes, kUnit, kThreads>;
  const auto packages = static_cast<const Package*>(src);
  const auto lane = threadIdx.x % kThreads;
  device_vec<Package, kRounds> vec;
#pragma unroll
  for (std::size_t i = 0; i < kRounds; ++i) {
    vec.data[i] = details::load_cs(packages + i * kThreads + lane);
  }
  return vec;
}

/// \brief Writes back what `load_vec` with the same parameters returned.
template <
    std::size_t kBytes,
    std::size_t kUnit = details::default_unit(kBytes),
    std::size_t kThreads = kWarpThreads,
    typename Vec>
SGL_DEVICE void store_vec(void* __restrict__ dst, const Vec& vec) {
  using Package = details::package_t<kUnit>;
  constexpr auto kRounds = details::kRounds<kBytes, kUnit, kThreads>;
  static_assert(std::is_same_v<Vec, device_vec<Package, kRounds>>, "store_vec: parameters differ from load_vec's");
  const auto packages = static_cast<Package*>(dst);
  const auto lane = threadIdx.x % kThreads;
#pragma unroll
  for (std::size_t i = 0; i < kRounds; ++i) {
    details::store_cs(packages + i * kThreads + lane, vec.data[i]);
  }
}

/// \brief Streams `kBytes` from `src` to `dst` (see `load_vec`); the ranges must not overlap.
template <std::size_t kBytes, std::size_t kUnit = details::default_unit(kBytes), std::size_t kThreads = kWarpThreads>
SGL_DEVICE void copy(void* __restrict__ dst, const void* __restrict__ src) {
  store_vec<kBytes, kUnit, kThreads>(dst, load_vec<kBytes, kUnit, kThreads>(src));
}

}  // namespace device::warp
