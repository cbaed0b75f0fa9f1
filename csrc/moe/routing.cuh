// MoE routing: the top-k experts of each token from the router's logits, one warp per token.
//
// Scores: softmax over all experts (kSoftmax) or an elementwise sigmoid, computed in fp32 (expf, IEEE
// division). The weights are the scores of the chosen experts.
//
// Choice: with a correction bias (DeepSeek-V3), experts are ranked by `score + correction_bias[e]`;
// without one, by their logits (both scoring functions are increasing, so this is the order of the
// scores, without the ties that rounding the scores to fp32 would make). Grouped routing (num_groups > 1
// and topk_group < num_groups): the experts are num_groups contiguous groups; a group's rank is its best
// value, or with a bias the sum of its two best values (its one value in a group of one); only experts of
// the topk_group best groups are chosen. The top-k experts then come in descending rank. Among equal
// ranks the lowest index wins, for groups and for experts, and NaN ranks above everything (as in
// torch.topk). The weights are optionally divided by their sum (renormalize) and multiplied by `scale`
// (routed_scaling_factor).
//
// Layout: lane l holds experts l, l + 32, l + 64, ... (kVPT values per lane, experts <= 32 * kVPT), all
// in registers; the loads of one step are 32 consecutive logits. Each lane sorts its candidates once;
// each pick is then one `redux.sync` over the lanes' heads and a shift of the owner's list. bf16 logits
// without a bias rank by the logit itself, whose 16 bits and the expert's fit one 32-bit word: the best
// word names its expert and lane. Otherwise words are 64-bit (key, expert) and a pick reduces the key
// alone, its weight and expert reaching lane r by shuffles off the next pick's path; ties between
// lanes, found by a ballot off that path, redo the picks with a second `redux.sync` that takes the
// lowest expert. At one warp per token the latency is the chain of dependent instructions, warp-wide
// round trips among them, so the picks and the group scores keep ballots off it. Grouped routing with
// groups of 32 experts scores the groups in registers (value j of every lane is group j): a
// `redux.sync` per group, or with a bias, which sums a group's two best, shuffles that halve the groups
// a lane holds each round. Other group sizes stage the ranks in shared memory, where several lanes
// score each group. A group is kept when fewer than topk_group groups rank above it. No global scratch;
// one launch.
#pragma once

#include <sgl_kernel/runtime.cuh>
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace jit_kernel::moe {

inline constexpr int kWarpsPerBlock = 4;
inline constexpr int kMaxExperts = 512;
inline constexpr int kMaxGroups = 32;
inline constexpr int kMaxTopk = 32;
// The top-k compiled in (DeepSeek-V3, Kimi-K2, Qwen3-MoE): unrolled, the picks' lane == r selects are
// constant and each pick's shuffles overlap the next one's redux (12% off DeepSeek-V3 routing at 16
// tokens, 26% at 1,024, on the H100). Other top-k take the loop.
inline constexpr int kUnrolledTopk = 8;
inline constexpr unsigned kFull = 0xffffffffu;
// Grids of at most this many CTAs per SM trigger their PDL dependents at the start (RouteParams).
inline constexpr uint32_t kEarlyTriggerCtasPerSm = 4;

// A float as an unsigned integer of the same order (-inf < ... < 0 < ... < +inf < NaN; the two zeros and
// all NaNs are equal); 0 is below every float and marks "no candidate".
SGL_DEVICE uint32_t order_key(float v) {
  const uint32_t b = __float_as_uint(v + 0.f);  // -0 + 0 is +0: the two zeros tie
  const uint32_t key = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return v != v ? 0xffffffffu : key;  // selects, not branches: this runs per candidate
}

// The float of an order key (NaN for the key of NaN).
SGL_DEVICE float key_value(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// 1 / d correctly rounded for d in [1, 2^125) (the fast path of IEEE rcp.rn: an approximation and one
// Newton step), without the range test and slow-path branch of __frcp_rn: straight-line code that the
// compiler interleaves across a lane's values.
SGL_DEVICE float rcp_rn_moderate(float d) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  const float e = fmaf(d, r, -1.f);
  return fmaf(r, -e, r);
}

SGL_DEVICE float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFull, v, offset);
  return v;
}

