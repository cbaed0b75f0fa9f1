// per_tensor_quant_fp8: q = fp8_e4m3(clamp(x * (1 / scale), -448, 448)) over a flat tensor.
//
// Dynamic mode also computes scale = absmax(x) / 448 into output_s (no caller-side zeroing):
// - small inputs (<= kSmallElems; on sm_90+ up to kClusterElems with a cluster of blocks): one
//   launch does the absmax, writes the scale and quantises, with 32 elements per thread in flight;
// - large inputs: one cooperative launch that reads HBM once for what fits on chip
//   (one_pass_dynamic_kernel below), with the per-block maxima in a workspace from the caller's allocator.
// Static mode reads the given scale. A zero scale quantises everything to 0.
// Absmax mode (`absmax`, the seed's per_tensor_absmax_fp8) only folds absmax(x) / 448 into
// output_s: output_s = max(output_s, absmax(x) / 448), one read of x, one atomic per block.
// The single-block, static and absmax kernels may be launched with PDL (`enable_pdl`); the
// cooperative one is not (every block must be resident at once).
//
// Non-finite inputs: the absmax is fmaxf from 0, so NaN elements are ignored (an all-NaN input gives
// scale 0) and an inf gives scale inf, in every mode.
#pragma once

#include "fp8_store.cuh"

#include <sgl_kernel/atomic.cuh>
#include <sgl_kernel/cluster.cuh>
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
#include <array>
#include <atomic>
#include <cooperative_groups.h>
#include <cstddef>
#include <cstdint>

