// moe_align_block_size: sort the (token, slot) pairs of topk_ids by expert, each expert's run padded to
// a multiple of block_size, in the layout Triton fused-MoE GEMMs (vLLM's and SGLang's) read:
// - sorted_token_ids[i]: a flat index token * topk + slot into topk_ids, expert by expert in ascending
//   expert order; the padding after each expert's pairs holds numel (= tokens * topk), as does every
//   element past num_tokens_post_padded. The order of pairs within one expert is unspecified.
// - expert_ids[b]: the expert of block b (block_size rows of sorted_token_ids), or expert_map[expert]
//   with an expert-parallel map (-1: not on this rank); blocks past num_tokens_post_padded hold 0.
// - num_tokens_post_padded[0]: the sum over experts of round_up(count, block_size).
// Ids outside [0, num_experts) are skipped (not placed).
//
// Three paths, by the number of pairs (MoeAlignPaths; docs/design/moe.md has the measurements that set
// the bounds, and the sweep that measures them):
// - up to kThreads pairs: a pair and an expert per thread (align_small_kernel, one id load, four
//   barriers), one CTA, or up to 8 that share the stores of a longer sorted range;
// - up to kSmallPairs pairs: one CTA of 1024 threads counts the pairs per expert in shared memory,
//   takes the exclusive prefix sum of the padded counts (cub::BlockScan), then scatters through
//   per-expert cursors (shared-memory atomics);
// - beyond, three kernels launched with PDL, so that no single CTA reads every id (one CTA's
//   shared-memory atomics conflict in their banks): a grid of CTAs counts its chunks' pairs per expert
//   into a workspace histogram; one CTA sums it and lays out the blocks and the padding, leaving each
//   expert's first position in the workspace; then a grid of CTAs scatters, each ranking its chunk's
//   pairs per expert in shared memory and reserving one range per expert with one global atomic.
#pragma once

#include <sgl_kernel/ffi.h>
#include <sgl_kernel/runtime.cuh>
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>

#include <cub/block/block_scan.cuh>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>

#include <algorithm>
#include <bit>
#include <cstdint>

