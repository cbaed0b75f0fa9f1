// stream_wait: make the current stream wait, on the GPU, until flag[0] == value.
//
// One thread spins on the flag with acquire loads and backs off with __nanosleep, so the wait
// costs one warp slot of one SM and no host involvement. The producer (another stream, another
// process through IPC memory, or the host writing pinned memory) sets the flag.
//
//   wait          (flag, value)                       spins until flag[0] == value
//   wait_bounded  (flag, value, status, timeout_ns)   spins at most timeout_ns of GPU time
//
// The bounded form never traps: a trap would poison the CUDA context and lose every later
// kernel of the process. It writes a status word instead (kStatusDone or kStatusTimedOut) and
// returns, and the host reads the word when it chooses (the Python `Event.check()` raises).
// Work queued behind a timed-out wait runs on whatever the producer had written: callers that
// use the bounded form check the status before trusting the result.
#pragma once

#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>

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
  sleep_ns = sleep_ns < 1024 ? sleep_ns * 2 : sleep_ns;  // 32 ns .. ~1 us between polls
#endif
}

static __global__ void wait_kernel(const int32_t* flag, int32_t value) {
  uint32_t sleep_ns = 32;
  while (load_acquire(flag) != value) back_off(sleep_ns);
}

static __global__ void wait_bounded_kernel(const int32_t* flag, int32_t value, int32_t* status, uint64_t timeout_ns) {
  uint32_t sleep_ns = 32;
  const auto start = global_timer_ns();
  while (load_acquire(flag) != value) {
    if (global_timer_ns() - start >= timeout_ns) {
      *static_cast<volatile int32_t*>(status) = kStatusTimedOut;
      return;
    }
    back_off(sleep_ns);
  }
  *static_cast<volatile int32_t*>(status) = kStatusDone;
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

inline void wait(tvm::ffi::TensorView flag, int32_t value) {
  using namespace host;
  const auto device = check_flag(flag);
  LaunchKernel(1, 1, device)(wait_kernel, static_cast<const int32_t*>(flag.data_ptr()), value);
}

inline void wait_bounded(tvm::ffi::TensorView flag, int32_t value, tvm::ffi::TensorView status, int64_t timeout_ns) {
  using namespace host;
  const auto device = check_flag(flag);
  auto status_device = SymbolicDevice{};
  status_device.set_value(device);
  TensorMatcher({1})  //
      .with_dtype<int32_t>()
      .with_device<kDLCUDA>(status_device)
      .verify(status, "status");
  RuntimeCheck(timeout_ns >= 0, "stream_wait: timeout must be >= 0, got ", timeout_ns, " ns");
  LaunchKernel(1, 1, device)(
      wait_bounded_kernel,
      static_cast<const int32_t*>(flag.data_ptr()),
      value,
      static_cast<int32_t*>(status.data_ptr()),
      static_cast<uint64_t>(timeout_ns));
}

}  // namespace jit_kernel::stream_wait
