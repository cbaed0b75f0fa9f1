// decode_attention: attention of one query token per sequence over a KV cache in transformers'
// StaticCache layout, with grouped-query heads and flash-decoding splits.
//
//   query   [B, Hq, D]            T (bf16 or fp16), unit last stride, any other strides
//   k_cache [B, Hkv, max_len, D]  T, unit last stride, every other stride a multiple of 16 bytes
//   v_cache [B, Hkv, max_len, D]  the same (its own strides)
//   seq_lens [B]                  int32 or int64: sequence b attends to its first seq_lens[b] keys
//   out     [B, Hq, D]            T: softmax(scale * q . k) . v over those keys, fp32 accumulation
//   lse     [B, Hq]               float32 (optional): ln sum exp(scale * q . k), the natural log
//
// Work split: one CTA per (sequence, KV head, split, chunk of up to kMaxGroup query heads of that KV
// head's group). A CTA reads its range of the KV head's keys once, with 16-byte loads, for all the
// query heads it serves (Hq / Hkv of them; groups wider than kMaxGroup take several chunks). Each
// key row is read by D / 8 consecutive lanes (8 elements each), so a warp reads 32 / (D / 8) rows
// per load instruction, and kUnroll of those per step; the lanes of a row sum their partial dot
// products with butterfly shuffles, so every lane of the row holds the score.
//
// Loads: each lane streams its own 16-byte pieces of K and V through a ring of kStages steps in
// shared memory with cp.async, kStages - 1 steps ahead of the step it computes on, so that the
// loads of the next steps are in flight while a step's arithmetic runs (without the ring, a warp
// waits for each step's loads and then computes with none in flight). A lane reads back only what
// it copied itself, so the ring needs no barrier: cp.async.wait_group orders a lane's own copies. Every lane keeps, per
// query head, the running maximum and sum of its rows' keys (online softmax, in base 2: the query is
// prescaled by scale * log2(e)) and its 8 elements of the weighted sum of V. At the end the rows of
// a warp combine by shuffles and the warps through shared memory.
//
// Flash-decoding: with few CTAs per SM (small B * Hkv), each sequence's keys are split into
// num_splits ranges of split_len keys, chosen on the host from the shapes, the SM count and the
// kernel's occupancy alone (never from seq_lens, which stay on the device: no sync, CUDA-graph
// safe): the fewest splits whose waves of CTAs are nearly as full as the best choice's, up to what
// the caller's workspace holds. Each split writes its normalised partial output and its
// log-sum-exp (base 2) to that float32 workspace, and a second kernel merges the splits of every
// (sequence, query head). With one split the first kernel writes the output.
//
// Lengths: seq_lens[b] == 0 is an empty sequence (out 0, lse -inf, what merge_attn_states treats as
// no contribution); a length below 0 or above max_len cannot be checked on the host without a sync,
// so the kernel writes NaN for that sequence's output and lse instead of reading outside the cache.
#pragma once

#include "common.cuh"

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
#include <cmath>
#include <cstdint>
#include <limits>

