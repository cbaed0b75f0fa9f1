// speculative: verification of speculative-decoding drafts (python/jit_kernel/ops/speculative.py has
// the ops' semantics in full, docs/design/speculative.md how the kernels work).
//
//   chain:  FlashInfer's chain_speculative_sampling: draft token j is accepted with probability
//           min(1, target / draft); the first rejected position gets a token from the normalised
//           relu(target - draft); when every draft is accepted the bonus token comes from the target
//           distribution of position n. Random numbers from Philox (<sgl_kernel/philox.cuh>).
//   tree:   sgl-kernel's tree_speculative_sampling_target_only: an EAGLE draft tree walked level by
//           level with the caller's uniforms; the last position's token from relu(target - draft).
//   greedy: sgl-kernel's verify_tree_greedy: the same walk accepting a child when its token is the
//           target model's argmax at the parent.
//
// One CTA per request (chain, tree): one warp (chain) or thread 0 (tree) walks the drafts, then the
// whole CTA draws the last token from a row of the vocabulary (sample_row). The draw is exact and
// reproducible: each weight w = relu(target - draft) (non-finite differences count as 0) becomes a
// 64-bit integer W = floor(w * 2^s), with s chosen so that the row's largest weight lies in
// [2^39, 2^40); integer sums do not depend on the order of addition, so the token, the first index
// whose running sum of W exceeds r = floor(u * sum(W)), is a pure function of the row and of the
// uniform u (64 bits). Tokens whose weight is below 2^-40 of the largest are never drawn. Where the
// residual has no mass the token comes from the target row itself; where that has none either
// (an all-zero or non-finite row), the token is -1.
//
// Indices: draft token ids outside [0, vocab), tree links outside [-1, num_draft_tokens) and retrieve
// indices outside their tensors are handled in the kernels without a fault (see the ops' docstring);
// the Python layer raises IndexError for them first under JIT_KERNEL_CHECK_INDICES=1.
#pragma once

#include <sgl_kernel/cta.cuh>
#include <sgl_kernel/philox.cuh>
#include <sgl_kernel/runtime.cuh>
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>
#include <sgl_kernel/vec.cuh>
#include <sgl_kernel/warp.cuh>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>

#include <algorithm>
#include <cfloat>
#include <cstdint>

namespace jit_kernel::speculative {

inline constexpr uint32_t kThreads = 1024;  // one CTA per request
inline constexpr uint32_t kWarps = kThreads / 32;
inline constexpr uint32_t kGreedyThreads = 128;  // verify_tree_greedy: one thread per request
inline constexpr int kFixedBits = 40;            // the largest weight of a row lies in [2^39, 2^40)
// vocab <= 2^20 keeps the row's integer sum below 2^60 and its segment sums (one 64-bit word per
// 32 lanes' elements) within 64 KiB of shared memory.
inline constexpr int64_t kMaxVocab = int64_t{1} << 20;

// The weight of one token: target - draft where that is positive and finite, else 0 (never -0, so
// the weights order as their bit patterns for redux.sync).
SGL_DEVICE float residual(float q, float p) {
  const float d = q - p;
  return d > 0.f && d <= FLT_MAX ? d : 0.f;
}

// floor(w * 2^shift) for a weight w >= 0 with w * 2^shift < 2^40, through two power-of-two factors
// (scale_a * scale_b = 2^shift, each a float): both products are exact, except where w * scale_a
// falls below the normal range, which happens only when w * 2^shift < 1 (and the result is 0 anyway).
struct FixedScale {
  float scale_a, scale_b;
  SGL_DEVICE explicit FixedScale(int shift)
      : scale_a(ldexpf(1.f, shift / 2)), scale_b(ldexpf(1.f, shift - shift / 2)) {}
  SGL_DEVICE uint64_t operator()(float w) const {
    return __float2ull_rz(w * scale_a * scale_b);
  }
};

// A float uniform (the tree op's coins) as a 64-bit fraction: floor(u * 2^64) for u in [0, 1); NaN
// and u <= 0 give 0, u >= 1 the largest fraction.
SGL_DEVICE uint64_t coin_bits(float u) {
  if (!(u > 0.f)) return 0;
  if (u >= 1.f) return ~uint64_t{0};
  return __float2ull_rz(u * 18446744073709551616.f);  // 2^64: a power of two, so the product is exact
}

SGL_DEVICE int64_t load_index(const void* p, bool is64, int64_t i) {
  return is64 ? static_cast<const int64_t*>(p)[i] : static_cast<int64_t>(static_cast<const int32_t*>(p)[i]);
}

// Counter i += value, or = value where the op allocated the counter for this call (`add` false:
// no fill kernel to zero it first).
SGL_DEVICE void count(void* p, bool is64, bool add, int64_t i, int64_t value) {
  if (is64) {
    int64_t* c = static_cast<int64_t*>(p) + i;
    *c = add ? *c + value : value;
  } else {
    int32_t* c = static_cast<int32_t*>(p) + i;
    *c = add ? *c + static_cast<int32_t>(value) : static_cast<int32_t>(value);
  }
}

// Shared memory of sample_row besides the dynamic segment sums.
struct SampleSmem {
  float max_scratch[kWarps];
  uint64_t scan_scratch[kWarps];
  int64_t segment;     // the segment holding the token
  uint64_t remainder;  // r minus the sum of the segments before it
  int64_t token;
};

// Exclusive prefix sum of one value per thread over the CTA (thread order); `total` gets the sum.
SGL_DEVICE uint64_t cta_exclusive_sum(uint64_t value, uint64_t* scratch, uint64_t& total) {
  const uint32_t lane = threadIdx.x % 32, warp_id = threadIdx.x / 32;
  const uint64_t inclusive = device::warp::inclusive_sum(value);
  if (lane == 31) scratch[warp_id] = inclusive;
  __syncthreads();
  const uint64_t warp_total = lane < kWarps ? scratch[lane] : 0;
  const uint64_t warps_inclusive = device::warp::inclusive_sum(warp_total);
  const uint64_t before_warp = __shfl_sync(device::kFullMask, warps_inclusive - warp_total, warp_id);
  total = __shfl_sync(device::kFullMask, warps_inclusive, kWarps - 1);
  return before_warp + inclusive - value;
}

// Rows of the vocabulary: thread t of a tile owns kE consecutive elements (16 bytes), a warp's 32
// lanes one segment of 32 * kE elements. kVec: every row is made of aligned 16-byte vectors.
template <typename T, bool kVec>
struct Row {
  static constexpr int kE = 16 / sizeof(T);
  static constexpr int64_t kSegment = 32 * kE;
  static constexpr int64_t kTile = kThreads * kE;

