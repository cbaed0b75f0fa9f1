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
// Work split: one CTA per (sequence, KV head, split, chunk of up to kMaxGroup = 8 query heads of
// that KV head's group). A CTA reads its range of the KV head's keys once for all the query heads
// it serves (Hq / Hkv of them; groups wider than 8 take several chunks). Its warps take turns over
// tiles of kTileKeys = 16 keys: warp w computes tiles w, w + kWarps, ... of the range.
//
// Arithmetic on tensor cores (mma.sync m16n8k16, fp32 accumulation), as flash attention does it,
// with the query heads as the M rows: rows 0..7 are the chunk's heads (zeros past the group's end)
// and rows 8..15 are zeros. A tile's scores S [heads, 16 keys] = Q K^T take D / 16 k-steps over two
// n-tiles of 8 keys (K from shared memory by ldmatrix: rows of K are the B operand as stored); the
// scores' accumulator fragments are, after the online softmax (base 2, the scale applied in fp32),
// the A fragments of P for O += P V (V by ldmatrix.trans), P rounded to T as flash attention rounds
// it. The running row sum l adds the fp32 weights before rounding, so the log-sum-exp is exact to
// fp32. On CUDA cores the same work took every lane's 8-wide dot products, a shuffle reduction per
// head and key and the weights' updates per lane, several times the instructions of these MMAs; that
// bound the kernel by instruction issue, not by memory (docs/design/attention.md).
//
// Loads: each warp streams its tiles of K and V through its own ring of kStages tiles in shared
// memory with cp.async (16 bytes per copy, rows swizzled by 16-byte chunk so that ldmatrix reads
// conflict-free), kStages - 1 tiles ahead of the tile it computes on. A ring belongs to one warp,
// so a __syncwarp after cp.async.wait_group makes a tile visible, and no block barrier is needed.
//
// Flash-decoding: with fewer CTAs than SMs (small B * Hkv), each sequence's keys are split into
// num_splits ranges of split_len keys, chosen on the host from the shapes and the SM count alone
// (never from seq_lens, which stay on the device: no sync, CUDA-graph safe): the fewest splits
// whose waves of one CTA per SM are nearly as full as the best choice's, up to a bound from the
// same inputs. A CTA's four rings keep enough bytes in flight for an SM's share of the bandwidth,
// so more CTAs than SMs add per-split work and no bandwidth (docs/design/attention.md).
//
// Merging the splits: up to kMaxClusterSplits splits (sm_90+) run as one thread-block cluster per
// (sequence, KV head, chunk); each split leaves its normalised partial output and log-sum-exp
// (base 2) in its shared memory, and after a cluster barrier the cluster's CTAs merge them through
// distributed shared memory, each a share of the outputs: one kernel, no workspace. With more
// splits (or no clusters) each split writes its partial state to a float32 workspace the launcher
// allocates, and a second kernel merges the splits of every (sequence, query head). Both merge the
// splits in the same order with the same arithmetic (merge_states), so they give the same bits.
// With one split the first kernel writes the output and nothing is allocated.
//
// Lengths: seq_lens[b] == 0 is an empty sequence (out 0, lse -inf, what merge_attn_states treats as
// no contribution); a length below 0 or above max_len cannot be checked on the host without a sync,
// so the kernel writes NaN for that sequence's output and lse instead of reading outside the cache.
#pragma once

#include "common.cuh"

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
#include <cmath>
#include <cooperative_groups.h>
#include <cstdint>
#include <limits>

namespace jit_kernel::attention {

inline constexpr uint32_t kThreads = 128;
inline constexpr uint32_t kWarps = kThreads / 32;
// Query heads one CTA serves: the M rows 0..7 of its MMAs.
inline constexpr int64_t kMaxGroup = 8;
// Keys per tile: the k of one P V MMA, two n-tiles of Q K^T.
inline constexpr int64_t kTileKeys = 16;
// At most this many splits per sequence.
inline constexpr int64_t kMaxSplits = 64;
// At most this many splits merged inside a cluster: the portable cluster size (why not 16:
// docs/design/attention.md).
inline constexpr int64_t kMaxClusterSplits = 8;
// Split lengths are rounded up to a multiple of this many keys (whole tiles).
inline constexpr int64_t kSplitAlign = kTileKeys;

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
  float scale_log2;       // scale * log2(e)
  bool merge_in_cluster;  // the splits of a (sequence, KV head, chunk) are one cluster and merge in it
};

