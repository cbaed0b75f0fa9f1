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
// Layout: lane l holds experts l * kVPT ... l * kVPT + kVPT - 1 (kVPT values per lane, experts <= 32 * kVPT),
// all in registers, loaded as whole vectors when the rows allow (RoutePlan). Each lane sorts its
// candidates once; each pick is then one `redux.sync` over the lanes' heads and a shift of the owner's
// list. bf16 logits without a bias rank by the logit itself, whose 16 bits and the expert's fit one
// 32-bit word: the best word names its expert and lane. Otherwise words are 64-bit (key, expert) and a
// pick reduces the key alone, its weight and expert reaching lane r by shuffles off the next pick's
// path; ties between lanes, found by a ballot off that path, redo the picks with a second `redux.sync`
// that takes the lowest expert. At one warp per token the latency is the chain of dependent
// instructions, warp-wide round trips and instruction fetches among them: the picks keep ballots off
// it, rare paths (ties, huge sigmoid denominators) are out-of-line calls, and the common rows run a
// kernel compiled without the general one's code. Grouped routing where a group is whole lanes
// (DeepSeek-V3: 32 experts, 4 lanes): a group's rank merges its lanes' two best by shuffles, which
// overlap the sort, and a lane whose group is dropped empties its list. Other group sizes stage the
// ranks in shared memory, where several lanes score each group. A group is kept when fewer than
// topk_group groups rank above it. No global scratch; one launch.
#pragma once

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
// constant and each pick's shuffles overlap the next one's redux (docs/design/moe.md). Other top-k take
// the loop.
inline constexpr int kUnrolledTopk = 8;
inline constexpr unsigned kFull = 0xffffffffu;
// Lane-aligned groups span at most 16 lanes (two groups or more over 32 lanes).
inline constexpr int kMaxLanesPerGroup = 16;
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

// a > b, computed where the compiler cannot rewrite the selects on it into min / max, which it lowers to
// a compare each: three compares per exchange of the sort instead of one.
SGL_DEVICE bool greater_opaque(uint64_t a, uint64_t b) {
  uint32_t greater;
  asm("{\n .reg .pred p;\n setp.gt.u64 p, %1, %2;\n selp.u32 %0, 1, 0, p;\n}" : "=r"(greater) : "l"(a), "l"(b));
  return greater != 0;
}
SGL_DEVICE bool greater_opaque(uint32_t a, uint32_t b) {
  uint32_t greater;
  asm("{\n .reg .pred p;\n setp.gt.u32 p, %1, %2;\n selp.u32 %0, 1, 0, p;\n}" : "=r"(greater) : "r"(a), "r"(b));
  return greater != 0;
}