  SGL_DEVICE static void load(const T* row, int64_t at, int64_t vocab, float (&out)[kE]) {
    if constexpr (kVec) {
      if (at < vocab) {
        device::AlignedVector<T, kE> v;
        v.load(row + at);
        device::to_floats(v, out);
      } else {
#pragma unroll
        for (int e = 0; e < kE; ++e) out[e] = 0.f;
      }
    } else {
#pragma unroll
      for (int e = 0; e < kE; ++e) out[e] = at + e < vocab ? dtype_trait<fp32_t>::from(row[at + e]) : 0.f;
    }
  }

  // The weights of the kE elements at `at`: relu(q - p), or relu(q) without p.
  SGL_DEVICE static void weights(const T* q, const T* p, int64_t at, int64_t vocab, float (&w)[kE]) {
    float qv[kE], pv[kE];
    load(q, at, vocab, qv);
    if (p != nullptr) {
      load(p, at, vocab, pv);
    } else {
#pragma unroll
      for (int e = 0; e < kE; ++e) pv[e] = 0.f;
    }
#pragma unroll
    for (int e = 0; e < kE; ++e) w[e] = residual(qv[e], pv[e]);
  }
};

// The token drawn from relu(q - p) (relu(q) where p is null, or where relu(q - p) has no mass) with
// the 64-bit uniform `bits`; -1 where relu(q) has no mass either. Every thread of the CTA calls it and
// gets the token. `segments` holds one 64-bit sum per segment of the row (div_ceil(vocab, kTile) *
// kWarps of them).
template <typename T, bool kVec>
SGL_DEVICE int64_t
sample_row(const T* q, const T* p, int64_t vocab, uint64_t bits, uint64_t* segments, SampleSmem& smem) {
  using R = Row<T, kVec>;
  constexpr int kE = R::kE;
  const uint32_t tid = threadIdx.x, lane = tid % 32, warp_id = tid / 32;

  // Pass 1: the largest weight, with and without the draft.
  float max_residual = 0.f, max_target = 0.f;
  for (int64_t at = tid * kE; at < vocab; at += R::kTile) {
    float qv[kE], pv[kE];
    R::load(q, at, vocab, qv);
    if (p != nullptr) {
      R::load(p, at, vocab, pv);
    } else {
#pragma unroll
      for (int e = 0; e < kE; ++e) pv[e] = 0.f;
    }
#pragma unroll
    for (int e = 0; e < kE; ++e) {
      max_residual = fmaxf(max_residual, residual(qv[e], pv[e]));
      max_target = fmaxf(max_target, residual(qv[e], 0.f));
    }
  }
  max_residual = device::cta::all_reduce_max_nonneg(max_residual, smem.max_scratch);
  __syncthreads();
  max_target = device::cta::all_reduce_max_nonneg(max_target, smem.max_scratch);
  const T* draft = max_residual > 0.f ? p : nullptr;
  const float largest = max_residual > 0.f ? max_residual : max_target;
  if (!(largest > 0.f)) return -1;  // the same answer in every thread
  int exponent = 0;
  frexpf(largest, &exponent);  // largest < 2^exponent
  const FixedScale to_fixed(kFixedBits - exponent);

  // Pass 2: the integer sum of each segment.
  const int64_t tiles = host::div_ceil(vocab, R::kTile);
  for (int64_t tile = 0; tile < tiles; ++tile) {
    float w[kE];
    R::weights(q, draft, tile * R::kTile + tid * kE, vocab, w);
    uint64_t sum = 0;
#pragma unroll
    for (int e = 0; e < kE; ++e) sum += to_fixed(w[e]);
    sum = device::warp::reduce_sum(sum);
    if (lane == 0) segments[tile * kWarps + warp_id] = sum;
  }
  if (tid == 0) {  // set below by the threads that find the token (always one, as r < total)
    smem.segment = 0;
    smem.remainder = 0;
    smem.token = -1;
  }
  __syncthreads();

  // The segment holding r: each thread sums a run of consecutive segments, a CTA scan places the runs.
  const int64_t num_segments = tiles * kWarps;
  const int64_t run = host::div_ceil(num_segments, int64_t{kThreads});
  const int64_t first = tid * run, last = first + run < num_segments ? first + run : num_segments;
  uint64_t run_sum = 0;
  for (int64_t g = first; g < last; ++g) run_sum += segments[g];
  uint64_t total = 0;
  const uint64_t before = cta_exclusive_sum(run_sum, smem.scan_scratch, total);
  const uint64_t r = __umul64hi(bits, total);  // floor(u * total), u = bits / 2^64
  if (before <= r && r - before < run_sum) {   // exactly one thread
    uint64_t acc = before;
    for (int64_t g = first; g < last; ++g) {
      if (r - acc < segments[g]) {
        smem.segment = g;
        smem.remainder = r - acc;
        break;
      }
      acc += segments[g];
    }
  }
  __syncthreads();

  // Pass 3: warp 0 finds the token inside the segment.
  if (warp_id == 0) {
    const int64_t at = smem.segment * R::kSegment + lane * kE;
    const uint64_t rem = smem.remainder;
    float w[kE];
    R::weights(q, draft, at, vocab, w);
    uint64_t fixed[kE], sum = 0;
#pragma unroll
    for (int e = 0; e < kE; ++e) sum += fixed[e] = to_fixed(w[e]);
    const uint64_t inclusive = device::warp::inclusive_sum(sum);
    uint64_t acc = inclusive - sum;
    if (acc <= rem && rem < inclusive) {  // exactly one lane
#pragma unroll
      for (int e = 0; e < kE; ++e) {
        if (rem - acc < fixed[e]) {
          smem.token = at + e;
          break;
        }
        acc += fixed[e];
      }
    }
  }
  __syncthreads();
  return smem.token;
}

template <typename T>
SGL_DEVICE const T* row_at(const void* base, int64_t stride0, int64_t stride1, int64_t i, int64_t j) {
  return static_cast<const T*>(base) + i * stride0 + j * stride1;
}

// ---------------------------------------------------------------------------------------------
// chain_speculative_sampling

struct ChainParams {
  const void* draft_probs;  // [B, n, V]
  int64_t draft_stride0, draft_stride1;
  const void* target_probs;  // [B, n + 1, V]
  int64_t target_stride0, target_stride1;
  const void* draft_ids;  // [B, n], contiguous, int32 or int64
  bool ids64;
  int32_t* output_ids;  // [B, n + 1], contiguous
  void* accepted;       // [B], int32 or int64
  bool accepted64;
  bool accepted_add;  // add to the counter (false: write it)
  void* emitted;      // [B], int32 or int64
  bool emitted64;
  bool emitted_add;
  const uint64_t* seed;  // [1] or [B], or nullptr for seed_value
  int64_t seed_stride;   // 0: one seed for every row
  uint64_t seed_value;
  const uint64_t* offset;
  int64_t offset_stride;
  uint64_t offset_value;
  bool own_streams;  // a seed or an offset per row: row b's draws are its own stream
  int64_t n;
  int64_t vocab;
};

// Draw k of row b: the row's own stream (index k) or, where rows share the seed and offset, the
// row mixed into the index (rows differ; row 0 is the same in both).
SGL_DEVICE device::philox::Words chain_draw(
    const ChainParams& p, uint64_t seed, uint64_t offset, int64_t b, int64_t k) {
  const uint64_t index = p.own_streams ? static_cast<uint64_t>(k) : (static_cast<uint64_t>(b) << 32) | k;
  return device::philox::draw(seed, offset, index);
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads, 1) chain_kernel(const __grid_constant__ ChainParams p) {
  extern __shared__ uint64_t segments[];
  __shared__ SampleSmem smem;
  __shared__ int64_t s_pos;
  const int64_t b = blockIdx.x;
  const uint32_t tid = threadIdx.x;
  const int64_t n = p.n, vocab = p.vocab;
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  const uint64_t seed = p.seed != nullptr ? p.seed[b * p.seed_stride] : p.seed_value;
  const uint64_t offset = p.offset != nullptr ? p.offset[b * p.offset_stride] : p.offset_value;

  // Warp 0, lane i: position i of each run of 32. Draw i's first word decides acceptance, its second
  // the independent test behind the accepted count.
  if (tid < 32) {
    int64_t pos = n, accepted = 0;
    for (int64_t base = 0; base < n; base += 32) {
      const int64_t i = base + tid;
      bool accept = false, independent = false;
      if (i < n) {
        const int64_t id = load_index(p.draft_ids, p.ids64, b * n + i);
        float q = 0.f, d = 0.f;
        if (id >= 0 && id < vocab) {
          q = dtype_trait<fp32_t>::from(row_at<T>(p.target_probs, p.target_stride0, p.target_stride1, b, i)[id]);
          d = dtype_trait<fp32_t>::from(row_at<T>(p.draft_probs, p.draft_stride0, p.draft_stride1, b, i)[id]);
        }
        const auto words = chain_draw(p, seed, offset, b, i);
        accept = device::philox::uniform01(words.x) * d < q;
        independent = device::philox::uniform01(words.y) * d < q;
      }
      const uint32_t rejected = __ballot_sync(device::kFullMask, i < n && !accept);
      const uint32_t passed = __ballot_sync(device::kFullMask, independent);
      if (pos == n) {
        if (rejected != 0) {
          const int first = __ffs(rejected) - 1;
          pos = base + first;
          accepted += first + __popc(passed >> first);
        } else {
          accepted += 32 < n - base ? 32 : n - base;
        }
      } else {
        accepted += __popc(passed);
      }
    }
    if (tid == 0) {
      s_pos = pos;
      count(p.accepted, p.accepted64, p.accepted_add, b, accepted);
      count(p.emitted, p.emitted64, p.emitted_add, b, pos);
    }
  }
  __syncthreads();
  const int64_t pos = s_pos;

  const T* q = row_at<T>(p.target_probs, p.target_stride0, p.target_stride1, b, pos);
  const T* d = pos < n ? row_at<T>(p.draft_probs, p.draft_stride0, p.draft_stride1, b, pos) : nullptr;
  const uint64_t bits = device::philox::bits64(chain_draw(p, seed, offset, b, n));
  const int64_t token = sample_row<T, kVec>(q, d, vocab, bits, segments, smem);

  int32_t* out = p.output_ids + b * (n + 1);
  for (int64_t i = tid; i <= n; i += kThreads) {
    out[i] = i < pos    ? static_cast<int32_t>(load_index(p.draft_ids, p.ids64, b * n + i))
             : i == pos ? static_cast<int32_t>(token)
                        : -1;
  }
}

// ---------------------------------------------------------------------------------------------
// The draft tree: node i of request b has token candidates[b, i], first child retrive_next_token[b, i]
// and next sibling retrive_next_sibling[b, i] (-1: none; node 0 is the root), and its output slot is
// retrive_index[b, i] (an index into predicts). Links outside [-1, num_draft_tokens) end the list; a
// level visits at most num_draft_tokens siblings.

struct TreeParams {
  int32_t* predicts;  // [P]
  int64_t num_predicts;
  int32_t* accept_index;      // [B, S]
  int32_t* accept_token_num;  // [B]
  const void* candidates;     // [B, D] (with the three below: contiguous, one index dtype)
  const void* retrive_index;
  const void* next_token;
  const void* next_sibling;
  bool idx64;
  const float* uniform_samples;  // [B, D]
  const float* uniform_final;    // [B]
  const void* target_probs;      // [B, D, V]
  int64_t target_stride0, target_stride1;
  void* draft_probs;  // [B, D, V]: a rejected child's entry is set to its target probability
  int64_t draft_stride0, draft_stride1;
  const void* target_predict;  // verify_tree_greedy: [B, D], contiguous
  int64_t num_target_predict;
  int64_t num_spec_step;  // S
  int64_t num_draft;      // D
  int64_t vocab;
  float threshold_single;
  float threshold_acc;  // at least 1e-9
};

SGL_DEVICE int64_t tree_link(const TreeParams& p, const void* links, int64_t b, int64_t node) {
  const int64_t next = load_index(links, p.idx64, b * p.num_draft + node);
  return next >= 0 && next < p.num_draft ? next : -1;
}

SGL_DEVICE void set_predict(const TreeParams& p, int64_t slot, int64_t token) {
  if (slot >= 0 && slot < p.num_predicts) p.predicts[slot] = static_cast<int32_t>(token);
}

struct WalkEnd {
  int64_t node;  // the last accepted node (local index), whose target row gives the last token
  int64_t slot;  // its retrive_index: where the last token goes in predicts
  bool bonus;    // every step accepted: the last token comes from the target alone
};

// The walk of tree_speculative_sampling_target_only (one thread): at each level, the children of the
// last accepted node in sibling order; child c (token t) is accepted when coin <= prob_acc /
// threshold_acc or target[node, t] >= threshold_single, where prob_acc sums target[node, t] over the
// children tried at this level and coin is uniform_samples[b, node]. A rejected child's draft_probs
// entry is set to its target probability, so that relu(target - draft) leaves it out.
template <typename T>
SGL_DEVICE WalkEnd tree_walk(const TreeParams& p, int64_t b) {
  const int64_t S = p.num_spec_step, D = p.num_draft;
  int64_t node = 0, slot = load_index(p.retrive_index, p.idx64, b * D);
  p.accept_index[b * S] = static_cast<int32_t>(slot);
  float coin = p.uniform_samples[b * D];
  float prob_acc = 0.f;
  int64_t accepted = 0;
  for (int64_t step = 1; step < S; ++step) {
    int64_t child = tree_link(p, p.next_token, b, node);
    const T* target = row_at<T>(p.target_probs, p.target_stride0, p.target_stride1, b, node);
    T* draft = static_cast<T*>(p.draft_probs) + b * p.draft_stride0 + node * p.draft_stride1;
    bool advanced = false;
    for (int64_t tries = 0; child != -1 && tries < D; ++tries) {
      const int64_t token = load_index(p.candidates, p.idx64, b * D + child);
      const bool valid = token >= 0 && token < p.vocab;
      const float single = valid ? dtype_trait<fp32_t>::from(target[token]) : 0.f;
      prob_acc = __fadd_rn(prob_acc, single);
      if (valid && (coin <= __fdiv_rn(prob_acc, p.threshold_acc) || single >= p.threshold_single)) {
        const int64_t child_slot = load_index(p.retrive_index, p.idx64, b * D + child);
        set_predict(p, slot, token);
        ++accepted;
        p.accept_index[b * S + accepted] = static_cast<int32_t>(child_slot);
        prob_acc = 0.f;
        node = child;
        slot = child_slot;
        coin = p.uniform_samples[b * D + child];
        advanced = true;
        break;
      }
      if (valid) draft[token] = target[token];
      child = tree_link(p, p.next_sibling, b, child);
    }
    if (!advanced) break;  // no child accepted at this level (or no child)
  }
  p.accept_token_num[b] = static_cast<int32_t>(accepted);
  return {node, slot, accepted == S - 1};
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads, 1) tree_kernel(const __grid_constant__ TreeParams p) {
  extern __shared__ uint64_t segments[];
  __shared__ SampleSmem smem;
  __shared__ WalkEnd s_end;
  const int64_t b = blockIdx.x;
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  if (threadIdx.x == 0) s_end = tree_walk<T>(p, b);
  __syncthreads();  // also makes thread 0's draft_probs writes visible to the CTA
  const WalkEnd end = s_end;
  const T* q = row_at<T>(p.target_probs, p.target_stride0, p.target_stride1, b, end.node);
  const T* d = end.bonus ? nullptr : row_at<T>(p.draft_probs, p.draft_stride0, p.draft_stride1, b, end.node);
  const int64_t token = sample_row<T, kVec>(q, d, p.vocab, coin_bits(p.uniform_final[b]), segments, smem);
  if (threadIdx.x == 0) set_predict(p, end.slot, token);
}

// verify_tree_greedy: the same walk, a child accepted when its token equals target_predict at the
// last accepted node's slot (target_predict read flat, as [B * D]); the last slot gets that argmax.
__global__ void greedy_kernel(const __grid_constant__ TreeParams p, int64_t batch) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kGreedyThreads + threadIdx.x;
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  if (b >= batch) return;
  const int64_t S = p.num_spec_step, D = p.num_draft;
  const auto target_at = [&](int64_t slot, int64_t& token) {
    if (slot < 0 || slot >= p.num_target_predict) return false;
    token = load_index(p.target_predict, p.idx64, slot);
    return true;
  };
  int64_t node = 0, slot = load_index(p.retrive_index, p.idx64, b * D);
  p.accept_index[b * S] = static_cast<int32_t>(slot);
  int64_t accepted = 0;
  for (int64_t step = 1; step < S; ++step) {
    int64_t child = tree_link(p, p.next_token, b, node);
    int64_t want = 0;
    const bool known = target_at(slot, want);
    bool advanced = false;
    for (int64_t tries = 0; child != -1 && tries < D; ++tries) {
      const int64_t token = load_index(p.candidates, p.idx64, b * D + child);
      if (known && token == want) {
        const int64_t child_slot = load_index(p.retrive_index, p.idx64, b * D + child);
        set_predict(p, slot, want);
        ++accepted;
        p.accept_index[b * S + accepted] = static_cast<int32_t>(child_slot);
        node = child;
        slot = child_slot;
        advanced = true;
        break;
      }
      child = tree_link(p, p.next_sibling, b, child);
    }
    if (!advanced) break;
  }
  p.accept_token_num[b] = static_cast<int32_t>(accepted);
  int64_t last = 0;
  if (target_at(slot, last)) set_predict(p, slot, last);
}