namespace jit_kernel::attention {

inline constexpr uint32_t kThreads = 128;
inline constexpr uint32_t kWarps = kThreads / 32;
// Query heads one CTA serves: its per-lane state (query, accumulator) lives in registers.
inline constexpr int64_t kMaxGroup = 8;
// At most this many splits per sequence (the host's choice stays well below it).
inline constexpr int64_t kMaxSplits = 1024;
// Split lengths are rounded up to a multiple of this many keys.
inline constexpr int64_t kSplitAlign = 16;

struct DecodeParams {
  const void* q;
  int64_t q_stride_b, q_stride_h;
  const void* k;
  int64_t k_stride_b, k_stride_h, k_stride_l;
  const void* v;
  int64_t v_stride_b, v_stride_h, v_stride_l;
  const void* seq_lens;
  bool seq_lens_int64;
  void* out;
  int64_t out_stride_b, out_stride_h;
  float* lse;          // [B, Hq] contiguous, or nullptr
  float* partial_out;  // [B, Hq, split_stride, D] in the workspace, or nullptr (one split: out written directly)
  float* partial_lse;  // [B, Hq, split_stride] after it (base 2)
  int64_t batch;
  int32_t num_heads, num_kv_heads, group, head_chunks, num_splits, split_stride;
  int64_t max_len, split_len;
  float scale_log2;  // scale * log2(e)
};

namespace detail {

SGL_DEVICE int64_t load_length(const DecodeParams& p, int64_t b) {
  return p.seq_lens_int64 ? static_cast<const int64_t*>(p.seq_lens)[b]
                          : static_cast<int64_t>(static_cast<const int32_t*>(p.seq_lens)[b]);
}

// 16 bytes of a K or V row into shared memory, past L1 (each is read once); `bytes` 0 writes zeros
// (a key past the range: its score is masked, and zeros keep its V row out of the sum).
SGL_DEVICE void copy_row_vector(uint4* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(static_cast<uint32_t>(
                   __cvta_generic_to_shared(dst))),
               "l"(src),
               "r"(bytes)
               : "memory");
}

SGL_DEVICE void commit_copies() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// Until at most kPending of this thread's committed copy groups are still in flight.
template <int kPending>
SGL_DEVICE void wait_copies() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

template <typename T, int N>
SGL_DEVICE void vector_to_floats(const uint4& bits, float (&out)[N]) {
  static_assert(sizeof(T) * N == 16, "a 16-byte vector");
  device::AlignedVector<T, N> v;
  __builtin_memcpy(&v, &bits, 16);
  device::to_floats(v, out);
}

// exp2(x - m) where m may be -inf (then every x is -inf too and the weight is 0, never NaN).
SGL_DEVICE float weight(float x, float m) {
  return m == -std::numeric_limits<float>::infinity() ? 0.0f : exp2f(x - m);
}

// The share of the launched waves' CTA slots that `blocks` CTAs fill, `resident` at a time.
inline double wave_fill(int64_t blocks, int64_t resident) {
  const int64_t waves = (blocks + resident - 1) / resident;
  return static_cast<double>(blocks) / static_cast<double>(waves * resident);
}

// Splits per sequence for `ctas` CTAs of one split, `resident` CTAs at a time on the device, at most
// `max_splits`: the fewest whose waves are filled within 5% of the best choice's.
inline int64_t choose_splits(int64_t ctas, int64_t resident, int64_t max_splits) {
  double best = 0.0;
  for (int64_t s = 1; s <= max_splits; ++s) best = std::max(best, wave_fill(ctas * s, resident));
  for (int64_t s = 1; s <= max_splits; ++s) {
    if (wave_fill(ctas * s, resident) >= 0.95 * best) return s;
  }
  return 1;
}

// How many CTAs of `kKernel` (kThreads each) run at once on the device: asked once per device.
template <auto kKernel>
inline int64_t resident_blocks(int device_id) {
  struct Tag;
  return host::runtime::detail::per_device<Tag>(device_id, {}, [](int id) {
    uint32_t per_sm = 0;
    host::runtime::detail::on_device(id, {}, [&] { per_sm = host::runtime::get_blocks_per_sm(kKernel, kThreads); });
    return static_cast<int>(std::max<uint32_t>(per_sm, 1) * host::runtime::sm_count(id));
  });
}

}  // namespace detail