// Batcher's odd-even merge sort network for kN (a power of two) values: 19 compare-exchanges for 8
// values where odd-even transposition takes 28. Built at compile time, so that every index of the
// sort is a constant (the arrays stay in registers).
template <int kN>
struct MergeSortNetwork {
  static_assert(kN > 0 && (kN & (kN - 1)) == 0, "a power of two");
  template <typename Visit>
  static constexpr void visit(Visit&& visit) {
    for (int p = 1; p < kN; p *= 2) {
      for (int k = p; k >= 1; k /= 2) {
        for (int j = k % p; j + k < kN; j += 2 * k) {
          for (int i = 0; i < k && i + j + k < kN; ++i) {
            if ((i + j) / (2 * p) == (i + j + k) / (2 * p)) visit(i + j, i + j + k);
          }
        }
      }
    }
  }
  static constexpr int kSize = [] {
    int n = 0;
    visit([&](int, int) { ++n; });
    return n;
  }();
  static constexpr std::array<std::array<int, 2>, kSize> kPairs = [] {
    std::array<std::array<int, 2>, kSize> pairs{};
    int n = 0;
    visit([&](int a, int b) { pairs[n++] = {a, b}; });
    return pairs;
  }();
};

// Sorts v (and w with it) best first (a larger word first), branch-free.
template <int kN, typename Word, std::size_t... kI>
SGL_DEVICE void sort_descending(Word (&v)[kN], float (&w)[kN], std::index_sequence<kI...>) {
  const auto exchange = [&]<int kA, int kB>() {
    const bool keep = v[kA] > v[kB];
    const Word hi = keep ? v[kA] : v[kB];
    const Word lo = keep ? v[kB] : v[kA];
    const float whi = keep ? w[kA] : w[kB];
    const float wlo = keep ? w[kB] : w[kA];
    v[kA] = hi;
    v[kB] = lo;
    w[kA] = whi;
    w[kB] = wlo;
  };
  (exchange.template operator()<MergeSortNetwork<kN>::kPairs[kI][0], MergeSortNetwork<kN>::kPairs[kI][1]>(), ...);
}

template <int kN, typename Word>
SGL_DEVICE void sort_descending(Word (&v)[kN], float (&w)[kN]) {
  sort_descending(v, w, std::make_index_sequence<MergeSortNetwork<kN>::kSize>{});
}

// The two best keys of each of kN arrays over the warp (lane l holds element l of every array; the second
// is the best of the rest once one holder of the best is left out), by a transposing shuffle reduction:
// while a lane holds several arrays, each round halves them (it keeps one half, sends the other to its
// partner lane ^ offset and merges what it receives). 32 lanes reduce 8 arrays in 4 + 2 + 1 + 1 + 1
// rounds of two shuffles, where a redux.sync and a ballot per array wait on each other. Lane l ends
// with the array whose index is its bits 4, 3, ... read from the top (lane_of: a lane that holds h).
template <int kN>
struct TopTwo {
  static_assert(kN > 0 && kN <= 32 && (kN & (kN - 1)) == 0, "a power of two up to 32");
  static constexpr int kLog2 = std::countr_zero(static_cast<unsigned>(kN));
  static constexpr int lane_of(int h) {
    int lane = 0;
    for (int k = 0; k < kLog2; ++k) lane |= ((h >> (kLog2 - 1 - k)) & 1) << (4 - k);
    return lane;
  }

  // The multiset union's two best: (first, second) merged with (other_first, other_second).
  SGL_DEVICE static void merge(uint32_t& first, uint32_t& second, uint32_t other_first, uint32_t other_second) {
    second = max(min(first, other_first), max(second, other_second));
    first = max(first, other_first);
  }

  template <int kM = kN, int kOffset = 16>
  SGL_DEVICE static void reduce(uint32_t (&first)[kN], uint32_t (&second)[kN], uint32_t lane) {
    if constexpr (kOffset > 0) {
      constexpr int kHalf = kM > 1 ? kM / 2 : 1;
      const bool upper = kM > 1 && (lane & kOffset);
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        constexpr int kOther = kM > 1 ? kHalf : 0;  // the index paired with i (i itself once one is left)
        const uint32_t lo_first = first[i], hi_first = first[i + kOther];
        const uint32_t lo_second = second[i], hi_second = second[i + kOther];
        const uint32_t other_first = __shfl_xor_sync(kFull, upper ? lo_first : hi_first, kOffset);
        const uint32_t other_second = __shfl_xor_sync(kFull, upper ? lo_second : hi_second, kOffset);
        first[i] = upper ? hi_first : lo_first;
        second[i] = upper ? hi_second : lo_second;
        merge(first[i], second[i], other_first, other_second);
      }
      reduce<kHalf, kOffset / 2>(first, second, lane);
    }
  }
};

