// per_token_quant_fp8: one float32 scale per row of `[num_tokens, hidden]`, values in fp8 e4m3.
//
// Dynamic mode: scale[r] = absmax(row r) / 448, q = fp8(x * (1 / scale[r])). A row whose absmax is 0
// (all zeros) gets scale 0 and q 0 (no guarded minimum: a zero scale dequantises to exactly 0).
// Static mode: one per-tensor scale is read from `output_s` (shape (1,)); a zero scale gives q 0.
//
// Non-finite inputs (the same rules in per_token_group_fp8.cuh): the absmax is taken with fmaxf,
// which ignores NaN, so a NaN element does not change its row's scale and quantises to NaN; an
// infinite element makes the scale inf, so the row's finite elements quantise to 0 and the
// infinite ones to NaN (inf * 0). The fp8 conversion saturates finite values to +-448 (SATFINITE).
//
// One CTA per row (any row count, one small launch for decode sizes): each thread keeps up to
// kHeld = 2 16-byte vectors of its row in registers (see `threads_for`), so the row is read from HBM
// once; rows wider than 2 x 1024 vectors (bf16 above 16384) stream the rest and re-read it (from
// L2) to quantise. Rows that are not whole aligned 16-byte vectors take the scalar kernel (kN = 1).
#pragma once

#include "fp8_store.cuh"

#include <sgl_kernel/cta.cuh>
#include <sgl_kernel/ffi.h>
#include <sgl_kernel/runtime.cuh>
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>
#include <sgl_kernel/vec.cuh>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cuda_fp8.h>

namespace jit_kernel::token_quant {

using fp8::inverse;
using fp8::store_fp8;

inline constexpr float kFp8Max = 448.f;

template <typename T>
inline constexpr int kVec = 16 / static_cast<int>(sizeof(T));

template <typename T, std::size_t kN>
SGL_DEVICE float absmax_vec(float m, const device::AlignedVector<T, kN>& x) {
  float f[kN];
  device::to_floats(x, f);
#pragma unroll
  for (std::size_t j = 0; j < kN; ++j) m = fmaxf(m, fabsf(f[j]));
  return m;
}

// Quantises vector `x` and stores it as fp8 vector number `v` of `out`.
template <typename T, std::size_t kN>
SGL_DEVICE void quantise_vec(fp8_e4m3_t* out, int64_t v, const device::AlignedVector<T, kN>& x, float inv_scale) {
  float y[kN];
  device::to_floats(x, y);
#pragma unroll
  for (std::size_t j = 0; j < kN; ++j) y[j] *= inv_scale;
  store_fp8<static_cast<int>(kN)>(out + v * static_cast<int64_t>(kN), y);
}

inline constexpr int kRowMaxThreads = 1024;
// Vectors per thread kept in registers: 2 (bf16 32 registers, fp32 34; with 4, 52 and 64 left room
// for 4 and 2 CTAs of 256 threads per SM instead of 8).
inline constexpr int kHeld = 2;

// One CTA per row. kStatic: the scale is `*static_scale`; else absmax / 448, stored to s[row].
template <typename T, int kN, bool kStatic>
__global__ void __launch_bounds__(kRowMaxThreads) per_token_kernel(
    fp8_e4m3_t* __restrict__ q,
    float* __restrict__ s,
    const float* __restrict__ static_scale,
    const T* __restrict__ in,
    int64_t in_stride,
    int64_t d) {
  using Vec = device::AlignedVector<T, kN>;
  __shared__ float smem[32];
  const int64_t row = blockIdx.x;
  const T* x = in + row * in_stride;
  fp8_e4m3_t* y = q + row * d;
  const int64_t nvec = d / kN;  // kN divides d (the launcher picks kN = 1 otherwise)
  const int64_t tid = threadIdx.x;
  const int64_t step = blockDim.x;
  device::PDLWaitPrimary();
  Vec held[kHeld];
#pragma unroll
  for (int k = 0; k < kHeld; ++k) {
    if (tid + k * step < nvec) held[k].load(x, tid + k * step);
  }
  float inv_scale;
  if constexpr (kStatic) {
    inv_scale = inverse(*static_scale);
  } else {
    float m = 0.f;
#pragma unroll
    for (int k = 0; k < kHeld; ++k) {
      if (tid + k * step < nvec) m = absmax_vec(m, held[k]);
    }
    for (int64_t v = tid + kHeld * step; v < nvec; v += step) {
      Vec t;
      t.load(x, v);
      m = absmax_vec(m, t);
    }
    m = device::cta::all_reduce_max_nonneg(m, smem);  // m >= 0 and not NaN (absmax_vec by fmaxf)
    const float scale = m / kFp8Max;
    if (tid == 0) s[row] = scale;
    inv_scale = inverse(scale);
  }
  device::PDLTriggerSecondary();
#pragma unroll
  for (int k = 0; k < kHeld; ++k) {
    if (tid + k * step < nvec) quantise_vec(y, tid + k * step, held[k], inv_scale);
  }
  for (int64_t v = tid + kHeld * step; v < nvec; v += step) {
    Vec t;
    t.load(x, v);
    quantise_vec(y, v, t, inv_scale);
  }
}

// About two vectors per thread, rmsnorm's rule for the same row shape (docs/design/norm.md,
// docs/design/quant.md), 32..1024 threads.
inline uint32_t threads_for(int64_t nvec) {
  const int64_t half = (nvec + 1) / 2;
  return static_cast<uint32_t>(std::clamp<int64_t>((half + 31) / 32 * 32, 32, kRowMaxThreads));
}

template <typename T>
struct PerTokenQuantFp8 {
  // q = fp8(input * (1 / scale)), scale[r] = absmax(input[r]) / 448 into output_s ([N, 1]).
  static void dynamic(
      tvm::ffi::TensorView output_q,
      tvm::ffi::TensorView output_s,
      tvm::ffi::TensorView input,
      tvm::ffi::Optional<bool> enable_pdl) {
    run<false>(output_q, output_s, input, enable_pdl);
  }

