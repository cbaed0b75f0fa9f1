// math.cuh: every function for float, half, bfloat16, packed pairs; integer fallbacks.
#include <sgl_kernel/math.cuh>

#include <cstdint>

namespace {

template <typename T>
__device__ T everything(T x, T y) {
  using namespace device;
  return math::max(math::min(math::abs(x), y), math::sqrt(math::rsqrt(math::exp(math::sin(math::cos(x))))));
}

__global__ void math_kernel(
    float* f, fp16_t* h, bf16_t* b, fp16x2_t* h2, bf16x2_t* b2, fp32x2_t* f2, int* i, uint32_t* u) {
  using namespace device;
  const auto t = threadIdx.x;
  f[t] = everything(f[t], math::log2e * math::loge2 + math::pi + math::FP8_E4M3_MAX + math::FP8_E5M2_MAX);
  h[t] = everything(h[t], h[t + 1]);
  b[t] = everything(b[t], b[t + 1]);
  h2[t] = everything(h2[t], h2[t + 1]);
  b2[t] = everything(b2[t], b2[t + 1]);
  f2[t] = everything(f2[t], f2[t + 1]);
  i[t] = math::max(math::abs(i[t]), math::min(i[t + 1], 7));
  u[t] = math::abs(math::max(u[t], 3u));
}

}  // namespace

void launch_math(float* f, fp16_t* h, bf16_t* b, fp16x2_t* h2, bf16x2_t* b2, fp32x2_t* f2, int* i, uint32_t* u) {
  math_kernel<<<1, 32>>>(f, h, b, h2, b2, f2, i, u);
}