// ---------------------------------------------------------------------------------------------
// Launchers

// A row stride that is never used (a dimension of size 1) is 0: the vector test ignores it.
inline int64_t used_stride(tvm::ffi::TensorView t, int dim) {
  return t.size(dim) > 1 ? t.stride(dim) : 0;
}

template <typename T>
struct Speculative {
  static constexpr int64_t kE = Row<T, true>::kE;

  static bool vector_rows(tvm::ffi::TensorView t, int64_t vocab) {
    constexpr int64_t bytes = 16;
    const int64_t es = sizeof(T);
    return vocab % kE == 0 && reinterpret_cast<uintptr_t>(t.data_ptr()) % bytes == 0 &&
           (used_stride(t, 0) * es) % bytes == 0 && (used_stride(t, 1) * es) % bytes == 0;
  }

  static std::size_t segment_bytes(int64_t vocab) {
    return static_cast<std::size_t>(host::div_ceil(vocab, Row<T, true>::kTile) * kWarps * sizeof(uint64_t));
  }

  static void check_vocab(const char* op, int64_t vocab) {
    host::RuntimeCheck(
        vocab >= 1 && vocab <= kMaxVocab, op, ": vocab_size must be in [1, ", kMaxVocab, "], got ", vocab);
  }

  // A seed or offset tensor: int64 or uint64, [1] or [batch] (any stride), on the probabilities' device.
  static const uint64_t* philox_tensor(
      const tvm::ffi::Optional<tvm::ffi::TensorView>& t,
      const char* name,
      const char* length_name,
      int64_t batch,
      host::SymbolicDevice& device,
      int64_t& stride,
      bool& per_row) {
    using namespace host;
    stride = 0;
    if (!t.has_value()) return nullptr;
    auto length = SymbolicSize{length_name};
    length.set_options({1, batch});
    TensorMatcher({length}).with_strides({-1}).with_dtype<int64_t, uint64_t>().with_device<kDLCUDA>(device).verify(
        *t, name);
    const int64_t n = (*t).size(0);
    stride = n > 1 ? (*t).stride(0) : 0;
    per_row = per_row || n == batch;
    return static_cast<const uint64_t*>((*t).data_ptr());
  }