struct RouteParams {
  float* weights;      // [tokens, topk]
  int32_t* ids;        // [tokens, topk]
  const void* logits;  // [tokens, experts], row stride `stride`
  const void* bias;    // [experts] or nullptr
  int64_t stride;
  int64_t tokens;
  int experts;
  int topk;
  int groups;
  int topk_group;
  bool bias_fp32;
  bool renormalize;
  // PDL: the next kernel may launch at this grid's start (it waits for this grid to finish before it
  // reads), else once the scores and groups are done. Early hides more of the next launch, but the next
  // kernel's CTAs then wait beside this grid's warps. On the H100, early took 0.17-0.19 us off
  // 256-expert routing at 1-128 tokens (0.12-0.15 us slower for 128 experts without a bias), was as fast or
  // faster at 1,024-2,048 tokens, and up to 28% slower at 4,096 (1,024 CTAs).
  bool early_trigger;
  float scale;
};

// kShortKeys: 32-bit candidate words (see the pick stage); only for bf16 logits without a bias.
// kTopk: the top-k when compiled in (kUnrolledTopk), 0 when read from p.
template <typename T, int kVPT, bool kSoftmax, bool kShortKeys, int kTopk>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) route_kernel(const RouteParams p) {
  static_assert(!kShortKeys || std::is_same_v<T, bf16_t>, "short keys hold bf16 ranks only");
  static_assert(kVPT <= 32, "the taken / excluded masks hold 32 bits");
  __shared__ float staged[kWarpsPerBlock][kMaxExperts];
  __shared__ uint32_t group_score[kWarpsPerBlock][kMaxGroups];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  const bool has_bias = p.bias != nullptr;
  const int topk = kTopk > 0 ? kTopk : p.topk;
  constexpr int kPickUnroll = kTopk > 0 ? kTopk : 1;  // the run-time top-k keeps its loop
  device::PDLWaitPrimary();
  if (p.early_trigger) device::PDLTriggerSecondary();
  if (token >= p.tokens) return;
  const T* row = static_cast<const T*>(p.logits) + token * p.stride;

  // Every load is issued before any is used: converting each value as it came let the register
  // allocator give a later load the register of an earlier one's value, and the later load then waited
  // a whole memory round trip for it.
  T raw[kVPT];
  float bias[kVPT];  // loaded with the logits: one memory round trip for both
#pragma unroll
  for (int j = 0; j < kVPT; ++j) raw[j] = j * 32 + lane < p.experts ? row[j * 32 + lane] : T{};
#pragma unroll
  for (int j = 0; j < kVPT; ++j) {
    const int e = j * 32 + lane;
    bias[j] = !has_bias || e >= p.experts ? 0.f
              : p.bias_fp32               ? static_cast<const float*>(p.bias)[e]
                                          : dtype_trait<fp32_t>::from(static_cast<const T*>(p.bias)[e]);
  }
  float score[kVPT];  // the score (the weight)
  float rank[kVPT];   // what the choice compares
  uint32_t out = 0;   // bit j: expert j * 32 + lane cannot be chosen (absent or in a dropped group)
#pragma unroll
  for (int j = 0; j < kVPT; ++j) {
    const bool absent = j * 32 + lane >= p.experts;
    score[j] = absent ? -INFINITY : dtype_trait<fp32_t>::from(raw[j]);
    out |= static_cast<uint32_t>(absent) << j;
    rank[j] = score[j];
  }
  if constexpr (kSoftmax) {
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < kVPT; ++j) m = fmaxf(m, score[j]);
    m = key_value(__reduce_max_sync(kFull, order_key(m)));
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      score[j] = (out >> j) & 1u ? 0.f : expf(score[j] - m);
      s += score[j];
    }
    // Renormalised weights without a bias need no softmax denominator: it cancels in the division by
    // the chosen weights' sum. Otherwise (the bias adds to probabilities) divide by it.
    if (!p.renormalize || has_bias) {
      const float total = warp_sum(s);
#pragma unroll
      for (int j = 0; j < kVPT; ++j) score[j] = score[j] / total;
    }
  } else {
    // sigmoid = 1 / (1 + exp(-x)), IEEE: the denominator is >= 1; from 2^125 (x < -86.6, or -inf) the
    // lane takes __frcp_rn's full path (rare: one branch per lane, not one per value).
    float denom[kVPT];
    bool huge = false;
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      denom[j] = 1.f + expf(-score[j]);
      huge |= denom[j] >= 0x1p125f && !((out >> j) & 1u);  // an absent expert's score is never read
      score[j] = rcp_rn_moderate(denom[j]);
    }
    if (huge) {
#pragma unroll
      for (int j = 0; j < kVPT; ++j) score[j] = __frcp_rn(denom[j]);
    }
  }
  if (has_bias) {
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      if (!((out >> j) & 1u)) rank[j] = score[j] + bias[j];
    }
  }

  const bool grouped = p.groups > 1 && p.topk_group < p.groups;
  if (grouped && p.experts == p.groups * 32) {
    // Groups of 32 experts: lane l's value j (expert j * 32 + l) is in group j. Without a bias a group's key
    // is its best key, one redux.sync (independent across groups); with one, the sum of its two best,
    // from TopTwo's shuffles, then gathered by every lane.
    uint32_t group_key[kVPT];  // warp-uniform
    uint32_t mine = 0;         // lane g: group g's key
    uint32_t first[kVPT], second[kVPT];
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      first[j] = (out >> j) & 1u ? 0u : order_key(rank[j]);
      second[j] = 0u;
    }
    if (has_bias) {
      TopTwo<kVPT>::reduce(first, second, lane);
      const uint32_t key = order_key(key_value(first[0]) + key_value(second[0]));
#pragma unroll
      for (int h = 0; h < kVPT; ++h) group_key[h] = __shfl_sync(kFull, key, TopTwo<kVPT>::lane_of(h));
      mine = __shfl_sync(kFull, key, TopTwo<kVPT>::lane_of(lane % kVPT));  // with the others, not after
    } else {
#pragma unroll
      for (int j = 0; j < kVPT; ++j) group_key[j] = __reduce_max_sync(kFull, first[j]);
#pragma unroll
      for (int j = 0; j < kVPT; ++j) mine = lane == j ? group_key[j] : mine;
    }
    // Lane g keeps group g when fewer than topk_group groups rank above it (a larger key, or an equal key
    // and a lower index). Bitwise, not short-circuit: the terms are independent selects, not branches.
    int above = 0;
