// sampling: one kernel that filters a row of logits (or probabilities) and samples from it, renormalises
// it, or masks it.
//
//   temperature -> top-k -> top-p (over the renormalised top-k set, or "joint": over the whole row)
//   -> min-p (relative to the largest probability) -> then one of
//   sample:  a token id drawn from what is left (or the argmax, lowest index among ties, where the
//            temperature is 0), and its log-probability under that distribution;
//   renorm:  the row's probabilities, 0 outside the kept set and renormalised inside it;
//   mask:    the processed logits (logits / temperature), -inf outside the kept set.
//
// Work split: one thread-block cluster of kCluster blocks per output row. Each block loads its slice
// of the row from global memory once into shared memory; every later step (the maximum, the top-k and
// top-p thresholds, the sums, the draw) reads shared memory, and the blocks combine their partial
// results through distributed shared memory after a cluster barrier. So a row is read from global
// memory once (renorm and mask read it a second time, from L2, to write their output), and a batch
// of one row still spreads over kCluster SMs.
//
// Every filter keeps the values from some threshold up, so a row's kept set is the elements whose
// order-preserving float key is at least the largest of the filters' threshold keys. min-p's follows
// from the maximum. top-k's and top-p's take two steps: a histogram over bins of each value's
// distance below the row's maximum picks the bin holding the threshold; every block lists its
// elements in that bin and above. Where the cluster's lists together hold at most kListCapacity
// elements (top-k with a small k, as engines use it), the blocks that need the thresholds gather
// them, sort them (largest value first, ties by index) and finish alone: the thresholds, the kept
// mass and the draw are prefix sums of that order. Otherwise an exact radix selection (four passes of
// 8 bits over the keys, through the cluster) runs over the threshold bin's elements
// (docs/design/sampling.md). top-k counts elements, top-p sums weights. Weights are w = exp(x - max)
// (logits) or p / max(p) (probabilities) in fixed point, round(w * 2^30), so every sum is an
// integer, exact and independent of the order of the atomics: the same row and random bits give the
// same token bit for bit, at any slot and batch size. A token whose weight rounds to 0 (below 2^-31
// of the largest) is never kept.
//
// Ties at a threshold are kept: every element equal to the k-th largest value, and every element equal
// to the value at which top-p's cumulative mass (from the largest value down) first reaches p.
//
// The draw: 64 random bits from Philox4x32-10 keyed by the row's seed with counter (offset, stream)
// (`device::philox::draw`) scale the kept mass S to an integer target t in [0, S); the token is the
// first element whose inclusive prefix sum of kept weights exceeds t, in a fixed order: the sorted
// order of the gathered list, or else the slice's threads' runs in index order.
//
// Invalid rows never fault: a NaN or +inf in the row, no finite logit (no positive probability), or
// a per-row parameter out of range (temperature < 0 or NaN, top_k < 1, top_p outside (0, 1], min_p
// outside [0, 1]) gives token id -1 and log-probability NaN (sample) or a row of NaN (renorm, mask).
#pragma once

#include <sgl_kernel/math.cuh>
#include <sgl_kernel/philox.cuh>
#include <sgl_kernel/runtime.cuh>
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>

#include <cooperative_groups.h>
#include <cmath>
#include <cstdint>
#include <limits>