  static void chain(
      tvm::ffi::TensorView draft_probs,
      tvm::ffi::TensorView draft_token_ids,
      tvm::ffi::TensorView target_probs,
      tvm::ffi::TensorView output_token_ids,
      tvm::ffi::TensorView output_accepted_token_num,
      tvm::ffi::TensorView output_emitted_draft_token_num,
      tvm::ffi::Optional<tvm::ffi::TensorView> seed,
      tvm::ffi::Optional<tvm::ffi::TensorView> offset,
      int64_t seed_value,
      int64_t offset_value,
      bool add_accepted,
      bool add_emitted) {
    using namespace host;
    constexpr const char* op = "chain_speculative_sampling";
    auto B = SymbolicSize{"batch_size"};
    auto N = SymbolicSize{"num_speculate_tokens"};
    auto V = SymbolicSize{"vocab_size"};
    auto device = SymbolicDevice{};
    TensorMatcher({B, N, V})
        .with_strides({-1, -1, 1})
        .with_device<kDLCUDA>(device)
        .with_dtype<T>()
        .verify(draft_probs, "draft_probs");
    TensorMatcher({B, N}).with_dtype<int32_t, int64_t>().with_device<kDLCUDA>(device).verify(
        draft_token_ids, "draft_token_ids");
    TensorMatcher({B, -1, V})
        .with_strides({-1, -1, 1})
        .with_device<kDLCUDA>(device)
        .with_dtype<T>()
        .verify(target_probs, "target_probs");
    const int64_t batch = B.unwrap(), n = N.unwrap(), vocab = V.unwrap();
    RuntimeCheck(
        target_probs.size(1) == n + 1,
        op,
        ": target_probs must have num_speculate_tokens + 1 = ",
        n + 1,
        " distributions per request (dimension 1), got ",
        target_probs.size(1));
    TensorMatcher({B, n + 1})
        .with_dtype<int32_t>()
        .with_device<kDLCUDA>(device)
        .verify(output_token_ids, "output_token_ids");
    TensorMatcher({B}).with_dtype<int32_t, int64_t>().with_device<kDLCUDA>(device).verify(
        output_accepted_token_num, "output_accepted_token_num");
    TensorMatcher({B}).with_dtype<int32_t, int64_t>().with_device<kDLCUDA>(device).verify(
        output_emitted_draft_token_num, "output_emitted_draft_token_num");
    check_vocab(op, vocab);
    ChainParams p{};
    p.own_streams = false;
    p.seed = philox_tensor(seed, "seed", "seed_length", batch, device, p.seed_stride, p.own_streams);
    p.offset = philox_tensor(offset, "offset", "offset_length", batch, device, p.offset_stride, p.own_streams);
    if (batch == 0 || has_no_data(output_token_ids)) return;  // fake (torch.compile) calls end here
    p.seed_value = static_cast<uint64_t>(seed_value);
    p.offset_value = static_cast<uint64_t>(offset_value);
    p.draft_probs = draft_probs.data_ptr();
    p.draft_stride0 = used_stride(draft_probs, 0);
    p.draft_stride1 = used_stride(draft_probs, 1);
    p.target_probs = target_probs.data_ptr();
    p.target_stride0 = used_stride(target_probs, 0);
    p.target_stride1 = used_stride(target_probs, 1);
    p.draft_ids = draft_token_ids.data_ptr();
    p.ids64 = is_type<int64_t>(draft_token_ids.dtype());
    p.output_ids = static_cast<int32_t*>(output_token_ids.data_ptr());
    p.accepted = output_accepted_token_num.data_ptr();
    p.accepted64 = is_type<int64_t>(output_accepted_token_num.dtype());
    p.accepted_add = add_accepted;
    p.emitted_add = add_emitted;
    p.emitted = output_emitted_draft_token_num.data_ptr();
    p.emitted64 = is_type<int64_t>(output_emitted_draft_token_num.dtype());
    p.n = n;
    p.vocab = vocab;
    const bool vec = vector_rows(target_probs, vocab) && (n == 0 || vector_rows(draft_probs, vocab));
    const DLDevice dev = device.unwrap();
    const auto kernel = vec ? chain_kernel<T, true> : chain_kernel<T, false>;
    LaunchKernel(static_cast<uint32_t>(batch), kThreads, dev, segment_bytes(vocab))
        .enable_pdl(runtime::supports_pdl(dev.device_id))(kernel, p);
  }

