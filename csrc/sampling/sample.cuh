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
// Thresholds take two steps: a histogram over bins of each value's distance below the row's maximum
// picks the bin holding the threshold, then an exact radix selection (four passes of 8 bits over the
// values' order-preserving float keys) runs over that bin's elements only, from a list of candidates
// where they fit (docs/design/sampling.md). top-k counts elements, top-p sums weights. Weights are w = exp(x - max) (logits) or p / max(p) (probabilities) in fixed point,
// round(w * 2^30), so every sum is an integer, exact and independent of the order of the atomics:
// the same row and random bits give the same token bit for bit, at any slot and batch size. A token
// whose weight rounds to 0 (below 2^-31 of the largest) is never kept.
//
// Ties at a threshold are kept: every element equal to the k-th largest value, and every element equal
// to the value at which top-p's cumulative mass (from the largest value down) first reaches p.
//
// The draw: 64 random bits from Philox4x32-10 keyed by the row's seed with counter (offset, stream)
// (`device::philox::draw`) scale the kept mass S to an integer target t in [0, S); the token is the
// first index whose inclusive prefix sum of kept weights (in index order) exceeds t.
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
  unsigned long long hist[2][256];
  unsigned long long slot[2][4];
};

struct Shared {
  Exchange x;
  unsigned long long total[256];  // the cluster's histogram of the current pass
  unsigned long long warp_part[kWarps][2];
  unsigned long long result[4];
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

// Sum (op 0) or max (op 1) of up to four u64 per block over the cluster: every block gets the same
// results in s.result, reduced in rank order.
template <uint32_t kCluster>
SGL_DEVICE void cluster_reduce(Shared& s, const unsigned long long (&mine)[4], const int (&ops)[4]) {
  auto cluster = cooperative_groups::this_cluster();
  const uint32_t buf = s.round & 1;
  if (threadIdx.x < 4) s.x.slot[buf][threadIdx.x] = mine[threadIdx.x];
  cluster.sync();
  if (threadIdx.x < 4) {
    const int op = ops[threadIdx.x];
    unsigned long long acc = 0;
    for (uint32_t r = 0; r < kCluster; ++r) {
      const unsigned long long v = cluster.map_shared_rank(&s.x, r)->slot[buf][threadIdx.x];
      acc = op == 1 ? (v > acc ? v : acc) : acc + v;
    }
    s.result[threadIdx.x] = acc;
  }
  next_round(s);
}

// Block-wide sum of one u64 per thread, in a fixed order; every thread gets it.
SGL_DEVICE unsigned long long block_sum(Shared& s, unsigned long long v, int slot) {
  for (int d = 16; d > 0; d >>= 1) v += __shfl_xor_sync(0xffffffffu, v, d);
  if (threadIdx.x % 32 == 0) s.warp_part[threadIdx.x / 32][slot] = v;
  __syncthreads();
  unsigned long long total = 0;
  for (uint32_t w = 0; w < kWarps; ++w) total += s.warp_part[w][slot];
  __syncthreads();
  return total;
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
  unsigned long long* hist = s.x.hist[buf];
  if (threadIdx.x < 256) hist[threadIdx.x] = 0;
  __syncthreads();
  domain.each([&](float x) {
    uint32_t bin;
    unsigned long long w;
    bin_and_weight(x, bin, w);
    if (w != 0) atomicAdd(&hist[bin], w);
  });
  cluster.sync();
  if (threadIdx.x < 256) {
    unsigned long long acc = 0;
    for (uint32_t r = 0; r < kCluster; ++r) acc += cluster.map_shared_rank(&s.x, r)->hist[buf][threadIdx.x];
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
// the domain's elements in bin `bin` first reaches `target`: four passes of 8 bits.
template <uint32_t kCluster, typename Bin, typename Weight>
SGL_DEVICE uint32_t refine(
    Shared& s, const Domain& domain, uint32_t bin, unsigned long long target, Bin&& bin_of, Weight&& weight_of) {
  uint32_t prefix = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    const uint32_t high = shift >= 24 ? 0u : (0xffffffffu << (shift + 8));
    histogram<kCluster>(s, domain, [&](float x, uint32_t& digit, unsigned long long& w) {
      const uint32_t key = float_key(x);
      digit = (key >> shift) & 255u;
      w = (bin_of(x) == bin && (key & high) == (prefix & high)) ? weight_of(x) : 0ull;
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

inline constexpr uint32_t kListCapacity = 2048;  // candidates a block keeps, beyond its slice

// Shared memory of a block, beyond the static `Shared`: its slice, then its candidate list.
inline std::size_t dynamic_smem(int64_t chunk) {
  return static_cast<std::size_t>(chunk + kListCapacity) * sizeof(uint32_t);
}

template <typename T, uint32_t kCluster>
__global__ void __launch_bounds__(kThreads, 2) sample_kernel(const __grid_constant__ Params p, int mode) {
  using namespace detail;
  extern __shared__ __align__(16) uint32_t values[];  // the slice's values (float bits), then the list
  uint32_t* list_x = values + p.chunk;
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
    auto take = [&](uint32_t i, float x) {
      values[i] = __float_as_uint(x);
      bad |= (!(x < INFINITY) && !(x == -INFINITY)) || (p.probs && x < 0.0f);  // NaN, +inf, p < 0
      local_max = fmaxf(local_max, x);
    };
    uint32_t vector_end = 0;
    if (p.aligned) {
      // Every thread issues up to kBatch 16-byte loads before it uses any: enough bytes in flight
      // for one block to stream its slice.
      constexpr uint32_t kVec = 16 / sizeof(T);
      constexpr uint32_t kBatch = 32 / kVec;
      const uint32_t vectors = n / kVec;
      const uint4* src4 = reinterpret_cast<const uint4*>(src);
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
            for (uint32_t k = 0; k < kVec; ++k) take(idx * kVec + k, to_float(e[k]) * scale);
          }
        }
      }
      vector_end = vectors * kVec;
    }
    for (uint32_t i = vector_end + threadIdx.x; i < n; i += kThreads) take(i, to_float(src[i]) * scale);
  }
  {
    float m = local_max;
    for (int d = 16; d > 0; d >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, d));
    const int any_bad = __syncthreads_or(bad);
    if (threadIdx.x % 32 == 0) s.warp_part[threadIdx.x / 32][0] = float_key(m);
    __syncthreads();
    unsigned long long key = 0;
    for (uint32_t w = 0; w < kWarps; ++w) key = max(key, s.warp_part[w][0]);
    const unsigned long long mine[4] = {key, any_bad ? 1ull : 0ull, 0, 0};
    constexpr int ops[4] = {1, 1, 0, 0};
    cluster_reduce<kCluster>(s, mine, ops);
  }
  const uint32_t max_key = static_cast<uint32_t>(s.result[0]);
  const float row_max = __uint_as_float((max_key & 0x80000000u) ? (max_key & 0x7fffffffu) : ~max_key);
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

  // The bins of the thresholds' first pass: a value's distance below the row's maximum, in eighths
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
    const unsigned long long mine[4] = {~global, 0, 0, 0};  // the max of the complement: the lowest index
    constexpr int ops[4] = {1, 0, 0, 0};
    cluster_reduce<kCluster>(s, mine, ops);
    argmax = static_cast<int64_t>(~s.result[0]);
    if (mode == kSample) {
      if (rank == 0 && threadIdx.x == 0) write_id(argmax, 0.0f);
      finish();
      return;
    }
  }