#pragma unroll
    for (int h = 0; h < kVPT; ++h) {
      const bool better = (group_key[h] > mine) | ((group_key[h] == mine) & (h < lane));
      above += static_cast<int>(h < p.groups) & static_cast<int>(better);
    }
    const uint32_t kept = __ballot_sync(kFull, lane < p.groups && above < p.topk_group);
    out |= ~kept;  // bit j: group j
  } else if (grouped) {
    const int per_group = p.experts / p.groups;
    // e / per_group without an integer division per expert: (e + 0.5) / per_group is at least
    // 0.5 / per_group >= 1 / 1024 away from an integer, far beyond the product's rounding (< 1e-4).
    const float inv_per_group = 1.f / static_cast<float>(per_group);
    const auto group_of = [&](int e) { return static_cast<int>((static_cast<float>(e) + 0.5f) * inv_per_group); };
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      const int e = j * 32 + lane;
      if (e < p.experts) staged[warp][e] = rank[j];
    }
    __syncwarp();
    // `lanes` lanes (a power of two) score each group: each its share, then a merge of the pairs.
    const int lanes_log2 = 31 - __clz(32 / p.groups);
    const int lanes = 1 << lanes_log2;
    const int g = lane >> lanes_log2;
    float first = -INFINITY, second = -INFINITY;
    if (g < p.groups) {
      const float* values = &staged[warp][g * per_group];
#pragma unroll 4
      for (int i = lane & (lanes - 1); i < per_group; i += lanes) {
        const float v = values[i];
        if (!(v <= first)) {  // NaN ranks first
          second = first;
          first = v;
        } else if (!(v <= second)) {
          second = v;
        }
      }
    }
    for (int offset = lanes / 2; offset > 0; offset >>= 1) {
      const float f = __shfl_xor_sync(kFull, first, offset);
      const float s = __shfl_xor_sync(kFull, second, offset);
      second = fmaxf(fminf(first, f), fmaxf(second, s));
      first = fmaxf(first, f);
    }
    const float group_rank = has_bias && per_group > 1 ? first + second : first;
    if (g < p.groups && (lane & (lanes - 1)) == 0) group_score[warp][g] = order_key(group_rank);
    __syncwarp();
    // Lane g keeps group g when fewer than topk_group groups rank above it (a larger key, or an equal
    // key and a lower index): one pass over the group keys instead of topk_group picks.
    bool keep = false;
    if (lane < p.groups) {
      const uint32_t mine = group_score[warp][lane];
      int above = 0;
#pragma unroll 8
      for (int h = 0; h < p.groups; ++h) {
        const uint32_t other = group_score[warp][h];
        above += other > mine || (other == mine && h < lane);
      }
      keep = above < p.topk_group;
    }
    const uint32_t kept = __ballot_sync(kFull, keep);
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      const int e = j * 32 + lane;
      if (e < p.experts && !((kept >> group_of(e)) & 1u)) out |= 1u << j;
    }
  }
  if (!p.early_trigger) device::PDLTriggerSecondary();

  // This lane's candidates as one word each, a larger word ranking first (word 0: not a candidate):
  // key << 32 | ~expert (a larger key, then a lower expert), or with kShortKeys the key's top 16 bits
  // << 16 | ~expert's low 16 bits in 32 bits: exact when the ranks are bf16 logits (no bias), whose
  // order keys differ in their top 16 bits only. Sorted best first once (Batcher's odd-even merge
  // sort, branch-free); a pick then takes the head of the owner's list and shifts it by one: no rescan
  // on the picks' critical path.
  using Word = std::conditional_t<kShortKeys, uint32_t, uint64_t>;
  Word cand[kVPT];
  float weight[kVPT];  // cand's weights, moved with them