namespace jit_kernel::moe_align {

inline constexpr int kThreads = 1024;
inline constexpr int kMaxExperts = kThreads;
// The most pairs the op gives the one-CTA kernel; the three kernels take more (docs/design/moe.md).
inline constexpr int64_t kSmallPairs = 3072;
inline constexpr int kScatterThreads = 256;
inline constexpr int kScatterItems = 4;  // pairs per thread of the scatter kernel
inline constexpr int kBatch = 8;         // ids a thread of the one-CTA loops loads before using them
inline constexpr int kHistThreads = 256;
inline constexpr int kHistItems = 16;  // pairs per thread of the histogram kernel
inline constexpr int kHistPairs = kHistThreads * kHistItems;

struct AlignParams {
  const void* topk_ids;
  const int32_t* expert_map;  // [experts] or nullptr
  int32_t* sorted_ids;
  int32_t* expert_ids;
  int32_t* post_padded;
  int32_t* cursor;  // [experts] workspace of the three-kernel path, else nullptr
  int32_t* hist;    // [chunks, experts] workspace of the three-kernel path: pairs per chunk and expert
  int32_t chunks;   // of kHistPairs pairs
  int32_t numel;
  int32_t experts;
  int32_t block_size;
  int32_t block_shift;  // log2(block_size) when a power of two, else -1
  int32_t sorted_len;
  int32_t blocks_len;
};

// round_up(n, block_size) / block_size, a shift when block_size is a power of two.
SGL_DEVICE int32_t blocks_of(const AlignParams& p, int32_t n) {
  return p.block_shift >= 0 ? (n + p.block_size - 1) >> p.block_shift : (n + p.block_size - 1) / p.block_size;
}

template <typename Id>
SGL_DEVICE int32_t expert_of(const AlignParams& p, int64_t i) {
  const int64_t e = static_cast<int64_t>(static_cast<const Id*>(p.topk_ids)[i]);
  return e >= 0 && e < p.experts ? static_cast<int32_t>(e) : -1;
}

// f(i, expert) for every placed pair i this thread of a kThreads CTA owns; the ids are loaded kBatch at
// a time, so that their latencies overlap.
template <typename Id, typename F>
SGL_DEVICE void for_each_pair(const AlignParams& p, F&& f) {
  for (int64_t first = threadIdx.x; first < p.numel; first += int64_t{kThreads} * kBatch) {
    int32_t e[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t i = first + j * kThreads;
      e[j] = i < p.numel ? expert_of<Id>(p, i) : -1;
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (e[j] >= 0) f(static_cast<int32_t>(first + j * kThreads), e[j]);
    }
  }
}

// The layout's counting part, by one CTA of kThreads: counts per expert (from the ids, or kFromHist:
// the sum of the histogram's rows), offsets (into `start`), expert_ids, num_tokens_post_padded, and
// numel in every sorted position that holds no pair (each expert's padding and the tail): every
// position is written once, by this or by the scatter. Returns the padded total to every thread.
template <typename Id, bool kFromHist = false>
SGL_DEVICE int32_t lay_out(const AlignParams& p, int32_t* counts, int32_t* start) {
  using Scan = cub::BlockScan<int32_t, kThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int32_t total;
  const int t = threadIdx.x;
  if (t < p.experts) counts[t] = 0;
  __syncthreads();
  device::PDLWaitPrimary();
  if constexpr (kFromHist) {
    // kThreads / experts threads per expert (at least one), each summing every so many rows.
    const int per_expert = kThreads / p.experts;
    if (t < per_expert * p.experts) {
      const int e = t % p.experts;
      int32_t n = 0;
#pragma unroll 8
      for (int c = t / p.experts; c < p.chunks; c += per_expert) n += p.hist[static_cast<int64_t>(c) * p.experts + e];
      if (n > 0) atomicAdd(&counts[e], n);
    }
  } else {
    for_each_pair<Id>(p, [&](int32_t, int32_t e) { atomicAdd(&counts[e], 1); });
  }
  __syncthreads();
  const int32_t count = t < p.experts ? counts[t] : 0;
  const int32_t padded = (count + p.block_size - 1) / p.block_size * p.block_size;
  int32_t offset;
  int32_t sum;
  Scan(scan_storage).ExclusiveSum(padded, offset, sum);
  if (t < p.experts) start[t] = offset;
  if (t == 0) {
    total = sum;
    p.post_padded[0] = sum;
  }
  __syncthreads();
  const int32_t all = total;
  // Each expert's padding, a warp per expert: one thread per expert would store its up to
  // block_size - 1 positions one by one, each warp store touching 32 experts' lines.
  for (int e = t / 32; e < p.experts; e += kThreads / 32) {
    const int32_t first = start[e] + counts[e];
    const int32_t end = start[e] + (counts[e] + p.block_size - 1) / p.block_size * p.block_size;
    for (int32_t i = first + t % 32; i < end; i += 32) p.sorted_ids[i] = p.numel;
  }
  // Block b's expert: the last expert whose run starts at or before row b * block_size (that run
  // holds the row, since the next one starts after it), by binary search over `start`.
  for (int32_t b = t; b < all / p.block_size; b += kThreads) {
    const int32_t row = b * p.block_size;
    int lo = 0, hi = p.experts - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (start[mid] <= row) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    p.expert_ids[b] = p.expert_map != nullptr ? p.expert_map[lo] : lo;
  }
  for (int32_t b = all / p.block_size + t; b < p.blocks_len; b += kThreads) p.expert_ids[b] = 0;
  for (int32_t i = all + t; i < p.sorted_len; i += kThreads) p.sorted_ids[i] = p.numel;
  return all;
}

// Up to kThreads pairs: one pair and one expert per thread. Each thread loads its id once; a
// shared-memory atomic counts the pair; the experts' padded sizes are scanned (a warp scan, each
// warp's total in shared memory, the totals before a warp summed with one redux.sync); each pair lands
// at its expert's start plus its rank, and each expert writes its blocks' ids. Sorted positions that
// hold no pair get numel. Four barriers, one global id load per thread, no global atomics.
// - One CTA (!kSliced): the rank is the counting atomic's result; all sorted positions are filled
//   first, while the id loads are in flight, and the pairs land over them after a barrier.
// - A sorted range of more than kFillPerCta positions (kSliced): one CTA's stores, the fill and the
//   scattered pairs, took most of the time, so a grid of CTAs shares them. Every CTA counts every
//   pair, and those before its slice of the pairs; a pair of its slice lands at its expert's start
//   plus the pairs before the slice plus its rank within the slice (the same in every CTA, so the
//   CTAs' positions are disjoint); each CTA fills a share of the padding (a warp per expert) and of
//   the tail, which no pair's position overlaps.
inline constexpr int64_t kFillPerCta = 2048;
inline constexpr int64_t kMaxSlicedCtas = 8;

template <typename Id, bool kSliced>
__global__ void __launch_bounds__(kThreads) align_small_kernel(const AlignParams p) {
  __shared__ int32_t counts[kMaxExperts];                // counts, then each expert's start
  __shared__ int32_t sizes[kSliced ? kMaxExperts : 1];   // counts
  __shared__ int32_t before[kSliced ? kMaxExperts : 1];  // pairs before the slice, then its ranks
  __shared__ int32_t warp_total[kThreads / 32];
  const int t = threadIdx.x;
  const int lane = t % 32;
  const int warp = t / 32;
  const int ctas = kSliced ? static_cast<int>(gridDim.x) : 1;
  const int cta = kSliced ? static_cast<int>(blockIdx.x) : 0;
  const int32_t slice = kSliced ? (p.numel + ctas - 1) / ctas : p.numel;
  const int32_t slice_begin = cta * slice;
  const bool mine = t >= slice_begin && t < slice_begin + slice;
  if (t < p.experts) {
    counts[t] = 0;
    if constexpr (kSliced) before[t] = 0;
  }
  device::PDLWaitPrimary();
  const int32_t e = t < p.numel ? expert_of<Id>(p, t) : -1;
  const int32_t mapped = p.expert_map != nullptr && t < p.experts ? p.expert_map[t] : t;  // loaded with the id
  if constexpr (!kSliced) {
    for (int32_t i = t; i < p.sorted_len; i += kThreads) p.sorted_ids[i] = p.numel;
  }
  __syncthreads();
  int32_t rank = 0;
  if constexpr (kSliced) {
    if (e >= 0) {
      atomicAdd(&counts[e], 1);
      if (t < slice_begin) atomicAdd(&before[e], 1);
    }
  } else {
    rank = e >= 0 ? atomicAdd(&counts[e], 1) : 0;
  }
  __syncthreads();
  if constexpr (kSliced) rank = e >= 0 && mine ? atomicAdd(&before[e], 1) : 0;
  const int32_t count = t < p.experts ? counts[t] : 0;
  const int32_t blocks = blocks_of(p, count);
  int32_t inclusive = blocks;  // in blocks: the scan of block counts
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int32_t v = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += v;
  }
  if (lane == 31) warp_total[warp] = inclusive;
  __syncthreads();
  const int32_t other = warp_total[lane];
  const int32_t preceding = __reduce_add_sync(0xffffffffu, lane < warp ? other : 0);
  const int32_t all_blocks = __reduce_add_sync(0xffffffffu, other);
  const int32_t first_block = preceding + inclusive - blocks;
  if (t < p.experts) {
    counts[t] = first_block * p.block_size;
    if constexpr (kSliced) sizes[t] = count;
  }
  if (t == 0 && cta == 0) p.post_padded[0] = all_blocks * p.block_size;
  device::PDLTriggerSecondary();
  if (!kSliced || t % ctas == cta) {  // blocks is 0 past the experts
    for (int32_t b = 0; b < blocks; ++b) p.expert_ids[first_block + b] = mapped;
  }
  for (int32_t b = all_blocks + cta * kThreads + t; b < p.blocks_len; b += ctas * kThreads) p.expert_ids[b] = 0;
  __syncthreads();
  if (e >= 0 && mine) p.sorted_ids[counts[e] + rank] = t;
  if constexpr (kSliced) {
    for (int x = cta * (kThreads / 32) + warp; x < p.experts; x += ctas * (kThreads / 32)) {
      const int32_t end = counts[x] + blocks_of(p, sizes[x]) * p.block_size;
      for (int32_t i = counts[x] + sizes[x] + lane; i < end; i += 32) p.sorted_ids[i] = p.numel;
    }
    const int32_t all = all_blocks * p.block_size;
    for (int32_t i = all + cta * kThreads + t; i < p.sorted_len; i += ctas * kThreads) p.sorted_ids[i] = p.numel;
  }
}