  Domain domain{values, n, list_x, 0, false};
  // Build the block's list of candidates: the slice's elements in bins up to `last`, kept when they
  // fit (kListCapacity); otherwise the passes keep reading the slice.
  auto build_list = [&](uint32_t last) {
    if (threadIdx.x == 0) s.list_size = 0;
    __syncthreads();
    for (uint32_t base = 0; base < n; base += kThreads) {
      const uint32_t i = base + threadIdx.x;
      const bool in = i < n && bin_of(__uint_as_float(values[i])) <= last;
      const uint32_t ballot = __ballot_sync(0xffffffffu, in);
      uint32_t start = 0;
      if (threadIdx.x % 32 == 0 && ballot) start = atomicAdd(&s.list_size, __popc(ballot));
      start = __shfl_sync(0xffffffffu, start, 0);
      const uint32_t at = start + __popc(ballot & ((1u << (threadIdx.x % 32)) - 1));
      if (in && at < kListCapacity) list_x[at] = values[i];
    }
    __syncthreads();
    domain.list_n = s.list_size;
    domain.use_list = domain.list_n <= kListCapacity;
    __syncthreads();
  };

  // 2. top-k: the elements in bins below `k_bin`, and those in `k_bin` with keys from `k_key` on.
  uint32_t k_bin = 255, k_key = 0;
  if (!greedy && top_k < p.vocab) {
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
    unsigned long long target = static_cast<unsigned long long>(top_k);
    k_bin = pick(s, target, false);
    const bool whole_bin = s.total[k_bin] == target;
    if (k_bin < 255 || n <= kListCapacity) build_list(k_bin);
    if (!whole_bin) {
      k_key = refine<kCluster>(s, domain, k_bin, target, bin_of, [](float) { return 1ull; });
    }
  }
  auto passes_k = [&](float x) {
    const uint32_t bin = bin_of(x);
    return bin < k_bin || (bin == k_bin && float_key(x) >= k_key);
  };

