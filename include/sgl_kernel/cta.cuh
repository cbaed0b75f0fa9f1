/// \file cta.cuh
/// \brief Block-wide (CTA) reductions: warp shuffles, then one warp combines
/// the per-warp results through shared memory.

#pragma once

#include <sgl_kernel/math.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/warp.cuh>

#include <cstdint>
#include <type_traits>

namespace device::cta {

namespace details {

template <typename T, typename Op>
SGL_DEVICE void reduce(T value, T* smem, T identity, Op warp_reduce) {
  const uint32_t warp_id = threadIdx.x / kWarpThreads;
  const uint32_t lane = threadIdx.x % kWarpThreads;
  value = warp_reduce(value);
  if (lane == 0) smem[warp_id] = value;
  __syncthreads();
  if (warp_id == 0) {
    const uint32_t num_warps = (blockDim.x + kWarpThreads - 1) / kWarpThreads;
    value = warp_reduce(lane < num_warps ? smem[lane] : identity);
    if (lane == 0) smem[0] = value;
  }
}

template <typename T, typename Op>
SGL_DEVICE auto all_reduce(T value, T* smem, T identity, Op warp_reduce) -> T {
  const uint32_t warp_id = threadIdx.x / kWarpThreads;
  const uint32_t lane = threadIdx.x % kWarpThreads;
  value = warp_reduce(value);
  if (lane == 0) smem[warp_id] = value;
  __syncthreads();
  const uint32_t num_warps = (blockDim.x + kWarpThreads - 1) / kWarpThreads;
  return warp_reduce(lane < num_warps ? smem[lane] : identity);
}

}  // namespace details

/**
 * \brief Sum of `value` over the whole block, written to `smem[0]`.
 *
 * \param smem shared memory for at least `blockDim.x / 32` values.
 * \note All threads must call it, and `blockDim.x` must be a multiple of 32.
 *       It does not end with `__syncthreads()`: synchronize before reading
 *       `smem[0]`, and again before `smem` is reused (e.g. by a second call).
 */
template <typename T>
SGL_DEVICE void reduce_sum(T value, std::type_identity_t<T>* smem) {
  details::reduce(value, smem, T{}, [](T v) { return warp::reduce_sum(v); });
}

/// \brief Maximum of `value` over the block, written to `smem[0]` (see `reduce_sum`).
/// \param min_value identity for the unused lanes; the default 0 suits absolute
///        maxima, pass `-INFINITY` for signed data.
template <typename T>
SGL_DEVICE void reduce_max(T value, std::type_identity_t<T>* smem, std::type_identity_t<T> min_value = T{}) {
  details::reduce(value, smem, min_value, [](T v) { return warp::reduce_max(v); });
}

/**
 * \brief Sum of `value` over the whole block, returned to every thread, after a
 *        single `__syncthreads()`: each warp combines the per-warp partials
 *        itself instead of waiting for warp 0 to publish them.
 *
 * \param smem shared memory for at least `blockDim.x / 32` values.
 * \note All threads must call it, and `blockDim.x` must be a multiple of 32.
 *       Synchronize before `smem` is reused.
 */
template <typename T>
SGL_DEVICE auto all_reduce_sum(T value, std::type_identity_t<T>* smem) -> T {
  return details::all_reduce(value, smem, T{}, [](T v) { return warp::reduce_sum(v); });
}

/// \brief Maximum of `value` over the block, returned to every thread (see `all_reduce_sum`).
template <typename T>
SGL_DEVICE auto all_reduce_max(T value, std::type_identity_t<T>* smem, std::type_identity_t<T> min_value = T{}) -> T {
  return details::all_reduce(value, smem, min_value, [](T v) { return warp::reduce_max(v); });
}

/// \brief Maximum of a float that is +0, positive or +inf (an absolute value) over the block,
/// returned to every thread (see `all_reduce_sum`), by `warp::reduce_max_nonneg` at both levels.
SGL_DEVICE float all_reduce_max_nonneg(float value, float* smem) {
  return details::all_reduce(value, smem, 0.f, [](float v) { return warp::reduce_max_nonneg(v); });
}

/// \brief Minimum of `value` over the block, written to `smem[0]` (see `reduce_sum`).
template <typename T>
SGL_DEVICE void reduce_min(T value, std::type_identity_t<T>* smem, std::type_identity_t<T> max_value) {
  details::reduce(value, smem, max_value, [](T v) { return warp::reduce_min(v); });
}

}  // namespace device::cta