namespace jit_kernel::sampling {

// Blocks per row: 8 (the portable cluster size), or 16 for small batches, whose rows would otherwise
// leave most SMs idle.
inline constexpr uint32_t kCluster = 8;
inline constexpr uint32_t kWideCluster = 16;
inline constexpr int64_t kWideClusterMaxBatch = 8;
inline constexpr uint32_t kThreads = 512;
inline constexpr uint32_t kWarps = kThreads / 32;
// A block's slice of the row lives in shared memory: 8 slices of up to 49,152 floats (192 KiB each).
inline constexpr int64_t kMaxVocab = 393216;
inline constexpr uint32_t kOne = 1u << 30;         // the fixed-point weight of the largest element

enum Mode : int { kSample = 0, kRenorm = 1, kMask = 2 };

// A per-row parameter: a tensor element (float32, or int32 / int64 for top_k) or one value for all.
struct Param {
  const void* ptr;  // nullptr: `value` for every row
  int32_t dtype;    // 0 float32, 1 int32, 2 int64
  double value;
};

struct Params {
  const void* input;  // [rows, V] of T, row stride `input_stride`
  int64_t input_stride;
  void* output;  // renorm / mask: [B, V] of T; sample: token ids [B]
  int64_t output_stride;
  bool ids_are_int64;
  float* logprobs;          // sample: [B] or nullptr
  const void* row_indices;  // [B] int32 / int64, or nullptr (output b reads row b)
  bool row_indices_int64;
  int64_t num_rows;  // rows of input (the range row_indices may take)
  int64_t batch;     // output rows
  int64_t vocab;
  int64_t chunk;  // elements per block (a multiple of the vector width)
  bool probs;     // input holds probabilities rather than logits
  bool joint;     // top-p over the whole row, not the top-k set
  Param temperature, top_k, top_p, min_p;
  const int64_t* seed;  // [B] or [1] (seed_per_row false), or nullptr: `seed_value`
  int64_t* offset;      // [B] or [1] (offset_per_row false), or nullptr: `offset_value`; advanced when `advance`
  bool seed_per_row, offset_per_row;
  uint64_t seed_value, offset_value;
  bool stream_is_row;  // the Philox stream index is the output row (scalar seeds) rather than 0
  bool advance;
  bool aligned;  // input rows start on 16 bytes: vector loads
};

namespace detail {

SGL_DEVICE float load_param(const Param& p, int64_t b) {
  if (p.ptr == nullptr) return static_cast<float>(p.value);
  if (p.dtype == 0) return static_cast<const float*>(p.ptr)[b];
  if (p.dtype == 1) return static_cast<float>(static_cast<const int32_t*>(p.ptr)[b]);
  return static_cast<float>(static_cast<const int64_t*>(p.ptr)[b]);
}

SGL_DEVICE int64_t load_top_k(const Param& p, int64_t b) {
  if (p.ptr == nullptr) return static_cast<int64_t>(p.value);
  if (p.dtype == 1) return static_cast<const int32_t*>(p.ptr)[b];
  return static_cast<const int64_t*>(p.ptr)[b];
}

// Order-preserving key of a float: a larger float has a larger key (-inf the smallest non-NaN).
SGL_DEVICE uint32_t float_key(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The per-block scratch that the cluster reads through distributed shared memory. Each exchange
// alternates between two buffers, so one cluster barrier per exchange suffices: a block writes a
// buffer again only after the next barrier, which every block passes after its reads of this one.
struct Exchange {
  // A histogram's bins as two 32-bit words each: shared memory has native 32-bit atomic adds only
  // (a 64-bit one is a compare-and-swap loop, which contended bins spin in).
  uint32_t low[2][256];
  uint32_t high[2][256];
  unsigned long long slot[2][2];
};

struct Shared {
  Exchange x;
  unsigned long long total[256];  // the cluster's histogram of the current pass
  unsigned long long warp_part[kWarps][2];
  unsigned long long result[16];
  uint32_t picked;
  unsigned long long remaining;
  uint32_t list_size;
  uint32_t round;
};

SGL_DEVICE void next_round(Shared& s) {
  __syncthreads();
  if (threadIdx.x == 0) s.round += 1;
  __syncthreads();
}

// The maxima of two u64 per block over the cluster, into s.result[0] and s.result[1] for every block.
template <uint32_t kCluster>
SGL_DEVICE void cluster_max(Shared& s, unsigned long long first, unsigned long long second) {
  auto cluster = cooperative_groups::this_cluster();
  const uint32_t buf = s.round & 1;
  if (threadIdx.x < 2) s.x.slot[buf][threadIdx.x] = threadIdx.x == 0 ? first : second;
  cluster.sync();
  if (threadIdx.x < 2) {
    unsigned long long acc = 0;
    for (uint32_t r = 0; r < kCluster; ++r) acc = max(acc, cluster.map_shared_rank(&s.x, r)->slot[buf][threadIdx.x]);
    s.result[threadIdx.x] = acc;
  }
  next_round(s);
}

// Every block's value of one u64 over the cluster, into s.result[0 .. kCluster).
template <uint32_t kCluster>
SGL_DEVICE void cluster_gather(Shared& s, unsigned long long mine) {
  auto cluster = cooperative_groups::this_cluster();
  const uint32_t buf = s.round & 1;
  if (threadIdx.x == 0) s.x.slot[buf][0] = mine;
  cluster.sync();
  if (threadIdx.x < kCluster) s.result[threadIdx.x] = cluster.map_shared_rank(&s.x, threadIdx.x)->slot[buf][0];
  next_round(s);
}

// Inclusive prefix sum over the block of one u64 per thread (in thread order), and the block's total.
SGL_DEVICE unsigned long long block_inclusive_scan(Shared& s, unsigned long long v, unsigned long long& total) {
  const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int d = 1; d < 32; d <<= 1) {
    const unsigned long long up = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= static_cast<uint32_t>(d)) v += up;
  }
  if (lane == 31) s.warp_part[warp][1] = v;
  __syncthreads();
  total = 0;
  for (uint32_t w = 0; w < kWarps; ++w) {
    const unsigned long long part = s.warp_part[w][1];
    if (w < warp) v += part;
    total += part;
  }
  __syncthreads();
  return v;
}

// The elements a pass visits: the block's slice of the row, or its list of candidates (values and
// indices in the slice), when it has one. `f(x, i)` for each.
struct Domain {
  const uint32_t* values;
  uint32_t n;
  const uint32_t* list_x;
  uint32_t list_n;
  bool use_list;

  template <typename F>
  SGL_DEVICE void each(F&& f) const {
    if (use_list) {
      for (uint32_t j = threadIdx.x; j < list_n; j += kThreads) f(__uint_as_float(list_x[j]));
    } else {
      for (uint32_t i = threadIdx.x; i < n; i += kThreads) f(__uint_as_float(values[i]));
    }
  }
};

// One histogram over the cluster into s.total: `bin_and_weight(x, bin, w)` for each element of the
// domain; elements with w == 0 are skipped.
template <uint32_t kCluster, typename F>
SGL_DEVICE void histogram(Shared& s, const Domain& domain, F&& bin_and_weight) {
  auto cluster = cooperative_groups::this_cluster();
  const uint32_t buf = s.round & 1;
  uint32_t* low = s.x.low[buf];
  uint32_t* high = s.x.high[buf];
  if (threadIdx.x < 256) {
    low[threadIdx.x] = 0;
    high[threadIdx.x] = 0;
  }
  __syncthreads();
  // Adds w to a bin exactly: the low word wraps at most once per add, and the add that wraps it
  // carries one into the high word.
  auto add = [&](uint32_t bin, unsigned long long w) {
    const uint32_t w_low = static_cast<uint32_t>(w);
    const uint32_t before = atomicAdd(&low[bin], w_low);
    const uint32_t carry = (before + w_low < before ? 1u : 0u) + static_cast<uint32_t>(w >> 32);
    if (carry != 0) atomicAdd(&high[bin], carry);
  };
  // Bin 255 (everything far below the maximum) would take most elements' atomics: it sums in a
  // register instead, one atomic per warp.
  unsigned long long far = 0;
  domain.each([&](float x) {
    uint32_t bin;
    unsigned long long w;
    bin_and_weight(x, bin, w);
    if (bin == 255) far += w;
    else if (w != 0) add(bin, w);
  });
  for (int d = 16; d > 0; d >>= 1) far += __shfl_xor_sync(0xffffffffu, far, d);
  if (threadIdx.x % 32 == 0 && far != 0) add(255, far);
  cluster.sync();
  if (threadIdx.x < 256) {
    unsigned long long acc = 0;
    for (uint32_t r = 0; r < kCluster; ++r) {
      const Exchange* remote = cluster.map_shared_rank(&s.x, r);
      acc += (static_cast<unsigned long long>(remote->high[buf][threadIdx.x]) << 32) | remote->low[buf][threadIdx.x];
    }
    s.total[threadIdx.x] = acc;
  }
  next_round(s);
}

// From s.total, scanned from bin 0 up (`from_top` false) or from bin 255 down: the bin at which the
// running sum first reaches `target` (>= 1), and what of the target remains inside that bin. Every
// thread gets both.
SGL_DEVICE uint32_t pick(Shared& s, unsigned long long& target, bool from_top) {
  if (threadIdx.x < 32) {
    const uint32_t lane = threadIdx.x;
    auto bin_at = [&](uint32_t order) { return from_top ? 255u - order : order; };
    unsigned long long mine = 0;
    for (uint32_t j = 0; j < 8; ++j) mine += s.total[bin_at(8 * lane + j)];
    unsigned long long inclusive = mine;
    for (int d = 1; d < 32; d <<= 1) {
      const unsigned long long up = __shfl_up_sync(0xffffffffu, inclusive, d);
      if (lane >= static_cast<uint32_t>(d)) inclusive += up;
    }
    const uint32_t ballot = __ballot_sync(0xffffffffu, inclusive >= target);
    const uint32_t first = ballot ? __ffs(ballot) - 1 : 31;  // the target never exceeds the total
    if (lane == first) {
      unsigned long long acc = inclusive - mine;
      uint32_t order = 8 * lane + 7;
      for (uint32_t j = 0; j < 8; ++j) {
        const unsigned long long here = s.total[bin_at(8 * lane + j)];
        if (acc + here >= target || j == 7) {
          order = 8 * lane + j;
          break;
        }
        acc += here;
      }
      s.picked = bin_at(order);
      s.remaining = target - acc;
    }
  }
  __syncthreads();
  target = s.remaining;
  const uint32_t picked = s.picked;
  __syncthreads();
  return picked;
}

// The key (float_key of the value) at which the weighted count, from the largest value down, of
// the domain's elements in bin `bin` first reaches `target`: passes of 8 bits over the keys, from the
// digit holding the highest bit in which `low` and `high` (keys that bound the bin's) differ. The
// bits above it are the same in every key of the bin, so the passes above it would each find one digit.
template <uint32_t kCluster, typename Bin, typename Weight>
SGL_DEVICE uint32_t refine(
    Shared& s,
    const Domain& domain,
    uint32_t bin,
    unsigned long long target,
    uint32_t low,
    uint32_t high,
    Bin&& bin_of,
    Weight&& weight_of) {
  const uint32_t differ = low ^ high;
  int shift = differ == 0 ? 0 : (31 - __clz(differ)) / 8 * 8;
  uint32_t prefix = shift >= 24 ? 0u : (low & (0xffffffffu << (shift + 8)));
  for (; shift >= 0; shift -= 8) {
    const uint32_t above = shift >= 24 ? 0u : (0xffffffffu << (shift + 8));
    histogram<kCluster>(s, domain, [&](float x, uint32_t& digit, unsigned long long& w) {
      const uint32_t key = float_key(x);
      digit = (key >> shift) & 255u;
      w = (bin_of(x) == bin && (key & above) == (prefix & above)) ? weight_of(x) : 0ull;
    });
    prefix |= pick(s, target, true) << shift;
  }
  return prefix;
}

// 2^x on the special-function unit: one instruction, the same bits on every call.
SGL_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <typename T>
SGL_DEVICE float to_float(T v) {
  return dtype_trait<fp32_t>::from(v);
}

}  // namespace detail