// The one-CTA path (up to kSmallPairs pairs in the op): everything in one CTA.
template <typename Id>
__global__ void __launch_bounds__(kThreads) align_kernel(const AlignParams p) {
  __shared__ int32_t counts[kMaxExperts];
  __shared__ int32_t cursor[kMaxExperts];
  lay_out<Id>(p, counts, cursor);
  __syncthreads();  // `cursor` holds each expert's start
  for_each_pair<Id>(p, [&](int32_t i, int32_t e) { p.sorted_ids[atomicAdd(&cursor[e], 1)] = i; });
  device::PDLTriggerSecondary();
}

// Beyond: first each CTA's kHistPairs pairs counted per expert, into row blockIdx.x of the histogram
// (every entry written: the workspace needs no zeroing).
template <typename Id>
__global__ void __launch_bounds__(kHistThreads) histogram_kernel(const AlignParams p) {
  __shared__ int32_t local[kMaxExperts];
  const int t = threadIdx.x;
  for (int e = t; e < p.experts; e += kHistThreads) local[e] = 0;
  __syncthreads();
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kHistPairs;
  int32_t expert[kHistItems];
  device::PDLWaitPrimary();  // whatever produced topk_ids
#pragma unroll
  for (int j = 0; j < kHistItems; ++j) {
    const int64_t i = base + j * kHistThreads + t;
    expert[j] = i < p.numel ? expert_of<Id>(p, i) : -1;
  }
#pragma unroll
  for (int j = 0; j < kHistItems; ++j) {
    if (expert[j] >= 0) atomicAdd(&local[expert[j]], 1);
  }
  __syncthreads();
  device::PDLTriggerSecondary();
  int32_t* row = p.hist + static_cast<int64_t>(blockIdx.x) * p.experts;
  for (int e = t; e < p.experts; e += kHistThreads) row[e] = local[e];
}