#pragma unroll
  for (int j = 0; j < kVPT; ++j) {
    weight[j] = score[j];
    const uint32_t expert = j * 32 + lane;
    Word word;
    if constexpr (kShortKeys) {
      word = (order_key(rank[j]) & 0xffff0000u) | (~expert & 0xffffu);
    } else {
      word = (static_cast<uint64_t>(order_key(rank[j])) << 32) | ~expert;
    }
    cand[j] = (out >> j) & 1u ? Word{0} : word;  // order keys are never 0
  }
  sort_descending(cand, weight);
  float chosen_weight = 0.f;  // lane r keeps the r-th choice
  int chosen_id = 0;
  float total = 0.f;  // the chosen weights' sum, in rank order
  if constexpr (kShortKeys) {
    // Words are unique: the best one names its expert, and so its lane. A pick is one redux.sync, one
    // shuffle for the weight, and a shift of the owner's list.
#pragma unroll kPickUnroll
    for (int r = 0; r < topk; ++r) {
      const uint32_t best = __reduce_max_sync(kFull, cand[0]);
      const int id = static_cast<int>(~best & 0xffffu);
      const int owner = id & 31;
      const float w = __shfl_sync(kFull, weight[0], owner);
      total += w;
      if (lane == r) {
        chosen_weight = w;
        chosen_id = id;
      }
      if (lane == owner) {
#pragma unroll
        for (int i = 0; i + 1 < kVPT; ++i) {
          cand[i] = cand[i + 1];
          weight[i] = weight[i + 1];
        }
        cand[kVPT - 1] = 0u;
      }
    }
  } else {
    // 64-bit words: each pick runs on the key alone, as if keys were unique: one redux.sync, and the lane
    // holding the best key owns it and shifts its list (selects, no branch). A ballot per pick, off that
    // path (its round trip would double a pick's), notes whether another lane held the same key. If one did
    // (rare), the picks are redone from the sorted lists with the exact rule: among the holders, the lane
    // of the lowest expert (a second redux.sync). Keys never run out (topk <= the candidates), so the best
    // key is a candidate's.
    const auto pick_all = [&]<bool kExact>() -> bool {
      Word c[kVPT];
      float w[kVPT];
#pragma unroll
      for (int i = 0; i < kVPT; ++i) {
        c[i] = cand[i];
        w[i] = weight[i];
      }
      uint32_t tied = 0;
      float sum = 0.f, my_weight = 0.f;
      int my_id = 0;
#pragma unroll kPickUnroll
      for (int r = 0; r < topk; ++r) {
        const uint32_t key = static_cast<uint32_t>(c[0] >> 32);
        const uint32_t expert = ~static_cast<uint32_t>(c[0]);
        bool owner = key == __reduce_max_sync(kFull, key);
        const uint32_t holders = __ballot_sync(kFull, owner);
        const bool sole = (holders & (holders - 1)) == 0;
        if constexpr (kExact) {
          if (!sole) {  // warp-uniform; every lane takes part in the redux
            const uint32_t lowest = __reduce_min_sync(kFull, owner ? expert : 0xffffffffu);
            owner = owner && expert == lowest;
          }
        } else {
          tied |= !sole;
        }
        // The pick's weight and expert reach every lane by shuffles from the owner (a tied pass takes
        // the lowest holder's and is redone); they wait for the ballot, the next pick does not.
        const int from = __ffs(kExact ? __ballot_sync(kFull, owner) : holders) - 1;
        const float picked_weight = __shfl_sync(kFull, w[0], from);
        const int picked_id = __shfl_sync(kFull, static_cast<int>(expert), from);
        sum += picked_weight;
        my_weight = lane == r ? picked_weight : my_weight;
        my_id = lane == r ? picked_id : my_id;
#pragma unroll
        for (int i = 0; i + 1 < kVPT; ++i) {
          c[i] = owner ? c[i + 1] : c[i];
          w[i] = owner ? w[i + 1] : w[i];
        }
        c[kVPT - 1] = owner ? Word{0} : c[kVPT - 1];
      }
      total = sum;
      chosen_weight = my_weight;
      chosen_id = my_id;
      return tied != 0;
    };
    if (pick_all.template operator()<false>()) pick_all.template operator()<true>();
  }
  const float factor = p.renormalize && total > 0.f ? p.scale / total : p.scale;
  if (lane < topk) {
    p.weights[token * topk + lane] = chosen_weight * factor;
    p.ids[token * topk + lane] = chosen_id;
  }
}

