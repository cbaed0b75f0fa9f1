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

  /// \brief `store` to global memory where `ok`, as one predicated instruction: no branch. For
  /// kernels that issue several loads before their conditional stores: ptxas moves a load into
  /// the branch of its only use, after the branches before it, which serialises the loads' latencies.
  /// 4, 8 or 16 bytes.
  SGL_DEVICE void store_if(bool ok, void* ptr, std::size_t offset = 0) const {
    static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "AlignedVector::store_if: 4, 8 or 16 bytes");
    uint32_t w[kBytes / 4];
    __builtin_memcpy(w, &m_storage, kBytes);
    auto* dst = static_cast<Storage*>(ptr) + offset;
    const uint32_t pred = ok;
    if constexpr (kBytes == 16) {
      asm volatile("{ .reg .pred p; setp.ne.u32 p, %0, 0; @p st.global.v4.u32 [%1], {%2, %3, %4, %5}; }" ::"r"(pred),
                   "l"(dst),
                   "r"(w[0]),
                   "r"(w[1]),
                   "r"(w[2]),
                   "r"(w[3])
                   : "memory");
    } else if constexpr (kBytes == 8) {
      asm volatile("{ .reg .pred p; setp.ne.u32 p, %0, 0; @p st.global.v2.u32 [%1], {%2, %3}; }" ::"r"(pred),
                   "l"(dst),
                   "r"(w[0]),
                   "r"(w[1])
                   : "memory");
    } else {
      asm volatile("{ .reg .pred p; setp.ne.u32 p, %0, 0; @p st.global.u32 [%1], %2; }" ::"r"(pred), "l"(dst), "r"(w[0])
                   : "memory");
    }
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

/// \brief Widest single load/store in bytes, by memory (sglang 0.5.23): global memory takes
/// `device::kMaxVecBytes` (32 on Blackwell), shared memory and portable code 16.
struct LoadStoreBytes {
  enum type : int64_t {
    MAX_GMEM = static_cast<int64_t>(device::kMaxVecBytes),
    MAX_SMEM = 16,
    MAX_PORTABLE = 16,
    MIN_COALESCED = 4,
    MIN_COALALESCED = MIN_COALESCED,  // sglang's spelling
    RAW_1B = 1,
    RAW_2B = 2,
    RAW_4B = 4,
    RAW_8B = 8,
    RAW_16B = 16,
    RAW_32B = 32,
  };
};

/**
 * \brief Element-wise sum of `M` vectors of packed pairs (`bf16x2_t`, `fp16x2_t`, `fp32x2_t`), e.g.
 *        the contributions of `M` peers in an all-reduce (sglang 0.5.23).
 *
 * With `kFP32Acc` (the default) the sum runs in fp32 and is rounded once at the end, so it does
 * not depend on the order of the peers as much as a bf16 running sum would; `false` adds in `T2`.
 */
template <bool kFP32Acc = true, typename T2, std::size_t N, std::size_t M>
SGL_DEVICE auto reduce_vec(const AlignedVector<T2, N> (&vecs)[M]) -> AlignedVector<T2, N> {
  static_assert(M > 0, "reduce_vec: no vectors");
  AlignedVector<T2, N> result;
  if constexpr (kFP32Acc) {
    static_assert(dtype_trait<T2>::kVecSize == 2, "reduce_vec: packed pairs only");
#pragma unroll
    for (std::size_t j = 0; j < N; ++j) {
      auto total = cast<fp32x2_t>(vecs[0][j]);
#pragma unroll
      for (std::size_t i = 1; i < M; ++i) {
        const auto term = cast<fp32x2_t>(vecs[i][j]);
        total.x += term.x;
        total.y += term.y;
      }
      result[j] = cast<T2>(total);
    }
  } else {
    result = vecs[0];
#pragma unroll
    for (std::size_t i = 1; i < M; ++i) {
#pragma unroll
      for (std::size_t j = 0; j < N; ++j)
        result[j] = ReductionTrait<ReductionOp::SUM, T2>::reduce(result[j], vecs[i][j]);
    }
  }
  return result;
}

/**
 * \brief `out[j] = float(v[j])`. 16-bit element types go a pair at a time, one packed conversion
 *        per pair (bf16: a shift and a mask, type.cuh), where element-wise conversion extracts
 *        each upper half first.
 */
template <typename T, std::size_t N>
SGL_DEVICE void to_floats(const AlignedVector<T, N>& v, float (&out)[N]) {
  if constexpr (sizeof(T) == 2 && N % 2 == 0) {
    using Packed = packed_t<T>;
#pragma unroll
    for (std::size_t j = 0; j < N; j += 2) {
      const fp32x2_t f = dtype_trait<fp32x2_t>::from(Packed{v[j], v[j + 1]});
      out[j] = f.x;
      out[j + 1] = f.y;
    }
  } else {
#pragma unroll
    for (std::size_t j = 0; j < N; ++j) out[j] = dtype_trait<fp32_t>::from(v[j]);
  }
}

/**
 * \brief `v[j] = T(in[j])`, rounded to nearest. 16-bit element types go a pair at a time, one
 *        packed conversion per pair (`cvt.rn.bf16x2.f32`), half the instructions of element-wise
 *        rounding and no repacking for a store.
 */
template <typename T, std::size_t N>
SGL_DEVICE void from_floats(AlignedVector<T, N>& v, const float (&in)[N]) {
  if constexpr (sizeof(T) == 2 && N % 2 == 0) {
    using Packed = packed_t<T>;
#pragma unroll
    for (std::size_t j = 0; j < N; j += 2) {
      const Packed p = dtype_trait<Packed>::from(fp32x2_t{in[j], in[j + 1]});
      __builtin_memcpy(&v[j], &p, sizeof(p));  // the pair as is (element stores would repack it)
    }
  } else {
#pragma unroll
    for (std::size_t j = 0; j < N; ++j) v[j] = dtype_trait<T>::from(in[j]);
  }
}

}  // namespace device
