// Fixture: the remaining kernel code of the seeds' guides, kept as written: the walkthrough of
// SGLang's JIT kernel system, §0x4.1 (cuda_wait_value) and §0x5.2 (MyKernel), and the "C++ Utilities"
// snippets of SGLang's JIT kernel development guide. Each snippet sits in its own namespace because
// the guides reuse names like `test` and `kernel`.
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>

namespace wait_value {  // walkthrough §0x4.1

__global__ void wait_flag_kernel(const int32_t* flag, int32_t target) {
  const volatile int32_t* vflag = (volatile const int32_t*)flag;

  while (*vflag != target) {
#if __CUDA_ARCH__ >= 700
    __nanosleep(100);  // Volta及以上:降低功耗
#else
    // Pre-Volta:busy-wait
#endif
  }
}

auto stream_wait_value(const tvm::ffi::TensorView flag, std::int32_t value) -> void {
  using namespace host;

  auto length = SymbolicSize{"length"};
  TensorMatcher({length})
    .with_dtype<int32_t>()
    .with_device<kDLCUDA>()
    .verify(flag);
  RuntimeCheck(length.unwrap() >= 1, "wait_flag expects a non-empty tensor.");

  auto* ptr = static_cast<std::int32_t*>(flag.data_ptr());
  const auto stream = LaunchKernel::resolve_device(flag.device());

  constexpr int blocks = 1;
  constexpr int threads = 1;
  wait_flag_kernel<<<blocks, threads, 0, stream>>>(ptr, value);
  RuntimeDeviceCheck(cudaGetLastError());
}

}  // namespace wait_value

namespace my_kernel {  // walkthrough §0x5.2

__global__ void my_kernel_impl(float* output, const float* input, int size) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx < size) {
    output[idx] = input[idx] * 2.0f;
  }
}

template <int kBlockSize>
struct MyKernel {
  static void run(tvm::ffi::TensorView output, tvm::ffi::TensorView input) {
    using namespace host;

    auto N = SymbolicSize{"N"};
    auto device = SymbolicDevice{};

    TensorMatcher({N})
        .with_dtype<float>()
        .with_device<kDLCUDA>(device)
        .verify(input)
        .verify(output);

    const int size = N.unwrap();
    const int num_blocks = div_ceil(size, kBlockSize);

    auto* out_ptr = static_cast<float*>(output.data_ptr());
    auto* in_ptr = static_cast<const float*>(input.data_ptr());

    LaunchKernel(num_blocks, kBlockSize, device.unwrap())(
        my_kernel_impl, out_ptr, in_ptr, size
    );
  }
};

}  // namespace my_kernel

namespace guide_irange {  // development guide, "Integer Range"

void test() {
  for (auto i : host::irange(100)) { // [0, 100)
    // do something
    (void)i;  // [added] silences -Wunused-variable in the empty loop body
  }
  for (auto i : host::irange(0, 100)) { // [0, 100)
    // do something
    (void)i;  // [added]
  }
}

}  // namespace guide_irange

namespace guide_checks {  // development guide, "Runtime Checking"

void test() {
  host::RuntimeCheck(1 + 1 == 2, 1 + 1, " != ", 2);
  host::RuntimeDeviceCheck();
  // check the provided `cudaError_t`
  host::RuntimeDeviceCheck(cudaGetLastError());
}

}  // namespace guide_checks

namespace guide_tensor {  // development guide, "Tensor Checking"

void test(const tvm::ffi::TensorView k_cache, const tvm::ffi::TensorView v_cache) {
  using namespace host;

  auto D = SymbolicSize{"D"};  // cache dimension
  auto N = SymbolicSize{"N"};  // kvcache stride
  auto dtype = SymbolicDType{};
  auto device = SymbolicDevice{};

  TensorMatcher({-1, D})  //
      .with_strides({N, 1})
      .with_dtype<int32_t, int64_t>(dtype)
      .with_device<kDLCUDA, kDLCPU>(device)
      .verify(k_cache)
      .verify(v_cache);
}

}  // namespace guide_tensor

namespace guide_launch {  // development guide, "Kernel Launching"

__global__ void kernel() {}

void test() {
  const auto num_blocks = 1;
  const auto num_threads = 32;
  const auto dynamic_smem = 0;

  DLDevice dev{kDLCUDA, 0};  // suppose this is initialized properly  [initialized: avoids -Wuninitialized]
  host::LaunchKernel(num_blocks, num_threads, dev)(kernel);

  cudaStream_t stream = host::LaunchKernel::resolve_device(dev);
  host::LaunchKernel(num_blocks, num_threads, stream, dynamic_smem)(kernel);
}

}  // namespace guide_launch