namespace detail {

SGL_DEVICE int64_t load_length(const DecodeParams& p, int64_t b) {
  return p.seq_lens_int64 ? static_cast<const int64_t*>(p.seq_lens)[b]
                          : static_cast<int64_t>(static_cast<const int32_t*>(p.seq_lens)[b]);
}

// 16 bytes of a K or V row into shared memory, past L1 (each is read once); `bytes` 0 writes zeros
// (a key past the range: its score is masked, and zeros keep its V row out of the sum).
SGL_DEVICE void copy_16(uint32_t dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}

SGL_DEVICE void commit_copies() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// Until at most kPending of this thread's committed copy groups are still in flight.
template <int kPending>
SGL_DEVICE void wait_copies() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Four 8 x 8 matrices of 16-bit elements from shared memory (lane l gives the address of row l % 8
// of matrix l / 8); lane i receives elements (i / 4, 2 (i % 4) .. + 1) of each, or with `kTrans`
// elements (2 (i % 4) .. + 1, i / 4).
template <bool kTrans>
SGL_DEVICE void load_matrices(uint32_t (&r)[4], uint32_t address) {
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  }
}

// d += a * b for a 16 x 16 A whose rows 8..15 are zeros (a0: row g, k 2t..; a2: row g, k 2t + 8..)
// and a 16 x 8 B (b0: k 2t.., b1: k 2t + 8.., column g), fp32 accumulators.
template <typename T>
SGL_DEVICE void mma(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  const uint32_t zero = 0;
  if constexpr (std::is_same_v<T, bf16_t>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(zero), "r"(a2), "r"(zero), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(zero), "r"(a2), "r"(zero), "r"(b0), "r"(b1));
  }
}

// Two floats as one register of two T (the first in the low half), rounded to nearest.
template <typename T>
SGL_DEVICE uint32_t pack(float lo, float hi) {
  device::AlignedVector<T, 2> v;
  v[0] = dtype_trait<T>::from(lo);
  v[1] = dtype_trait<T>::from(hi);
  uint32_t bits;
  __builtin_memcpy(&bits, &v, 4);
  return bits;
}

// exp2(x - m) where m may be -inf (then every x is -inf too and the weight is 0, never NaN).
SGL_DEVICE float weight(float x, float m) {
  return m == -std::numeric_limits<float>::infinity() ? 0.0f : exp2f(x - m);
}

// The merge of `splits` partial states of one output vector: `lse(s)` the base-2 log-sum-exp of
// split s (-inf for a split without keys), `part(s)` its normalised partial output (4 elements).
// Sets `lse2` to the merged log-sum-exp (base 2) and returns the merged output vector (zeros and
// -inf when no split has a key).
template <typename Lse, typename Part>
SGL_DEVICE float4 merge_states(int splits, Lse&& lse, Part&& part, float& lse2) {
  float top = -std::numeric_limits<float>::infinity();
  for (int s = 0; s < splits; ++s) top = fmaxf(top, lse(s));
  lse2 = top;
  if (top == -std::numeric_limits<float>::infinity()) return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float4 value = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  float sum = 0.0f;
  for (int s = 0; s < splits; ++s) {
    const float w = exp2f(lse(s) - top);  // 0 for a split without keys
    const float4 v = part(s);
    sum += w;
    value.x = fmaf(w, v.x, value.x);
    value.y = fmaf(w, v.y, value.y);
    value.z = fmaf(w, v.z, value.z);
    value.w = fmaf(w, v.w, value.w);
  }
  const float inv = 1.0f / sum;
  lse2 = top + log2f(sum);
  return make_float4(value.x * inv, value.y * inv, value.z * inv, value.w * inv);
}

// Four merged output elements of (sequence b, query head h) from column d, and the head's lse with
// the first column (NaN for a sequence whose length is out of range).
template <typename T>
SGL_DEVICE void store_merged(const DecodeParams& p, int64_t b, int64_t h, int d, float4 o, float lse2, bool valid) {
  if (!valid) o.x = o.y = o.z = o.w = lse2 = std::numeric_limits<float>::quiet_NaN();
  T* out = static_cast<T*>(p.out) + b * p.out_stride_b + h * p.out_stride_h + d;
  out[0] = dtype_trait<T>::from(o.x);
  out[1] = dtype_trait<T>::from(o.y);
  out[2] = dtype_trait<T>::from(o.z);
  out[3] = dtype_trait<T>::from(o.w);
  if (d == 0 && p.lse != nullptr) p.lse[b * p.num_heads + h] = lse2 * kLn2;
}

