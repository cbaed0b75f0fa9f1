// apply_rope_with_cos_sin_cache_inplace: rotary embedding of q and k in place (see common.cuh for
// layouts and semantics).
//
// Template parameter: T (the activation dtype) only. The head size, rotary dim, style, position
// dtype and cache dtype are run-time values: no reduction runs over a head, so a compile-time head
// size would save only a little index arithmetic.
//
// Kernel: one thread per (token, head, unit); a unit is kP rotation pairs. On aligned heads, NeoX:
// one 16-byte vector in each half (kP = 16 / sizeof(T)); GPT-J: one 16-byte vector (kP = 8 /
// sizeof(T)); otherwise one pair of scalar accesses. A block is (units, heads, tokens) threads: a
// token's heads side by side (up to kMaxBlockThreads threads), several tokens per block when a
// token's threads are few. The head loads are issued first: they do not depend on the position,
// so the position's load and the cos/sin load that needs it run under them (one memory latency per
// thread for the bulk, not two). The index arithmetic runs before the PDL wait.
#pragma once

#include "common.cuh"

namespace jit_kernel::rope {

inline constexpr int kMaxBlockThreads = 512;
inline constexpr int kTargetBlockThreads = 256;
static_assert(kMaxHeadSize / 2 <= kMaxBlockThreads);

// kV elements at `ptr`: one aligned vector (kVec) or kV scalar accesses.
template <typename T, int kV, bool kVec>
struct Group {
  T v[kV];
  SGL_DEVICE void load(const T* ptr) {
    if constexpr (kVec) {
      device::AlignedVector<T, kV> a;
      a.load(ptr);
#pragma unroll
      for (int j = 0; j < kV; ++j) v[j] = a[j];
    } else {
#pragma unroll
      for (int j = 0; j < kV; ++j) v[j] = ptr[j];
    }
  }
  SGL_DEVICE void store(T* ptr) const {
    if constexpr (kVec) {
      device::AlignedVector<T, kV> a;
#pragma unroll
      for (int j = 0; j < kV; ++j) a[j] = v[j];
      a.store(ptr);
    } else {
#pragma unroll
      for (int j = 0; j < kV; ++j) ptr[j] = v[j];
    }
  }
};

template <typename T, bool kVec, bool kNeox>
struct RopeShape {
  static constexpr int kV = kVec ? kVecElems<T> : (kNeox ? 1 : 2);  // elements per access
  static constexpr int kP = kNeox ? kV : kV / 2;                    // pairs per unit
};

template <typename T, bool kVec, bool kNeox>
__global__ void __launch_bounds__(kMaxBlockThreads) rope_kernel(const __grid_constant__ Params p) {
  using S = RopeShape<T, kVec, kNeox>;
  constexpr int kV = S::kV;
  constexpr int kP = S::kP;
  using G = Group<T, kV, kVec>;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * blockDim.z + threadIdx.z;
  const int64_t h = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
  const int64_t i0 = static_cast<int64_t>(threadIdx.x) * kP;  // first pair of this unit
  const bool active = token < p.tokens && h < p.q_heads + p.k_heads;
  T* const ptr = active ? head_ptr<T>(p, token, h) : nullptr;
  device::PDLWaitPrimary();
  if (!active) return;
  G a, b;
  if constexpr (kNeox) {
    a.load(ptr + i0);
    b.load(ptr + p.half + i0);
  } else {
    a.load(ptr + 2 * i0);
  }
  const int64_t pos = load_position(p, token);
  device::PDLTriggerSecondary();
  // Out-of-range positions are skipped (common.cuh): nothing is stored for them.
  if (pos < 0 || pos >= p.max_pos) return;
  float c[kP], s[kP];
  load_cos_sin<T, kP>(p, cache_row<T>(p, pos), i0, c, s);
#pragma unroll
  for (int j = 0; j < kP; ++j) {
    float x, y;
    if constexpr (kNeox) {
      rotate(dtype_trait<fp32_t>::from(a.v[j]), dtype_trait<fp32_t>::from(b.v[j]), c[j], s[j], x, y);
      a.v[j] = dtype_trait<T>::from(x);
      b.v[j] = dtype_trait<T>::from(y);
    } else {
      rotate(dtype_trait<fp32_t>::from(a.v[2 * j]), dtype_trait<fp32_t>::from(a.v[2 * j + 1]), c[j], s[j], x, y);
      a.v[2 * j] = dtype_trait<T>::from(x);
      a.v[2 * j + 1] = dtype_trait<T>::from(y);
    }
  }
  if constexpr (kNeox) {
    a.store(ptr + i0);
    b.store(ptr + p.half + i0);
  } else {
    a.store(ptr + 2 * i0);
  }
}

template <typename T, bool kVec, bool kNeox>
void launch_rope(Params p, DLDevice dev, bool pdl) {
  using namespace host;
  using S = RopeShape<T, kVec, kNeox>;
  const int64_t heads = p.q_heads + p.k_heads;
  const int64_t units = p.half / S::kP;  // <= kMaxHeadSize / 2 = kMaxBlockThreads
  // Heads of a token side by side, split evenly over grid.y when they exceed one block.
  const int64_t grid_y = div_ceil(heads * units, int64_t{kMaxBlockThreads});
  const int64_t block_heads = div_ceil(heads, grid_y);
  const int64_t block_tokens =
      std::clamp<int64_t>(kTargetBlockThreads / (units * block_heads), 1, 64);  // 64: max blockDim.z
  const int64_t grid_x = div_ceil(p.tokens, block_tokens);
  RuntimeCheck(
      grid_x < (int64_t{1} << 31) && grid_y <= 65535, "rope: too many tokens or heads: ", p.tokens, ", ", heads);
  const dim3 grid(static_cast<uint32_t>(grid_x), static_cast<uint32_t>(grid_y));
  const dim3 block(
      static_cast<uint32_t>(units), static_cast<uint32_t>(block_heads), static_cast<uint32_t>(block_tokens));
  LaunchKernel(grid, block, dev).enable_pdl(pdl)(rope_kernel<T, kVec, kNeox>, p);
}

template <typename T>
struct Rope {
  static void run(
      tvm::ffi::TensorView positions,
      tvm::ffi::TensorView query,
      tvm::ffi::TensorView key,
      int64_t head_size,
      tvm::ffi::TensorView cos_sin_cache,
      bool is_neox,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    auto device = SymbolicDevice{};
    const Params p = make_params<T>(positions, query, key, head_size, cos_sin_cache, device);
    // max_pos 0: every token skipped; no data: a fake call's checks alone.
    if (p.tokens == 0 || p.q_heads + p.k_heads == 0 || p.max_pos == 0 || has_no_data(query)) return;
    const auto dev = device.unwrap();
    const bool pdl = runtime::resolve_pdl(enable_pdl, dev.device_id);
    constexpr int kV = kVecElems<T>;
    const bool vec = heads_vector_aligned<T>(p) && p.half % (is_neox ? kV : kV / 2) == 0;
    if (is_neox) {
      vec ? launch_rope<T, true, true>(p, dev, pdl) : launch_rope<T, false, true>(p, dev, pdl);
    } else {
      vec ? launch_rope<T, true, false>(p, dev, pdl) : launch_rope<T, false, false>(p, dev, pdl);
    }
  }
};

}  // namespace jit_kernel::rope