  // The tree's index tensors: [B, D], contiguous, all of one dtype (int32 or int64).
  static void check_tree(
      tvm::ffi::TensorView predicts,
      tvm::ffi::TensorView accept_index,
      tvm::ffi::TensorView accept_token_num,
      tvm::ffi::TensorView candidates,
      tvm::ffi::TensorView retrive_index,
      tvm::ffi::TensorView retrive_next_token,
      tvm::ffi::TensorView retrive_next_sibling,
      host::SymbolicSize& B,
      host::SymbolicSize& D,
      host::SymbolicSize& S,
      host::SymbolicDevice& device,
      host::SymbolicDType& idx) {
    using namespace host;
    TensorMatcher({B, D})
        .with_dtype<int32_t, int64_t>(idx)
        .with_device<kDLCUDA>(device)
        .verify(candidates, "candidates")
        .verify(retrive_index, "retrive_index")
        .verify(retrive_next_token, "retrive_next_token")
        .verify(retrive_next_sibling, "retrive_next_sibling");
    TensorMatcher({-1}).with_dtype<int32_t>().with_device<kDLCUDA>(device).verify(predicts, "predicts");
    TensorMatcher({B, S}).with_dtype<int32_t>().with_device<kDLCUDA>(device).verify(accept_index, "accept_index");
    TensorMatcher({B}).with_dtype<int32_t>().with_device<kDLCUDA>(device).verify(accept_token_num, "accept_token_num");
  }