// Sorts v (and w with it) best first (a larger word first), branch-free.
template <int kN, typename Word, std::size_t... kI>
SGL_DEVICE void sort_descending(Word (&v)[kN], float (&w)[kN], std::index_sequence<kI...>) {
  const auto exchange = [&]<int kA, int kB>() {
    // 16 values: the plain compare, whose min / max forms keep the register count under the spill point.
    const bool keep = kN <= 8 ? greater_opaque(v[kA], v[kB]) : v[kA] > v[kB];
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

// The multiset union's two best keys: (first, second) merged with (other_first, other_second).
SGL_DEVICE void merge_top_two(uint32_t& first, uint32_t& second, uint32_t other_first, uint32_t other_second) {
  second = max(min(first, other_first), max(second, other_second));
  first = max(first, other_first);
}

// The two best of kN keys (the second is the best of the rest once one holder of the best is left out),
// by a tournament of merges: pairs, then pairs of pairs.
template <int kN>
SGL_DEVICE void top_two(const uint32_t (&key)[kN], uint32_t& first, uint32_t& second) {
  static_assert(kN >= 2 && (kN & (kN - 1)) == 0, "a power of two from 2");
  uint32_t f[kN / 2], s[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) {
    f[i] = max(key[2 * i], key[2 * i + 1]);
    s[i] = min(key[2 * i], key[2 * i + 1]);
  }
#pragma unroll
  for (int width = kN / 2; width > 1; width /= 2) {
#pragma unroll
    for (int i = 0; i < width / 2; ++i) merge_top_two(f[i], s[i], f[i + width / 2], s[i + width / 2]);
  }
  first = f[0];
  second = s[0];
}

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
  int group_lanes_log2;  // lane-aligned grouped routing: log2 of the lanes that hold a group
  bool bias_fp32;
  bool renormalize;
  // PDL: the next kernel may launch at this grid's start (it waits for this grid to finish before it
  // reads), else once the scores and groups are done. Early hides more of the next launch, but the next
  // kernel's CTAs then wait beside this grid's warps: early pays on small grids only, of at most
  // kEarlyTriggerCtasPerSm CTAs per SM (docs/design/moe.md).
  bool early_trigger;
  float scale;
};

// Values per lane for an expert count: 32, 64, 128, 256 or 512 experts rounded up, over 32 lanes.
inline constexpr int values_per_lane(int64_t experts) {
  return experts <= 32 ? 1 : experts <= 64 ? 2 : experts <= 128 ? 4 : experts <= 256 ? 8 : 16;
}

// A lane's kVPT consecutive elements, loaded as whole vectors (min(16 bytes, kVPT elements), to which
// the source is aligned) where `ok`, else zeros. Predicated loads, no branch; read them only once every
// load of the lane is issued (converting one early lets its registers take the next load's value).
template <typename E, int kVPT>
struct LaneVectors {
  static constexpr int kChunk = kVPT * sizeof(E) < 16 ? kVPT : static_cast<int>(16 / sizeof(E));
  using Chunk = device::AlignedStorage<E, kChunk>;
  Chunk chunk[kVPT / kChunk];

  SGL_DEVICE void load(const E* src, bool ok) {
#pragma unroll
    for (int c = 0; c < kVPT / kChunk; ++c) chunk[c] = ok ? reinterpret_cast<const Chunk*>(src)[c] : Chunk{};
  }
  SGL_DEVICE E operator[](int j) const {
    return chunk[j / kChunk].data[j % kChunk];
  }
};

// __frcp_rn of kVPT values, out of line: its slow-path code stays off the common path, which would
// otherwise jump over it to code not yet fetched, a stall a warp per token cannot hide
// (docs/design/moe.md).
template <int kVPT>
__device__ __noinline__ void rcp_rn_all(float* out, const float* in) {
#pragma unroll
  for (int j = 0; j < kVPT; ++j) out[j] = __frcp_rn(in[j]);
}

// What a lane keeps of the picks: lane r the r-th choice, every lane the chosen weights' sum (in rank order).
struct Picked {
  float weight = 0.f;
  int id = 0;
  float total = 0.f;
};

// The top-k of the lanes' sorted 64-bit lists (key << 32 | ~expert). Each pick runs on the key alone, as if
// keys were unique: one redux.sync, and the lane holding the best key owns it and shifts its list
// (selects, no branch). A ballot per pick, off that path (its round trip would double a pick's), notes
// whether another lane held the same key: then (kExact false) the result is to be redone with kExact,
// where among the holders the lane of the lowest expert owns the pick (a second redux.sync). Keys never
// run out (topk <= the candidates), so the best key is a candidate's. Returns whether a key was tied.
template <int kVPT, int kPickUnroll, bool kExact>
SGL_DEVICE bool pick_long_words(const uint64_t* cand, const float* weight, int topk, int lane, Picked& picked) {
  uint64_t c[kVPT];
  float w[kVPT];
#pragma unroll
  for (int i = 0; i < kVPT; ++i) {
    c[i] = cand[i];
    w[i] = weight[i];
  }
  uint32_t tied = 0;
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
    // The pick's weight and expert reach every lane by shuffles from the owner (a tied pass takes the
    // lowest holder's and is redone); they wait for the ballot, the next pick does not.
    const int from = __ffs(kExact ? __ballot_sync(kFull, owner) : holders) - 1;
    const float picked_weight = __shfl_sync(kFull, w[0], from);
    const int picked_id = __shfl_sync(kFull, static_cast<int>(expert), from);
    picked.total += picked_weight;
    picked.weight = lane == r ? picked_weight : picked.weight;
    picked.id = lane == r ? picked_id : picked.id;
#pragma unroll
    for (int i = 0; i + 1 < kVPT; ++i) {
      c[i] = owner ? c[i + 1] : c[i];
      w[i] = owner ? w[i + 1] : w[i];
    }
    c[kVPT - 1] = owner ? uint64_t{0} : c[kVPT - 1];
  }
  return tied != 0;
}

// The exact picks (ties between lanes, rare), out of line like rcp_rn_all.
template <int kVPT, int kPickUnroll>
__device__ __noinline__ void pick_long_words_exact(
    const uint64_t* cand, const float* weight, int topk, int lane, Picked* out) {
  Picked picked;
  pick_long_words<kVPT, kPickUnroll, true>(cand, weight, topk, lane, picked);
  *out = picked;
}

