// cta.cuh: block-wide sum/max/min.
#include <sgl_kernel/cta.cuh>

#include <cmath>

namespace {

__global__ void cta_kernel(const float* in, float* out, const int* ints, int* int_out) {
  using namespace device;
  __shared__ float smem[32];
  __shared__ int ismem[32];
  const float x = in[blockIdx.x * blockDim.x + threadIdx.x];
  cta::reduce_sum(x, smem);
  __syncthreads();
  const float sum = smem[0];
  __syncthreads();
  cta::reduce_max(x, smem, -INFINITY);
  __syncthreads();
  const float max = smem[0];
  __syncthreads();
  cta::reduce_max(fabsf(x), smem);
  __syncthreads();
  const float absmax = smem[0];
  __syncthreads();
  cta::reduce_min(x, smem, INFINITY);
  cta::reduce_sum(ints[threadIdx.x], ismem);
  __syncthreads();
  if (threadIdx.x == 0) {
    out[blockIdx.x * 4 + 0] = sum;
    out[blockIdx.x * 4 + 1] = max;
    out[blockIdx.x * 4 + 2] = absmax;
    out[blockIdx.x * 4 + 3] = smem[0];
    int_out[blockIdx.x] = ismem[0];
  }
}

}  // namespace

void launch_cta(const float* in, float* out, const int* ints, int* int_out) {
  cta_kernel<<<4, 256>>>(in, out, ints, int_out);
}