  static TreeParams tree_params(
      tvm::ffi::TensorView predicts,
      tvm::ffi::TensorView accept_index,
      tvm::ffi::TensorView accept_token_num,
      tvm::ffi::TensorView candidates,
      tvm::ffi::TensorView retrive_index,
      tvm::ffi::TensorView retrive_next_token,
      tvm::ffi::TensorView retrive_next_sibling,
      int64_t num_spec_step,
      int64_t num_draft) {
    TreeParams p{};
    p.predicts = static_cast<int32_t*>(predicts.data_ptr());
    p.num_predicts = predicts.size(0);
    p.accept_index = static_cast<int32_t*>(accept_index.data_ptr());
    p.accept_token_num = static_cast<int32_t*>(accept_token_num.data_ptr());
    p.candidates = candidates.data_ptr();
    p.retrive_index = retrive_index.data_ptr();
    p.next_token = retrive_next_token.data_ptr();
    p.next_sibling = retrive_next_sibling.data_ptr();
    p.idx64 = host::is_type<int64_t>(candidates.dtype());
    p.num_spec_step = num_spec_step;
    p.num_draft = num_draft;
    return p;
  }

  static void tree(
      tvm::ffi::TensorView predicts,
      tvm::ffi::TensorView accept_index,
      tvm::ffi::TensorView accept_token_num,
      tvm::ffi::TensorView candidates,
      tvm::ffi::TensorView retrive_index,
      tvm::ffi::TensorView retrive_next_token,
      tvm::ffi::TensorView retrive_next_sibling,
      tvm::ffi::TensorView uniform_samples,
      tvm::ffi::TensorView uniform_samples_for_final_sampling,
      tvm::ffi::TensorView target_probs,
      tvm::ffi::TensorView draft_probs,
      double threshold_single,
      double threshold_acc) {
    using namespace host;
    constexpr const char* op = "tree_speculative_sampling_target_only";
    auto B = SymbolicSize{"batch_size"};
    auto D = SymbolicSize{"num_draft_tokens"};
    auto S = SymbolicSize{"num_spec_step"};
    auto V = SymbolicSize{"vocab_size"};
    auto device = SymbolicDevice{};
    auto idx = SymbolicDType{};
    check_tree(
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        B,
        D,
        S,
        device,
        idx);
    TensorMatcher({B, D}).with_dtype<fp32_t>().with_device<kDLCUDA>(device).verify(uniform_samples, "uniform_samples");
    TensorMatcher({B}).with_dtype<fp32_t>().with_device<kDLCUDA>(device).verify(
        uniform_samples_for_final_sampling, "uniform_samples_for_final_sampling");
    TensorMatcher({B, D, V})
        .with_strides({-1, -1, 1})
        .with_device<kDLCUDA>(device)
        .with_dtype<T>()
        .verify(target_probs, "target_probs")
        .verify(draft_probs, "draft_probs");
    RuntimeCheck(
        threshold_single >= 0 && threshold_single <= 1,
        op,
        ": threshold_single must be in [0, 1], got ",
        threshold_single);
    RuntimeCheck(
        threshold_acc >= 0 && threshold_acc <= 1, op, ": threshold_acc must be in [0, 1], got ", threshold_acc);
    RuntimeCheck(S.unwrap() >= 1, op, ": accept_index must have at least one column (num_spec_step), got 0");
    RuntimeCheck(D.unwrap() >= 1, op, ": the tree must have at least one node (num_draft_tokens), got 0");
    const int64_t batch = B.unwrap(), vocab = V.unwrap();
    check_vocab(op, vocab);
    if (batch == 0 || has_no_data(predicts)) return;  // fake (torch.compile) calls end here
    TreeParams p = tree_params(
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        S.unwrap(),
        D.unwrap());
    p.uniform_samples = static_cast<const float*>(uniform_samples.data_ptr());
    p.uniform_final = static_cast<const float*>(uniform_samples_for_final_sampling.data_ptr());
    p.target_probs = target_probs.data_ptr();
    p.target_stride0 = used_stride(target_probs, 0);
    p.target_stride1 = used_stride(target_probs, 1);
    p.draft_probs = draft_probs.data_ptr();
    p.draft_stride0 = used_stride(draft_probs, 0);
    p.draft_stride1 = used_stride(draft_probs, 1);
    p.vocab = vocab;
    p.threshold_single = static_cast<float>(threshold_single);
    p.threshold_acc = std::max(static_cast<float>(threshold_acc), 1e-9f);
    const bool vec = vector_rows(target_probs, vocab) && vector_rows(draft_probs, vocab);
    const DLDevice dev = device.unwrap();
    const auto kernel = vec ? tree_kernel<T, true> : tree_kernel<T, false>;
    LaunchKernel(static_cast<uint32_t>(batch), kThreads, dev, segment_bytes(vocab))
        .enable_pdl(runtime::supports_pdl(dev.device_id))(kernel, p);
  }

