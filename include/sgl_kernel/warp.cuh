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

/**
 * \brief Maximum over the whole warp of a float that is +0, positive or +inf
 *        (an absolute value, never NaN or -0), in one `redux.sync` on its bits:
 *        such floats order as their bit patterns do. Every lane gets the result.
 *        Five shuffle steps are five dependent round trips; this is one.
 * \note Needs sm_80; below it, falls back to `reduce_max`.
 */
SGL_DEVICE float reduce_max_nonneg(float value) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  return __uint_as_float(__reduce_max_sync(kFullMask, __float_as_uint(value)));
#else
  return reduce_max(value);
#endif
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

/// \brief This thread's lane (`%laneid`); `get_lane_id<8>()` is its index in a group of 8 lanes.
using ::device::get_lane_id;

/**
 * \brief True in exactly one of the calling (converged) lanes: the lane that issues a TMA copy or
 *        an mbarrier arrive for the whole warp. `elect.sync` on sm_90+ (one instruction, and the
 *        compiler knows the branch is warp-uniform), the lowest active lane before.
 */
SGL_DEVICE bool elect_one_lane() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t elected;
  asm volatile(
      "{\n"
      "  .reg .pred p;\n"
      "  elect.sync _|p, 0xffffffff;\n"
      "  selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(elected));
  return elected != 0;
#else
  return get_lane_id() == static_cast<uint32_t>(__ffs(__activemask()) - 1);
#endif
}

/// \brief Every lane of a group of `kWidth` lanes gets the value of the group's lane `src_lane`.
template <uint32_t kWidth = kWarpThreads, typename T>
SGL_DEVICE T broadcast(T value, uint32_t src_lane, uint32_t active_mask = kFullMask) {
  static_assert(kWidth > 0 && kWidth <= kWarpThreads && (kWidth & (kWidth - 1)) == 0);
  return __shfl_sync(active_mask, value, src_lane, kWidth);
}

/**
 * \brief Inclusive scan (prefix reduction) within each group of `kWidth` consecutive lanes: lane
 *        `i` of a group gets `op(v[0], ..., v[i])`, e.g. `inclusive_sum(count)` for the offset just
 *        past this lane's items. `lane_id` must be the lane's index *within its group*
 *        (`get_lane_id<kWidth>()`, the default).
 *
 * A Hillis-Steele scan: one shuffle per power-of-two distance in `[kStart, kFinish)`. With the
 * defaults that is the full scan. `kStart > 1` scans lanes `kStart` apart (the input already holds
 * scans of blocks of `kStart`); `kStart > kFinish` scans backwards (suffixes: lane `i` gets
 * `op(v[i], ..., v[kStart - 1])`), as sglang 0.5.23 defines them.
 */
template <ReductionOp kOp, uint32_t kWidth = kWarpThreads, uint32_t kStart = 1, uint32_t kFinish = kWidth, typename T>
SGL_DEVICE T inclusive_reduce(T value, uint32_t lane_id = get_lane_id<kWidth>(), uint32_t active_mask = kFullMask) {
  constexpr auto pow2 = [](uint32_t x) { return x > 0 && (x & (x - 1)) == 0; };
  static_assert(pow2(kWidth) && pow2(kStart) && pow2(kFinish) && kWidth <= kWarpThreads);
  static_assert(kStart <= kWidth && kFinish <= kWidth);
  using Op = ReductionTrait<kOp, T>;
  if constexpr (kStart <= kFinish) {
#pragma unroll
    for (uint32_t distance = kStart; distance < kFinish; distance *= 2) {
      const T lower = __shfl_up_sync(active_mask, value, distance, kWidth);
      if (lane_id >= distance) value = Op::reduce(value, lower);
    }
  } else {
#pragma unroll
    for (uint32_t distance = kFinish; distance < kStart; distance *= 2) {
      const T upper = __shfl_down_sync(active_mask, value, distance, kWidth);
      if (lane_id + distance < kStart) value = Op::reduce(value, upper);
    }
  }
  return value;
}

template <uint32_t kWidth = kWarpThreads, uint32_t kStart = 1, uint32_t kFinish = kWidth, typename T>
SGL_DEVICE T inclusive_sum(T value, uint32_t lane_id = get_lane_id<kWidth>(), uint32_t active_mask = kFullMask) {
  return inclusive_reduce<ReductionOp::SUM, kWidth, kStart, kFinish>(value, lane_id, active_mask);
}

template <uint32_t kWidth = kWarpThreads, uint32_t kStart = 1, uint32_t kFinish = kWidth, typename T>
SGL_DEVICE T inclusive_max(T value, uint32_t lane_id = get_lane_id<kWidth>(), uint32_t active_mask = kFullMask) {
  return inclusive_reduce<ReductionOp::MAX, kWidth, kStart, kFinish>(value, lane_id, active_mask);
}