// The share of the launched waves' CTA slots that `blocks` CTAs fill, `resident` at a time.
inline double wave_fill(int64_t blocks, int64_t resident) {
  const int64_t waves = (blocks + resident - 1) / resident;
  return static_cast<double>(blocks) / static_cast<double>(waves * resident);
}

// The most splits per sequence worth considering: CTAs (`batch * kv_heads * splits`) for up to
// kMaxCtasPerSm on every SM (above the kernel's occupancy), no split shorter than kMinSplitKeys keys
// of the cache (fewer would spend more on the merge than they save), at most kMaxSplits; 1 when the
// batch alone fills the GPU. From the shapes only: the lengths stay on the device.
inline constexpr int64_t kMaxCtasPerSm = 8;
inline constexpr int64_t kMinSplitKeys = 128;
inline int64_t split_bound(int64_t batch, int64_t kv_heads, int64_t max_len, int64_t sms) {
  const int64_t ctas = std::max<int64_t>(batch * kv_heads, 1);
  const int64_t wanted = (kMaxCtasPerSm * sms + ctas - 1) / ctas;
  return std::max<int64_t>(1, std::min({wanted, max_len / kMinSplitKeys, kMaxSplits}));
}

// Splits per sequence for `ctas` CTAs of one split, `resident` CTAs in a wave (one per SM), at most
// `max_splits`: the fewest whose waves are filled within 5% of the best choice's.
inline int64_t choose_splits(int64_t ctas, int64_t resident, int64_t max_splits) {
  double best = 0.0;
  for (int64_t s = 1; s <= max_splits; ++s) best = std::max(best, wave_fill(ctas * s, resident));
  for (int64_t s = 1; s <= max_splits; ++s) {
    if (wave_fill(ctas * s, resident) >= 0.95 * best) return s;
  }
  return 1;
}

}  // namespace detail

// Ring slots per warp: as many tiles as 96 KiB per CTA holds, 2 to 4 (head dim 64: 4, 128: 3, 256: 2).
constexpr int decode_stages(int head_dim) {
  const int tiles = 96 * 1024 / (static_cast<int>(kWarps) * 2 * static_cast<int>(kTileKeys) * head_dim * 2);
  return tiles < 2 ? 2 : (tiles > 4 ? 4 : tiles);
}

// Dynamic shared memory of a CTA: its warps' rings (16-bit K and V tiles).
constexpr std::size_t decode_shared_bytes(int head_dim) {
  return std::size_t{kWarps} * decode_stages(head_dim) * 2 * kTileKeys * head_dim * 2;
}

