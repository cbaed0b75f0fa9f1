// utils.cuh: device helpers in a kernel, both LaunchKernel forms, PDL, error checks.
#include <sgl_kernel/utils.cuh>

#include <cstdint>

namespace {

__global__ void copy_kernel(const void* __restrict__ src, void* __restrict__ dst, int64_t n) {
  device::PDLWaitPrimary<true>();
  const auto i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    device::store_as<fp16_t>(dst, device::load_as<fp16_t>(src, i), i);
    // pointer::offset is usable on both sides, bytes by default or in units of T.
    const void* src_f = device::pointer::offset(src, n * 2, 0);
    void* dst_f = device::pointer::offset<float>(dst, n / 2);
    device::store_as<float>(dst_f, device::load_as<float>(src_f, i), i);
  }
  device::device_vec<uint32_t, 4> regs{};
  regs.data[0] = host::div_ceil(static_cast<uint32_t>(n), 4u);
  if (regs.data[0] == 0xdeadbeef) device::store_as<uint32_t>(dst, regs.data[0]);
  device::PDLTriggerSecondary<true>();
  device::PDLWaitPrimary<false>();
}

}  // namespace

void launch_both_ways(DLDevice device, cudaStream_t stream, const void* src, void* dst, int64_t n) {
  using namespace host;
  const auto blocks = div_ceil(n, int64_t{256});
  LaunchKernel(blocks, 256, device)(copy_kernel, src, dst, n);
  LaunchKernel(dim3(2, 2), dim3(128), stream, 64 * 1024).enable_pdl()(copy_kernel, src, dst, n);
  LaunchKernel(1, 32, LaunchKernel::resolve_device(device)).enable_pdl(false)(copy_kernel, src, dst, int64_t{0});
  RuntimeDeviceCheck();
  RuntimeDeviceCheck(cudaGetLastError());
  RuntimeDeviceCheck(cudaDeviceSynchronize(), DebugInfo{});
}