// Candidates a block lists (values and indices of its slice's elements in the bins a threshold's
// first step picked), and the most the cluster gathers into one sorted list to finish the thresholds
// and the draw inside one block. The same bound for both: whether a row is finished from the gathered
// list depends on the row alone, never on how many blocks share it.
inline constexpr uint32_t kListCapacity = 2048;

// Shared memory of a block, beyond the static `Shared`, in 32-bit words: its slice (reused for the
// gathered list, 2 x kListCapacity u64), then its list of candidates (values, then indices).
inline std::size_t dynamic_smem(int64_t chunk) {
  const int64_t region = chunk > 4 * int64_t{kListCapacity} ? chunk : 4 * int64_t{kListCapacity};
  return static_cast<std::size_t>(region + 2 * kListCapacity) * sizeof(uint32_t);
}

namespace detail {

// The float whose order-preserving key is `key` (the inverse of float_key).
SGL_DEVICE float key_float(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// The smallest key in [low, high] at which `holds(value)` is true, for a predicate that holds from
// some value upward (`high` must hold): 32 halvings of the key range.
template <typename F>
SGL_DEVICE uint32_t lowest_key_where(uint32_t low, uint32_t high, F&& holds) {
  while (low < high) {
    const uint32_t mid = low + (high - low) / 2;
    if (holds(key_float(mid))) high = mid;
    else low = mid + 1;
  }
  return low;
}

// Sorts `n2` (a power of two) u64 in shared memory in ascending order: a bitonic network.
SGL_DEVICE void bitonic_sort(unsigned long long* a, uint32_t n2) {
  for (uint32_t k = 2; k <= n2; k <<= 1) {
    for (uint32_t j = k >> 1; j > 0; j >>= 1) {
      for (uint32_t i = threadIdx.x; i < n2; i += kThreads) {
        const uint32_t partner = i ^ j;
        if (partner > i) {
          const unsigned long long x = a[i], y = a[partner];
          if ((x > y) == ((i & k) == 0)) {
            a[i] = y;
            a[partner] = x;
          }
        }
      }
      __syncthreads();
    }
  }
}

// The first position in [0, n) whose value is >= `target` (or n) in an ascending array.
SGL_DEVICE uint32_t lower_bound(const unsigned long long* a, uint32_t n, unsigned long long target) {
  uint32_t low = 0, high = n;
  while (low < high) {
    const uint32_t mid = (low + high) / 2;
    if (a[mid] < target) low = mid + 1;
    else high = mid;
  }
  return low;
}

}  // namespace detail

template <typename T, uint32_t kCluster>
__global__ void __launch_bounds__(kThreads, 2) sample_kernel(const __grid_constant__ Params p, int mode) {
  using namespace detail;
  extern __shared__ __align__(16) uint32_t values[];  // the slice's values (float bits), then the list
  const uint32_t region = static_cast<uint32_t>(max(p.chunk, 4 * int64_t{kListCapacity}));
  uint32_t* list_x = values + region;
  uint32_t* list_i = list_x + kListCapacity;
  __shared__ Shared s;
  auto cluster = cooperative_groups::this_cluster();
  const uint32_t rank = cluster.block_rank();
  const int64_t b = blockIdx.x / kCluster;
  const int64_t begin = static_cast<int64_t>(rank) * p.chunk;
  const uint32_t n = static_cast<uint32_t>(max(int64_t{0}, min(p.chunk, p.vocab - begin)));
  if (threadIdx.x == 0) {
    s.round = 0;
    s.list_size = 0;
  }

  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();

  int64_t row = b;
  if (p.row_indices != nullptr) {
    row = p.row_indices_int64 ? static_cast<const int64_t*>(p.row_indices)[b]
                              : static_cast<const int32_t*>(p.row_indices)[b];
  }
  const float temperature = p.probs ? 1.0f : load_param(p.temperature, b);
  const int64_t top_k = p.top_k.ptr == nullptr && p.top_k.value <= 0 ? p.vocab : load_top_k(p.top_k, b);
  const float top_p = load_param(p.top_p, b);
  const float min_p = load_param(p.min_p, b);
  bool valid = row >= 0 && row < p.num_rows && temperature >= 0.0f && top_k >= 1 && top_p > 0.0f && top_p <= 1.0f &&
               min_p >= 0.0f && min_p <= 1.0f;
  const bool greedy = temperature == 0.0f;
  const float scale = greedy ? 1.0f : 1.0f / temperature;
  // Read before any block can advance the offset (at the end, after cluster barriers).
  const uint64_t seed = p.seed != nullptr ? static_cast<uint64_t>(p.seed[p.seed_per_row ? b : 0]) : p.seed_value;
  const uint64_t offset =
      p.offset != nullptr ? static_cast<uint64_t>(p.offset[p.offset_per_row ? b : 0]) : p.offset_value;

  // 1. Load the slice (logits scaled by 1 / temperature, or probabilities), its maximum, and whether
  //    it holds a NaN or +inf (or, for probabilities, a negative value).
  float local_max = -INFINITY;
  bool bad = false;
  if (valid) {
    const T* src = static_cast<const T*>(p.input) + row * p.input_stride + begin;
    auto take = [&](float x) {
      bad |= !(x < INFINITY) || (p.probs && x < 0.0f);  // NaN, +inf, p < 0
      local_max = fmaxf(local_max, x);
      return __float_as_uint(x);
    };
    uint32_t vector_end = 0;
    if (p.aligned) {
      // Every thread issues up to kBatch 16-byte loads before it uses any: enough bytes in flight
      // for one block to stream its slice. Each load's elements go to shared memory as 16-byte stores.
      constexpr uint32_t kVec = 16 / sizeof(T);
      constexpr uint32_t kBatch = 32 / kVec;
      const uint32_t vectors = n / kVec;
      const uint4* src4 = reinterpret_cast<const uint4*>(src);
      uint4* dst4 = reinterpret_cast<uint4*>(values);
      for (uint32_t base = 0; base < vectors; base += kThreads * kBatch) {
        uint4 v[kBatch];
#pragma unroll
        for (uint32_t j = 0; j < kBatch; ++j) {
          const uint32_t idx = base + j * kThreads + threadIdx.x;
          if (idx < vectors) v[j] = __ldg(src4 + idx);
        }
#pragma unroll
        for (uint32_t j = 0; j < kBatch; ++j) {
          const uint32_t idx = base + j * kThreads + threadIdx.x;
          if (idx < vectors) {
            const T* e = reinterpret_cast<const T*>(&v[j]);
#pragma unroll
            for (uint32_t q = 0; q < kVec; q += 4) {
              dst4[idx * (kVec / 4) + q / 4] = make_uint4(
                  take(to_float(e[q]) * scale),
                  take(to_float(e[q + 1]) * scale),
                  take(to_float(e[q + 2]) * scale),
                  take(to_float(e[q + 3]) * scale));
            }
          }
        }
      }
      vector_end = vectors * kVec;
    }
    for (uint32_t i = vector_end + threadIdx.x; i < n; i += kThreads) values[i] = take(to_float(src[i]) * scale);
  }
  {
    float m = local_max;
    for (int d = 16; d > 0; d >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
    const int any_bad = __syncthreads_or(bad);
    if (threadIdx.x % 32 == 0) s.warp_part[threadIdx.x / 32][0] = float_key(m);
    __syncthreads();
    unsigned long long key = 0;
    for (uint32_t w = 0; w < kWarps; ++w) key = max(key, s.warp_part[w][0]);
    cluster_max<kCluster>(s, key, any_bad ? 1ull : 0ull);
  }
  const uint32_t max_key = static_cast<uint32_t>(s.result[0]);
  const float row_max = key_float(max_key);
  valid = valid && s.result[1] == 0 && row_max > -INFINITY && (!p.probs || row_max > 0.0f);

  auto finish = [&] {
    if (p.advance && p.offset != nullptr && rank == 0 && threadIdx.x == 0) {
      p.offset[b] = static_cast<int64_t>(offset + 1);
    }
    cluster.sync();  // no block exits while another may still read its shared memory
  };
  auto write_id = [&](int64_t id, float logprob) {
    if (p.ids_are_int64) static_cast<int64_t*>(p.output)[b] = id;
    else static_cast<int32_t*>(p.output)[b] = static_cast<int32_t>(id);
    if (p.logprobs != nullptr) p.logprobs[b] = logprob;
  };
  if (!valid) {
    if (mode == kSample) {
      if (rank == 0 && threadIdx.x == 0) write_id(-1, NAN);
    } else {
      T* dst = static_cast<T*>(p.output) + b * p.output_stride + begin;
      for (uint32_t i = threadIdx.x; i < n; i += kThreads) dst[i] = dtype_trait<T>::from(NAN);
    }
    finish();
    return;
  }

  // The bins of the thresholds' first step: a value's distance below the row's maximum, in eighths
  // of a nat (logits) or of an octave (probabilities); 255 holds all from 31.875 on. Monotone: a
  // larger value never has a larger bin.
  const float inv_max = 1.0f / row_max;
  auto bin_of = [&](float x) -> uint32_t {
    if (!p.probs) {
      const float d = (row_max - x) * 8.0f;
      return d < 255.0f ? static_cast<uint32_t>(d) : 255u;
    }
    const uint32_t w = min(__float_as_uint(fmaxf(x * inv_max, 0.0f)), 0x3f800000u);
    return min((0x3f800000u - w) >> 20, 255u);
  };
  // Keys that bound those of a bin's values: its edges, widened by far more than the rounding of
  // bin_of's arithmetic.
  auto bin_keys = [&](uint32_t bin, uint32_t& low, uint32_t& high) {
    if (bin >= 255) {
      low = 0;
      high = max_key;
      return;
    }
    float upper, lower;
    if (!p.probs) {
      upper = row_max - static_cast<float>(bin) * 0.125f;
      lower = row_max - static_cast<float>(bin + 1) * 0.125f;
    } else {
      upper = row_max * __uint_as_float(0x3f800000u - (bin << 20));
      lower = row_max * __uint_as_float(0x3f800000u - ((bin + 1) << 20));
    }
    const float margin = (fabsf(row_max) + fabsf(lower)) * 1e-5f + 1e-30f;
    high = min(max_key, float_key(upper + margin));
    low = float_key(lower - margin);
  };
  // Fixed-point weights: round(w * 2^30), w = exp(x - max) or p / max(p).
  const float max_log2 = row_max * device::math::log2e;
  auto weight_of = [&](float x) -> uint32_t {
    const float w = p.probs ? fminf(fmaxf(x * inv_max, 0.0f), 1.0f) : fast_exp2(fmaf(x, device::math::log2e, -max_log2));
    return __float2uint_rn(w * static_cast<float>(kOne));
  };

  // Greedy rows: the lowest index holding the maximum.
  int64_t argmax = -1;
  if (greedy) {
    uint32_t first = 0xffffffffu;
    for (uint32_t i = threadIdx.x; i < n; i += kThreads) {
      if (__uint_as_float(values[i]) == row_max) {
        first = i;
        break;
      }
    }
    for (int d = 16; d > 0; d >>= 1) first = min(first, __shfl_xor_sync(0xffffffffu, first, d));
    if (threadIdx.x % 32 == 0) s.warp_part[threadIdx.x / 32][0] = first;
    __syncthreads();
    unsigned long long lowest = 0xffffffffull;
    for (uint32_t w = 0; w < kWarps; ++w) lowest = min(lowest, s.warp_part[w][0]);
    const unsigned long long global = lowest == 0xffffffffull ? ~0ull : static_cast<unsigned long long>(begin) + lowest;
    cluster_max<kCluster>(s, ~global, 0);  // the max of the complement: the lowest index
    argmax = static_cast<int64_t>(~s.result[0]);
    if (mode == kSample) {
      if (rank == 0 && threadIdx.x == 0) write_id(argmax, 0.0f);
      finish();
      return;
    }
  }

  // Every filter keeps the values from some threshold up, so what all of them keep is the elements
  // whose key is at least the largest of their threshold keys: `kept_from`.
  uint32_t kept_from = 0;
  const bool filter_k = !greedy && top_k < p.vocab;
  const bool filter_p = !greedy && top_p < 1.0f;
  // 4. min-p: weight >= min_p * the largest weight (2^30).
  if (!greedy && min_p > 0.0f) {
    const uint32_t min_weight = static_cast<uint32_t>(ceil(static_cast<double>(min_p) * kOne));
    kept_from = lowest_key_where(0, max_key, [&](float x) { return weight_of(x) >= min_weight; });
  }

  // The rest of the row's draw: the kept mass of the slice (each thread a run of odd length, so that
  // a warp's reads of shared memory fall in 32 different banks), the cluster's total, and the token
  // at the target, found by the thread whose run holds it.
  auto draw_from_slice = [&] {
    const uint32_t per_thread = ((n + kThreads - 1) / kThreads) | 1u;
    const uint32_t run_begin = min(n, threadIdx.x * per_thread);
    const uint32_t run_end = min(n, run_begin + per_thread);
    unsigned long long run_mass = 0;
    for (uint32_t i = run_begin; i < run_end; ++i) {
      const uint32_t bits = values[i];
      if (float_key(__uint_as_float(bits)) >= kept_from) run_mass += weight_of(__uint_as_float(bits));
    }
    unsigned long long block_mass = 0;
    const unsigned long long run_last = block_inclusive_scan(s, run_mass, block_mass);
    cluster_gather<kCluster>(s, block_mass);
    unsigned long long total = 0, before = 0;
    for (uint32_t r = 0; r < kCluster; ++r) {
      if (r < rank) before += s.result[r];
      total += s.result[r];
    }
    const uint64_t stream = p.stream_is_row ? static_cast<uint64_t>(b) : 0;
    const uint64_t random = device::philox::bits64(device::philox::draw(seed, offset, stream));
    const unsigned long long target = __umul64hi(random, total);  // uniform on [0, total)
    const unsigned long long run_start = before + run_last - run_mass;
    if (run_mass > 0 && target >= run_start && target < run_start + run_mass) {
      unsigned long long acc = run_start;
      for (uint32_t i = run_begin; i < run_end; ++i) {
        const float x = __uint_as_float(values[i]);
        if (float_key(x) < kept_from) continue;
        const uint32_t q = weight_of(x);
        acc += q;
        if (acc > target) {
          write_id(begin + i, static_cast<float>(log(static_cast<double>(q)) - log(static_cast<double>(total))));
          break;
        }
      }
    }
    finish();
  };

  // Renorm / mask: read the slice again (from L2) and write it, keeping what `keeps` keeps.
  auto write_rows = [&](auto&& keeps) {
    const T* src = static_cast<const T*>(p.input) + row * p.input_stride + begin;
    T* dst = static_cast<T*>(p.output) + b * p.output_stride + begin;
    if (mode == kRenorm) {
      // The kept probabilities' float sum, in a fixed order (threads, warps, blocks by rank).
      float sum = 0.0f;
      for (uint32_t i = threadIdx.x; i < n; i += kThreads) {
        const float x = to_float(src[i]);
        if (keeps(begin + i, x)) sum += x;
      }
      for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
      if (threadIdx.x % 32 == 0) s.warp_part[threadIdx.x / 32][0] = __float_as_uint(sum);
      __syncthreads();
      float block_total = 0.0f;
      for (uint32_t w = 0; w < kWarps; ++w) block_total += __uint_as_float(static_cast<uint32_t>(s.warp_part[w][0]));
      cluster_gather<kCluster>(s, __float_as_uint(block_total));
      float row_sum = 0.0f;
      for (uint32_t r = 0; r < kCluster; ++r) row_sum += __uint_as_float(static_cast<uint32_t>(s.result[r]));
      const float inv = 1.0f / row_sum;
      for (uint32_t i = threadIdx.x; i < n; i += kThreads) {
        const float x = to_float(src[i]);
        dst[i] = dtype_trait<T>::from(keeps(begin + i, x) ? x * inv : 0.0f);
      }
    } else {
      for (uint32_t i = threadIdx.x; i < n; i += kThreads) {
        const float x = to_float(src[i]) * scale;
        dst[i] = dtype_trait<T>::from(keeps(begin + i, x) ? x : -INFINITY);
      }
    }
    finish();
  };
  auto keeps_from = [&](int64_t, float x) { return float_key(x) >= kept_from; };

  if (greedy) {
    write_rows([&](int64_t i, float) { return i == argmax; });
    return;
  }
  if (!filter_k && !filter_p) {
    if (mode == kSample) draw_from_slice();
    else write_rows(keeps_from);
    return;
  }

  // 2, 3. top-k and top-p. The first step of the first of them (top-k's counts, or top-p's mass
  // where top-k is off) picks the bin holding its threshold; each block lists the elements in that
  // bin and above. Where the cluster's lists together fit in one (kListCapacity), every block that
  // needs the thresholds gathers them, sorted by value (largest first, ties by index), and finishes
  // alone; otherwise the thresholds take the cluster's exact radix passes.
  Domain domain{values, n, list_x, 0, false};
  unsigned long long target = 0, row_mass = 0;
  uint32_t first_bin = 255;
  if (filter_k) {
    // Counts per bin; bin 255 (everything far below the maximum) is the rest of the row.
    histogram<kCluster>(s, domain, [&](float x, uint32_t& bin, unsigned long long& w) {
      bin = bin_of(x);
      w = bin < 255 ? 1 : 0;
    });
    unsigned long long near = 0;
    for (uint32_t j = 0; j < 255; ++j) near += s.total[j];
    __syncthreads();
    if (threadIdx.x == 0) s.total[255] = static_cast<unsigned long long>(p.vocab) - near;
    __syncthreads();
    target = static_cast<unsigned long long>(top_k);
  } else {
    histogram<kCluster>(s, domain, [&](float x, uint32_t& bin, unsigned long long& w) {
      bin = bin_of(x);
      w = weight_of(x);
    });
    for (uint32_t j = 0; j < 256; ++j) row_mass += s.total[j];
    target = max(static_cast<unsigned long long>(ceil(static_cast<double>(row_mass) * top_p)), 1ull);
  }
  first_bin = pick(s, target, false);
  const bool whole_bin = s.total[first_bin] == target;
  __syncthreads();

  // The block's list, in any order: values and (global) indices of its elements in bins up to first_bin.
  for (uint32_t base = 0; base < n; base += kThreads) {
    const uint32_t i = base + threadIdx.x;
    const bool in = i < n && bin_of(__uint_as_float(values[i])) <= first_bin;
    const uint32_t ballot = __ballot_sync(0xffffffffu, in);
    uint32_t start = 0;
    if (threadIdx.x % 32 == 0 && ballot) start = atomicAdd(&s.list_size, __popc(ballot));
    start = __shfl_sync(0xffffffffu, start, 0);
    const uint32_t at = start + __popc(ballot & ((1u << (threadIdx.x % 32)) - 1));
    if (in && at < kListCapacity) {
      list_x[at] = values[i];
      list_i[at] = static_cast<uint32_t>(begin + i);
    }
  }
  __syncthreads();
  const uint32_t listed = s.list_size;
  cluster_gather<kCluster>(s, listed);
  unsigned long long gathered = 0;
  for (uint32_t r = 0; r < kCluster; ++r) gathered += s.result[r];
  // joint top-p after top-k needs the whole row's mass, which the lists do not hold.
  if (gathered <= kListCapacity && !(filter_k && filter_p && p.joint)) {
    unsigned long long* sorted = reinterpret_cast<unsigned long long*>(values);  // the slice is no longer read
    unsigned long long* prefix = sorted + kListCapacity;
    const bool finishes = mode != kSample || rank == 0;
    const uint32_t count = static_cast<uint32_t>(gathered);
    uint32_t n2 = 1;
    while (n2 < count) n2 <<= 1;
    if (finishes) {
      // Sort keys: (~key << 32 | index) ascending is value descending, then index ascending.
      // One warp per block of the cluster (kCluster <= kWarps), all reading at once.
      static_assert(kCluster <= kWarps);
      const uint32_t r = threadIdx.x / 32;
      if (r < kCluster) {
        uint32_t at = 0;
        for (uint32_t q = 0; q < r; ++q) at += static_cast<uint32_t>(s.result[q]);
        const uint32_t size = static_cast<uint32_t>(s.result[r]);
        const uint32_t* rx = cluster.map_shared_rank(list_x, r);
        const uint32_t* ri = cluster.map_shared_rank(list_i, r);
        for (uint32_t j = threadIdx.x % 32; j < size; j += 32) {
          sorted[at + j] = (static_cast<unsigned long long>(~float_key(__uint_as_float(rx[j]))) << 32) | ri[j];
        }
      }
      for (uint32_t j = count + threadIdx.x; j < n2; j += kThreads) sorted[j] = ~0ull;
    }
    cluster.sync();  // every block's list is read: blocks may leave
    if (!finishes) return;
    __syncthreads();
    bitonic_sort(sorted, n2);
    auto key_at = [&](uint32_t j) { return ~static_cast<uint32_t>(sorted[j] >> 32); };
    // Inclusive prefix sums of the weights in sorted order: each thread four consecutive entries.
    {
      constexpr uint32_t kPer = kListCapacity / kThreads;
      unsigned long long q[kPer], mine = 0;
#pragma unroll
      for (uint32_t j = 0; j < kPer; ++j) {
        const uint32_t at = threadIdx.x * kPer + j;
        q[j] = at < count ? weight_of(key_float(key_at(at))) : 0u;
        mine += q[j];
      }
      unsigned long long total = 0;
      unsigned long long acc = block_inclusive_scan(s, mine, total) - mine;
#pragma unroll
      for (uint32_t j = 0; j < kPer; ++j) {
        const uint32_t at = threadIdx.x * kPer + j;
        acc += q[j];
        if (at < count) prefix[at] = acc;
      }
      __syncthreads();
    }
    // The number of sorted entries whose key is at least `key`.
    auto count_from = [&](uint32_t key) {
      return lower_bound(sorted, count, (static_cast<unsigned long long>(~key) << 32) | 0xffffffffull);
    };
    const uint32_t k_from = filter_k ? key_at(static_cast<uint32_t>(min(top_k, static_cast<int64_t>(count))) - 1) : 0u;
    kept_from = max(kept_from, k_from);
    if (filter_p) {
      // top-p over the top-k set (ties at its threshold included), or over the row.
      const unsigned long long base = filter_k ? prefix[count_from(k_from) - 1] : row_mass;
      const unsigned long long p_target = max(static_cast<unsigned long long>(ceil(static_cast<double>(base) * top_p)), 1ull);
      const uint32_t at = lower_bound(prefix, count, p_target);
      kept_from = max(kept_from, key_at(min(at, count - 1)));
    }
    const uint32_t kept = count_from(kept_from);
    if (mode == kSample) {
      const unsigned long long total = prefix[kept - 1];
      const uint64_t stream = p.stream_is_row ? static_cast<uint64_t>(b) : 0;
      const uint64_t random = device::philox::bits64(device::philox::draw(seed, offset, stream));
      const unsigned long long t = __umul64hi(random, total);
      if (threadIdx.x == 0) {
        const uint32_t at = lower_bound(prefix, kept, t + 1);  // the first inclusive prefix above t
        const unsigned long long q = prefix[at] - (at > 0 ? prefix[at - 1] : 0);
        write_id(static_cast<int64_t>(sorted[at] & 0xffffffffull),
                 static_cast<float>(log(static_cast<double>(q)) - log(static_cast<double>(total))));
        if (p.advance && p.offset != nullptr) p.offset[b] = static_cast<int64_t>(offset + 1);
      }
      return;
    }
    write_rows(keeps_from);
    return;
  }

  // The cluster's exact passes. A block whose list holds all its candidates passes over the list.
  domain.list_n = listed;
  domain.use_list = listed <= kListCapacity;
  uint32_t k_from = 0;
  if (filter_k) {
    uint32_t k_low, k_high;
    bin_keys(first_bin, k_low, k_high);
    // top-k's threshold: the smallest key of the bins up to first_bin where the whole bin is kept,
    // else the refinement inside it.
    k_from = whole_bin ? lowest_key_where(0, max_key, [&](float x) { return bin_of(x) <= first_bin; })
                       : refine<kCluster>(s, domain, first_bin, target, k_low, k_high, bin_of, [](float) { return 1ull; });
    kept_from = max(kept_from, k_from);
  }
  if (filter_p) {
    auto mass_of = [&](float x) -> unsigned long long {
      return (p.joint || float_key(x) >= k_from) ? weight_of(x) : 0u;
    };
    uint32_t p_bin = first_bin;
    if (filter_k) {
      const Domain mass_domain = p.joint ? Domain{values, n, list_x, 0, false} : domain;
      histogram<kCluster>(s, mass_domain, [&](float x, uint32_t& bin, unsigned long long& w) {
        bin = bin_of(x);
        w = mass_of(x);
      });
      unsigned long long base = 0;
      for (uint32_t j = 0; j < 256; ++j) base += s.total[j];
      target = max(static_cast<unsigned long long>(ceil(static_cast<double>(base) * top_p)), 1ull);
      p_bin = pick(s, target, false);
    }
    const Domain refine_domain = p.joint && filter_k ? Domain{values, n, list_x, 0, false} : domain;
    uint32_t p_low, p_high;
    bin_keys(p_bin, p_low, p_high);
    kept_from = max(kept_from, refine<kCluster>(s, refine_domain, p_bin, target, p_low, p_high, bin_of, mass_of));
  }
  if (mode == kSample) draw_from_slice();
  else write_rows(keeps_from);
}

// The launcher: `mode` kSample writes token ids into `output` [B] (int32 or int64) and, when given,
// log-probabilities into `logprobs` [B] float32; kRenorm / kMask write rows of T into `output`
// [rows, V]. `input` [rows, V] of T (rows with unit inner stride, any row stride); `indices` [B]
// (sample only) maps output row b to input row indices[b]. Each per-row parameter is a tensor [B]
// (float32; top_k int32 or int64), a value for all rows, or neither (off). `seed` / `offset`: int64
// tensors of [B] (a request's own stream) or [1] (one stream per output row), or values.
template <typename T>
struct Sampler {
  static Param param(
      const char* name,
      const tvm::ffi::Optional<tvm::ffi::TensorView>& tensor,
      const tvm::ffi::Optional<double>& value,
      double off,
      bool integer,
      host::SymbolicSize& batch,
      host::SymbolicDevice& device) {
    using namespace host;
    if (tensor.has_value()) {
      const tvm::ffi::TensorView t = *tensor;
      if (integer) {
        TensorMatcher({batch}).with_strides({1}).with_dtype<int32_t, int64_t>().with_device<kDLCUDA>(device).verify(t, name);
      } else {
        TensorMatcher({batch}).with_strides({1}).with_dtype<fp32_t>().with_device<kDLCUDA>(device).verify(t, name);
      }
      const int32_t dtype = integer ? (t.dtype().bits == 64 ? 2 : 1) : 0;
      return Param{t.data_ptr(), dtype, 0.0};
    }
    return Param{nullptr, integer ? 2 : 0, value.has_value() ? *value : off};
  }

  static const int64_t* stream_tensor(
      const char* name,
      const tvm::ffi::Optional<tvm::ffi::TensorView>& tensor,
      int64_t batch,
      bool per_request,
      host::SymbolicDevice& device) {
    using namespace host;
    if (!tensor.has_value()) return nullptr;
    const tvm::ffi::TensorView t = *tensor;
    TensorMatcher({-1}).with_strides({1}).with_dtype<int64_t>().with_device<kDLCUDA>(device).verify(t, name);
    const int64_t length = t.size(0);
    RuntimeCheck(
        length == batch || (!per_request && length == 1),
        "sampling: ",
        name,
        " must have one element per output row (",
        batch,
        per_request ? ")" : ") or one for all rows",
        ", got ",
        length);
    return static_cast<const int64_t*>(t.data_ptr());
  }

  static void run(
      tvm::ffi::TensorView output,
      tvm::ffi::Optional<tvm::ffi::TensorView> logprobs,
      tvm::ffi::TensorView input,
      tvm::ffi::Optional<tvm::ffi::TensorView> indices,
      tvm::ffi::Optional<tvm::ffi::TensorView> temperature,
      tvm::ffi::Optional<double> temperature_value,
      tvm::ffi::Optional<tvm::ffi::TensorView> top_k,
      tvm::ffi::Optional<int64_t> top_k_value,
      tvm::ffi::Optional<tvm::ffi::TensorView> top_p,
      tvm::ffi::Optional<double> top_p_value,
      tvm::ffi::Optional<tvm::ffi::TensorView> min_p,
      tvm::ffi::Optional<double> min_p_value,
      tvm::ffi::Optional<tvm::ffi::TensorView> seed,
      tvm::ffi::Optional<tvm::ffi::TensorView> offset,
      int64_t seed_value,
      int64_t offset_value,
      int64_t mode,
      bool probs,
      bool joint,
      bool advance,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    RuntimeCheck(mode == kSample || mode == kRenorm || mode == kMask, "sampling: mode must be 0, 1 or 2, got ", mode);
    auto rows = SymbolicSize{"rows"};
    auto vocab = SymbolicSize{"vocab"};
    auto batch = SymbolicSize{"batch"};
    auto device = SymbolicDevice{};
    const char* input_name = probs ? "probs" : "logits";
    TensorMatcher::cuda_rows<T>({rows, vocab}, device).verify(input, input_name);
    Params p{};
    if (mode == kSample) {
      if (indices.has_value()) {
        TensorMatcher({batch}).with_strides({1}).with_dtype<int32_t, int64_t>().with_device<kDLCUDA>(device).verify(
            *indices, "indices");
      } else {
        batch.set_value(rows.unwrap());
      }
      TensorMatcher({batch}).with_dtype<int32_t, int64_t>().with_device<kDLCUDA>(device).verify(output, "out");
      if (logprobs.has_value()) {
        TensorMatcher({batch}).with_dtype<fp32_t>().with_device<kDLCUDA>(device).verify(*logprobs, "logprobs");
        p.logprobs = static_cast<float*>((*logprobs).data_ptr());
      }
      p.ids_are_int64 = output.dtype().bits == 64;
    } else {
      RuntimeCheck(!indices.has_value(), "sampling: indices are taken by sampling only");
      RuntimeCheck(!logprobs.has_value(), "sampling: logprobs are written by sampling only");
      batch.set_value(rows.unwrap());
      TensorMatcher::cuda_rows<T>({batch, vocab}, device).verify(output, "out");
      p.output_stride = output.size(0) > 1 ? output.stride(0) : 0;
    }
    const int64_t b = batch.unwrap();
    const int64_t v = vocab.unwrap();
    RuntimeCheck(v >= 1 && v <= kMaxVocab, "sampling: ", input_name, " must have a vocabulary of 1 to ", kMaxVocab, " entries, got ", v);
    if (temperature_value.has_value()) {
      const double t = *temperature_value;
      RuntimeCheck(std::isfinite(t) && t >= 0.0, "sampling: temperature must be a finite float >= 0, got ", t);
    }
    if (top_k_value.has_value()) RuntimeCheck(*top_k_value >= 1, "sampling: top_k must be at least 1, got ", *top_k_value);
    if (top_p_value.has_value()) {
      const double t = *top_p_value;
      RuntimeCheck(t > 0.0 && t <= 1.0, "sampling: top_p must be in (0, 1], got ", t);
    }
    if (min_p_value.has_value()) {
      const double t = *min_p_value;
      RuntimeCheck(t >= 0.0 && t <= 1.0, "sampling: min_p must be in [0, 1], got ", t);
    }
    RuntimeCheck(!probs || !(temperature.has_value() || temperature_value.has_value()),
                 "sampling: temperature applies to logits, not probabilities");
    p.temperature = param("temperature", temperature, temperature_value, 1.0, false, batch, device);
    p.top_k = param("top_k", top_k, top_k_value.has_value() ? tvm::ffi::Optional<double>(static_cast<double>(*top_k_value)) : tvm::ffi::Optional<double>(), 0.0, true, batch, device);
    p.top_p = param("top_p", top_p, top_p_value, 1.0, false, batch, device);
    p.min_p = param("min_p", min_p, min_p_value, 0.0, false, batch, device);
    p.seed = stream_tensor("seed", seed, b, false, device);
    p.offset = const_cast<int64_t*>(stream_tensor("offset", offset, b, advance, device));
    p.seed_value = static_cast<uint64_t>(seed_value);
    p.offset_value = static_cast<uint64_t>(offset_value);
    p.seed_per_row = seed.has_value() && (*seed).size(0) == b;
    p.offset_per_row = offset.has_value() && (*offset).size(0) == b;
    p.stream_is_row = !p.seed_per_row;
    p.advance = advance;
    if (has_no_data(output) || b == 0) return;  // the fake (torch.compile) call ends here: checks only

    p.input = input.data_ptr();
    p.input_stride = input.size(0) > 1 ? input.stride(0) : 0;
    p.output = output.data_ptr();
    p.row_indices = indices.has_value() ? (*indices).data_ptr() : nullptr;
    p.row_indices_int64 = indices.has_value() && (*indices).dtype().bits == 64;
    p.num_rows = rows.unwrap();
    p.batch = b;
    p.vocab = v;
    p.probs = probs;
    p.joint = joint;
    const DLDevice dev = device.unwrap();
    const bool pdl = runtime::resolve_pdl(enable_pdl, dev.device_id);
    if (b <= kWideClusterMaxBatch) {
      launch<kWideCluster>(p, static_cast<int>(mode), dev, pdl);
    } else {
      launch<kCluster>(p, static_cast<int>(mode), dev, pdl);
    }
  }

  template <uint32_t kBlocks>
  static void launch(Params& p, int mode, DLDevice dev, bool pdl) {
    using namespace host;
    constexpr int64_t kVec = 16 / sizeof(T);
    p.chunk = div_ceil(div_ceil(p.vocab, int64_t{kBlocks}), kVec) * kVec;
    p.aligned = reinterpret_cast<uintptr_t>(p.input) % 16 == 0 && p.input_stride % kVec == 0;
    constexpr auto kernel = sample_kernel<T, kBlocks>;
    // Once per device: the opt-in to the largest slice (LaunchKernel's own opt-in above 48 KiB of
    // dynamic shared memory does not count the static `Shared`), and clusters above the portable 8.
    runtime::init_per_device(dev.device_id, [] {
      constexpr int64_t kMaxChunk = (kMaxVocab / kBlocks + kVec - 1) / kVec * kVec;
      runtime::set_max_dynamic_smem(kernel, dynamic_smem(kMaxChunk));
      if constexpr (kBlocks > 8) {
        RuntimeDeviceCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
      }
    });
    LaunchKernel(static_cast<uint32_t>(p.batch * kBlocks), kThreads, dev, dynamic_smem(p.chunk))
        .enable_cluster(kBlocks)
        .enable_pdl(pdl)(kernel, p, mode);
  }
};

}  // namespace jit_kernel::sampling