template <uint32_t kWidth = kWarpThreads, uint32_t kStart = 1, uint32_t kFinish = kWidth, typename T>
SGL_DEVICE T inclusive_min(T value, uint32_t lane_id = get_lane_id<kWidth>(), uint32_t active_mask = kFullMask) {
  return inclusive_reduce<ReductionOp::MIN, kWidth, kStart, kFinish>(value, lane_id, active_mask);
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

/**
 * \brief The unit width `load_bytes` / `store_bytes` use for a `kBytes` row (sglang 0.5.23). A
 *        positive pattern is a largest width (`MAX_GMEM`, `RAW_8B`, ...): the widest power of two
 *        dividing both. A `WARP_UNIFORM_*` pattern (negative) also wants every lane to move the
 *        same number of units: rows of whole 128-byte lines split over the 32 lanes, with units of
 *        up to the given width, other rows take units of at most 4 bytes so that each round is
 *        still one full line.
 *
 * Kernels use the result as the alignment to require of their pointers (`ensure_alignment`).
 */
struct LoadStorePattern {
  using enum LoadStoreBytes::type;
  enum type : int64_t {
    WARP_UNIFORM_GMEM = -MAX_GMEM,
    WARP_UNIFORM_SMEM = -MAX_SMEM,
    WARP_UNIFORM_4B = -4,
    WARP_UNIFORM_8B = -8,
    WARP_UNIFORM_16B = -16,
    WARP_UNIFORM_32B = -32,
  };

  template <int64_t kBytes, int64_t kPattern>
  SGL_HOST_DEVICE static constexpr auto get_vec_bytes() -> int64_t {
    static_assert(kBytes > 0 && kPattern != 0);
    if constexpr (kPattern > 0) return largest_pow2_divisor(kBytes, kPattern);
    if constexpr (kBytes % (4 * kWarpThreads) != 0) return largest_pow2_divisor(kBytes, 4);
    return largest_pow2_divisor(kBytes / kWarpThreads, -kPattern);
  }

 private:
  /// The largest power of two dividing `bytes` and at most `limit` (a power of two).
  SGL_HOST_DEVICE static constexpr auto largest_pow2_divisor(int64_t bytes, int64_t limit) -> int64_t {
    int64_t unit = 1;
    while (unit < limit && bytes % (unit * 2) == 0) unit *= 2;
    return unit;
  }
};

namespace details {

/// The register type of a `kUnit`-byte unit: one load or store instruction.
template <int64_t kUnit>
using unit_t = std::conditional_t<
    kUnit == 1,
    uint8_t,
    std::conditional_t<kUnit == 2, uint16_t, AlignedStorage<uint32_t, static_cast<std::size_t>(kUnit / 4)>>>;

/// What one lane holds of a `load_bytes` row: its units, round by round.
template <typename Unit, int64_t kRounds>
struct lane_units {
  Unit data[kRounds];
  SGL_DEVICE auto operator[](int64_t i) -> Unit& {
    return data[i];
  }
  SGL_DEVICE auto operator[](int64_t i) const -> const Unit& {
    return data[i];
  }
  SGL_HOST_DEVICE static constexpr auto size() -> int64_t {
    return kRounds;
  }
};

template <int64_t kBytes, int64_t kUnit>
struct row_copy {
  static_assert(kUnit > 0 && (kUnit & (kUnit - 1)) == 0 && kUnit <= 32 && kBytes % kUnit == 0);
  using unit = unit_t<kUnit>;
  static constexpr int64_t kUnits = kBytes / kUnit;
  static constexpr int64_t kRounds = (kUnits + kWarpThreads - 1) / kWarpThreads;
  // Only the last round can be partial: then only its first lanes take part.
  static constexpr bool kPartial = kUnits % kWarpThreads != 0;
  using lanes_t = lane_units<unit, kRounds>;

  template <typename F>
  SGL_DEVICE static void each(F&& f) {
    const auto lane = static_cast<int64_t>(get_lane_id());
#pragma unroll
    for (int64_t round = 0; round < kRounds; ++round) {
      const auto index = round * kWarpThreads + lane;
      if (!kPartial || round + 1 < kRounds || index < kUnits) f(round, index);
    }
  }
};

}  // namespace details

/**
 * \brief The 32 lanes of a warp read the `kBytes` bytes at `src` together, `kUnit`-byte units
 *        (see `LoadStorePattern`) in coalesced rounds: lane `l` holds units `l`, `l + 32`, ....
 *        `src` must be `kUnit`-aligned. Hand the result to `store_bytes` with the same parameters.
 */
template <
    int64_t kBytes,
    int64_t kPattern = LoadStorePattern::MAX_GMEM,
    int64_t kUnit = LoadStorePattern::get_vec_bytes<kBytes, kPattern>()>
SGL_DEVICE auto load_bytes(const void* src) {
  using Copy = details::row_copy<kBytes, kUnit>;
  typename Copy::lanes_t lanes;
  const auto units = static_cast<const typename Copy::unit*>(src);
  Copy::each([&](int64_t round, int64_t index) { lanes[round] = units[index]; });
  return lanes;
}

/// \brief Writes a `load_bytes` result to the `kBytes` bytes at `dst` (`kUnit`-aligned).
template <
    int64_t kBytes,
    int64_t kPattern = LoadStorePattern::MAX_GMEM,
    int64_t kUnit = LoadStorePattern::get_vec_bytes<kBytes, kPattern>(),
    typename Lanes>
SGL_DEVICE void store_bytes(void* dst, const Lanes& lanes) {
  using Copy = details::row_copy<kBytes, kUnit>;
  static_assert(std::is_same_v<Lanes, typename Copy::lanes_t>, "store_bytes: parameters differ from load_bytes'");
  const auto units = static_cast<typename Copy::unit*>(dst);
  Copy::each([&](int64_t round, int64_t index) { units[index] = lanes[round]; });
}

}  // namespace device::warp
