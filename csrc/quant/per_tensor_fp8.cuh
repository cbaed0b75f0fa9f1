// per_tensor_quant_fp8: q = fp8_e4m3(clamp(x * (1 / scale), -448, 448)) over a flat tensor.
//
// Dynamic mode also computes scale = absmax(x) / 448 into output_s (no caller-side zeroing):
// - small inputs (<= kSmallElems = 8192): one block does the absmax, writes the scale and quantises,
//   in a single launch;
// - large inputs: a one-thread kernel zeroes output_s, an absmax kernel atomically maxes each
//   block's absmax / 448 into it (division by a positive constant is monotonic, so this is
//   exactly absmax / 448), and the quantise kernel reads it.
// Static mode reads the given scale. A zero scale quantises everything to 0.
#pragma once

#include <sgl_kernel/cta.cuh>
#include <sgl_kernel/runtime.cuh>
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>
#include <sgl_kernel/vec.cuh>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace jit_kernel::quant {

inline constexpr float kFp8Max = 448.f;
inline constexpr uint32_t kThreads = 512;
inline constexpr int64_t kSmallElems = 8192;

template <typename T>
inline constexpr int kVec = 16 / sizeof(T);

template <typename T, int kN>
SGL_DEVICE float absmax_range(const T* in, int64_t n, int64_t first, int64_t step) {
  using Vec = device::AlignedVector<T, kN>;
  float m = 0.f;
  const int64_t nvec = n / kN;
  for (int64_t v = first; v < nvec; v += step) {
    Vec x;
    x.load(in, v);
#pragma unroll
    for (int j = 0; j < kN; ++j) m = fmaxf(m, fabsf(dtype_trait<fp32_t>::from(x[j])));
  }
  for (int64_t i = nvec * kN + first; i < n; i += step) m = fmaxf(m, fabsf(dtype_trait<fp32_t>::from(in[i])));
  return m;
}

SGL_DEVICE fp8_e4m3_t to_fp8(float x, float inv_scale) {
  return fp8_e4m3_t(fminf(fmaxf(x * inv_scale, -kFp8Max), kFp8Max));
}

template <typename T, int kN>
SGL_DEVICE void quant_range(fp8_e4m3_t* out, const T* in, int64_t n, float inv_scale, int64_t first, int64_t step) {
  using Vec = device::AlignedVector<T, kN>;
  using Out = device::AlignedVector<fp8_e4m3_t, kN>;
  const int64_t nvec = n / kN;
  for (int64_t v = first; v < nvec; v += step) {
    Vec x;
    Out y;
    x.load(in, v);
#pragma unroll
    for (int j = 0; j < kN; ++j) y[j] = to_fp8(dtype_trait<fp32_t>::from(x[j]), inv_scale);
    y.store(out, v);
  }
  for (int64_t i = nvec * kN + first; i < n; i += step) out[i] = to_fp8(dtype_trait<fp32_t>::from(in[i]), inv_scale);
}

SGL_DEVICE float inverse(float scale) {
  return scale > 0.f ? 1.f / scale : 0.f;
}

// Single block: absmax, scale, quantise.
template <typename T, int kN>
__global__ void __launch_bounds__(kThreads)
    small_dynamic_kernel(fp8_e4m3_t* out, float* scale, const T* in, int64_t n) {
  __shared__ float smem[32];
  device::cta::reduce_max(absmax_range<T, kN>(in, n, threadIdx.x, blockDim.x), smem);
  __syncthreads();
  const float s = smem[0] / kFp8Max;
  if (threadIdx.x == 0) *scale = s;
  quant_range<T, kN>(out, in, n, inverse(s), threadIdx.x, blockDim.x);
}

// A template (like every kernel here): a plain __global__ in a header would be defined once per
// translation unit of the prebuilt library.
template <typename T>
__global__ void zero_kernel(float* value) {
  *value = 0.f;
}

template <typename T, int kN>
__global__ void __launch_bounds__(kThreads) absmax_kernel(float* scale, const T* in, int64_t n) {
  __shared__ float smem[32];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  device::cta::reduce_max(absmax_range<T, kN>(in, n, first, static_cast<int64_t>(gridDim.x) * blockDim.x), smem);
  if (threadIdx.x == 0) {
    // Non-negative floats order like their bit patterns as signed ints.
    atomicMax(reinterpret_cast<int*>(scale), __float_as_int(smem[0] / kFp8Max));
  }
}

template <typename T, int kN>
__global__ void __launch_bounds__(kThreads) quant_kernel(fp8_e4m3_t* out, const float* scale, const T* in, int64_t n) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  quant_range<T, kN>(out, in, n, inverse(*scale), first, static_cast<int64_t>(gridDim.x) * blockDim.x);
}

