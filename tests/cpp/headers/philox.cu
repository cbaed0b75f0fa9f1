// philox.cuh: every function used once, in a kernel (device side) and in a host function (the
// same functions are host and device, so a host test checks them against known answers).
#include <sgl_kernel/philox.cuh>

#include <cstdint>

namespace {

__global__ void draw_uniforms(uint64_t seed, uint64_t offset, float* out, uint64_t* bits) {
  using namespace device::philox;
  const Words words = draw(seed, offset, threadIdx.x);
  out[threadIdx.x] = uniform01(words.z);
  bits[threadIdx.x] = bits64(philox4x32_10(words, 1u, 2u));
}

[[maybe_unused]] uint64_t host_draw(uint64_t seed) {
  return device::philox::bits64(device::philox::draw(seed, 0, 0)) + device::philox::mul_hi(3u, 5u);
}

}  // namespace

void launch_draw_uniforms(float* out, uint64_t* bits) {
  draw_uniforms<<<1, 32>>>(7, 0, out, bits);
}
