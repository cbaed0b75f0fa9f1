// cluster.cuh: one value per block combined across a cluster, launched with LaunchKernel::enable_cluster.
#include <sgl_kernel/cluster.cuh>
#include <sgl_kernel/cta.cuh>

namespace {

__global__ void cluster_kernel(const float* in, float* out) {
  __shared__ float smem[32];
  __shared__ float slots[2];
  const float block_sum = device::cta::all_reduce_sum(in[blockIdx.x * blockDim.x + threadIdx.x], smem);
  const float sum = device::cluster::all_reduce<2>(block_sum, slots, [](float a, float b) { return a + b; });
  if (threadIdx.x == 0) out[blockIdx.x] = sum + static_cast<float>(device::cluster::block_rank());
}

}  // namespace

void launch_cluster(const float* in, float* out, cudaStream_t stream) {
  host::LaunchKernel(4, 64, stream).enable_cluster(2)(cluster_kernel, in, out);
}