// One CTA: one (sequence, KV head, split, chunk of up to kMaxGroup query heads).
template <int kHeadDim, typename T>
__global__ __launch_bounds__(kThreads) void decode_kernel(const __grid_constant__ DecodeParams p) {
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks of a key row
  constexpr int kSteps = kHeadDim / 16;  // k-steps of Q K^T; n-tiles of P V: 2 per step
  constexpr int kRowBytes = kHeadDim * 2;
  constexpr int kTileBytes = static_cast<int>(kTileKeys) * kRowBytes;  // of K, and of V
  constexpr int kStages = decode_stages(kHeadDim);
  constexpr int kCopies = 2 * static_cast<int>(kTileKeys) * kChunks / 32;  // cp.async per lane and tile
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  static_assert(kChunks >= 8, "the swizzle spreads 8 rows over 8 chunks");
  struct Combine {
    float acc[kWarps][kMaxGroup][kHeadDim];
    float max[kWarps][kMaxGroup];
    float sum[kWarps][kMaxGroup];
  };
  struct Split {  // this split's merged state, for the cluster's merge
    float out[kMaxGroup][kHeadDim];
    float lse[kMaxGroup];
  };
  static_assert(sizeof(Combine) % 16 == 0, "the split's state after the warps' is 16-byte aligned");
  static_assert(sizeof(Combine) + sizeof(Split) <= decode_shared_bytes(kHeadDim), "the states fit in the rings");
  extern __shared__ __align__(128) unsigned char shared[];
  Combine& combine = *reinterpret_cast<Combine*>(shared);
  Split& state = *reinterpret_cast<Split*>(shared + sizeof(Combine));

  const int warp = static_cast<int>(threadIdx.x / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int g = lane / 4, t = lane % 4;  // the MMA fragments' row (head) and column pair

  uint32_t block = blockIdx.x;  // a cluster's blocks are consecutive: the splits are the fastest index
  const int split = static_cast<int>(block % static_cast<uint32_t>(p.num_splits));
  block /= static_cast<uint32_t>(p.num_splits);
  const int chunk = static_cast<int>(block % static_cast<uint32_t>(p.head_chunks));
  block /= static_cast<uint32_t>(p.head_chunks);
  const int kv_head = static_cast<int>(block % static_cast<uint32_t>(p.num_kv_heads));
  const int64_t b = static_cast<int64_t>(block / static_cast<uint32_t>(p.num_kv_heads));
  const int first_head = kv_head * p.group + chunk * static_cast<int>(kMaxGroup);
  const int heads = min(static_cast<int>(kMaxGroup), p.group - chunk * static_cast<int>(kMaxGroup));

  const T* q_rows = static_cast<const T*>(p.q) + b * p.q_stride_b + static_cast<int64_t>(first_head) * p.q_stride_h;
  const char* k_base =
      reinterpret_cast<const char*>(static_cast<const T*>(p.k) + b * p.k_stride_b + kv_head * p.k_stride_h);
  const char* v_base =
      reinterpret_cast<const char*>(static_cast<const T*>(p.v) + b * p.v_stride_b + kv_head * p.v_stride_h);
  const int64_t k_row_bytes = p.k_stride_l * static_cast<int64_t>(sizeof(T));
  const int64_t v_row_bytes = p.v_stride_l * static_cast<int64_t>(sizeof(T));

  device::PDLWaitPrimary();  // launched with PDL: wait for the previous kernel's writes
  device::PDLTriggerSecondary();

  const int64_t length = detail::load_length(p, b);
  const bool valid = length >= 0 && length <= p.max_len;
  const int64_t begin = static_cast<int64_t>(split) * p.split_len;
  const int64_t stop = begin + p.split_len < length ? begin + p.split_len : length;
  const int64_t end = valid ? stop : begin;  // an invalid length reads nothing

  // Q's A fragments, row g (head first_head + g; zeros past the chunk's heads): per k-step the
  // pairs at k 2t and 2t + 8.
  uint32_t q_frag[kSteps][2];
  {
    const T* q_row = q_rows + static_cast<int64_t>(min(g, heads - 1)) * p.q_stride_h;
    const bool head = g < heads;
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const T* pair = q_row + 16 * ks + 8 * h + 2 * t;  // two loads: a head's stride may be odd
        q_frag[ks][h] =
            head ? detail::pack<T>(dtype_trait<fp32_t>::from(pair[0]), dtype_trait<fp32_t>::from(pair[1])) : 0u;
      }
    }
  }

  // The warp's ring: kStages tiles, each K's 16 rows then V's, rows swizzled by 16-byte chunk.
  const uint32_t ring =
      static_cast<uint32_t>(__cvta_generic_to_shared(shared)) + static_cast<uint32_t>(warp * kStages * 2 * kTileBytes);
  const auto swizzled = [](int row, int chunk16) {
    return static_cast<uint32_t>(row * kRowBytes + ((chunk16 ^ (row % 8)) * 16));
  };
  const int64_t tiles = end > begin ? (end - begin + kTileKeys - 1) / kTileKeys : 0;
  const int64_t warp_tiles = tiles > warp ? (tiles - warp + kWarps - 1) / kWarps : 0;
  // Tile i of this warp (keys begin + (warp + i kWarps) 16 ..) into ring slot `stage`, as one commit
  // group (empty past the warp's last tile, so that the count of groups in flight stays the same).
  const auto issue = [&](int64_t i, int stage) {
    if (i < warp_tiles) {
      const int64_t first_key = begin + (warp + i * kWarps) * kTileKeys;
      const uint32_t slot = ring + static_cast<uint32_t>(stage * 2 * kTileBytes);
#pragma unroll
      for (int c = 0; c < kCopies; ++c) {
        const int piece = lane + 32 * c;  // K's rows' chunks, then V's
        const bool is_v = piece >= static_cast<int>(kTileKeys) * kChunks;
        const int within = is_v ? piece - static_cast<int>(kTileKeys) * kChunks : piece;
        const int row = within / kChunks, chunk16 = within % kChunks;
        const int64_t key = first_key + row;
        const bool in_range = key < end;
        const int64_t at = in_range ? key : 0;
        const char* src = (is_v ? v_base + at * v_row_bytes : k_base + at * k_row_bytes) + chunk16 * 16;
        detail::copy_16(slot + (is_v ? kTileBytes : 0) + swizzled(row, chunk16), src, in_range ? 16 : 0);
      }
    }
    detail::commit_copies();
  };