// The launcher of every routing op: topk_softmax, topk_sigmoid and grouped_topk.
template <typename T>
struct MoeRoute {
  static void route(
      tvm::ffi::TensorView weights,
      tvm::ffi::TensorView ids,
      tvm::ffi::TensorView gating_output,
      tvm::ffi::Optional<tvm::ffi::TensorView> correction_bias,
      bool softmax,
      bool renormalize,
      int64_t num_expert_group,
      int64_t topk_group,
      double routed_scaling_factor,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    auto N = SymbolicSize{"num_tokens"};
    auto E = SymbolicSize{"num_experts"};
    auto K = SymbolicSize{"topk"};
    auto device = SymbolicDevice{};
    TensorMatcher::cuda_rows<T>({N, E}, device).verify(gating_output, "gating_output");
    TensorMatcher({N, K}).with_device<kDLCUDA>(device).with_dtype<fp32_t>().verify(weights, "topk_weights");
    TensorMatcher({N, K}).with_device<kDLCUDA>(device).with_dtype<int32_t>().verify(ids, "topk_ids");
    const int64_t experts = E.unwrap();
    const int64_t topk = K.unwrap();
    RuntimeCheck(
        experts >= 1 && experts <= kMaxExperts,
        "moe routing: gating_output must have 1 to ",
        kMaxExperts,
        " experts (columns), got ",
        experts);
    RuntimeCheck(
        topk >= 1 && topk <= kMaxTopk && topk <= experts,
        "moe routing: topk must be in [1, min(",
        kMaxTopk,
        ", experts = ",
        experts,
        ")], got ",
        topk);
    RuntimeCheck(
        num_expert_group >= 1 && num_expert_group <= kMaxGroups && experts % num_expert_group == 0,
        "moe routing: num_expert_group must be in [1, ",
        kMaxGroups,
        "] and divide the experts (",
        experts,
        "), got ",
        num_expert_group);
    RuntimeCheck(
        topk_group >= 1 && topk_group <= num_expert_group,
        "moe routing: topk_group must be in [1, num_expert_group = ",
        num_expert_group,
        "], got ",
        topk_group);
    RuntimeCheck(
        topk <= topk_group * (experts / num_expert_group),
        "moe routing: topk (",
        topk,
        ") exceeds the experts of topk_group groups (",
        topk_group * (experts / num_expert_group),
        ")");
    RuntimeCheck(
        std::isfinite(routed_scaling_factor),
        "moe routing: routed_scaling_factor must be finite, got ",
        routed_scaling_factor);
    const void* bias = nullptr;
    bool bias_fp32 = true;
    if (correction_bias.has_value()) {
      TensorMatcher({E}).with_device<kDLCUDA>(device).with_dtype<fp32_t, T>().verify(
          *correction_bias, "correction_bias");
      bias = (*correction_bias).data_ptr();
      bias_fp32 = is_type<fp32_t>((*correction_bias).dtype());
    }
    const int64_t tokens = N.unwrap();
    RuntimeCheck(tokens < (int64_t{1} << 31) * kWarpsPerBlock, "moe routing: too many tokens: ", tokens);
    if (tokens == 0 || has_no_data(weights)) return;  // nothing to do, or a fake call's checks alone
    const DLDevice dev = device.unwrap();
    const auto grid = static_cast<uint32_t>(div_ceil(tokens, int64_t{kWarpsPerBlock}));
    const RouteParams p{
        static_cast<float*>(weights.data_ptr()),
        static_cast<int32_t*>(ids.data_ptr()),
        gating_output.data_ptr(),
        bias,
        gating_output.stride(0),
        tokens,
        static_cast<int>(experts),
        static_cast<int>(topk),
        static_cast<int>(num_expert_group),
        static_cast<int>(topk_group),
        bias_fp32,
        renormalize,
        grid <= kEarlyTriggerCtasPerSm * runtime::sm_count(dev.device_id),
        static_cast<float>(routed_scaling_factor)};
    const bool pdl = runtime::resolve_pdl(enable_pdl, dev.device_id);
    auto go = [&](auto kernel) { LaunchKernel(grid, kWarpsPerBlock * 32, dev).enable_pdl(pdl)(kernel, p); };
    if (softmax) {
      dispatch<true>(experts, topk, bias == nullptr, go);
    } else {
      dispatch<false>(experts, topk, bias == nullptr, go);
    }
  }

