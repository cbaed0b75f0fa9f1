// tile.cuh: the thread/warp/cta accessors over vectors.
#include <sgl_kernel/tile.cuh>
#include <sgl_kernel/vec.cuh>

#include <cstdint>

namespace {

template <uint32_t kThreads>
__global__ void tile_copy(const void* src, void* dst, int64_t num_vecs) {
  using namespace device;
  using vec_t = AlignedVector<fp16x2_t, 4>;
  const auto cta = tile::Memory<vec_t>::cta(kThreads);
  for (int64_t k = 0; cta.in_bound(num_vecs, k); ++k) cta.store(dst, cta.load(src, k), k);
  const auto warp = tile::Memory<float>::warp();
  if (warp.in_bound(32)) warp.store(dst, warp.load(src) + static_cast<float>(warp.num_threads()));
  const auto half_warp = tile::Memory<float>::warp(16);
  half_warp.store(dst, half_warp.load(src, 1), 1);
  constexpr auto one = tile::Memory<int>::thread();
  static_assert(one.num_threads() == 1 && one.thread_id() == 0);
  if (threadIdx.x == 0) one.store(dst, one.load(src) + static_cast<int>(tile::Memory<int>::cta().num_threads()));
}

}  // namespace

void launch_tile(const void* src, void* dst, int64_t n) {
  tile_copy<256><<<1, 256>>>(src, dst, n);
}