// One CTA: one (sequence, KV head, split, chunk of kGroup query heads).
template <int kHeadDim, typename T, int kGroup>
__global__ __launch_bounds__(kThreads) void decode_kernel(const __grid_constant__ DecodeParams p) {
  constexpr int kVec = 16 / sizeof(T);            // elements per lane: 8
  constexpr int kLanes = kHeadDim / kVec;         // lanes per key row: 8, 16 or 32
  constexpr int kRows = 32 / kLanes;              // key rows per warp load: 4, 2 or 1
  constexpr int kUnroll = kGroup >= 8 ? 2 : 4;    // loads in flight per lane (of K, and of V)
  constexpr int kWarpKeys = kRows * kUnroll;      // keys per warp step
  constexpr int kBlockKeys = kWarpKeys * kWarps;  // keys per CTA step
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  static_assert(kHeadDim % kVec == 0 && 32 % kLanes == 0, "head_dim must be 64, 128 or 256");
  // The ring: per step and lane kUnroll vectors of K, then kUnroll of V, stored [step][vector][thread]
  // so that a warp's 16-byte accesses are consecutive. As many steps as 48 KiB of static shared
  // memory holds, at most 4.
  constexpr int kStepVectors = 2 * kUnroll;
  constexpr int kStepBytes = static_cast<int>(kThreads) * kStepVectors * 16;
  constexpr int kStages = std::clamp(49152 / kStepBytes, 2, 4);
  // After the loop the ring's memory holds the warps' partial states for their combination.
  struct Combine {
    float acc[kWarps][kGroup][kHeadDim];
    float max[kWarps][kGroup];
    float sum[kWarps][kGroup];
  };
  constexpr int kSharedBytes = std::max(kStages * kStepBytes, static_cast<int>(sizeof(Combine)));
  static_assert(kSharedBytes <= 49152, "the ring and the combination fit 48 KiB of static shared memory");
  __shared__ alignas(16) unsigned char shared[kSharedBytes];
  uint4* const ring = reinterpret_cast<uint4*>(shared);
  Combine& combine = *reinterpret_cast<Combine*>(shared);

  const int warp = static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int row = lane / kLanes;  // this lane's key row within a warp load
  const int sub = lane % kLanes;  // this lane's 8 elements of the head dim: [sub * 8, sub * 8 + 8)

  uint32_t block = blockIdx.x;
  const int chunk = static_cast<int>(block % static_cast<uint32_t>(p.head_chunks));
  block /= static_cast<uint32_t>(p.head_chunks);
  const int split = static_cast<int>(block % static_cast<uint32_t>(p.num_splits));
  block /= static_cast<uint32_t>(p.num_splits);
  const int kv_head = static_cast<int>(block % static_cast<uint32_t>(p.num_kv_heads));
  const int64_t b = static_cast<int64_t>(block / static_cast<uint32_t>(p.num_kv_heads));
  const int first_head = kv_head * p.group + chunk * kGroup;
  const int heads = min(kGroup, p.group - chunk * kGroup);  // the query heads this CTA writes

  const T* q_rows = static_cast<const T*>(p.q) + b * p.q_stride_b + static_cast<int64_t>(first_head) * p.q_stride_h;
  const T* k_rows = static_cast<const T*>(p.k) + b * p.k_stride_b + kv_head * p.k_stride_h + sub * kVec;
  const T* v_rows = static_cast<const T*>(p.v) + b * p.v_stride_b + kv_head * p.v_stride_h + sub * kVec;

  device::PDLWaitPrimary();  // launched with PDL: wait for the previous kernel's writes
  device::PDLTriggerSecondary();

  const int64_t length = detail::load_length(p, b);
  const bool valid = length >= 0 && length <= p.max_len;
  const int64_t begin = static_cast<int64_t>(split) * p.split_len;
  const int64_t stop = begin + p.split_len < length ? begin + p.split_len : length;
  const int64_t end = valid ? stop : begin;  // an invalid length reads nothing

  // The lane's 8 query elements of each head, prescaled so that q . k is the base-2 score. Heads past
  // the group's end (a group that is not a multiple of kGroup) repeat the last one; nothing writes them.
  float q[kGroup][kVec];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    const T* q_row = q_rows + static_cast<int64_t>(min(g, heads - 1)) * p.q_stride_h + sub * kVec;
#pragma unroll
    for (int e = 0; e < kVec; ++e) q[g][e] = dtype_trait<fp32_t>::from(q_row[e]) * p.scale_log2;
  }

  float m[kGroup], l[kGroup], acc[kGroup][kVec];
