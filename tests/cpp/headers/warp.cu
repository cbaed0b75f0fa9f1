// warp.cuh: reductions (whole and sub-warp) and the streaming copies for every unit size.
#include <sgl_kernel/warp.cuh>

#include <cstddef>
#include <cstdint>

namespace {

__global__ void reduce_kernel(float* f, int* i, fp16_t* h, bf16x2_t* b2) {
  using namespace device;
  const auto t = threadIdx.x;
  f[t] = warp::reduce_sum(f[t]) + warp::reduce_max(f[t]) + warp::reduce_min(f[t]) + warp::reduce_sum<float, 8>(f[t]);
  i[t] = warp::reduce_sum(i[t]) + warp::reduce_max<int, 16>(i[t], 0xffffu);
  h[t] = warp::reduce_max(h[t]);
  b2[t] = warp::reduce_min(b2[t]);
}

template <std::size_t kBytes, std::size_t kUnit, std::size_t kThreads>
__global__ void stream_kernel(void* dst, const void* src) {
  using namespace device;
  const auto vec = warp::load_vec<kBytes, kUnit, kThreads>(src);
  warp::store_vec<kBytes, kUnit, kThreads>(dst, vec);
  warp::copy<kBytes, kUnit, kThreads>(pointer::offset(dst, kBytes), pointer::offset(src, kBytes));
  warp::copy<kBytes>(dst, src);  // default unit and full warp
}

}  // namespace

void launch_warp(float* f, int* i, fp16_t* h, bf16x2_t* b2, void* dst, const void* src) {
  reduce_kernel<<<1, 32>>>(f, i, h, b2);
  stream_kernel<128, 4, 32><<<1, 32>>>(dst, src);
  stream_kernel<256, 8, 32><<<1, 32>>>(dst, src);
  stream_kernel<512, 16, 32><<<1, 32>>>(dst, src);
  stream_kernel<1024, 16, 8><<<1, 32>>>(dst, src);
}