 private:
  // Values per lane: the expert count rounded up to 32, 64, 128, 256 or 512.
  template <bool kSoftmax, bool kShortKeys, int kTopk, typename Go>
  static void dispatch(int64_t experts, Go&& go) {
    if (experts <= 32) {
      go(route_kernel<T, 1, kSoftmax, kShortKeys, kTopk>);
    } else if (experts <= 64) {
      go(route_kernel<T, 2, kSoftmax, kShortKeys, kTopk>);
    } else if (experts <= 128) {
      go(route_kernel<T, 4, kSoftmax, kShortKeys, kTopk>);
    } else if (experts <= 256) {
      go(route_kernel<T, 8, kSoftmax, kShortKeys, kTopk>);
    } else {
      go(route_kernel<T, 16, kSoftmax, kShortKeys, kTopk>);
    }
  }
  template <bool kSoftmax, bool kShortKeys, typename Go>
  static void dispatch(int64_t experts, int64_t topk, Go&& go) {
    if (topk == kUnrolledTopk) {
      dispatch<kSoftmax, kShortKeys, kUnrolledTopk>(experts, go);
    } else {
      dispatch<kSoftmax, kShortKeys, 0>(experts, go);
    }
  }
  template <bool kSoftmax, typename Go>
  static void dispatch(int64_t experts, int64_t topk, bool short_keys, Go&& go) {
    if constexpr (std::is_same_v<T, bf16_t>) {
      if (short_keys) {
        dispatch<kSoftmax, true>(experts, topk, go);
        return;
      }
    }
    dispatch<kSoftmax, false>(experts, topk, go);
  }
};

}  // namespace jit_kernel::moe