#pragma unroll
  for (int g = 0; g < kGroup; ++g) {
    m[g] = kNegInf;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[g][e] = 0.0f;
  }

  // The warp's steps: keys [warp_begin + i * kBlockKeys, + kWarpKeys) for i < steps. The count
  // depends on the warp only, so every shuffle below runs on the whole warp.
  const int64_t warp_begin = begin + warp * kWarpKeys;
  const int64_t steps = end > warp_begin ? (end - warp_begin + kBlockKeys - 1) / kBlockKeys : 0;
  uint4* const lane_ring = ring + threadIdx.x;
  // Step i's copies into ring slot `stage`, as one commit group (empty past the last step, so that
  // the count of groups in flight stays the same every iteration).
  const auto issue = [&](int64_t i, int stage) {
    if (i < steps) {
      const int64_t base = warp_begin + i * kBlockKeys;
      uint4* const slot = lane_ring + stage * kStepVectors * static_cast<int>(kThreads);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t key = base + u * kRows + row;
        const bool in_range = key < end;
        const int64_t at = in_range ? key : 0;
        const uint32_t bytes = in_range ? 16 : 0;
        detail::copy_row_vector(slot + u * static_cast<int>(kThreads), k_rows + at * p.k_stride_l, bytes);
        detail::copy_row_vector(slot + (kUnroll + u) * static_cast<int>(kThreads), v_rows + at * p.v_stride_l, bytes);
      }
    }
    detail::commit_copies();
  };
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) issue(stage, stage);

  int stage = 0;  // the ring slot of step i
  for (int64_t i = 0; i < steps; ++i) {
    detail::wait_copies<kStages - 2>();  // step i's group has landed
    uint4 k_bits[kUnroll], v_bits[kUnroll];
    bool in_range[kUnroll];
    const uint4* const slot = lane_ring + stage * kStepVectors * static_cast<int>(kThreads);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      k_bits[u] = slot[u * static_cast<int>(kThreads)];
      v_bits[u] = slot[(kUnroll + u) * static_cast<int>(kThreads)];
      in_range[u] = warp_begin + i * kBlockKeys + u * kRows + row < end;
    }
    // The slot this lane read in the previous iteration takes step i + kStages - 1.
    const int refill = stage == 0 ? kStages - 1 : stage - 1;
    issue(i + kStages - 1, refill);
    stage = stage + 1 == kStages ? 0 : stage + 1;
    float s[kUnroll][kGroup];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float kf[kVec];
      detail::vector_to_floats<T>(k_bits[u], kf);
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kVec; ++e) dot = fmaf(q[g][e], kf[e], dot);
        s[u][g] = dot;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int g = 0; g < kGroup; ++g) {
#pragma unroll
        for (int offset = kLanes / 2; offset > 0; offset /= 2) {
          s[u][g] += __shfl_xor_sync(device::kFullMask, s[u][g], offset);
        }
        if (!in_range[u]) s[u][g] = kNegInf;
      }
    }
    float vf[kUnroll][kVec];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) detail::vector_to_floats<T>(v_bits[u], vf[u]);
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      float next = m[g];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) next = fmaxf(next, s[u][g]);
      if (next == kNegInf) continue;             // no key of this row yet: nothing to add
      const float rescale = exp2f(m[g] - next);  // 0 when m[g] is -inf
      l[g] *= rescale;
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[g][e] *= rescale;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float w = exp2f(s[u][g] - next);  // 0 for keys out of range
        l[g] += w;
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[g][e] = fmaf(w, vf[u][e], acc[g][e]);
      }
      m[g] = next;
    }
  }

  // The rows of the warp: lanes holding the same elements of different rows combine.