#pragma unroll
  for (int stage = 0; stage < kStages - 1; ++stage) issue(stage, stage);

  // Row g's state: running maximum (base 2), this lane's share of the row sum, and the output's
  // accumulator fragments (columns 8 n + 2t, + 1 of n-tile n; its rows 8..15 stay zero).
  float m = kNegInf, l = 0.0f;
  float o[2 * kSteps][4];
#pragma unroll
  for (int n = 0; n < 2 * kSteps; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  int stage = 0;  // the ring slot of tile i
  for (int64_t i = 0; i < warp_tiles; ++i) {
    detail::wait_copies<kStages - 2>();  // tile i has landed for this lane's copies,
    __syncwarp();                        // and for the warp's; every lane is done with tile i - 1
    issue(i + kStages - 1, stage == 0 ? kStages - 1 : stage - 1);  // into tile i - 1's slot
    const uint32_t k_tile = ring + static_cast<uint32_t>(stage * 2 * kTileBytes);
    const uint32_t v_tile = k_tile + kTileBytes;
    stage = stage + 1 == kStages ? 0 : stage + 1;

    // S = Q K^T: n-tile j holds keys 8 j + 2t, + 1 of row g in s[j][0..1].
    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int ks = 0; ks < kSteps; ks += 2) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        // Matrices: (keys 8j.., k-step ks, low and high 8), then k-step ks + 1.
        const int mi = lane / 8;
        uint32_t bk[4];
        detail::load_matrices<false>(bk, k_tile + swizzled(8 * j + lane % 8, 2 * (ks + mi / 2) + mi % 2));
        detail::mma<T>(s[j], q_frag[ks][0], q_frag[ks][1], bk[0], bk[1]);
        detail::mma<T>(s[j], q_frag[ks + 1][0], q_frag[ks + 1][1], bk[2], bk[3]);
      }
    }
    const int64_t tile_key = begin + (warp + i * kWarps) * kTileKeys;
    float tile_max = kNegInf;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool in_range = tile_key + 8 * j + 2 * t + e < end;
        s[j][e] = in_range ? s[j][e] * p.scale_log2 : kNegInf;
        tile_max = fmaxf(tile_max, s[j][e]);
      }
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(device::kFullMask, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(device::kFullMask, tile_max, 2));
    const float next = fmaxf(m, tile_max);
    if (next != kNegInf) {                    // the same for the row's 4 lanes; a row without keys yet adds nothing
      const float rescale = exp2f(m - next);  // 0 when m is -inf
      m = next;
      float w[2][2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) w[j][e] = exp2f(s[j][e] - next);  // 0 for keys out of range
      }
      l = l * rescale + ((w[0][0] + w[0][1]) + (w[1][0] + w[1][1]));
#pragma unroll
      for (int n = 0; n < 2 * kSteps; ++n) {
        o[n][0] *= rescale;
        o[n][1] *= rescale;
      }
      const uint32_t p0 = detail::pack<T>(w[0][0], w[0][1]);  // keys 2t, 2t + 1
      const uint32_t p2 = detail::pack<T>(w[1][0], w[1][1]);  // keys 8 + 2t, 8 + 2t + 1
      // O += P V: matrices (keys 0..7, columns 16 jj..), (keys 8..15, same), then columns 16 jj + 8.
#pragma unroll
      for (int jj = 0; jj < kSteps; ++jj) {
        const int mi = lane / 8;
        uint32_t bv[4];
        detail::load_matrices<true>(bv, v_tile + swizzled(8 * (mi % 2) + lane % 8, 2 * jj + mi / 2));
        detail::mma<T>(o[2 * jj], p0, p2, bv[0], bv[1]);
        detail::mma<T>(o[2 * jj + 1], p0, p2, bv[2], bv[3]);
      }
    }
  }

  // The row's sum over its 4 lanes; then the warps' states through shared memory (the rings' space).
  l += __shfl_xor_sync(device::kFullMask, l, 1);
  l += __shfl_xor_sync(device::kFullMask, l, 2);
  detail::wait_copies<0>();  // the empty trailing groups
  __syncthreads();           // every warp is done with its ring before the space holds the states
