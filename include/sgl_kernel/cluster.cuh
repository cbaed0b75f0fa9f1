/// \file cluster.cuh
/// \brief Reductions across a thread-block cluster (sm_90+): each block
/// contributes one value, every block gets the total, after one cluster barrier.

#pragma once

#include <sgl_kernel/utils.cuh>

#include <cooperative_groups.h>
#include <cstdint>

namespace device::cluster {

/**
 * \brief `op` over one value per block of a cluster of `kSize` blocks.
 *
 * Threads `0 .. kSize - 1` of each block write the block's value into slot
 * `block_rank` of every block's `slots` (distributed shared memory); after one
 * cluster barrier each block reads its own slots, in rank order, so every block
 * gets the same result and none reads another's memory afterwards (a block may
 * then exit while others still run).
 *
 * \param block_value this block's value; threads `0 .. kSize - 1` must hold it.
 * \param slots `__shared__ T[kSize]`, not reused until the next block-wide barrier.
 * \note Every thread of every block of the cluster must call it; launch with
 *       `LaunchKernel::enable_cluster(kSize)`. Needs sm_90: traps below.
 */
template <unsigned kSize, typename T, typename Op>
SGL_DEVICE auto all_reduce(T block_value, T (&slots)[kSize], Op op) -> T {
  if constexpr (kSize == 1) return block_value;
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  auto cluster = cooperative_groups::this_cluster();
  if (threadIdx.x < kSize) *cluster.map_shared_rank(&slots[cluster.block_rank()], threadIdx.x) = block_value;
  cluster.sync();
  T total = slots[0];
#pragma unroll
  for (unsigned rank = 1; rank < kSize; ++rank) total = op(total, slots[rank]);
  return total;
#else
  __trap();
  return block_value;
#endif
}

/// \brief Rank of this block in its cluster (0 below sm_90).
SGL_DEVICE auto block_rank() -> uint32_t {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  return cooperative_groups::this_cluster().block_rank();
#else
  return 0;
#endif
}

}  // namespace device::cluster