#pragma unroll
  for (int offset = kLanes; offset < 32; offset *= 2) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
      const float m_other = __shfl_xor_sync(device::kFullMask, m[g], offset);
      const float l_other = __shfl_xor_sync(device::kFullMask, l[g], offset);
      const float next = fmaxf(m[g], m_other);
      const float mine = detail::weight(m[g], next), theirs = detail::weight(m_other, next);
      l[g] = l[g] * mine + l_other * theirs;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float other = __shfl_xor_sync(device::kFullMask, acc[g][e], offset);
        acc[g][e] = acc[g][e] * mine + other * theirs;
      }
      m[g] = next;
    }
  }
  detail::wait_copies<0>();  // the empty trailing groups
  __syncthreads();            // every warp is done with the ring before it holds the partial states
  if (row == 0) {
#pragma unroll
    for (int g = 0; g < kGroup; ++g) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) combine.acc[warp][g][sub * kVec + e] = acc[g][e];
      if (sub == 0) {
        combine.max[warp][g] = m[g];
        combine.sum[warp][g] = l[g];
      }
    }
  }
  __syncthreads();

  // The warps: one output element per thread and step, each over the kWarps partial states.
  for (int i = static_cast<int>(threadIdx.x); i < heads * kHeadDim; i += static_cast<int>(kThreads)) {
    const int g = i / kHeadDim, d = i % kHeadDim;
    float top = kNegInf;
#pragma unroll
    for (int w = 0; w < static_cast<int>(kWarps); ++w) top = fmaxf(top, combine.max[w][g]);
    float sum = 0.0f, value = 0.0f;
#pragma unroll
    for (int w = 0; w < static_cast<int>(kWarps); ++w) {
      const float scale = detail::weight(combine.max[w][g], top);
      sum = fmaf(combine.sum[w][g], scale, sum);
      value = fmaf(combine.acc[w][g][d], scale, value);
    }
    float o = 0.0f, lse2 = kNegInf;  // no key: an empty sequence, or a split past its end
    if (top != kNegInf) {
      o = value / sum;
      lse2 = top + log2f(sum);
    }
    if (!valid) o = lse2 = std::numeric_limits<float>::quiet_NaN();
    const int64_t h = first_head + g;
    const int64_t head_row = b * p.num_heads + h;
    if (p.partial_out == nullptr) {
      static_cast<T*>(p.out)[b * p.out_stride_b + h * p.out_stride_h + d] = dtype_trait<T>::from(o);
      if (d == 0 && p.lse != nullptr) p.lse[head_row] = lse2 * kLn2;
    } else {
      const int64_t slot = head_row * p.split_stride + split;
      p.partial_out[slot * kHeadDim + d] = o;
      if (d == 0) p.partial_lse[slot] = lse2;
    }
  }
}

// The splits of one (sequence, query head) per kHeadDim / 4 threads (4 elements each): weights
// exp2(lse_s - max), the partial outputs summed with them, divided by their sum.
template <int kHeadDim, typename T>
__global__ __launch_bounds__(kThreads) void merge_splits_kernel(const __grid_constant__ DecodeParams p) {
  constexpr int kRowThreads = kHeadDim / 4;
  constexpr int kRowsPerBlock = static_cast<int>(kThreads) / kRowThreads;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t head_row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kRowThreads;
  const int t = static_cast<int>(threadIdx.x % kRowThreads);

  device::PDLWaitPrimary();  // the splits' partial results
  device::PDLTriggerSecondary();
  if (head_row >= p.batch * p.num_heads) return;

  const int64_t b = head_row / p.num_heads, h = head_row % p.num_heads;
  const int64_t length = detail::load_length(p, b);
  const bool valid = length >= 0 && length <= p.max_len;
  const int splits = p.num_splits;
  const float* lse = p.partial_lse + head_row * p.split_stride;
  const float4* parts = reinterpret_cast<const float4*>(p.partial_out + head_row * p.split_stride * kHeadDim) + t;

  float top = kNegInf;
  for (int s = 0; s < splits; ++s) top = fmaxf(top, lse[s]);
  float4 value = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float sum = 0.0f;
  if (top != kNegInf) {
    for (int s = 0; s < splits; ++s) {
      const float w = exp2f(lse[s] - top);  // 0 for a split without keys (-inf)
      const float4 part = parts[static_cast<int64_t>(s) * (kHeadDim / 4)];
      sum += w;
      value.x = fmaf(w, part.x, value.x);
      value.y = fmaf(w, part.y, value.y);
      value.z = fmaf(w, part.z, value.z);
      value.w = fmaf(w, part.w, value.w);
    }
  }
  float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  float lse2 = kNegInf;
  if (top != kNegInf) {
    const float inv = 1.0f / sum;
    o[0] = value.x * inv;
    o[1] = value.y * inv;
    o[2] = value.z * inv;
    o[3] = value.w * inv;
    lse2 = top + log2f(sum);
  }
  if (!valid) o[0] = o[1] = o[2] = o[3] = lse2 = std::numeric_limits<float>::quiet_NaN();
  T* out = static_cast<T*>(p.out) + b * p.out_stride_b + h * p.out_stride_h + t * 4;
#pragma unroll
  for (int e = 0; e < 4; ++e) out[e] = dtype_trait<T>::from(o[e]);
  if (t == 0 && p.lse != nullptr) p.lse[head_row] = lse2 * kLn2;
}