#pragma unroll
  for (int n = 0; n < 2 * kSteps; ++n) {
    combine.acc[warp][g][8 * n + 2 * t] = o[n][0];
    combine.acc[warp][g][8 * n + 2 * t + 1] = o[n][1];
  }
  if (t == 0) {
    combine.max[warp][g] = m;
    combine.sum[warp][g] = l;
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
    if (p.merge_in_cluster) {
      state.out[g][d] = o;
      if (d == 0) state.lse[g] = lse2;
      continue;
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
  if (p.merge_in_cluster) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
    // The cluster's splits, through distributed shared memory: block rank r merges output vectors
    // r, r + splits, ... of the chunk's heads x kHeadDim / 4.
    auto cluster = cooperative_groups::this_cluster();
    cluster.sync();  // every split's state is in its block's shared memory
    constexpr int kVectors = kHeadDim / 4;
    const int splits = p.num_splits;
    for (int i = split * static_cast<int>(kThreads) + static_cast<int>(threadIdx.x); i < heads * kVectors;
         i += splits * static_cast<int>(kThreads)) {
      const int g = i / kVectors, d = 4 * (i % kVectors);
      float lse2;
      const float4 o = detail::merge_states(
          splits,
          [&](int s) { return *cluster.map_shared_rank(&state.lse[g], static_cast<unsigned>(s)); },
          [&](int s) {
            return *reinterpret_cast<const float4*>(
                cluster.map_shared_rank(&state.out[g][d], static_cast<unsigned>(s)));
          },
          lse2);
      detail::store_merged<T>(p, b, first_head + g, d, o, lse2, valid);
    }
    cluster.sync();  // no block exits while another still reads its shared memory
#else
    __trap();  // the launcher merges in a cluster on sm_90+ only
#endif
  }
}

// The splits of one (sequence, query head) per kHeadDim / 4 threads (4 elements each): weights
// exp2(lse_s - max), the partial outputs summed with them, divided by their sum.
template <int kHeadDim, typename T>
__global__ __launch_bounds__(kThreads) void merge_splits_kernel(const __grid_constant__ DecodeParams p) {
  constexpr int kRowThreads = kHeadDim / 4;
  constexpr int kRowsPerBlock = static_cast<int>(kThreads) / kRowThreads;
  const int64_t head_row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kRowThreads;
  const int t = static_cast<int>(threadIdx.x % kRowThreads);

  device::PDLWaitPrimary();  // the splits' partial results
  device::PDLTriggerSecondary();
  if (head_row >= p.batch * p.num_heads) return;

  const int64_t b = head_row / p.num_heads, h = head_row % p.num_heads;
  const int64_t length = detail::load_length(p, b);
  const bool valid = length >= 0 && length <= p.max_len;
  const float* lse = p.partial_lse + head_row * p.split_stride;
  const float4* parts = reinterpret_cast<const float4*>(p.partial_out + head_row * p.split_stride * kHeadDim) + t;
  float lse2;
  const float4 o = detail::merge_states(
      p.num_splits,
      [&](int s) { return lse[s]; },
      [&](int s) { return parts[static_cast<int64_t>(s) * (kHeadDim / 4)]; },
      lse2);
  detail::store_merged<T>(p, b, h, 4 * t, o, lse2, valid);
}

// How a launch merges its splits (DecodeAttention::run_with's `merge`): as the launcher chooses, by
// the second kernel, inside a cluster, or inside a cluster whose blocks the scheduler is asked to
// spread over SMs.
enum class Merge : int64_t { kChosen = 0, kKernel = 1, kCluster = 2, kSpreadCluster = 3 };

template <int kHeadDim, typename T>
struct DecodeAttention {
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head_dim must be 64, 128 or 256");

  // The op. out, lse: the results (lse optional). The splits' float32 workspace, where they merge
  // by the second kernel (their partial outputs [B, Hq, S, D], then their LSEs [B, Hq, S]), comes
  // from the caller's allocator: under PyTorch its caching allocator on the current stream (the
  // graph's pool during a capture).
  static void run(
      tvm::ffi::TensorView out,
      tvm::ffi::Optional<tvm::ffi::TensorView> lse,
      tvm::ffi::TensorView query,
      tvm::ffi::TensorView k_cache,
      tvm::ffi::TensorView v_cache,
      tvm::ffi::TensorView seq_lens,
      double scale,
      tvm::ffi::Optional<bool> enable_pdl) {
    run_with(out, lse, query, k_cache, v_cache, seq_lens, scale, enable_pdl, 0, static_cast<int64_t>(Merge::kChosen));
  }