// Then the layout from the histogram, and each expert's start in the workspace for the scatter.
__global__ void __launch_bounds__(kThreads) count_kernel(const AlignParams p) {
  __shared__ int32_t counts[kMaxExperts];
  __shared__ int32_t start[kMaxExperts];
  lay_out<int32_t, true>(p, counts, start);  // the ids are not read
  device::PDLTriggerSecondary();
  for (int e = threadIdx.x; e < p.experts; e += kThreads) p.cursor[e] = start[e];
}

// The scatter: kScatterThreads * kScatterItems pairs per CTA.
template <typename Id>
__global__ void __launch_bounds__(kScatterThreads) scatter_kernel(const AlignParams p) {
  __shared__ int32_t local[kMaxExperts];
  const int t = threadIdx.x;
  for (int e = t; e < p.experts; e += kScatterThreads) local[e] = 0;
  __syncthreads();
  const int32_t base = static_cast<int32_t>(blockIdx.x) * kScatterThreads * kScatterItems;
  int32_t expert[kScatterItems];
  int32_t rank[kScatterItems];
  device::PDLWaitPrimary();  // the count kernel's starts (and whatever produced topk_ids)
#pragma unroll
  for (int j = 0; j < kScatterItems; ++j) {
    const int32_t i = base + j * kScatterThreads + t;
    expert[j] = i < p.numel ? expert_of<Id>(p, i) : -1;
  }
#pragma unroll
  for (int j = 0; j < kScatterItems; ++j) rank[j] = expert[j] >= 0 ? atomicAdd(&local[expert[j]], 1) : 0;
  __syncthreads();
  for (int e = t; e < p.experts; e += kScatterThreads) {
    const int32_t n = local[e];
    local[e] = n > 0 ? atomicAdd(&p.cursor[e], n) : 0;  // this CTA's first position for expert e
  }
  __syncthreads();
  device::PDLTriggerSecondary();
#pragma unroll
  for (int j = 0; j < kScatterItems; ++j) {
    if (expert[j] >= 0) p.sorted_ids[local[expert[j]] + rank[j]] = base + j * kScatterThreads + t;
  }
}