// What a routing kernel is compiled for. The lane-aligned plans load every lane's experts as whole
// vectors (experts a multiple of kVPT, rows and bias aligned to the vectors): what every model runs,
// compiled without the general plan's element loads and shared-memory group staging, so that their
// instructions run straight through (a jump over unused code costs an instruction fetch at one warp
// per token).
enum class RoutePlan : int {
  kGeneral,     // element loads; any grouping (staged in shared memory)
  kFlat,        // lane-aligned, not grouped
  kLaneGroups,  // lane-aligned, grouped, each group whole lanes (group_lanes_log2)
};

// kShortKeys: 32-bit candidate words (see the pick stage); only for bf16 logits without a bias.
// kTopk: the top-k when compiled in (kUnrolledTopk), 0 when read from p.
template <typename T, int kVPT, bool kSoftmax, bool kShortKeys, int kTopk, RoutePlan kPlan>
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
  const int base = lane * kVPT;  // this lane's first expert
  const T* row = static_cast<const T*>(p.logits) + token * p.stride + base;
  // This lane's output slot (-1: none), computed here and held (the asm hides how): recomputed at the
  // end, it would put the thread and block id reads (S2R, tens of cycles) on the path to the stores.
  int64_t out_slot = lane < topk ? token * topk + lane : -1;
  asm("" : "+l"(out_slot));

  // Every load is issued before any is used: converting each value as it came let the register
  // allocator give a later load the register of an earlier one's value, and the later load then waited
  // a whole memory round trip for it.
  T raw[kVPT];
  float bias[kVPT];  // loaded with the logits: one memory round trip for both
  if constexpr (kPlan != RoutePlan::kGeneral) {
    const bool any = base < p.experts;  // a lane has all its experts or none
    LaneVectors<T, kVPT> logits_in, bias_in;
    LaneVectors<float, kVPT> bias_in_fp32;
    // Unpredicated, so that the address is computed before the row's predicate: a lane past the experts
    // reads the last lane's (its values count as absent).
    logits_in.load(row - base + min(base, p.experts - kVPT), true);
    bias_in_fp32.load(static_cast<const float*>(p.bias) + base, any && has_bias && p.bias_fp32);
    bias_in.load(static_cast<const T*>(p.bias) + base, any && has_bias && !p.bias_fp32);
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      raw[j] = logits_in[j];
      const float b = dtype_trait<fp32_t>::from(bias_in[j]);
      bias[j] = p.bias_fp32 ? bias_in_fp32[j] : b;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kVPT; ++j) raw[j] = base + j < p.experts ? row[j] : T{};
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      const int e = base + j;
      bias[j] = !has_bias || e >= p.experts ? 0.f
                : p.bias_fp32               ? static_cast<const float*>(p.bias)[e]
                                            : dtype_trait<fp32_t>::from(static_cast<const T*>(p.bias)[e]);
    }
  }
  float score[kVPT];  // the score (the weight)
  float rank[kVPT];   // what the choice compares
  uint32_t out = 0;   // bit j: expert base + j cannot be chosen (absent or in a dropped group)
#pragma unroll
  for (int j = 0; j < kVPT; ++j) {
    const bool absent = base + j >= p.experts;
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
    // lane takes __frcp_rn's full path (rare: one branch per lane, not one per value, out of line).
    float denom[kVPT];
    bool huge = false;
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      denom[j] = 1.f + expf(-score[j]);
      huge |= denom[j] >= 0x1p125f && !((out >> j) & 1u);  // an absent expert's score is never read
      score[j] = rcp_rn_moderate(denom[j]);
    }
    if (huge) {
      float in[kVPT], out[kVPT];  // local copies: only these go through memory for the call
#pragma unroll
      for (int j = 0; j < kVPT; ++j) in[j] = denom[j];
      rcp_rn_all<kVPT>(out, in);
#pragma unroll
      for (int j = 0; j < kVPT; ++j) score[j] = out[j];
    }
  }
  if (has_bias) {
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      if (!((out >> j) & 1u)) rank[j] = score[j] + bias[j];
    }
  }

  const bool grouped = p.groups > 1 && p.topk_group < p.groups;
  if (kPlan == RoutePlan::kGeneral && grouped) {
    const int per_group = p.experts / p.groups;
    // e / per_group without an integer division per expert: (e + 0.5) / per_group is at least
    // 0.5 / per_group >= 1 / 1024 away from an integer, far beyond the product's rounding (< 1e-4).
    const float inv_per_group = 1.f / static_cast<float>(per_group);
    const auto group_of = [&](int e) { return static_cast<int>((static_cast<float>(e) + 0.5f) * inv_per_group); };
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      const int e = base + j;
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
      const int e = base + j;
      if (e < p.experts && !((kept >> group_of(e)) & 1u)) out |= 1u << j;
    }
  }

  uint32_t key[kVPT];  // the ranks' order keys, 0 where not a candidate (order keys are never 0)
