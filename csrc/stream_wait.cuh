// stream_wait: make the current stream wait, on the GPU, until flag[0] == value; set a flag in
// stream order.
//
//   wait          (flag, value)                       holds the stream until flag[0] == value
//   write         (flag, value)                       flag[0] = value once earlier work is done
//   wait_bounded  (flag, value, status, timeout_ns)   waits at most timeout_ns of GPU time
//   uses_driver_ops ()  -> bool                       whether this driver has the memory operations
//
// `wait` and `write` use the driver's stream memory operations (cuStreamWaitValue32 /
// cuStreamWriteValue32). They hold or signal a stream without running a kernel, so they occupy no
// SM and need no module loaded. (Under lazy module loading, the first launch of any kernel
// synchronises the context, so it still blocks while a stream is held for a producer that is not
// enqueued yet: see python/jit_kernel/ops/stream_wait.py.) Where the driver lacks these
// operations, `wait` falls back to a spinning kernel only if modules are loaded eagerly
// (CUDA_MODULE_LOADING=EAGER), and otherwise refuses with a clear error.
//
// `wait_bounded` is a kernel by necessity (the driver's waits have no timeout). Its spin ends
// after timeout_ns, so it cannot deadlock; it writes kStatusDone or kStatusTimedOut to `status`,
// and on a timeout the stream goes on (the caller asked for that by choosing the bounded form, and
// reads the status). It never traps: a trap would poison the CUDA context. `status` may be device
// memory or pinned host memory (readable by the host while the stream is still busy).
#pragma once

#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cstdint>
#include <cuda.h>
#include <cuda_runtime.h>