namespace jit_kernel::quant {

using fp8::inverse;

inline constexpr float kFp8Max = 448.f;
inline constexpr uint32_t kThreads = 512;
// The small path: one block (or, on sm_90+, one cluster of kSmallCluster blocks: one SM alone
// moves a small fraction of the memory bandwidth) of up to 1024 threads, kSmallUnroll<kN> vectors
// per thread per round, 32 elements (more spills the bf16 instance at the 64 registers 1024 threads
// allow). Above kSmallElems (kClusterElems with a cluster) the cooperative kernel's fixed cost
// pays off.
inline constexpr uint32_t kSmallThreads = 1024;
template <int kN>
inline constexpr int kSmallUnroll = kN == 1 ? 8 : 32 / kN;
inline constexpr int64_t kSmallElems = 8192;
inline constexpr unsigned kSmallCluster = 8;
inline constexpr int64_t kClusterElems = int64_t{kSmallCluster} * kSmallThreads * 32;  // one round
// From kWideClusterElems on, clusters of 16 blocks where the GPU runs them (non-portable size);
// smaller inputs keep kSmallCluster blocks. Where the bound comes from: docs/design/quant.md.
inline constexpr unsigned kWideCluster = 16;
inline constexpr int64_t kWideClusterElems = 65536;

template <typename T>
inline constexpr int kVec = 16 / sizeof(T);

template <typename T, std::size_t kN>
SGL_DEVICE float absmax_vec(float m, const device::AlignedVector<T, kN>& x) {
#pragma unroll
  for (std::size_t j = 0; j < kN; ++j) m = fmaxf(m, fabsf(dtype_trait<fp32_t>::from(x[j])));
  return m;
}

// fp8(clamp(x * inv_scale, -max, max)), NaN to -max: the lower bound is an fmaxf (which also maps
// NaN to it), the upper one the conversion's saturation (SATFINITE: +inf and everything above max
// give max), one instruction less per element than clamping both ends.
SGL_DEVICE float clamp_below(float x, float inv_scale, float max) {
  return fmaxf(x * inv_scale, -max);
}

SGL_DEVICE fp8_e4m3_t to_fp8(float x, float inv_scale) {
  return fp8_e4m3_t(clamp_below(x, inv_scale, kFp8Max));  // the constructor converts with SATFINITE
}

// Quantises vector `x` (to_fp8 of each element, converted in pairs) and stores it as fp8 vector
// number `v` of `out` (kEvictFirst: with an evict-first cache hint); kKind: __NV_E4M3 or __NV_E5M2
// (its max given as `max`).
template <bool kEvictFirst = false, __nv_fp8_interpretation_t kKind = __NV_E4M3, typename T, std::size_t kN>
SGL_DEVICE void quantise_vec(
    void* out, int64_t v, const device::AlignedVector<T, kN>& x, float inv_scale, float max = kFp8Max) {
  float f[kN];
  device::to_floats(x, f);
#pragma unroll
  for (std::size_t j = 0; j < kN; ++j) f[j] = clamp_below(f[j], inv_scale, max);
  if constexpr (kN == 1) {
    static_cast<__nv_fp8_storage_t*>(out)[v] = __nv_cvt_float_to_fp8(f[0], __NV_SATFINITE, kKind);
  } else {
    const auto packed = fp8::pack_fp8<static_cast<int>(kN), kKind>(f);
    if constexpr (kEvictFirst) {
      packed.store_evict_first(out, v);
    } else {
      packed.store(out, v);
    }
  }
}

template <typename T, int kN>
SGL_DEVICE void quant_range(fp8_e4m3_t* out, const T* in, int64_t n, float inv_scale, int64_t first, int64_t step) {
  const int64_t nvec = n / kN;
  for (int64_t v = first; v < nvec; v += step) {
    device::AlignedVector<T, kN> x;
    x.load(in, v);
    quantise_vec(out, v, x, inv_scale);
  }
  for (int64_t i = nvec * kN + first; i < n; i += step) out[i] = to_fp8(dtype_trait<fp32_t>::from(in[i]), inv_scale);
}

// One block or one cluster (kCluster blocks): absmax, scale, quantise. With P threads in all, round r
// covers vectors [r * R, (r + 1) * R), R = P * kSmallUnroll<kN>; each thread issues its loads of a
// round at once, keeps the last round in registers and re-reads the earlier ones (from L1/L2).
template <typename T, int kN, unsigned kCluster>
__global__ void __launch_bounds__(kSmallThreads)
    small_dynamic_kernel(fp8_e4m3_t* out, float* scale, const T* in, int64_t n) {
  using Vec = device::AlignedVector<T, kN>;
  __shared__ float smem[32];
  __shared__ float block_max[kCluster];
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  // n <= kClusterElems: 32-bit indices.
  const int threads = static_cast<int>(blockDim.x * kCluster);
  const int thread = static_cast<int>(device::cluster::block_rank() * blockDim.x + threadIdx.x);
  const int nvec = static_cast<int>(n) / kN;
  const int per_round = threads * kSmallUnroll<kN>;
  const int rounds = (nvec + per_round - 1) / per_round;
  auto index = [&](int r, int k) { return r * per_round + k * threads + thread; };
  float m = 0.f;
  Vec held[kSmallUnroll<kN>];
  for (int r = 0; r < rounds; ++r) {
#pragma unroll
    for (int k = 0; k < kSmallUnroll<kN>; ++k) {
      if (index(r, k) < nvec) {
        held[k].load(in, index(r, k));
        m = absmax_vec(m, held[k]);
      }
    }
  }
  const int tail = nvec * kN + thread;  // the last n % kN elements, one per thread
  if (tail < n) m = fmaxf(m, fabsf(dtype_trait<fp32_t>::from(in[tail])));
  m = device::cta::all_reduce_max_nonneg(m, smem);  // m >= 0, never NaN (absmax_vec)
  m = device::cluster::all_reduce<kCluster>(m, block_max, [](float a, float b) { return fmaxf(a, b); });
  const float s = m / kFp8Max;
  if (thread == 0) *scale = s;
  const float inv_scale = inverse(s);
  auto quantise = [&](const Vec& x, int v) { quantise_vec(out, v, x, inv_scale); };
#pragma unroll
  for (int k = 0; k < kSmallUnroll<kN>; ++k) {
    if (rounds > 0 && index(rounds - 1, k) < nvec) quantise(held[k], index(rounds - 1, k));
  }
  for (int r = rounds - 2; r >= 0; --r) {
#pragma unroll
    for (int k = 0; k < kSmallUnroll<kN>; ++k) {
      held[k].load(in, index(r, k));  // earlier rounds are whole: only the last can run past nvec
      quantise(held[k], index(r, k));
    }
  }
  if (tail < n) out[tail] = to_fp8(dtype_trait<fp32_t>::from(in[tail]), inv_scale);
}

template <typename T, int kN>
__global__ void __launch_bounds__(kThreads) quant_kernel(fp8_e4m3_t* out, const float* scale, const T* in, int64_t n) {
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  quant_range<T, kN>(out, in, n, inverse(*scale), first, static_cast<int64_t>(gridDim.x) * blockDim.x);
}

// Absmax only: *scale = max(*scale, absmax(in[0, n)) / 448). The input is read as elements
// [0, head) (so that in + head is 16-byte aligned: a view at any element offset still gets 16-byte
// loads), vectors of kN from in + head, and the last (n - head) % kN elements; the head and tail
// (fewer than kN each) go one per thread of block 0. Grid-stride over the vectors, kAbsmaxUnroll
// loads in flight per thread; then one block reduction and one atomic max per block. The per-block
// division by 448 is the dynamic kernels' `m / kFp8Max`, and fp32 division is monotonic, so the
// maximum of the quotients is bit-equal to dynamic mode's scale of the same input.
// Plain loads (not evict-first): a static quantisation of the same input usually follows.
inline constexpr int kAbsmaxUnroll = 4;
// Grid: one vector per thread up to 2 blocks per SM (resident together: <= 64 registers; ptxas,
// sm_90a: fp32 47, fp16 48, bf16 61), then grid-stride: 2 x 512 threads x 4 x 16 bytes = 64 KiB
// in flight per SM, and at most 2 atomics per SM on output_s.
inline constexpr int kAbsmaxBlocksPerSm = 2;

template <typename T, int kN>
__global__ void __launch_bounds__(kThreads, kAbsmaxBlocksPerSm)
    absmax_kernel(float* scale, const T* in, int64_t n, int64_t head) {
  using Vec = device::AlignedVector<T, kN>;
  __shared__ float smem[32];
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const T* body = in + head;
  const int64_t nvec = (n - head) / kN;
  float m = 0.f;
  for (int64_t v = first; v < nvec; v += kAbsmaxUnroll * step) {
    Vec x[kAbsmaxUnroll];
#pragma unroll
    for (int u = 0; u < kAbsmaxUnroll; ++u) {
      if (v + u * step < nvec) x[u].load(body, v + u * step);
    }
#pragma unroll
    for (int u = 0; u < kAbsmaxUnroll; ++u) {
      if (v + u * step < nvec) m = absmax_vec(m, x[u]);
    }
  }
  if (first < head) m = fmaxf(m, fabsf(dtype_trait<fp32_t>::from(in[first])));
  const int64_t tail = head + nvec * kN + first;
  if (tail < n) m = fmaxf(m, fabsf(dtype_trait<fp32_t>::from(in[tail])));
  device::cta::reduce_max(m, smem);
  // m >= 0 (never NaN): an integer atomic max (atomic.cuh). A NaN already in *scale stays if its
  // sign bit is clear (torch's NaN) and is replaced if it is set; any other old value gives max().
  if (threadIdx.x == 0) device::atomic::max(scale, smem[0] / kFp8Max);
}

// The one-pass kernel keeps part of the input on chip across its grid barrier: kHeldVecs 16-byte
// vectors per thread in registers (20 registers: two 512-thread blocks per SM fit without
// spilling) plus `stash_slots` vectors per thread in dynamic shared memory.
inline constexpr int kHeldVecs = 5;
inline constexpr int kStreamUnroll = 4;
inline constexpr int kBlocksPerSm = 2;

// Dynamic mode in one pass over HBM (a cooperative launch, every block resident). Thread g covers
// vectors g + i * P, iteration i < iters (P = all threads; only the last iteration can run past
// the end). Iterations [0, stash) go to shared memory, the last kHeldVecs to registers, the ones
// between stream.
// 1. The stash, the streamed part and the held vectors are read in that order for the absmax.
// 2. Each block's maximum goes to block_max[blockIdx.x]; grid barrier; every block reduces
//    block_max (block 0 also stores the scale: no zeroing by anyone).
// 3. The held vectors are quantised, the streamed part is re-read newest first (what pass 1 read
//    last is still in L2), then the stashed vectors are quantised.
// Every global access but the first read of the streamed part is evict-first, so that L2 keeps it
// for its re-read (docs/design/quant.md).
template <typename T, int kN>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) one_pass_dynamic_kernel(
    fp8_e4m3_t* out, float* scale, float* block_max, const T* in, int64_t n, int64_t stash_slots) {
  using Vec = device::AlignedVector<T, kN>;
  // Slot k of this thread is vector k * blockDim.x + threadIdx.x. Moved with Vec::load / store: a
  // Vec read through a reference into shared memory compiles to one load per element.
  extern __shared__ uint4 stash[];
  auto slot = [&](int64_t k) { return k * blockDim.x + threadIdx.x; };
  __shared__ float smem[32];
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nvec = n / kN;
  const int64_t iters = (nvec + step - 1) / step;
  const int64_t held_first = iters > kHeldVecs ? iters - kHeldVecs : 0;
  const int64_t stash_end = stash_slots < held_first ? stash_slots : held_first;
  auto vec = [&](int64_t i) { return first + i * step; };
  auto quantise = [&](const Vec& x, float inv_scale, int64_t v) { quantise_vec<true>(out, v, x, inv_scale); };

  // Batches of kStreamUnroll vectors, every load of a batch issued before any use (a store
  // between two loads would order them: `out` and `in` may alias as far as the compiler knows).
  auto for_batches = [&](int64_t begin, int64_t end, bool evict_first, auto&& use) {
    for (int64_t i = begin; i < end; i += kStreamUnroll) {
      Vec x[kStreamUnroll];
#pragma unroll
      for (int u = 0; u < kStreamUnroll; ++u) {
        if (i + u >= end) continue;
        if (evict_first) {
          x[u].load_evict_first(in, vec(i + u));
        } else {
          x[u].load(in, vec(i + u));
        }
      }
#pragma unroll
      for (int u = 0; u < kStreamUnroll; ++u) {
        if (i + u < end) use(x[u], i + u);
      }
    }
  };
  float m = 0.f;
  for_batches(0, stash_end, true, [&](const Vec& x, int64_t i) {
    m = absmax_vec(m, x);
    x.store(static_cast<void*>(stash), slot(i));
  });
  for_batches(stash_end, held_first, false, [&](const Vec& x, int64_t) { m = absmax_vec(m, x); });
  Vec held[kHeldVecs];
#pragma unroll
  for (int k = 0; k < kHeldVecs; ++k) {
    if (vec(held_first + k) < nvec) held[k].load_evict_first(in, vec(held_first + k));
  }
#pragma unroll
  for (int k = 0; k < kHeldVecs; ++k) {
    if (vec(held_first + k) < nvec) m = absmax_vec(m, held[k]);
  }
  const int64_t tail = nvec * kN + first;  // the last n % kN elements, one per thread
  if (tail < n) m = fmaxf(m, fabsf(dtype_trait<fp32_t>::from(in[tail])));

  device::cta::reduce_max(m, smem);
  if (threadIdx.x == 0) block_max[blockIdx.x] = smem[0];
  cooperative_groups::this_grid().sync();  // also makes every block_max store visible

  float total = 0.f;
  for (uint32_t b = threadIdx.x; b < gridDim.x; b += blockDim.x) total = fmaxf(total, block_max[b]);
  device::cta::reduce_max(total, smem);  // the barrier above ordered thread 0's read of smem[0]
  __syncthreads();
  const float s = smem[0] / kFp8Max;
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale = s;
  const float inv_scale = inverse(s);

  // The held vectors first: their registers are free for the batches below.
#pragma unroll
  for (int k = 0; k < kHeldVecs; ++k) {
    if (vec(held_first + k) < nvec) quantise(held[k], inv_scale, vec(held_first + k));
  }
  // Newest first: batches walk down from held_first, each batch's indices down from its top.
  for (int64_t top = held_first - 1; top >= stash_end; top -= kStreamUnroll) {
    Vec x[kStreamUnroll];
#pragma unroll
    for (int u = 0; u < kStreamUnroll; ++u) {
      if (top - u >= stash_end) x[u].load_evict_first(in, vec(top - u));
    }
#pragma unroll
    for (int u = 0; u < kStreamUnroll; ++u) {
      if (top - u >= stash_end) quantise(x[u], inv_scale, vec(top - u));
    }
  }
#pragma unroll kStreamUnroll
  for (int64_t i = 0; i < stash_end; ++i) {
    Vec x;
    x.load(static_cast<const void*>(stash), slot(i));
    quantise(x, inv_scale, vec(i));
  }
  if (tail < n) out[tail] = to_fp8(dtype_trait<fp32_t>::from(in[tail]), inv_scale);
}