// The dynamic mode's second pass walks the vectors from the end: what the absmax pass read last
// is the most likely to still be in L2, so reading it first turns more of the re-read into hits.
template <typename T, int kN>
__global__ void __launch_bounds__(kThreads)
    quant_reverse_kernel(fp8_e4m3_t* out, const float* scale, const T* in, int64_t n) {
  using Vec = device::AlignedVector<T, kN>;
  using Out = device::AlignedVector<fp8_e4m3_t, kN>;
  const float inv_scale = inverse(*scale);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / kN;
  for (int64_t i = first; i < nvec; i += step) {
    const int64_t v = nvec - 1 - i;
    Vec x;
    Out y;
    x.load(in, v);
#pragma unroll
    for (int j = 0; j < kN; ++j) y[j] = to_fp8(dtype_trait<fp32_t>::from(x[j]), inv_scale);
    y.store(out, v);
  }
  for (int64_t i = nvec * kN + first; i < n; i += step) out[i] = to_fp8(dtype_trait<fp32_t>::from(in[i]), inv_scale);
}

template <typename T>
struct PerTensorQuantFp8 {
  static void verify(
      tvm::ffi::TensorView output_q, tvm::ffi::TensorView output_s, tvm::ffi::TensorView input, DLDevice& dev) {
    using namespace host;
    auto n = SymbolicSize{"num_elements"};
    auto device = SymbolicDevice{};
    TensorMatcher({n}).with_device<kDLCUDA>(device).with_dtype<T>().verify(input, "input");
    TensorMatcher({n}).with_device<kDLCUDA>(device).with_dtype<fp8_e4m3_t>().verify(output_q, "output_q");
    TensorMatcher({1}).with_device<kDLCUDA>(device).with_dtype<fp32_t>().verify(output_s, "output_s");
    dev = device.unwrap();
  }

  static bool aligned(const void* a, const void* b) {
    return reinterpret_cast<uint64_t>(a) % 16 == 0 && reinterpret_cast<uint64_t>(b) % (16 / sizeof(T)) == 0;
  }

  static uint32_t grid(int64_t units, int device_id) {
    static const uint32_t num_sm = host::runtime::get_sm_count(device_id);
    return static_cast<uint32_t>(std::clamp<int64_t>(host::div_ceil(units, int64_t{kThreads}), 1, num_sm * 8));
  }

  template <typename Kernel>
  static void launch_elementwise(
      Kernel vec_kernel, Kernel scalar_kernel, bool vec, int64_t n, DLDevice dev, auto... args) {
    const auto blocks = grid(vec ? n / kVec<T> : n, dev.device_id);
    host::LaunchKernel(blocks, kThreads, dev)(vec ? vec_kernel : scalar_kernel, args..., n);
  }

  static void dynamic(tvm::ffi::TensorView output_q, tvm::ffi::TensorView output_s, tvm::ffi::TensorView input) {
    DLDevice dev;
    verify(output_q, output_s, input, dev);
    const int64_t n = input.size(0);
    auto* q = static_cast<fp8_e4m3_t*>(output_q.data_ptr());
    auto* s = static_cast<float*>(output_s.data_ptr());
    const auto* x = static_cast<const T*>(input.data_ptr());
    const bool vec = aligned(x, q);
    if (n <= kSmallElems) {
      host::LaunchKernel(1, kThreads, dev)(
          vec ? small_dynamic_kernel<T, kVec<T>> : small_dynamic_kernel<T, 1>, q, s, x, n);
      return;
    }
    host::LaunchKernel(1, 1, dev)(zero_kernel<T>, s);  // a launch (not a memset) also makes the device current
    launch_elementwise(absmax_kernel<T, kVec<T>>, absmax_kernel<T, 1>, vec, n, dev, s, x);
    launch_elementwise(
        quant_reverse_kernel<T, kVec<T>>, quant_reverse_kernel<T, 1>, vec, n, dev, q, static_cast<const float*>(s), x);
  }

  static void static_scale(tvm::ffi::TensorView output_q, tvm::ffi::TensorView output_s, tvm::ffi::TensorView input) {
    DLDevice dev;
    verify(output_q, output_s, input, dev);
    const int64_t n = input.size(0);
    if (n == 0) return;
    auto* q = static_cast<fp8_e4m3_t*>(output_q.data_ptr());
    const auto* s = static_cast<const float*>(output_s.data_ptr());
    const auto* x = static_cast<const T*>(input.data_ptr());
    launch_elementwise(quant_kernel<T, kVec<T>>, quant_kernel<T, 1>, aligned(x, q), n, dev, q, s, x);
  }
};

}  // namespace jit_kernel::quant
