// apply_rope_with_cos_sin_cache_inplace: rotary embedding of q and k in place (see common.cuh for
// layouts and semantics).
//
// Template parameter: T (the activation dtype) only. The head size, rotary dim, style, position
// dtype and cache dtype are run-time values: no reduction runs over a head, so a compile-time head
// size would only save one integer division per thread.
//
// Kernel: a token is served by `units * slots` threads. Thread (unit u, slot) loads the token's
// position and the cos/sin of its unit once (kP pairs), then rotates unit u of heads slot,
// slot + slots, ... (q heads then k heads), kBatch heads' loads issued before the first store. A
// unit is kP pairs: on aligned heads, NeoX: one 8-byte access in each half (kP = 8 / sizeof(T));
// GPT-J: one 16-byte vector (kP = 8 / sizeof(T)); otherwise one pair of scalar accesses. (NeoX with
// 16-byte vectors in each half needs 112 registers at kBatch = 4 on sm_90a, 8-byte ones 64: the
// accesses stay fully coalesced: 16 lanes read a 128-byte half of a head.) The host picks
// `slots` so that a small launch spreads one head per thread and a large one gives each thread up
// to kBatch heads (more bytes in flight per thread, fewer cos/sin reloads), and packs several
// tokens into a block of about 256 threads.
#pragma once

#include "common.cuh"

namespace jit_kernel::rope {

inline constexpr int kBatch = 4;
// A token's threads (units * slots) and a block stay within this: units <= kMaxHeadSize / 2, and
// 512 rather than 1024 leaves the compiler 128 registers per thread for kBatch heads in flight.
inline constexpr int kMaxBlockThreads = 512;
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
  // elements per group access; pairs per unit
  static constexpr int kV = kVec ? (kNeox ? kVecElems<T> / 2 : kVecElems<T>) : (kNeox ? 1 : 2);
  static constexpr int kP = kNeox ? kV : kV / 2;
};

template <typename T, bool kVec, bool kNeox>
__global__ void __launch_bounds__(kMaxBlockThreads) rope_kernel(const Params p) {
  using S = RopeShape<T, kVec, kNeox>;
  constexpr int kV = S::kV;
  constexpr int kP = S::kP;
  using G = Group<T, kV, kVec>;
  const int group = p.units * p.slots;
  const int local = static_cast<int>(threadIdx.x) / group;
  const int r = static_cast<int>(threadIdx.x) - local * group;
  const int slot = r / p.units;
  const int u = r - slot * p.units;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * p.tokens_per_block + local;
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  if (local >= p.tokens_per_block || token >= p.tokens) return;
  // Out-of-range positions are skipped (common.cuh): nothing is stored for them. Branch-free up to
  // the stores, so that the head loads do not wait for the position.
  const int64_t raw_pos = load_position(p, token);
  const bool valid = raw_pos >= 0 && raw_pos < p.max_pos;  // max_pos >= 1 (the host returns otherwise)
  const void* row = cache_row<T>(p, valid ? raw_pos : 0);
  const int64_t i0 = static_cast<int64_t>(u) * kP;  // first pair of this unit
  float c[kP], s[kP];
#pragma unroll
  for (int j = 0; j < kP; ++j) {
    c[j] = load_cache<T>(p, row, i0 + j);
    s[j] = load_cache<T>(p, row, p.half + i0 + j);
  }
  const int64_t heads = p.q_heads + p.k_heads;
  for (int64_t h0 = slot; h0 < heads; h0 += static_cast<int64_t>(kBatch) * p.slots) {
    G a[kBatch], b[kBatch];
    T* ptr[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int64_t h = h0 + static_cast<int64_t>(i) * p.slots;
      if (h < heads) {
        ptr[i] = head_ptr<T>(p, token, h);
        if constexpr (kNeox) {
          a[i].load(ptr[i] + i0);
          b[i].load(ptr[i] + p.half + i0);
        } else {
          a[i].load(ptr[i] + 2 * i0);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int64_t h = h0 + static_cast<int64_t>(i) * p.slots;
      if (valid && h < heads) {
#pragma unroll
        for (int j = 0; j < kP; ++j) {
          float x, y;
          if constexpr (kNeox) {
            rotate(dtype_trait<fp32_t>::from(a[i].v[j]), dtype_trait<fp32_t>::from(b[i].v[j]), c[j], s[j], x, y);
            a[i].v[j] = dtype_trait<T>::from(x);
            b[i].v[j] = dtype_trait<T>::from(y);
          } else {
            rotate(
                dtype_trait<fp32_t>::from(a[i].v[2 * j]),
                dtype_trait<fp32_t>::from(a[i].v[2 * j + 1]),
                c[j],
                s[j],
                x,
                y);
            a[i].v[2 * j] = dtype_trait<T>::from(x);
            a[i].v[2 * j + 1] = dtype_trait<T>::from(y);
          }
        }
        if constexpr (kNeox) {
          a[i].store(ptr[i] + i0);
          b[i].store(ptr[i] + p.half + i0);
        } else {
          a[i].store(ptr[i] + 2 * i0);
        }
      }
    }
  }
}

inline constexpr int64_t kTargetBlockThreads = 256;
inline constexpr int64_t kResidentThreadsPerSm = 1024;  // at the kernels' 64-68 registers per thread

template <typename T, bool kVec, bool kNeox>
void launch_rope(Params p, DLDevice dev, bool pdl) {
  using namespace host;
  using S = RopeShape<T, kVec, kNeox>;
  const int64_t heads = p.q_heads + p.k_heads;
  const int64_t units = p.half / S::kP;  // <= kMaxHeadSize / 2 = kMaxBlockThreads
  // Heads per thread: 1 while one head per thread does not fill the GPU, up to kBatch beyond.
  const int64_t work = p.tokens * heads * units;
  const int64_t per_thread =
      std::clamp<int64_t>(work / (int64_t{host::runtime::sm_count(dev.device_id)} * kResidentThreadsPerSm), 1, kBatch);
  int64_t slots = div_ceil(heads, per_thread);
  slots = std::clamp<int64_t>(slots, 1, std::max<int64_t>(1, kMaxBlockThreads / units));
  const int64_t group = units * slots;
  const int64_t tokens_per_block = std::max<int64_t>(1, kTargetBlockThreads / group);
  const int64_t blocks = div_ceil(p.tokens, tokens_per_block);
  RuntimeCheck(blocks < (int64_t{1} << 31), "rope: too many tokens: ", p.tokens);
  p.units = static_cast<int32_t>(units);
  p.slots = static_cast<int32_t>(slots);
  p.tokens_per_block = static_cast<int32_t>(tokens_per_block);
  LaunchKernel(static_cast<uint32_t>(blocks), static_cast<uint32_t>(tokens_per_block * group), dev)
      .enable_pdl(pdl)(rope_kernel<T, kVec, kNeox>, p);
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
