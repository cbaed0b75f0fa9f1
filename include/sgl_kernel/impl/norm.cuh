/// \file impl/norm.cuh
/// \brief RMSNorm building blocks for 16-bit rows (the interface of sglang.jit_kernel's shared
/// norm header): the caller loads a row into registers, these functions normalise it.
///
/// A row of `kDim` `fp16_t`/`bf16_t` values is held as packed pairs (`packed_t<T>`):
/// - `kDim <= 256` (64, 128 or 256): one warp per row, lane `l` holds pairs
///   `[l * N, (l + 1) * N)` with `N = kDim / 64` (`StorageType<T, kDim>`); `apply_norm_warp`.
/// - `kDim > 256` (a multiple of 256, up to 8192): one CTA of `get_cta_threads<T, kDim>()` threads,
///   8 elements (16 bytes) per thread; `apply_norm_cta`, with `__shared__ float smem[kSmemBufferSize]`.
///
/// Both return `x * rsqrt(mean(x^2) + eps) * w` for the thread's elements, computed in fp32 and
/// rounded once. Every thread of the warp (CTA) must call them.
///
/// \code
///   using Storage = device::norm::StorageType<bf16_t, 128>;
///   Storage x, w;
///   x.load(input_row, lane);
///   w.load(weight, lane);
///   device::norm::apply_norm_warp<128>(x, w, eps).store(output_row, lane);
/// \endcode

#pragma once

#include <sgl_kernel/math.cuh>
#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/vec.cuh>
#include <sgl_kernel/warp.cuh>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace host::norm {

// The helpers are `__host__ __device__`: kernels size their storage with them, and this must not
// depend on nvcc's --expt-relaxed-constexpr.

/// \brief Whether the building blocks cover rows of `kDim` elements of `T`.
template <typename T, int64_t kDim>
SGL_HOST_DEVICE constexpr auto is_config_supported() -> bool {
  if constexpr (!std::is_same_v<T, fp16_t> && !std::is_same_v<T, bf16_t>) {
    return false;
  } else if constexpr (kDim <= 256) {
    return kDim == 64 || kDim == 128 || kDim == 256;
  } else {
    return kDim % 256 == 0 && kDim <= 8192;
  }
}

/// \brief Whether rows of `kDim` need a whole CTA (`apply_norm_cta`) rather than a warp.
template <typename T, int64_t kDim>
SGL_HOST_DEVICE constexpr auto should_use_cta() -> bool {
  static_assert(is_config_supported<T, kDim>(), "norm: unsupported dtype or row size");
  return kDim > 256;
}

/// \brief Threads of the CTA that normalises one row (16 bytes each, so at most 1024).
template <typename T, int64_t kDim>
SGL_HOST_DEVICE constexpr auto get_cta_threads() -> uint32_t {
  static_assert(should_use_cta<T, kDim>(), "norm: rows of <= 256 elements take one warp");
  return static_cast<uint32_t>(kDim * sizeof(T) / 16);
}

}  // namespace host::norm

namespace device::norm {

// The norm namespaces' host helpers are used from kernels too (`norm::get_cta_threads`).
using ::host::norm::get_cta_threads;
using ::host::norm::is_config_supported;
using ::host::norm::should_use_cta;

/// \brief Registers one thread holds: `kDim / 64` packed pairs per lane for a warp row, 16 bytes
/// (4 pairs) per thread for a CTA row.
template <typename T, int64_t kDim>
using StorageType = AlignedVector<packed_t<T>, (kDim > 256 ? 4 : static_cast<std::size_t>(kDim / (2 * kWarpThreads)))>;

/// \brief Floats of shared memory `apply_norm_cta` needs: one partial sum per warp (at most 32),
/// and one slot for the row's scale, apart so that back-to-back calls need no extra barrier.
inline constexpr uint32_t kSmemBufferSize = kWarpThreads + 1;

namespace details {

/// \brief This thread's share of the row's sum of squares, in fp32.
template <typename Packed, std::size_t N>
SGL_DEVICE auto sum_of_squares(const AlignedVector<Packed, N>& x) -> float {
  float sum = 0.0f;
#pragma unroll
  for (std::size_t i = 0; i < N; ++i) {
    const auto v = cast<fp32x2_t>(x[i]);
    sum += v.x * v.x + v.y * v.y;
  }
  return sum;
}

template <typename Packed, std::size_t N>
SGL_DEVICE auto scale(const AlignedVector<Packed, N>& x, const AlignedVector<Packed, N>& w, float factor)
    -> AlignedVector<Packed, N> {
  AlignedVector<Packed, N> out;
#pragma unroll
  for (std::size_t i = 0; i < N; ++i) {
    const auto v = cast<fp32x2_t>(x[i]);
    const auto g = cast<fp32x2_t>(w[i]);
    out[i] = cast<Packed>(fp32x2_t{v.x * factor * g.x, v.y * factor * g.y});
  }
  return out;
}

}  // namespace details

/**
 * \brief RMSNorm of a row held by one warp (`kDim` of 64, 128 or 256).
 * \param input, weight this lane's `StorageType` of the row and of the weight.
 */
template <int64_t kDim, typename Vec>
SGL_DEVICE auto apply_norm_warp(const Vec& input, const Vec& weight, float eps) -> Vec {
  static_assert(kDim <= 256, "norm: rows above 256 elements need apply_norm_cta");
  static_assert(Vec::size() * 2 * kWarpThreads == kDim, "norm: the vector must be StorageType<T, kDim>");
  const float total = warp::reduce_sum(details::sum_of_squares(input));
  return details::scale(input, weight, math::rsqrt(total / kDim + eps));
}

/**
 * \brief RMSNorm of a row held by a CTA (`kDim > 256`), 16 bytes per thread.
 * \param smem `kSmemBufferSize` floats of shared memory, used by nothing else meanwhile.
 * \param num_warps warps of the CTA (all of them hold part of the row).
 * \note Has two `__syncthreads()`; it may be called again right away with the same `smem`.
 */
template <int64_t kDim, typename Vec>
SGL_DEVICE auto apply_norm_cta(
    const Vec& input, const Vec& weight, float eps, float* smem, uint32_t num_warps = blockDim.x / kWarpThreads)
    -> Vec {
  static_assert(kDim > 256, "norm: rows of <= 256 elements take apply_norm_warp");
  const uint32_t warp_id = threadIdx.x / kWarpThreads;
  const uint32_t lane = threadIdx.x % kWarpThreads;
  const float partial = warp::reduce_sum(details::sum_of_squares(input));
  if (lane == 0) smem[warp_id] = partial;
  __syncthreads();
  if (warp_id == 0) {
    const float total = warp::reduce_sum(lane < num_warps ? smem[lane] : 0.0f);
    if (lane == 0) smem[kWarpThreads] = math::rsqrt(total / kDim + eps);
  }
  __syncthreads();
  return details::scale(input, weight, smem[kWarpThreads]);
}

}  // namespace device::norm
