/// \file cluster.cuh
/// \brief Reductions across a thread-block cluster (sm_90+), after one cluster barrier: of one
/// value per block, or of every thread's value in one block's order.

#pragma once

#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/warp.cuh>

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

/**
 * \brief Reductions over every thread of a cluster of `kSize` blocks of `kWarps` warps, in the order
 * one block made of the cluster's blocks reduces (`cta::all_reduce`; thread `t` of block rank `r`
 * as thread `r * blockDim.x + t`): each warp's partial goes to slot `r * kWarps + warp` of every
 * block (`st.async` into distributed shared memory, counted by that block's mbarrier), then each
 * warp reduces the slots as that one block's warps would. A sum is the bits of
 * `cta::all_reduce_sum` over that block. Up to `kRounds` reductions, each with its own slots and
 * barrier (a block may start the next while another still waits for the last).
 *
 * No cluster barrier on the way: the one that makes the barriers' initialisation visible is
 * arrived at by `init` (at the top of the kernel) and waited for at the first reduction, long
 * after every block arrived. A block has received all it will before it returns from a round, so
 * no block writes into one that has exited.
 *
 * \note Every thread of every block calls `init` and then each round in order; launch with
 *       `LaunchKernel::enable_cluster(kSize)`; sm_90+ (traps below).
 */
template <unsigned kSize, unsigned kWarps, unsigned kRounds>
struct WarpExchange {
  static_assert(kSize >= 2 && kSize * kWarps <= kWarpThreads, "one slot a lane of one warp");
  alignas(16) float slots[kRounds][kSize * kWarps];
  alignas(16) float lanes[kWarps][kWarpThreads];  // all_reduce_sum's lane values, a row per warp
  uint64_t arrived[kRounds];

  /// \brief Initialise the barriers (thread 0) and arrive at the cluster barrier (every thread).
  SGL_DEVICE void init() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    if (threadIdx.x == 0) {
#pragma unroll
      for (unsigned r = 0; r < kRounds; ++r) {
        const uint32_t bar = smem_address(&arrived[r]);
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(kBytes) : "memory");
      }
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#else
    __trap();
#endif
  }

  /// \brief Round `kRound`: `warp_reduce` of every thread's value over the cluster, to every thread
  /// (`identity` fills the slots past the cluster's warps).
  template <unsigned kRound, typename WarpReduce>
  SGL_DEVICE auto all_reduce(float value, float identity, WarpReduce warp_reduce) -> float {
    exchange<kRound>(warp_reduce(value));
    const uint32_t lane = threadIdx.x % kWarpThreads;
    return warp_reduce(lane < kSize * kWarps ? slots[kRound][lane] : identity);
  }

  /// \brief Round `kRound`'s exchange: this warp's `value` (its lanes agree on it) into every
  /// block's slot, then wait until this block's slots are all written.
  template <unsigned kRound>
  SGL_DEVICE void exchange(float value) {
    static_assert(kRound < kRounds);
    const uint32_t lane = threadIdx.x % kWarpThreads;
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    if constexpr (kRound == 0) asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
    if (lane < kSize) {
      const uint32_t slot = map(&slots[kRound][block_rank() * kWarps + threadIdx.x / kWarpThreads], lane);
      const uint32_t bar = map(&arrived[kRound], lane);
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(slot),
                   "r"(__float_as_uint(value)),
                   "r"(bar)
                   : "memory");
    }
    const uint32_t bar = smem_address(&arrived[kRound]);
    asm volatile(
        "{\n\t.reg .pred done;\n\t"
        "WAIT_%=:\n\t"
        "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], 0;\n\t"
        "@!done bra WAIT_%=;\n\t}" ::"r"(bar)
        : "memory");
#else
    (void)lane;
    __trap();
#endif
  }

  /// \brief A sum over the cluster (round `kRound`). The slots are summed by every lane in the
  /// butterfly's own order (`warp::reduce_sum` of lane `l` holding slot `l`, 0 past the last): the
  /// same bits from one shared-memory read and a tree of adds instead of five shuffle round trips.
  /// The warp's own sum is taken the same way, from its lanes' values in shared memory.
  template <unsigned kRound>
  SGL_DEVICE auto all_reduce_sum(float value) -> float {
    float* const mine = lanes[threadIdx.x / kWarpThreads];
    mine[threadIdx.x % kWarpThreads] = value;
    __syncwarp();
    exchange<kRound>(butterfly_sum<kWarpThreads>(mine));
    return butterfly_sum<kSize * kWarps>(slots[kRound]);
  }

  /// \brief The maximum of a float that is +0, positive or +inf over the cluster (round `kRound`).
  template <unsigned kRound>
  SGL_DEVICE auto all_reduce_max_nonneg(float value) -> float {
    return all_reduce<kRound>(value, 0.f, [](float v) { return warp::reduce_max_nonneg(v); });
  }

 private:
  // warp::reduce_sum's result over lanes holding values[0 .. kCount) (0 past them), computed by one
  // lane from shared memory: the butterfly's adds as lane 0 makes them (every lane gets those bits,
  // an add being commutative).
  template <unsigned kCount>
  static SGL_DEVICE float butterfly_sum(const float* values) {
    float v[kWarpThreads];
#pragma unroll
    for (unsigned l = 0; l < kWarpThreads; l += 4) {
      if (l + 4 <= kCount) {
        const float4 four = *reinterpret_cast<const float4*>(values + l);
        v[l] = four.x, v[l + 1] = four.y, v[l + 2] = four.z, v[l + 3] = four.w;
      } else {
#pragma unroll
        for (unsigned j = 0; j < 4; ++j) v[l + j] = l + j < kCount ? values[l + j] : 0.f;
      }
    }
    fold<kWarpThreads / 2>(v);
    return v[0];
  }
  // One butterfly step as lane 0 sees it: v[l] += v[l + kOffset] for l < kOffset, then the next.
  template <unsigned kOffset>
  static SGL_DEVICE void fold(float (&v)[kWarpThreads]) {
#pragma unroll
    for (unsigned l = 0; l < kOffset; ++l) v[l] = v[l] + v[l + kOffset];
    if constexpr (kOffset > 1) fold<kOffset / 2>(v);
  }
  static constexpr uint32_t kBytes = kSize * kWarps * sizeof(float);  // a round's bytes into each block
  static SGL_DEVICE uint32_t smem_address(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
  }
  static SGL_DEVICE uint32_t map(const void* p, uint32_t rank) {
    uint32_t remote = 0;
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_address(p)), "r"(rank));
#endif
    return remote;
  }
};

}  // namespace device::cluster