#pragma unroll
  for (int j = 0; j < kVPT; ++j) key[j] = (out >> j) & 1u ? 0u : order_key(rank[j]);

  // Lane-aligned groups: group g is lanes g << group_lanes_log2 onwards, and its key is its best key, or
  // with a bias the sum of its two best (per_group >= 2 here), from each lane's two best merged over the
  // group's lanes by shuffles. Straight-line (rounds past the group's lanes are selects), so that its
  // shuffles' round trips overlap the sort below instead of preceding it.
  bool dropped = false;
  if constexpr (kPlan == RoutePlan::kLaneGroups) {
    static_assert(kVPT > 1, "two groups or more of whole lanes: two values per lane or more");
    uint32_t first, second;
    top_two(key, first, second);
    const int lanes = 1 << p.group_lanes_log2;
#pragma unroll
    for (int offset = 1; offset < kMaxLanesPerGroup; offset *= 2) {
      uint32_t merged_first = first, merged_second = second;
      merge_top_two(
          merged_first, merged_second, __shfl_xor_sync(kFull, first, offset), __shfl_xor_sync(kFull, second, offset));
      first = offset < lanes ? merged_first : first;
      second = offset < lanes ? merged_second : second;
    }
    const uint32_t mine = has_bias ? order_key(key_value(first) + key_value(second)) : first;
    // At most kVPT groups. This lane's group is dropped when topk_group or more groups rank above it (a
    // larger key, or an equal key and a lower index). Bitwise, not short-circuit: the terms are
    // independent selects, not branches.
    const int g = lane >> p.group_lanes_log2;
    int above = 0;
#pragma unroll
    for (int h = 0; h < kVPT; ++h) {
      const uint32_t other = __shfl_sync(kFull, mine, (h << p.group_lanes_log2) & 31);
      const bool better = (other > mine) | ((other == mine) & (h < g));
      above += static_cast<int>(h < p.groups) & static_cast<int>(better);
    }
    dropped = above >= p.topk_group;  // lanes past the experts hold no candidates anyway
  }

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
    const uint32_t expert = base + j;
    if constexpr (kShortKeys) {
      cand[j] = key[j] == 0u ? 0u : (key[j] & 0xffff0000u) | (~expert & 0xffffu);
    } else {
      cand[j] = key[j] == 0u ? uint64_t{0} : (static_cast<uint64_t>(key[j]) << 32) | ~expert;
    }
  }
  sort_descending(cand, weight);