  static void greedy(
      tvm::ffi::TensorView predicts,
      tvm::ffi::TensorView accept_index,
      tvm::ffi::TensorView accept_token_num,
      tvm::ffi::TensorView candidates,
      tvm::ffi::TensorView retrive_index,
      tvm::ffi::TensorView retrive_next_token,
      tvm::ffi::TensorView retrive_next_sibling,
      tvm::ffi::TensorView target_predict) {
    using namespace host;
    constexpr const char* op = "verify_tree_greedy";
    auto B = SymbolicSize{"batch_size"};
    auto D = SymbolicSize{"num_draft_tokens"};
    auto S = SymbolicSize{"num_spec_step"};
    auto device = SymbolicDevice{};
    auto idx = SymbolicDType{};
    check_tree(
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        B,
        D,
        S,
        device,
        idx);
    TensorMatcher({B, D}).with_dtype<int32_t, int64_t>(idx).with_device<kDLCUDA>(device).verify(
        target_predict, "target_predict");
    RuntimeCheck(S.unwrap() >= 1, op, ": accept_index must have at least one column (num_spec_step), got 0");
    RuntimeCheck(D.unwrap() >= 1, op, ": the tree must have at least one node (num_draft_tokens), got 0");
    const int64_t batch = B.unwrap();
    if (batch == 0 || has_no_data(predicts)) return;  // fake (torch.compile) calls end here
    TreeParams p = tree_params(
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        S.unwrap(),
        D.unwrap());
    p.target_predict = target_predict.data_ptr();
    p.num_target_predict = batch * D.unwrap();
    const DLDevice dev = device.unwrap();
    LaunchKernel(static_cast<uint32_t>(div_ceil(batch, int64_t{kGreedyThreads})), kGreedyThreads, dev)
        .enable_pdl(runtime::supports_pdl(dev.device_id))(greedy_kernel, p, batch);
  }
};

}  // namespace jit_kernel::speculative