  // 3. top-p: the smallest set of the largest values whose mass reaches top_p of the top-k set's (or,
  //    joint, the row's), by the same two steps with weights for counts.
  uint32_t p_bin = 255, p_key = 0;
  if (!greedy && top_p < 1.0f) {
    const Domain mass_domain = p.joint ? Domain{values, n, list_x, 0, false} : domain;
    histogram<kCluster>(s, mass_domain, [&](float x, uint32_t& bin, unsigned long long& w) {
      bin = bin_of(x);
      w = (p.joint || passes_k(x)) ? weight_of(x) : 0u;
    });
    unsigned long long base = 0;
    for (uint32_t j = 0; j < 256; ++j) base += s.total[j];
    unsigned long long target = static_cast<unsigned long long>(ceil(static_cast<double>(base) * top_p));
    target = max(target, 1ull);
    p_bin = pick(s, target, false);
    if (!domain.use_list && !p.joint && (p_bin < 255 || n <= kListCapacity)) build_list(p_bin);
    const Domain refine_domain = p.joint ? mass_domain : domain;
    p_key = refine<kCluster>(s, refine_domain, p_bin, target, bin_of, [&](float x) -> unsigned long long {
      return (p.joint || passes_k(x)) ? weight_of(x) : 0u;
    });
  }
  // 4. min-p: weight >= min_p * the largest weight (2^30).
  const uint32_t min_weight = min_p > 0.0f ? static_cast<uint32_t>(ceil(static_cast<double>(min_p) * kOne)) : 0u;
  auto kept = [&](float x) {
    const uint32_t bin = bin_of(x);
    const uint32_t key = float_key(x);
    return (bin < k_bin || (bin == k_bin && key >= k_key)) && (bin < p_bin || (bin == p_bin && key >= p_key)) &&
           (min_weight == 0 || weight_of(x) >= min_weight);
  };