// The launcher: up to kPerThreadPairs pairs (at most kThreads) the one-pair-per-thread kernel, up to
// kOneCtaPairs the one-CTA kernel, beyond the three kernels. MoeAlign, the op, takes kThreads and
// kSmallPairs; bench_moe's --align-sweep compiles other bounds, to time each path at any size.
template <int64_t kPerThreadPairs = kThreads, int64_t kOneCtaPairs = kSmallPairs>
struct MoeAlignPaths {
  static_assert(kPerThreadPairs >= 0 && kPerThreadPairs <= kThreads, "align_small_kernel holds kThreads pairs");
  static_assert(kOneCtaPairs >= 0);

  static void run(
      tvm::ffi::TensorView sorted_token_ids,
      tvm::ffi::TensorView expert_ids,
      tvm::ffi::TensorView num_tokens_post_padded,
      tvm::ffi::TensorView topk_ids,
      int64_t num_experts,
      int64_t block_size,
      tvm::ffi::Optional<tvm::ffi::TensorView> expert_map,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    auto N = SymbolicSize{"num_tokens"};
    auto K = SymbolicSize{"topk"};
    auto S = SymbolicSize{"sorted_len"};
    auto B = SymbolicSize{"blocks"};
    auto device = SymbolicDevice{};
    TensorMatcher({N, K}).with_device<kDLCUDA>(device).with_dtype<int32_t, int64_t>().verify(topk_ids, "topk_ids");
    TensorMatcher({S}).with_device<kDLCUDA>(device).with_dtype<int32_t>().verify(sorted_token_ids, "sorted_token_ids");
    TensorMatcher({B}).with_device<kDLCUDA>(device).with_dtype<int32_t>().verify(expert_ids, "expert_ids");
    TensorMatcher({1}).with_device<kDLCUDA>(device).with_dtype<int32_t>().verify(
        num_tokens_post_padded, "num_tokens_post_padded");
    RuntimeCheck(
        num_experts >= 1 && num_experts <= kMaxExperts,
        "moe_align_block_size: num_experts must be in [1, ",
        kMaxExperts,
        "], got ",
        num_experts);
    RuntimeCheck(
        block_size >= 1 && block_size <= 1024,
        "moe_align_block_size: block_size must be in [1, 1024], got ",
        block_size);
    const int64_t numel = N.unwrap() * K.unwrap();
    // At most min(numel, num_experts) experts have pairs, each padded by at most block_size - 1.
    const int64_t need = numel + std::min(numel, num_experts) * (block_size - 1);
    RuntimeCheck(need < (int64_t{1} << 31), "moe_align_block_size: too many token-expert pairs: ", numel);
    RuntimeCheck(
        S.unwrap() >= need,
        "moe_align_block_size: sorted_token_ids must hold at least numel + min(numel, "
        "num_experts) * (block_size - 1) = ",
        need,
        " elements, got ",
        S.unwrap());
    RuntimeCheck(
        B.unwrap() >= div_ceil(need, block_size),
        "moe_align_block_size: expert_ids must hold at least ",
        div_ceil(need, block_size),
        " blocks, got ",
        B.unwrap());
    RuntimeCheck(S.unwrap() < (int64_t{1} << 31), "moe_align_block_size: sorted_token_ids is too long: ", S.unwrap());
    const int32_t* map = nullptr;
    if (expert_map.has_value()) {
      auto M = SymbolicSize{"num_experts"};
      M.set_value(num_experts);
      TensorMatcher({M}).with_device<kDLCUDA>(device).with_dtype<int32_t>().verify(*expert_map, "expert_map");
      map = static_cast<const int32_t*>((*expert_map).data_ptr());
    }
    if (has_no_data(num_tokens_post_padded)) return;  // a fake call's checks alone (it always has data otherwise)
    const DLDevice dev = device.unwrap();
    const bool pdl = runtime::resolve_pdl(enable_pdl, dev.device_id);
    AlignParams p{
        topk_ids.data_ptr(),
        map,
        static_cast<int32_t*>(sorted_token_ids.data_ptr()),
        static_cast<int32_t*>(expert_ids.data_ptr()),
        static_cast<int32_t*>(num_tokens_post_padded.data_ptr()),
        nullptr,
        nullptr,
        0,
        static_cast<int32_t>(numel),
        static_cast<int32_t>(num_experts),
        static_cast<int32_t>(block_size),
        (block_size & (block_size - 1)) == 0 ? std::countr_zero(static_cast<uint32_t>(block_size)) : -1,
        static_cast<int32_t>(S.unwrap()),
        static_cast<int32_t>(B.unwrap())};
    const bool wide = is_type<int64_t>(topk_ids.dtype());
    if (numel <= kPerThreadPairs) {
      const int64_t ctas = std::clamp(div_ceil(S.unwrap(), kFillPerCta), int64_t{1}, kMaxSlicedCtas);
      if (ctas == 1) {
        LaunchKernel(1, kThreads, dev)
            .enable_pdl(pdl)(wide ? align_small_kernel<int64_t, false> : align_small_kernel<int32_t, false>, p);
      } else {
        LaunchKernel(static_cast<uint32_t>(ctas), kThreads, dev)
            .enable_pdl(pdl)(wide ? align_small_kernel<int64_t, true> : align_small_kernel<int32_t, true>, p);
      }
      return;
    }
    if (numel <= kOneCtaPairs) {
      LaunchKernel(1, kThreads, dev).enable_pdl(pdl)(wide ? align_kernel<int64_t> : align_kernel<int32_t>, p);
      return;
    }
    // The cursors, then the histogram: freed when the call returns, reused by the caching allocator
    // in stream order.
    const int64_t chunks = div_ceil(numel, int64_t{kHistPairs});
    const auto workspace = ffi::empty({(chunks + 1) * num_experts}, dl_dtype_v<int32_t>, dev);
    p.cursor = static_cast<int32_t*>(workspace.data_ptr());
    p.hist = p.cursor + num_experts;
    p.chunks = static_cast<int32_t>(chunks);
    // Each kernel reads what the one before wrote: with PDL it waits for that kernel to end.
    LaunchKernel(static_cast<uint32_t>(chunks), kHistThreads, dev)
        .enable_pdl(pdl)(wide ? histogram_kernel<int64_t> : histogram_kernel<int32_t>, p);
    LaunchKernel(1, kThreads, dev).enable_pdl(pdl)(count_kernel, p);
    const auto grid = static_cast<uint32_t>(div_ceil(numel, int64_t{kScatterThreads} * kScatterItems));
    LaunchKernel(grid, kScatterThreads, dev)
        .enable_pdl(pdl)(wide ? scatter_kernel<int64_t> : scatter_kernel<int32_t>, p);
  }
};

using MoeAlign = MoeAlignPaths<>;

}  // namespace jit_kernel::moe_align