template <int kHeadDim, typename T>
struct DecodeAttention {
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head_dim must be 64, 128 or 256");

  // out, lse: the results. workspace: float32, contiguous, of B * Hq * max_splits * (D + 1) elements
  // (the splits' partial outputs [B, Hq, max_splits, D], then their LSEs [B, Hq, max_splits]), for
  // up to max_splits splits; None with max_splits 1.
  static void run(
      tvm::ffi::TensorView out,
      tvm::ffi::Optional<tvm::ffi::TensorView> lse,
      tvm::ffi::TensorView query,
      tvm::ffi::TensorView k_cache,
      tvm::ffi::TensorView v_cache,
      tvm::ffi::TensorView seq_lens,
      tvm::ffi::Optional<tvm::ffi::TensorView> workspace,
      int64_t max_splits,
      double scale,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    auto batch = SymbolicSize{"batch"};
    auto heads = SymbolicSize{"num_heads"};
    auto kv_heads = SymbolicSize{"num_kv_heads"};
    auto max_len = SymbolicSize{"max_len"};
    auto head_dim = SymbolicSize{"head_dim"};
    head_dim.set_value(kHeadDim);
    auto device = SymbolicDevice{};
    TensorMatcher::cuda_rows<T>({batch, heads, head_dim}, device).verify(query, "query").verify(out, "out");
    TensorMatcher::cuda_rows<T>({batch, kv_heads, max_len, head_dim}, device)
        .ensure_alignment(16)
        .verify(k_cache, "k_cache")
        .verify(v_cache, "v_cache");
    TensorMatcher({batch}).with_strides({1}).with_dtype<int32_t, int64_t>().with_device<kDLCUDA>(device).verify(
        seq_lens, "seq_lens");
    if (lse.has_value()) {
      TensorMatcher({batch, heads}).with_dtype<fp32_t>().with_device<kDLCUDA>(device).verify(*lse, "lse");
    }
    RuntimeCheck(
        max_splits >= 1 && max_splits <= kMaxSplits,
        "decode_attention: max_splits must be in [1, ",
        kMaxSplits,
        "], got ",
        max_splits);
    RuntimeCheck(
        workspace.has_value() || max_splits == 1, "decode_attention: max_splits ", max_splits, " needs a workspace");
    if (workspace.has_value()) {
      auto size = SymbolicSize{"workspace_size"};
      size.set_value(batch.unwrap() * heads.unwrap() * max_splits * (kHeadDim + 1));
      TensorMatcher({size}).with_dtype<fp32_t>().with_device<kDLCUDA>(device).verify(*workspace, "workspace");
    }
    const int64_t hq = heads.unwrap(), hkv = kv_heads.unwrap();
    RuntimeCheck(
        hkv >= 1 && hq % hkv == 0,
        "decode_attention: the query heads (query's dim 1: ",
        hq,
        ") must be a multiple of the KV heads (k_cache's dim 1: ",
        hkv,
        ")");
    RuntimeCheck(std::isfinite(scale), "decode_attention: scale must be a finite float, got ", scale);
    const int64_t b = batch.unwrap();
    const int64_t group = hq / hkv;
    const int64_t ctas = b * hkv * div_ceil(group, kMaxGroup);  // of one split
    RuntimeCheck(
        ctas * max_splits <= int64_t{0x7fffffff}, "decode_attention: ", ctas * max_splits, " CTAs do not fit one grid");
    if (b == 0 || has_no_data(out)) return;  // the fake (torch.compile) call ends here: checks only

    DecodeParams p{};
    p.q = query.data_ptr();
    p.q_stride_b = query.stride(0);
    p.q_stride_h = query.stride(1);
    p.k = k_cache.data_ptr();
    p.k_stride_b = k_cache.stride(0);
    p.k_stride_h = k_cache.stride(1);
    p.k_stride_l = k_cache.stride(2);
    p.v = v_cache.data_ptr();
    p.v_stride_b = v_cache.stride(0);
    p.v_stride_h = v_cache.stride(1);
    p.v_stride_l = v_cache.stride(2);
    p.seq_lens = seq_lens.data_ptr();
    p.seq_lens_int64 = seq_lens.dtype().bits == 64;
    p.out = out.data_ptr();
    p.out_stride_b = out.stride(0);
    p.out_stride_h = out.stride(1);
    p.lse = lse.has_value() ? static_cast<float*>((*lse).data_ptr()) : nullptr;
    p.partial_out = workspace.has_value() ? static_cast<float*>((*workspace).data_ptr()) : nullptr;
    p.partial_lse = p.partial_out != nullptr ? p.partial_out + b * hq * max_splits * kHeadDim : nullptr;
    p.batch = b;
    p.num_heads = static_cast<int32_t>(hq);
    p.num_kv_heads = static_cast<int32_t>(hkv);
    p.group = static_cast<int32_t>(group);
    p.head_chunks = static_cast<int32_t>(div_ceil(group, kMaxGroup));
    p.split_stride = static_cast<int32_t>(max_splits);
    p.max_len = max_len.unwrap();
    p.scale_log2 = static_cast<float>(scale) * kLog2e;

    const DLDevice dev = device.unwrap();
    const bool pdl = runtime::resolve_pdl(enable_pdl, dev.device_id);
    // The query heads per CTA, a power of two: a CTA's registers hold the state of all of them.
    if (group > 4) {
      launch<8>(p, ctas, max_splits, dev, pdl);
    } else if (group > 2) {
      launch<4>(p, ctas, max_splits, dev, pdl);
    } else if (group == 2) {
      launch<2>(p, ctas, max_splits, dev, pdl);
    } else {
      launch<1>(p, ctas, max_splits, dev, pdl);
    }
  }

  template <int kGroup>
  static void launch(DecodeParams& p, int64_t ctas, int64_t max_splits, DLDevice dev, bool pdl) {
    using namespace host;
    constexpr auto kernel = decode_kernel<kHeadDim, T, kGroup>;
    const int64_t splits =
        max_splits > 1 ? detail::choose_splits(ctas, detail::resident_blocks<kernel>(dev.device_id), max_splits) : 1;
    p.num_splits = static_cast<int32_t>(splits);
    p.split_len = div_ceil(div_ceil(p.max_len, splits), kSplitAlign) * kSplitAlign;
    if (splits == 1) p.partial_out = p.partial_lse = nullptr;  // the one split writes the output
    LaunchKernel(static_cast<uint32_t>(ctas * splits), kThreads, dev).enable_pdl(pdl)(kernel, p);
    if (splits > 1) {
      constexpr int64_t kRowsPerBlock = kThreads / (kHeadDim / 4);
      const auto merge_grid = static_cast<uint32_t>(div_ceil(p.batch * p.num_heads, kRowsPerBlock));
      LaunchKernel(merge_grid, kThreads, dev).enable_pdl(pdl)(merge_splits_kernel<kHeadDim, T>, p);
    }
  }
};

}  // namespace jit_kernel::attention