  if (mode == kSample) {
    // 5. The kept mass, per block and in all, then the draw.
    unsigned long long mass = 0;
    domain.each([&](float x) {
      if (kept(x)) mass += weight_of(x);
    });
    const unsigned long long block_mass = block_sum(s, mass, 0);
    __shared__ unsigned long long block_masses[kCluster];
    {
      const uint32_t buf = s.round & 1;
      if (threadIdx.x == 0) s.x.slot[buf][0] = block_mass;
      cluster.sync();
      if (threadIdx.x < kCluster) block_masses[threadIdx.x] = cluster.map_shared_rank(&s.x, threadIdx.x)->slot[buf][0];
      next_round(s);
    }
    unsigned long long total = 0, before = 0;
    for (uint32_t r = 0; r < kCluster; ++r) {
      if (r < rank) before += block_masses[r];
      total += block_masses[r];
    }
    const uint64_t stream = p.stream_is_row ? static_cast<uint64_t>(b) : 0;
    const uint64_t bits = device::philox::bits64(device::philox::draw(seed, offset, stream));
    const unsigned long long target = __umul64hi(bits, total);  // uniform on [0, total)
    if (target >= before && target < before + block_mass) {
      // This block holds the token: the first index whose inclusive prefix of kept weights, in index
      // order, exceeds the target. Runs of odd length per thread, so that a warp's reads of shared
      // memory fall in 32 different banks.
      const uint32_t per_thread = ((n + kThreads - 1) / kThreads) | 1u;
      const uint32_t run_begin = min(n, threadIdx.x * per_thread);
      const uint32_t run_end = min(n, run_begin + per_thread);
      unsigned long long run_mass = 0;
      for (uint32_t i = run_begin; i < run_end; ++i) {
        const float x = __uint_as_float(values[i]);
        if (kept(x)) run_mass += weight_of(x);
      }
      unsigned long long inclusive = run_mass;
      const uint32_t lane = threadIdx.x % 32, warp = threadIdx.x / 32;
      for (int d = 1; d < 32; d <<= 1) {
        const unsigned long long up = __shfl_up_sync(0xffffffffu, inclusive, d);
        if (lane >= static_cast<uint32_t>(d)) inclusive += up;
      }
      if (lane == 31) s.warp_part[warp][1] = inclusive;
      __syncthreads();
      unsigned long long run_start = before + inclusive - run_mass;
      for (uint32_t w = 0; w < warp; ++w) run_start += s.warp_part[w][1];
      if (run_mass > 0 && target >= run_start && target < run_start + run_mass) {
        unsigned long long acc = run_start;
        for (uint32_t i = run_begin; i < run_end; ++i) {
          const float x = __uint_as_float(values[i]);
          if (!kept(x)) continue;
          const uint32_t q = weight_of(x);
          acc += q;
          if (acc > target) {
            write_id(begin + i, static_cast<float>(log(static_cast<double>(q)) - log(static_cast<double>(total))));
            break;
          }
        }
      }
    }
  } else {
    // Renorm / mask: read the row again (from L2) and write it.
    const T* src = static_cast<const T*>(p.input) + row * p.input_stride + begin;
    T* dst = static_cast<T*>(p.output) + b * p.output_stride + begin;
    auto keeps = [&](uint32_t i) {
      return greedy ? begin + i == argmax : kept(__uint_as_float(values[i]));
    };
    if (mode == kRenorm) {
      // The kept probabilities' float sum, in a fixed order (threads, warps, blocks by rank).
      float sum = 0.0f;
      for (uint32_t i = threadIdx.x; i < n; i += kThreads) {
        if (keeps(i)) sum += to_float(src[i]);
      }
      for (int d = 16; d > 0; d >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, d);
      if (threadIdx.x % 32 == 0) s.warp_part[threadIdx.x / 32][0] = __float_as_uint(sum);
      __syncthreads();
      float block_total = 0.0f;
      for (uint32_t w = 0; w < kWarps; ++w) block_total += __uint_as_float(static_cast<uint32_t>(s.warp_part[w][0]));
      const uint32_t buf = s.round & 1;
      if (threadIdx.x == 0) s.x.slot[buf][0] = __float_as_uint(block_total);
      cluster.sync();
      float row_sum = 0.0f;
      for (uint32_t r = 0; r < kCluster; ++r) {
        row_sum += __uint_as_float(static_cast<uint32_t>(cluster.map_shared_rank(&s.x, r)->slot[buf][0]));
      }
      const float inv = 1.0f / row_sum;
      for (uint32_t i = threadIdx.x; i < n; i += kThreads) {
        dst[i] = dtype_trait<T>::from(keeps(i) ? to_float(src[i]) * inv : 0.0f);
      }
    } else {
      for (uint32_t i = threadIdx.x; i < n; i += kThreads) {
        dst[i] = dtype_trait<T>::from(keeps(i) ? to_float(src[i]) * scale : -INFINITY);
      }
    }
  }
  finish();
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
    if constexpr (kBlocks > 8) {
      runtime::init_per_device<Sampler>(dev.device_id, [] {
        RuntimeDeviceCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
      });
    }
    LaunchKernel(static_cast<uint32_t>(p.batch * kBlocks), kThreads, dev, dynamic_smem(p.chunk))
        .enable_cluster(kBlocks)
        .enable_pdl(pdl)(kernel, p, mode);
  }
};

}  // namespace jit_kernel::sampling