template <typename T>
struct PerTensorQuantFp8 {
  static void verify(
      tvm::ffi::TensorView output_q, tvm::ffi::TensorView output_s, tvm::ffi::TensorView input, DLDevice& dev) {
    using namespace host;
    auto device = SymbolicDevice{};
    // Any shape, contiguous: output_q has input's.
    TensorMatcher::same_shape_as(input).with_device<kDLCUDA>(device).with_dtype<T>().verify(input, "input");
    TensorMatcher::same_shape_as(input).with_device<kDLCUDA>(device).with_dtype<fp8_e4m3_t>().verify(
        output_q, "output_q");
    TensorMatcher({1}).with_device<kDLCUDA>(device).with_dtype<fp32_t>().verify(output_s, "output_s");
    dev = device.unwrap();
  }

  static bool aligned(const void* a, const void* b) {
    return reinterpret_cast<uint64_t>(a) % 16 == 0 && reinterpret_cast<uint64_t>(b) % (16 / sizeof(T)) == 0;
  }

  static uint32_t grid(int64_t units, int device_id) {
    const uint32_t num_sm = host::runtime::sm_count(device_id);
    return static_cast<uint32_t>(std::clamp<int64_t>(host::div_ceil(units, int64_t{kThreads}), 1, num_sm * 8));
  }