namespace jit_kernel::stream_wait {

inline constexpr int32_t kStatusPending = 0;
inline constexpr int32_t kStatusDone = 1;
inline constexpr int32_t kStatusTimedOut = 2;

SGL_DEVICE auto load_acquire(const int32_t* flag) -> int32_t {
  int32_t value;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  asm volatile("ld.acquire.sys.global.b32 %0, [%1];" : "=r"(value) : "l"(flag) : "memory");
#else
  value = *static_cast<const volatile int32_t*>(flag);
#endif
  return value;
}

SGL_DEVICE auto global_timer_ns() -> uint64_t {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

SGL_DEVICE void back_off(uint32_t& sleep_ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  __nanosleep(sleep_ns);
  sleep_ns = sleep_ns < 1024 ? sleep_ns * 2 : sleep_ns;  // 32 .. 1024 ns between polls
#endif
}

static __global__ void wait_kernel(const int32_t* flag, int32_t value) {
  uint32_t sleep_ns = 32;
  while (load_acquire(flag) != value) back_off(sleep_ns);
}

static __global__ void write_kernel(int32_t* flag, int32_t value) {
  __threadfence_system();  // earlier work of the stream is visible before the flag
  *static_cast<volatile int32_t*>(flag) = value;
}

static __global__ void wait_bounded_kernel(const int32_t* flag, int32_t value, int32_t* status, uint64_t timeout_ns) {
  uint32_t sleep_ns = 32;
  const auto start = global_timer_ns();
  while (load_acquire(flag) != value) {
    if (global_timer_ns() - start >= timeout_ns) {
      *static_cast<volatile int32_t*>(status) = kStatusTimedOut;
      __threadfence_system();
      return;
    }
    back_off(sleep_ns);
  }
  *static_cast<volatile int32_t*>(status) = kStatusDone;
  __threadfence_system();
}

// The driver's stream memory operations, looked up once through the runtime (no link to libcuda).
struct DriverOps {
  decltype(&::cuStreamWaitValue32) wait_value = nullptr;
  decltype(&::cuStreamWriteValue32) write_value = nullptr;
  decltype(&::cuModuleGetLoadingMode) loading_mode = nullptr;

  static auto get() -> const DriverOps& {
    static const DriverOps ops = [] {
      DriverOps found;
      lookup("cuStreamWaitValue32", found.wait_value);
      lookup("cuStreamWriteValue32", found.write_value);
      lookup("cuModuleGetLoadingMode", found.loading_mode);
      return found;
    }();
    return ops;
  }

 private:
  template <typename Fn>
  static void lookup(const char* name, Fn& fn) {
    void* address = nullptr;
    cudaDriverEntryPointQueryResult result{};
    // Version 12000 selects the _v2 forms of the memory operations (CUDA 12 semantics).
    if (cudaGetDriverEntryPointByVersion(name, &address, 12000, cudaEnableDefault, &result) == cudaSuccess &&
        result == cudaDriverEntryPointSuccess) {
      fn = reinterpret_cast<Fn>(address);
    }
    cudaGetLastError();  // a missing symbol is not an error of the caller's next CUDA call
  }
};

inline auto modules_load_eagerly() -> bool {
  const auto& ops = DriverOps::get();
  CUmoduleLoadingMode mode{};
  return ops.loading_mode != nullptr && ops.loading_mode(&mode) == CUDA_SUCCESS && mode == CU_MODULE_EAGER_LOADING;
}

inline auto check_flag(const tvm::ffi::TensorView& flag) -> DLDevice {
  using namespace host;
  auto length = SymbolicSize{"flag_length"};
  auto device = SymbolicDevice{};
  TensorMatcher({length})  //
      .with_dtype<int32_t>()
      .with_device<kDLCUDA>(device)
      .verify(flag, "flag");
  RuntimeCheck(length.unwrap() >= 1, "stream_wait: 'flag' must have at least one element");
  return device.unwrap();
}

/// \brief Runs `body(stream)` on PyTorch's current stream of `device`, with `device` current.
template <typename Body>
inline void on_stream(DLDevice device, Body&& body) {
  using namespace host;
  int previous = 0;
  RuntimeDeviceCheck(cudaGetDevice(&previous));
  if (previous != device.device_id) RuntimeDeviceCheck(cudaSetDevice(device.device_id));
  const auto stream = static_cast<CUstream>(TVMFFIEnvGetStream(device.device_type, device.device_id));
  const auto result = body(stream);
  if (previous != device.device_id) RuntimeDeviceCheck(cudaSetDevice(previous));
  RuntimeDeviceCheck(result);
}

inline void wait(tvm::ffi::TensorView flag, int32_t value) {
  using namespace host;
  const auto device = check_flag(flag);
  const auto address = reinterpret_cast<CUdeviceptr>(flag.data_ptr());
  const auto& ops = DriverOps::get();
  bool held = false;
  on_stream(device, [&](CUstream stream) {
    if (ops.wait_value == nullptr) return cudaSuccess;
    const auto result = ops.wait_value(stream, address, static_cast<cuuint32_t>(value), CU_STREAM_WAIT_VALUE_EQ);
    held = result == CUDA_SUCCESS;
    return held || result == CUDA_ERROR_NOT_SUPPORTED ? cudaSuccess : cudaErrorUnknown;
  });
  if (held) return;
  RuntimeCheck(
      modules_load_eagerly(),
      "stream_wait: this driver has no stream memory operations (cuStreamWaitValue32), and a spinning wait "
      "kernel can deadlock under lazy module loading; set CUDA_MODULE_LOADING=EAGER before CUDA starts, or "
      "use the bounded wait");
  LaunchKernel(1, 1, device)(wait_kernel, static_cast<const int32_t*>(flag.data_ptr()), value);
}

inline void write(tvm::ffi::TensorView flag, int32_t value) {
  using namespace host;
  const auto device = check_flag(flag);
  const auto address = reinterpret_cast<CUdeviceptr>(flag.data_ptr());
  const auto& ops = DriverOps::get();
  bool written = false;
  on_stream(device, [&](CUstream stream) {
    if (ops.write_value == nullptr) return cudaSuccess;
    const auto result = ops.write_value(stream, address, static_cast<cuuint32_t>(value), CU_STREAM_WRITE_VALUE_DEFAULT);
    written = result == CUDA_SUCCESS;
    return written || result == CUDA_ERROR_NOT_SUPPORTED ? cudaSuccess : cudaErrorUnknown;
  });
  if (!written) LaunchKernel(1, 1, device)(write_kernel, static_cast<int32_t*>(flag.data_ptr()), value);
}

inline auto uses_driver_ops() -> bool {
  const auto& ops = DriverOps::get();
  return ops.wait_value != nullptr && ops.write_value != nullptr;
}

/// \brief The device address of `status`: device memory on the flag's device, or pinned host memory.
inline auto status_address(const tvm::ffi::TensorView& status, DLDevice device) -> int32_t* {
  using namespace host;
  auto status_device = SymbolicDevice{};
  TensorMatcher({1})  //
      .with_dtype<int32_t>()
      .with_device<kDLCUDA, kDLCPU, kDLCUDAHost>(status_device)
      .verify(status, "status");
  const auto where = status_device.unwrap();
  if (where.device_type == kDLCUDA) {
    RuntimeCheck(
        where.device_id == device.device_id,
        "stream_wait: 'status' is on cuda:",
        where.device_id,
        " but 'flag' is on cuda:",
        device.device_id);
    return static_cast<int32_t*>(status.data_ptr());
  }
  cudaPointerAttributes attributes{};
  const bool pinned = cudaPointerGetAttributes(&attributes, status.data_ptr()) == cudaSuccess &&
                      attributes.type == cudaMemoryTypeHost && attributes.devicePointer != nullptr;
  cudaGetLastError();
  RuntimeCheck(
      pinned, "stream_wait: a host 'status' must be pinned (torch.zeros(1, dtype=torch.int32, pin_memory=True))");
  return static_cast<int32_t*>(attributes.devicePointer);
}

inline void wait_bounded(tvm::ffi::TensorView flag, int32_t value, tvm::ffi::TensorView status, int64_t timeout_ns) {
  using namespace host;
  const auto device = check_flag(flag);
  auto* status_ptr = status_address(status, device);
  RuntimeCheck(timeout_ns >= 0, "stream_wait: timeout must be >= 0, got ", timeout_ns, " ns");
  LaunchKernel(1, 1, device)(
      wait_bounded_kernel,
      static_cast<const int32_t*>(flag.data_ptr()),
      value,
      status_ptr,
      static_cast<uint64_t>(timeout_ns));
}

}  // namespace jit_kernel::stream_wait
