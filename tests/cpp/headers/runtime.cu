// runtime.cuh: every query, with a kernel pointer and a template kernel name.
#include <sgl_kernel/runtime.cuh>

#include <cstddef>
#include <cstdint>

namespace {

template <int kThreads>
__global__ void __launch_bounds__(kThreads) busy_kernel(float* out) {
  extern __shared__ float smem[];
  smem[threadIdx.x] = static_cast<float>(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = smem[kThreads - 1 - threadIdx.x];
}

}  // namespace

auto occupancy_report(int device_id) -> std::size_t {
  using namespace host;
  static const uint32_t blocks = runtime::get_blocks_per_sm(busy_kernel<256>, 256, 256 * sizeof(float));
  static const uint32_t sms = runtime::get_sm_count(device_id);
  const auto kernel = busy_kernel<128>;
  const auto smem = runtime::get_available_dynamic_smem_per_block(kernel, 2, 128);
  const auto blocks_128 = runtime::get_blocks_per_sm(kernel, 128);
  return blocks * sms + smem + blocks_128 + static_cast<std::size_t>(runtime::get_cc_major(device_id)) +
         static_cast<std::size_t>(runtime::get_runtime_version());
}

// get_device_accessible_ptr: sglang's one-argument call, and with the argument's name for errors.
auto accessible(const tvm::ffi::TensorView& host_or_device) -> void* {
  void* const named = host::runtime::get_device_accessible_ptr(host_or_device, "cache");
  return named == host::runtime::get_device_accessible_ptr(host_or_device) ? named : nullptr;
}