  // `enable_pdl` applies to the single-block path only (see the top of this file). The one-pass
  // kernel's workspace (one float per block) comes from the caller's allocator, only when used.
  static void dynamic(
      tvm::ffi::TensorView output_q,
      tvm::ffi::TensorView output_s,
      tvm::ffi::TensorView input,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    DLDevice dev;
    verify(output_q, output_s, input, dev);
    if (has_no_data(output_s)) return;
    const int64_t n = input.numel();
    auto* q = static_cast<fp8_e4m3_t*>(output_q.data_ptr());
    auto* s = static_cast<float*>(output_s.data_ptr());
    const auto* x = static_cast<const T*>(input.data_ptr());
    const bool vec = aligned(x, q);
    const bool pdl = runtime::resolve_pdl(enable_pdl, dev.device_id);
    if (n <= kSmallElems) {
      vec ? launch_small<kVec<T>, 1>(q, s, x, n, dev, pdl) : launch_small<1, 1>(q, s, x, n, dev, pdl);
      return;
    }
    if (vec && n <= kClusterElems && runtime::has_clusters(dev.device_id)) {
      constexpr auto wide = small_dynamic_kernel<T, kVec<T>, kWideCluster>;
      if (n >= kWideClusterElems && runtime::max_cluster_size_per_device<wide>(dev, kSmallThreads) >= kWideCluster) {
        launch_small<kVec<T>, kWideCluster>(q, s, x, n, dev, pdl);
      } else {
        launch_small<kVec<T>, kSmallCluster>(q, s, x, n, dev, pdl);
      }
      return;
    }
    if (vec) {
      launch_one_pass<kVec<T>>(q, s, x, n, dev);
    } else {
      launch_one_pass<1>(q, s, x, n, dev);
    }
  }

