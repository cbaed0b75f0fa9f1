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
// One CTA of 1024 threads: per-expert counts in shared memory, an exclusive prefix sum of the padded
// counts (cub::BlockScan), then a scatter through per-expert cursors (shared-memory atomics).
#pragma once

#include <sgl_kernel/runtime.cuh>
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>

#include <cub/block/block_scan.cuh>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>

#include <algorithm>
#include <cstdint>

namespace jit_kernel::moe_align {

inline constexpr int kThreads = 1024;
inline constexpr int kMaxExperts = kThreads;

template <typename Id>
__global__ void __launch_bounds__(kThreads) align_kernel(
    const Id* __restrict__ topk_ids,
    const int32_t* __restrict__ expert_map,
    int32_t* __restrict__ sorted_ids,
    int32_t* __restrict__ expert_ids,
    int32_t* __restrict__ post_padded,
    int32_t numel,
    int32_t experts,
    int32_t block_size,
    int32_t sorted_len,
    int32_t blocks_len) {
  using Scan = cub::BlockScan<int32_t, kThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  __shared__ int32_t counts[kMaxExperts];
  __shared__ int32_t cursor[kMaxExperts];
  __shared__ int32_t total;
  const int t = threadIdx.x;
  if (t < experts) counts[t] = 0;
  __syncthreads();
  device::PDLWaitPrimary();
  for (int32_t i = t; i < numel; i += kThreads) {
    const int64_t e = static_cast<int64_t>(topk_ids[i]);
    if (e >= 0 && e < experts) atomicAdd(&counts[e], 1);
  }
  for (int32_t i = t; i < sorted_len; i += kThreads) sorted_ids[i] = numel;
  __syncthreads();
  const int32_t count = t < experts ? counts[t] : 0;
  const int32_t padded = (count + block_size - 1) / block_size * block_size;
  int32_t offset;
  int32_t sum;
  Scan(scan_storage).ExclusiveSum(padded, offset, sum);
  if (t < experts) {
    cursor[t] = offset;
    const int32_t value = expert_map != nullptr ? expert_map[t] : t;
    for (int32_t b = offset / block_size; b < (offset + padded) / block_size; ++b) expert_ids[b] = value;
  }
  if (t == 0) {
    total = sum;
    post_padded[0] = sum;
  }
  __syncthreads();
  for (int32_t b = total / block_size + t; b < blocks_len; b += kThreads) expert_ids[b] = 0;
  for (int32_t i = t; i < numel; i += kThreads) {
    const int64_t e = static_cast<int64_t>(topk_ids[i]);
    if (e >= 0 && e < experts) sorted_ids[atomicAdd(&cursor[e], 1)] = i;
  }
  device::PDLTriggerSecondary();
}

struct MoeAlign {
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
    TensorMatcher({N, K}).with_device<kDLCUDA>(device).with_dtype<int32_t, int64_t>().verify(topk_ids,
                                                                                                    "topk_ids");
    TensorMatcher({S}).with_device<kDLCUDA>(device).with_dtype<int32_t>().verify(sorted_token_ids, "sorted_token_ids");
    TensorMatcher({B}).with_device<kDLCUDA>(device).with_dtype<int32_t>().verify(expert_ids, "expert_ids");
    TensorMatcher({1}).with_device<kDLCUDA>(device).with_dtype<int32_t>().verify(num_tokens_post_padded,
                                                                                 "num_tokens_post_padded");
    RuntimeCheck(num_experts >= 1 && num_experts <= kMaxExperts, "moe_align_block_size: num_experts must be in [1, ",
                 kMaxExperts, "], got ", num_experts);
    RuntimeCheck(block_size >= 1 && block_size <= 1024, "moe_align_block_size: block_size must be in [1, 1024], got ",
                 block_size);
    const int64_t numel = N.unwrap() * K.unwrap();
    // At most min(numel, num_experts) experts have pairs, each padded by at most block_size - 1.
    const int64_t need = numel + std::min(numel, num_experts) * (block_size - 1);
    RuntimeCheck(need < (int64_t{1} << 31), "moe_align_block_size: too many token-expert pairs: ", numel);
    RuntimeCheck(S.unwrap() >= need, "moe_align_block_size: sorted_token_ids must hold at least numel + min(numel, "
                 "num_experts) * (block_size - 1) = ", need, " elements, got ", S.unwrap());
    RuntimeCheck(B.unwrap() >= div_ceil(need, block_size), "moe_align_block_size: expert_ids must hold at least ",
                 div_ceil(need, block_size), " blocks, got ", B.unwrap());
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
    auto args = [&](auto kernel, const auto* ids) {
      LaunchKernel(1, kThreads, dev)
          .enable_pdl(pdl)(
              kernel,
              ids,
              map,
              static_cast<int32_t*>(sorted_token_ids.data_ptr()),
              static_cast<int32_t*>(expert_ids.data_ptr()),
              static_cast<int32_t*>(num_tokens_post_padded.data_ptr()),
              static_cast<int32_t>(numel),
              static_cast<int32_t>(num_experts),
              static_cast<int32_t>(block_size),
              static_cast<int32_t>(S.unwrap()),
              static_cast<int32_t>(B.unwrap()));
    };
    if (is_type<int32_t>(topk_ids.dtype())) {
      args(align_kernel<int32_t>, static_cast<const int32_t*>(topk_ids.data_ptr()));
    } else {
      args(align_kernel<int64_t>, static_cast<const int64_t*>(topk_ids.data_ptr()));
    }
  }
};

}  // namespace jit_kernel::moe_align
