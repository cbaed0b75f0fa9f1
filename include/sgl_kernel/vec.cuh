/// \file vec.cuh
/// \brief `AlignedVector<T, N>`: N elements moved with one wide load/store.

#pragma once

#include <sgl_kernel/type.cuh>  // device::cast: sglang's vec.cuh provides it (0.5.23)
#include <sgl_kernel/utils.cuh>

#include <cstddef>
#include <type_traits>

namespace device {

/// \brief `N` elements of `T` aligned to their total size: what `AlignedVector` keeps, and what a
/// kernel can reinterpret memory as for one wide access (`AlignedStorage<uint32_t, 4>`, 16 bytes).
template <typename T, std::size_t N>
struct alignas(sizeof(T) * N) AlignedStorage {
  T data[N];
};

/**
 * \brief `N` elements of `T`, aligned to their total size so that copying the
 *        whole vector compiles to a single 32/64/128-bit (or, on sm_100+,
 *        256-bit) memory instruction.
 *
 * `load(ptr, i)` / `store(ptr, i)` treat `ptr` as an array of vectors and move
 * vector number `i`, i.e. elements `[i * N, (i + 1) * N)`. The address must be
 * aligned to `sizeof(T) * N` bytes.
 *
 * \code
 *   AlignedVector<fp16_t, 8> v;  // 16 bytes
 *   v.load(src, i);
 *   v[0] = v[0] + v[1];
 *   v.store(dst, i);
 * \endcode
 *
 * \tparam N a power of two with `sizeof(T) * N <= 32`.
 */
template <typename T, std::size_t N>
struct AlignedVector {
  static_assert(N > 0 && (N & (N - 1)) == 0, "AlignedVector: N must be a power of two");
  static_assert(sizeof(T) * N <= 32, "AlignedVector: at most 32 bytes (256 bits) per vector");

  using value_type = T;
  static constexpr std::size_t kSize = N;
  static constexpr std::size_t kBytes = sizeof(T) * N;

  /// \brief Loads vector number `offset` from `ptr`. The pointer is taken as untyped, as in
  /// sglang.jit_kernel's headers (kernels pass byte or fp8 pointers for other element types):
  /// `offset` always counts whole vectors, never elements of `*ptr`.
  SGL_DEVICE void load(const void* ptr, std::size_t offset = 0) {
    m_storage = static_cast<const Storage*>(ptr)[offset];
  }

  /// \brief Stores this vector as vector number `offset` of `ptr` (untyped, see `load`).
  SGL_DEVICE void store(void* ptr, std::size_t offset = 0) const {
    static_cast<Storage*>(ptr)[offset] = m_storage;
  }

  /// \brief `load` from global memory with an evict-first cache hint (`ld.global.cs`), for data
  /// read for the last time: it then does not push out of L2 what will be read again. At most
  /// 16 bytes.
  template <typename U>
  SGL_DEVICE void load_evict_first(const U* ptr, std::size_t offset = 0) {
    static_assert(
        std::is_same_v<U, T> || std::is_void_v<U>, "AlignedVector::load_evict_first: pointer must be T* or void*");
    static_assert(kBytes <= 16, "AlignedVector::load_evict_first: at most 16 bytes");
    const Bits bits = __ldcs(reinterpret_cast<const Bits*>(ptr) + offset);
    __builtin_memcpy(&m_storage, &bits, kBytes);
  }

  /// \brief `store` to global memory with an evict-first cache hint (`st.global.cs`), for data
  /// this kernel will not read again. At most 16 bytes.
  template <typename U>
  SGL_DEVICE void store_evict_first(U* ptr, std::size_t offset = 0) const {
    static_assert(
        std::is_same_v<U, T> || std::is_void_v<U>, "AlignedVector::store_evict_first: pointer must be T* or void*");
    static_assert(kBytes <= 16, "AlignedVector::store_evict_first: at most 16 bytes");
    Bits bits;
    __builtin_memcpy(&bits, &m_storage, kBytes);
    __stcs(reinterpret_cast<Bits*>(ptr) + offset, bits);
  }

  SGL_DEVICE void fill(T value) {
#pragma unroll
    for (std::size_t i = 0; i < N; ++i) m_storage.data[i] = value;
  }

  SGL_DEVICE auto operator[](std::size_t i) -> T& {
    return m_storage.data[i];
  }
  SGL_DEVICE auto operator[](std::size_t i) const -> const T& {
    return m_storage.data[i];
  }
  SGL_DEVICE auto data() -> T* {
    return m_storage.data;
  }
  SGL_DEVICE auto data() const -> const T* {
    return m_storage.data;
  }
  __host__ __device__ static constexpr auto size() -> std::size_t {
    return N;
  }

 private:
  // The unsigned type of kBytes (up to 16) that the cache-hint intrinsics (__ldcs, __stcs) take.
  using Bits = std::conditional_t<
      kBytes == 16,
      uint4,
      std::conditional_t<
          kBytes == 8,
          uint2,
          std::conditional_t<
              kBytes == 4,
              unsigned int,
              std::conditional_t<kBytes == 2, unsigned short, unsigned char>>>>;

  // The alignment is what lets the compiler emit one vector instruction per copy.
  using Storage = AlignedStorage<T, N>;
  Storage m_storage;
};

}  // namespace device
