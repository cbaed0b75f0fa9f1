// mbarrier.cuh: a two-stage ring in one block (a producer thread fills stages with bulk copies,
// the block reads them, one thread writes them back with a bulk store), every wrapper used once.
// The body is guarded, so the same kernel also builds for sm_80 (where the wrappers are deleted);
// sglang's spelling, sglang::device::ptx, reaches the same functions.
#include <sgl_kernel/mbarrier.cuh>

#include <cstdint>

namespace {

__global__ void ring_copy(const void* src, void* dst, uint32_t num_stages_total, uint32_t* checksum) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using namespace device::ptx;
  constexpr uint32_t kStageBytes = 4096;
  __shared__ alignas(128) uint8_t stage[2][kStageBytes];
  __shared__ uint64_t full[2];
  __shared__ uint64_t empty[2];
  if (threadIdx.x == 0) {
    for (int s = 0; s < 2; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 1);
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  uint32_t sum = 0;
  for (uint32_t it = 0; it < num_stages_total; ++it) {
    const uint32_t s = it % 2;
    const uint32_t phase = (it / 2) & 1;
    const auto* from = static_cast<const uint8_t*>(src) + static_cast<std::size_t>(it) * kStageBytes;
    if (threadIdx.x == 0) {
      mbar_wait_parity(&empty[s], phase ^ 1);
      bulk_prefetch_l2(from, kStageBytes);
      mbar_arrive_expect_tx(&full[s], kStageBytes / 2);
      mbar_expect_tx(&full[s], kStageBytes / 2);
      bulk_g2s(stage[s], from, kStageBytes, &full[s]);
    }
    while (!mbar_try_wait_parity(&full[s], phase)) {
    }
    sum += stage[s][threadIdx.x];
    __syncthreads();
    if (threadIdx.x == 0) {
      fence_proxy_async_shared();
      bulk_s2g(static_cast<uint8_t*>(dst) + static_cast<std::size_t>(it) * kStageBytes, stage[s], kStageBytes);
      bulk_commit_group();
      bulk_wait_group_read<0>();
      if (it % 2 == 0) {
        mbar_arrive(&empty[s]);
      } else {
        mbar_arrive_relaxed(&empty[s]);  // after the wait above: nothing left to publish
      }
    }
  }
  if (threadIdx.x == 0) bulk_wait_group<0>();
  atomicAdd(checksum, sum + (sglang::device::ptx::to_shared(&empty[0]) == to_shared(&empty[0]) ? 0u : 1u));
#else
  (void)src, (void)dst, (void)num_stages_total, (void)checksum;
#endif
}

}  // namespace

void launch_ring_copy(const void* src, void* dst, uint32_t stages, uint32_t* checksum, cudaStream_t stream) {
  host::LaunchKernel(1, 128, stream)(ring_copy, src, dst, stages, checksum);
}