  // Fewer threads with more loads each have the same latency and a shorter reduction.
  template <int kN, unsigned kCluster>
  static void launch_small(fp8_e4m3_t* q, float* s, const T* x, int64_t n, DLDevice dev, bool enable_pdl) {
    using namespace host;
    const int64_t per_thread = int64_t{kSmallUnroll<kN>} * kN * kCluster;
    const auto threads =
        static_cast<uint32_t>(std::clamp<int64_t>(div_ceil(n, per_thread * 32) * 32, 32, kSmallThreads));
    LaunchKernel(kCluster, threads, dev)
        .enable_pdl(enable_pdl)
        .enable_cluster(kCluster)(small_dynamic_kernel<T, kN, kCluster>, q, s, x, n);
  }

  // What one SM holds of the one-pass kernel, queried once per device (occupancy queries are
  // driver calls): resident blocks (the cooperative cap) and stash slots per thread.
  struct OnePassFit {
    int64_t resident_blocks;
    int64_t stash_slots;
  };

  template <int kN>
  static OnePassFit one_pass_fit(int device_id) {
    using namespace host;
    static std::array<std::atomic<int64_t>, 64> cached_blocks{}, cached_slots{};
    RuntimeCheck(device_id >= 0 && device_id < 64, "per_tensor_quant_fp8: device id ", device_id, " >= 64");
    if (const int64_t blocks = cached_blocks[device_id].load(); blocks > 0) return {blocks, cached_slots[device_id]};
    int saved = 0;
    RuntimeDeviceCheck(cudaGetDevice(&saved));
    RuntimeDeviceCheck(cudaSetDevice(device_id));
    const auto kernel = one_pass_dynamic_kernel<T, kN>;
    // The occupancy calculator caps dynamic smem at the kernel's opt-in limit (48 KiB until raised),
    // and a cooperative launch is checked against the carveout the driver picks for the launch:
    // ask for the largest shared carveout, and launch with exactly the smem measured here.
    int optin = 0;
    RuntimeDeviceCheck(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_id));
    cudaFuncAttributes attributes{};
    RuntimeDeviceCheck(cudaFuncGetAttributes(&attributes, kernel));
    RuntimeDeviceCheck(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - static_cast<int>(attributes.sharedSizeBytes)));
    RuntimeDeviceCheck(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    const std::size_t smem = runtime::get_available_dynamic_smem_per_block(kernel, kBlocksPerSm, kThreads);
    const int64_t slots = static_cast<int64_t>(smem / (kThreads * sizeof(device::AlignedVector<T, kN>)));
    const std::size_t used = static_cast<std::size_t>(slots) * kThreads * sizeof(device::AlignedVector<T, kN>);
    const int64_t per_sm = runtime::get_blocks_per_sm(kernel, kThreads, used);
    RuntimeDeviceCheck(cudaSetDevice(saved));
    RuntimeCheck(per_sm > 0, "per_tensor_quant_fp8: the one-pass kernel does not fit on an SM");
    cached_slots[device_id].store(slots);
    cached_blocks[device_id].store(per_sm * runtime::get_sm_count(device_id));
    return {cached_blocks[device_id].load(), slots};
  }

  template <int kN>
  static void launch_one_pass(fp8_e4m3_t* q, float* s, const T* x, int64_t n, DLDevice dev) {
    using namespace host;
    const OnePassFit fit = one_pass_fit<kN>(dev.device_id);
    const int64_t units = n / kN;
    const int64_t grid = std::clamp<int64_t>(div_ceil(units, int64_t{kThreads}), 1, fit.resident_blocks);
    // Freed when the call returns, reused by the caching allocator in stream order.
    const auto workspace = ffi::empty({grid}, dl_dtype_v<fp32_t>, dev);
    const int64_t iters = div_ceil(units, grid * kThreads);
    const int64_t stash = std::clamp<int64_t>(iters - kHeldVecs, 0, fit.stash_slots);
    // Always the full stash size: the launch then matches the occupancy that sized the grid.
    const std::size_t smem =
        static_cast<std::size_t>(fit.stash_slots) * kThreads * sizeof(device::AlignedVector<T, kN>);
    LaunchKernel(static_cast<uint32_t>(grid), kThreads, dev, smem)
        .enable_cooperative()(
            one_pass_dynamic_kernel<T, kN>, q, s, static_cast<float*>(workspace.data_ptr()), x, n, stash);
  }

  static void static_scale(
      tvm::ffi::TensorView output_q,
      tvm::ffi::TensorView output_s,
      tvm::ffi::TensorView input,
      tvm::ffi::Optional<bool> enable_pdl) {
    DLDevice dev;
    verify(output_q, output_s, input, dev);
    if (host::has_no_data(output_s)) return;
    const bool pdl = host::runtime::resolve_pdl(enable_pdl, dev.device_id);
    const int64_t n = input.numel();
    if (n == 0) return;
    auto* q = static_cast<fp8_e4m3_t*>(output_q.data_ptr());
    const auto* s = static_cast<const float*>(output_s.data_ptr());
    const auto* x = static_cast<const T*>(input.data_ptr());
    const bool vec = aligned(x, q);
    const auto blocks = grid(vec ? n / kVec<T> : n, dev.device_id);
    host::LaunchKernel(blocks, kThreads, dev)
        .enable_pdl(pdl)(vec ? quant_kernel<T, kVec<T>> : quant_kernel<T, 1>, q, s, x, n);
  }

  // output_s = max(output_s, absmax(input) / 448): accumulates, so the caller zeroes output_s
  // first (or calls again on another tensor for one scale over both). An empty input launches
  // nothing and leaves output_s as it was.
  static void absmax(tvm::ffi::TensorView output_s, tvm::ffi::TensorView input, tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    auto device = SymbolicDevice{};
    TensorMatcher::same_shape_as(input).with_device<kDLCUDA>(device).with_dtype<T>().verify(input, "input");
    TensorMatcher({1}).with_device<kDLCUDA>(device).with_dtype<fp32_t>().verify(output_s, "output_s");
    const DLDevice dev = device.unwrap();
    if (has_no_data(output_s)) return;
    const int64_t n = input.numel();
    if (n == 0) return;
    const auto* x = static_cast<const T*>(input.data_ptr());
    const auto address = reinterpret_cast<uintptr_t>(x);
    RuntimeCheck(
        address % sizeof(T) == 0,
        "per_tensor_absmax_fp8: 'input' data pointer ",
        address,
        " is not aligned to its element size ",
        sizeof(T));
    // Elements before the first 16-byte boundary (a view at an odd element offset).
    const int64_t head = std::min<int64_t>(n, static_cast<int64_t>((16 - address % 16) % 16 / sizeof(T)));
    const int64_t nvec = (n - head) / kVec<T>;
    const int64_t max_blocks = int64_t{runtime::sm_count(dev.device_id)} * kAbsmaxBlocksPerSm;
    const auto blocks = static_cast<uint32_t>(std::clamp<int64_t>(div_ceil(nvec, int64_t{kThreads}), 1, max_blocks));
    LaunchKernel(blocks, kThreads, dev)
        .enable_pdl(runtime::resolve_pdl(enable_pdl, dev.device_id))(
            absmax_kernel<T, kVec<T>>, static_cast<float*>(output_s.data_ptr()), x, n, head);
  }
};

}  // namespace jit_kernel::quant
