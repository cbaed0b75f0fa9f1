// atomic.cuh: float max/min in global and shared memory.
#include <sgl_kernel/atomic.cuh>

namespace {

__global__ void atomic_kernel(const float* in, float* global_max, float* global_min) {
  __shared__ float block_max;
  if (threadIdx.x == 0) block_max = -1e30f;
  __syncthreads();
  const float x = in[blockIdx.x * blockDim.x + threadIdx.x];
  device::atomic::max(&block_max, x);
  device::atomic::min(global_min, x);
  __syncthreads();
  if (threadIdx.x == 0) device::atomic::max(global_max, block_max);
}

}  // namespace

void launch_atomic(const float* in, float* global_max, float* global_min) {
  atomic_kernel<<<4, 128>>>(in, global_max, global_min);
}