  // The op's launch with a given number of splits (0: the launcher's choice) and merge (a Merge; a
  // cluster of up to 16 splits, the non-portable sizes opted into): what bench_decode_attention's
  // --split-sweep times, so that the sweep measures the op's own code.
  static void run_with(
      tvm::ffi::TensorView out,
      tvm::ffi::Optional<tvm::ffi::TensorView> lse,
      tvm::ffi::TensorView query,
      tvm::ffi::TensorView k_cache,
      tvm::ffi::TensorView v_cache,
      tvm::ffi::TensorView seq_lens,
      double scale,
      tvm::ffi::Optional<bool> enable_pdl,
      int64_t num_splits,
      int64_t merge) {
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
    const int64_t hq = heads.unwrap(), hkv = kv_heads.unwrap();
    check_heads(hq, hkv);
    RuntimeCheck(std::isfinite(scale), "decode_attention: scale must be a finite float, got ", scale);
    RuntimeCheck(
        num_splits >= 0 && num_splits <= kMaxSplits,
        "decode_attention: num_splits must be 0 (the launcher's choice) to ",
        kMaxSplits,
        ", got ",
        num_splits);
    RuntimeCheck(
        merge >= 0 && merge <= 3, "decode_attention: merge must be 0 (chosen), 1 (kernel), 2 (cluster) or 3 (spread)");
    const int64_t b = batch.unwrap();
    const int64_t group = hq / hkv;
    const int64_t ctas = b * hkv * div_ceil(group, kMaxGroup);  // of one split
    RuntimeCheck(
        ctas * kMaxSplits <= int64_t{0x7fffffff}, "decode_attention: ", ctas * kMaxSplits, " CTAs do not fit one grid");
    if (b == 0 || has_no_data(out)) return;  // the fake (torch.compile) call ends here: checks only
    const DLDevice dev = device.unwrap();
    const int64_t splits = num_splits > 0 ? num_splits : choose(b, hkv, group, max_len.unwrap(), dev.device_id);
    const bool in_cluster = merge == static_cast<int64_t>(Merge::kChosen)
                                ? merges_in_cluster(splits, dev.device_id)
                                : splits > 1 && merge != static_cast<int64_t>(Merge::kKernel);
    if (in_cluster && merge != static_cast<int64_t>(Merge::kChosen)) {
      RuntimeCheck(
          splits <= kMaxClusterBlocks && cluster_fits(dev.device_id, splits),
          "decode_attention: a cluster of ",
          splits,
          " blocks does not fit this device");
    }
    const bool in_workspace = splits > 1 && !in_cluster;
    const auto workspace =
        in_workspace ? ffi::empty({b * hq * splits * (kHeadDim + 1)}, dl_dtype_v<fp32_t>, dev) : ffi::Tensor{};

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
    p.partial_out = in_workspace ? static_cast<float*>(workspace.data_ptr()) : nullptr;
    p.partial_lse = in_workspace ? p.partial_out + b * hq * splits * kHeadDim : nullptr;
    p.merge_in_cluster = in_cluster;
    p.batch = b;
    p.num_heads = static_cast<int32_t>(hq);
    p.num_kv_heads = static_cast<int32_t>(hkv);
    p.group = static_cast<int32_t>(group);
    p.head_chunks = static_cast<int32_t>(div_ceil(group, kMaxGroup));
    p.split_stride = static_cast<int32_t>(splits);
    p.max_len = max_len.unwrap();
    p.scale_log2 = static_cast<float>(scale) * kLog2e;

    const bool pdl = runtime::resolve_pdl(enable_pdl, dev.device_id);
    p.num_splits = static_cast<int32_t>(splits);
    p.split_len = div_ceil(div_ceil(p.max_len, splits), kSplitAlign) * kSplitAlign;
    LaunchKernel(static_cast<uint32_t>(ctas * splits), kThreads, dev, kSharedBytes)
        .enable_pdl(pdl)
        .enable_cluster(in_cluster ? static_cast<unsigned>(splits) : 1u)
        .spread_clusters(in_cluster && merge == static_cast<int64_t>(Merge::kSpreadCluster))(kKernel, p);
    if (in_workspace) {
      constexpr int64_t kRowsPerBlock = kThreads / (kHeadDim / 4);
      const auto merge_grid = static_cast<uint32_t>(div_ceil(p.batch * p.num_heads, kRowsPerBlock));
      LaunchKernel(merge_grid, kThreads, dev).enable_pdl(pdl)(merge_splits_kernel<kHeadDim, T>, p);
    }
  }

