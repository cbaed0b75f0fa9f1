/// \file philox.cuh
/// \brief `device::philox`: the Philox4x32-10 counter-based generator (Salmon et al., "Parallel
/// random numbers: as easy as 1, 2, 3", SC 2011) and uniform draws built on it.
///
/// A draw is a pure function of a 64-bit key and a 128-bit counter, so a kernel can give every
/// request its own stream (key = the request's seed, counter = its offset and the index of the
/// draw) with no state beyond those numbers: the same (seed, offset, index) gives the same bits on
/// every launch, at any position in the batch. The functions are host and device, so tests check
/// them against the published known-answer vectors on the CPU.

#pragma once

#include <cstdint>

// Host and device, without the rest of utils.cuh (a host test includes this file alone).
#define SGL_PHILOX_FN __forceinline__ __host__ __device__

namespace device::philox {

/// \brief Four 32-bit words: a counter, or one draw's output.
struct Words {
  uint32_t x, y, z, w;
};

inline constexpr uint32_t kMultiplier0 = 0xD2511F53u;
inline constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
inline constexpr uint32_t kKeyBump0 = 0x9E3779B9u;  // the golden ratio
inline constexpr uint32_t kKeyBump1 = 0xBB67AE85u;  // sqrt(3) - 1

SGL_PHILOX_FN uint32_t mul_hi(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
#endif
}

/// \brief Philox4x32 with 10 rounds: the 128 output bits for `counter` under `key` (k0, k1).
SGL_PHILOX_FN Words philox4x32_10(Words counter, uint32_t k0, uint32_t k1) {
#if defined(__CUDA_ARCH__)  // the host compiler does not know the pragma
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    const uint32_t hi0 = mul_hi(kMultiplier0, counter.x);
    const uint32_t lo0 = kMultiplier0 * counter.x;
    const uint32_t hi1 = mul_hi(kMultiplier1, counter.z);
    const uint32_t lo1 = kMultiplier1 * counter.z;
    counter = Words{hi1 ^ counter.y ^ k0, lo1, hi0 ^ counter.w ^ k1, lo0};
    k0 += kKeyBump0;
    k1 += kKeyBump1;
  }
  return counter;
}

/// \brief The 128 bits of draw `index` of the stream (`seed`, `offset`): key = seed, counter =
/// (offset, index). Distinct (offset, index) pairs never share a counter.
SGL_PHILOX_FN Words draw(uint64_t seed, uint64_t offset, uint64_t index) {
  const Words counter{static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32), static_cast<uint32_t>(index),
                      static_cast<uint32_t>(index >> 32)};
  return philox4x32_10(counter, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

/// \brief 64 uniform bits from the first two words of a draw.
SGL_PHILOX_FN uint64_t bits64(Words words) {
  return (static_cast<uint64_t>(words.y) << 32) | words.x;
}

/// \brief A float uniform on [0, 1) from 32 bits: the top 24 bits, so every value is exact.
SGL_PHILOX_FN float uniform01(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

}  // namespace device::philox