  // q = fp8(input * (1 / output_s[0])): output_s holds one per-tensor scale, shape (1,).
  static void static_scale(
      tvm::ffi::TensorView output_q,
      tvm::ffi::TensorView output_s,
      tvm::ffi::TensorView input,
      tvm::ffi::Optional<bool> enable_pdl) {
    run<true>(output_q, output_s, input, enable_pdl);
  }

 private:
  // Both forms: output_s is [N, 1] (written, dynamic) or (1,) (read, kStatic).
  template <bool kStatic>
  static void run(
      tvm::ffi::TensorView output_q,
      tvm::ffi::TensorView output_s,
      tvm::ffi::TensorView input,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    auto N = SymbolicSize{"num_tokens"};
    auto D = SymbolicSize{"hidden_size"};
    auto device = SymbolicDevice{};
    TensorMatcher::cuda_rows<T>({N, D}, device).verify(input, "input");
    TensorMatcher({N, D}).with_device<kDLCUDA>(device).with_dtype<fp8_e4m3_t>().verify(output_q, "output_q");
    if constexpr (kStatic) {
      TensorMatcher({1}).with_device<kDLCUDA>(device).with_dtype<fp32_t>().verify(output_s, "output_s");
    } else {
      TensorMatcher({N, 1}).with_device<kDLCUDA>(device).with_dtype<fp32_t>().verify(output_s, "output_s");
    }
    float* s = kStatic ? nullptr : static_cast<float*>(output_s.data_ptr());
    const float* static_scale = kStatic ? static_cast<const float*>(output_s.data_ptr()) : nullptr;
    const DLDevice dev = device.unwrap();
    const int64_t n = input.size(0);
    const int64_t d = input.size(1);
    RuntimeCheck(n < (int64_t{1} << 31), "per_token_quant_fp8: at most 2^31 - 1 rows, got ", n);
    if (n == 0 || has_no_data(output_q)) return;  // nothing to do, or a fake call's checks alone
    const bool pdl = runtime::resolve_pdl(enable_pdl, dev.device_id);
    auto* q = static_cast<fp8_e4m3_t*>(output_q.data_ptr());
    const auto* x = static_cast<const T*>(input.data_ptr());
    const int64_t stride = input.stride(0);
    constexpr int kN = kVec<T>;
    const bool vec = reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(q) % kN == 0 &&
                     d % kN == 0 && (n == 1 || (stride * static_cast<int64_t>(sizeof(T))) % 16 == 0);
    const auto grid = static_cast<uint32_t>(n);
    if (vec) {
      LaunchKernel(grid, threads_for(d / kN), dev)
          .enable_pdl(pdl)(per_token_kernel<T, kN, kStatic>, q, s, static_scale, x, stride, d);
    } else {
      LaunchKernel(grid, threads_for(d), dev)
          .enable_pdl(pdl)(per_token_kernel<T, 1, kStatic>, q, s, static_scale, x, stride, d);
    }
  }
};

}  // namespace jit_kernel::token_quant