  // The launcher's choice for a query [B, Hq, D] and a cache [B, Hkv, max_len, D] on their device:
  // the number of splits, negated where they merge inside a cluster (bench_decode_attention's
  // --split-sweep names the op's choice beside the ones it times).
  static int64_t chosen_splits(tvm::ffi::TensorView query, tvm::ffi::TensorView k_cache) {
    const int64_t hq = query.size(1), hkv = k_cache.size(1);
    check_heads(hq, hkv);
    const int device_id = query.device().device_id;
    const int64_t splits = choose(query.size(0), hkv, hq / hkv, k_cache.size(2), device_id);
    return merges_in_cluster(splits, device_id) ? -splits : splits;
  }

  static constexpr auto kKernel = decode_kernel<kHeadDim, T>;
  static constexpr std::size_t kSharedBytes = decode_shared_bytes(kHeadDim);

 private:
  // The largest cluster sm_90 runs (a non-portable size): the most splits run_with merges in one.
  static constexpr int64_t kMaxClusterBlocks = 16;

  static void check_heads(int64_t hq, int64_t hkv) {
    host::RuntimeCheck(
        hkv >= 1 && hq % hkv == 0,
        "decode_attention: the query heads (query's dim 1: ",
        hq,
        ") must be a multiple of the KV heads (k_cache's dim 1: ",
        hkv,
        ")");
  }

  // The splits from the shapes and the SM count (one CTA per SM).
  static int64_t choose(int64_t batch, int64_t kv_heads, int64_t group, int64_t max_len, int device_id) {
    const int64_t ctas = batch * kv_heads * host::div_ceil(group, kMaxGroup);
    const int64_t sms = host::runtime::sm_count(device_id);
    const int64_t bound = detail::split_bound(batch, kv_heads, max_len, sms);
    return bound > 1 ? detail::choose_splits(ctas, sms, bound) : 1;
  }

  // The launcher's merge: inside a cluster where one holds the splits, else the second kernel.
  static bool merges_in_cluster(int64_t splits, int device_id) {
    return splits > 1 && splits <= max_cluster_splits(device_id);
  }

  // Whether one cluster of `size` blocks of the kernel, with its dynamic shared memory, fits the
  // device (sizes above 8 opted into: the non-portable sizes).
  static bool cluster_fits(int device_id, int64_t size) {
    using namespace host;
    if (!runtime::has_clusters(device_id)) return false;
    int clusters = 0;
    runtime::detail::on_device(device_id, {}, [&] {
      runtime::set_max_dynamic_smem(kKernel, kSharedBytes);
      if (size > 8)
        RuntimeDeviceCheck(cudaFuncSetAttribute(kKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
      cudaLaunchAttribute cluster{};
      cluster.id = cudaLaunchAttributeClusterDimension;
      cluster.val.clusterDim.x = static_cast<unsigned>(size);
      cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
      cudaLaunchConfig_t config{};
      config.gridDim = dim3(static_cast<unsigned>(size), 1, 1);
      config.blockDim = dim3(kThreads, 1, 1);
      config.dynamicSmemBytes = kSharedBytes;
      config.attrs = &cluster;
      config.numAttrs = 1;
      RuntimeDeviceCheck(cudaOccupancyMaxActiveClusters(&clusters, kKernel, &config));
    });
    return clusters >= 1;
  }

  // The most splits the device merges in a cluster: the largest of kMaxClusterSplits, its halves
  // down to 2, that fits (1 without clusters); asked once per device.
  static int64_t max_cluster_splits(int device_id) {
    struct Tag;
    return host::runtime::detail::per_device<Tag>(device_id, {}, [](int id) {
      for (int64_t size = kMaxClusterSplits; size >= 2; size /= 2) {
        if (cluster_fits(id, size)) return static_cast<int>(size);
      }
      return 1;
    });
  }
};

}  // namespace jit_kernel::attention