#pragma unroll
  for (int j = 0; j < kVPT; ++j) cand[j] = dropped ? Word{0} : cand[j];
  if (!p.early_trigger) device::PDLTriggerSecondary();
  Picked picked;
  if constexpr (kShortKeys) {
    // Words are unique: the best one names its expert, and so its lane. A pick is one redux.sync, one
    // shuffle for the weight, and a shift of the owner's list.
#pragma unroll kPickUnroll
    for (int r = 0; r < topk; ++r) {
      const uint32_t best = __reduce_max_sync(kFull, cand[0]);
      const int id = static_cast<int>(~best & 0xffffu);
      const int owner = id / kVPT;
      const float w = __shfl_sync(kFull, weight[0], owner);
      picked.total += w;
      if (lane == r) {
        picked.weight = w;
        picked.id = id;
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
    if (pick_long_words<kVPT, kPickUnroll, false>(cand, weight, topk, lane, picked)) {
      Word c_exact[kVPT];  // copies: only these go through memory for the call
      float w_exact[kVPT];
#pragma unroll
      for (int i = 0; i < kVPT; ++i) {
        c_exact[i] = cand[i];
        w_exact[i] = weight[i];
      }
      Picked exact;
      pick_long_words_exact<kVPT, kPickUnroll>(c_exact, w_exact, topk, lane, &exact);
      picked = exact;
    }
  }
  const float factor = p.renormalize && picked.total > 0.f ? p.scale / picked.total : p.scale;
  if (out_slot >= 0) {
    p.weights[out_slot] = picked.weight * factor;
    p.ids[out_slot] = picked.id;
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
    // The lane-aligned plans (RoutePlan): whole vectors of min(16 bytes, vpt elements) for the rows and the
    // bias; groups of whole lanes, at most vpt of them, a power of two lanes each.
    const int64_t vpt = values_per_lane(experts);
    const auto vector_aligned = [&](int64_t bytes_or_address, int64_t element_bytes) {
      return bytes_or_address % std::min<int64_t>(16, vpt * element_bytes) == 0;
    };
    const auto address = [](const void* ptr) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(ptr)); };
    const bool vector_loads = experts % vpt == 0 && vector_aligned(address(gating_output.data_ptr()), sizeof(T)) &&
                              vector_aligned(gating_output.stride(0) * int64_t{sizeof(T)}, sizeof(T)) &&
                              (bias == nullptr || vector_aligned(address(bias), bias_fp32 ? 4 : sizeof(T)));
    const bool grouped = num_expert_group > 1 && topk_group < num_expert_group;
    const int64_t lanes_per_group = experts / num_expert_group / vpt;
    const bool lane_groups = num_expert_group <= vpt && (experts / num_expert_group) % vpt == 0 &&
                             std::has_single_bit(static_cast<uint64_t>(lanes_per_group));
    const RoutePlan plan = !vector_loads || (grouped && !lane_groups) ? RoutePlan::kGeneral
                           : grouped                                  ? RoutePlan::kLaneGroups
                                                                      : RoutePlan::kFlat;
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
        lane_groups ? std::countr_zero(static_cast<uint64_t>(lanes_per_group)) : -1,
        bias_fp32,
        renormalize,
        grid <= kEarlyTriggerCtasPerSm * runtime::sm_count(dev.device_id),
        static_cast<float>(routed_scaling_factor)};
    const bool pdl = runtime::resolve_pdl(enable_pdl, dev.device_id);
    auto go = [&](auto kernel) { LaunchKernel(grid, kWarpsPerBlock * 32, dev).enable_pdl(pdl)(kernel, p); };
    // Compiled in: the scoring, 32-bit words (bf16 logits without a bias), top-k 8, the plan.
    with_flag(softmax, [&](auto softmax_flag) {
      with_flag(std::is_same_v<T, bf16_t> && bias == nullptr, [&](auto short_keys) {
        with_flag(topk == kUnrolledTopk, [&](auto unrolled) {
          with_plan(plan, [&](auto plan_constant) {
            constexpr int kTopk = decltype(unrolled)::value ? kUnrolledTopk : 0;
            dispatch<decltype(softmax_flag)::value, decltype(short_keys)::value, kTopk, decltype(plan_constant)::value>(
                experts, go);
          });
        });
      });
    });
  }

 private:
  template <typename F>
  static void with_flag(bool flag, F&& f) {
    if (flag) {
      f(std::true_type{});
    } else {
      f(std::false_type{});
    }
  }
  template <typename F>
  static void with_plan(RoutePlan plan, F&& f) {
    switch (plan) {
      case RoutePlan::kGeneral: return f(std::integral_constant<RoutePlan, RoutePlan::kGeneral>{});
      case RoutePlan::kFlat: return f(std::integral_constant<RoutePlan, RoutePlan::kFlat>{});
      default: return f(std::integral_constant<RoutePlan, RoutePlan::kLaneGroups>{});
    }
  }
  template <bool kSoftmax, bool kShortKeys, int kTopk, RoutePlan kPlan, typename Go>
  static void dispatch(int64_t experts, Go&& go) {
    if constexpr (kShortKeys && !std::is_same_v<T, bf16_t>) {
      return;  // never called: short keys hold bf16 ranks only
    } else {
      switch (values_per_lane(experts)) {
        case 1:
          // Never lane groups: two groups or more of whole lanes need two values per lane.
          if constexpr (kPlan != RoutePlan::kLaneGroups)
            return go(route_kernel<T, 1, kSoftmax, kShortKeys, kTopk, kPlan>);
          return;
        case 2: return go(route_kernel<T, 2, kSoftmax, kShortKeys, kTopk, kPlan>);
        case 4: return go(route_kernel<T, 4, kSoftmax, kShortKeys, kTopk, kPlan>);
        case 8: return go(route_kernel<T, 8, kSoftmax, kShortKeys, kTopk, kPlan>);
        default: return go(route_kernel<T, 16, kSoftmax, kShortKeys, kTopk, kPlan>);
      }
    }
  }
};

}  // namespace jit_kernel::moe
