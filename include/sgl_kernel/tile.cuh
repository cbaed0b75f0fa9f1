/// \file tile.cuh
/// \brief `tile::Memory<T>`: a group of threads reading or writing a
/// contiguous array of `T` cooperatively (coalesced: thread `tid` touches
/// element `tid + k * group_size` in round `k`).

#pragma once

#include <sgl_kernel/utils.cuh>

#include <cstdint>

namespace device::tile {

/**
 * \brief Cooperative accessor for a thread group of `tsize` threads, seen from thread `tid`.
 *
 * \code
 *   const auto mem = tile::Memory<AlignedVector<fp16x2_t, 4>>::cta();
 *   for (int64_t k = 0; mem.in_bound(n, k); ++k) {
 *     auto v = mem.load(src, k);   // src[threadIdx.x + k * blockDim.x]
 *     mem.store(dst, v, k);
 *   }
 * \endcode
 *
 * \tparam T the unit each thread moves, typically an `AlignedVector`.
 */
template <typename T>
class Memory {
 public:
  SGL_DEVICE constexpr Memory(uint32_t tid, uint32_t tsize) : m_tid(tid), m_tsize(tsize) {}

  /// \brief A single thread on its own.
  SGL_DEVICE static constexpr auto thread() -> Memory {
    return Memory{0, 1};
  }
  /// \brief The lanes of a warp (or of `warp_threads`-wide sub-warps).
  SGL_DEVICE static auto warp(uint32_t warp_threads = kWarpThreads) -> Memory {
    return Memory{threadIdx.x % warp_threads, warp_threads};
  }
  /// \brief All threads of the block (pass the thread count if it is a compile-time constant).
  SGL_DEVICE static auto cta(uint32_t cta_threads = blockDim.x) -> Memory {
    return Memory{threadIdx.x, cta_threads};
  }

  /// \brief `ptr[tid + offset * tsize]`, as `T`.
  SGL_DEVICE auto load(const void* ptr, int64_t offset = 0) const -> T {
    return static_cast<const T*>(ptr)[index(offset)];
  }
  SGL_DEVICE void store(void* ptr, const T& value, int64_t offset = 0) const {
    static_cast<T*>(ptr)[index(offset)] = value;
  }
  /// \brief Whether this thread's element of round `offset` is below `element_count`.
  SGL_DEVICE auto in_bound(int64_t element_count, int64_t offset = 0) const -> bool {
    return index(offset) < element_count;
  }

  SGL_DEVICE constexpr auto thread_id() const -> uint32_t {
    return m_tid;
  }
  SGL_DEVICE constexpr auto num_threads() const -> uint32_t {
    return m_tsize;
  }

 private:
  SGL_DEVICE constexpr auto index(int64_t offset) const -> int64_t {
    return static_cast<int64_t>(m_tid) + offset * static_cast<int64_t>(m_tsize);
  }

  uint32_t m_tid;
  uint32_t m_tsize;
};

}  // namespace device::tile
