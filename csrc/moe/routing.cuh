// MoE routing: top-k experts per token from the router's logits, one warp per token.
//
// Scores: softmax over all experts (kSoftmax) or an elementwise sigmoid, computed in fp32. Selection
// uses `score + correction_bias[e]` when a bias is given (DeepSeek-V3), while the returned weights are
// the unbiased scores. Grouped routing (num_groups > 1 and topk_group < num_groups): experts are split
// into num_groups contiguous groups; a group's score is the sum of its two best selection scores with a
// bias, else its best score; only experts of the topk_group best groups can be chosen. Then the top-k
// experts are chosen in descending order of selection score; among equal scores the lowest expert index
// wins (the same rule picks the groups). Weights are optionally divided by their sum (renormalize) and
// multiplied by `scale` (routed_scaling_factor).
//
// Layout: lane l holds experts l, l + 32, l + 64, ... (kVPT values per lane, experts <= 32 * kVPT), all
// in registers; the grouped path stages the selection scores of its warp in shared memory to score the
// groups. No global scratch; one launch.
#pragma once

#include <sgl_kernel/runtime.cuh>
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>

#include <cfloat>
#include <cstdint>

namespace jit_kernel::moe {

inline constexpr int kWarpsPerBlock = 4;
inline constexpr int kMaxExperts = 512;
inline constexpr int kMaxGroups = 32;
inline constexpr float kNegInf = -INFINITY;

// (value, index) with the larger value first, the lower index among equal values.
SGL_DEVICE bool better(float a, int ia, float b, int ib) {
  return a > b || (a == b && ia < ib);
}

// The warp's best (value, index) pair; every lane gets it.
SGL_DEVICE void warp_argmax(float& v, int& i) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, offset);
    const int oi = __shfl_xor_sync(0xffffffffu, i, offset);
    if (better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

SGL_DEVICE float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

SGL_DEVICE float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

struct RouteParams {
  float* weights;        // [tokens, topk]
  int32_t* ids;          // [tokens, topk]
  const void* logits;    // [tokens, experts], row stride `stride`
  const void* bias;      // [experts] or nullptr
  int64_t stride;
  int64_t tokens;
  int experts;
  int topk;
  int groups;
  int topk_group;
  bool bias_fp32;
  bool renormalize;
  float scale;
};

template <typename T, int kVPT, bool kSoftmax>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) route_kernel(const RouteParams p) {
  __shared__ float staged[kWarpsPerBlock][kMaxExperts];
  __shared__ float group_score[kWarpsPerBlock][kMaxGroups];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp;
  device::PDLWaitPrimary();
  if (token >= p.tokens) return;
  const T* row = static_cast<const T*>(p.logits) + token * p.stride;

  float score[kVPT];   // the unbiased score (the weight)
  float choice[kVPT];  // the selection score; -inf once taken or masked
#pragma unroll
  for (int j = 0; j < kVPT; ++j) {
    const int e = j * 32 + lane;
    score[j] = e < p.experts ? dtype_trait<fp32_t>::from(row[e]) : kNegInf;
  }
  if constexpr (kSoftmax) {
    float m = kNegInf;
#pragma unroll
    for (int j = 0; j < kVPT; ++j) m = fmaxf(m, score[j]);
    m = warp_max(m);
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      score[j] = j * 32 + lane < p.experts ? __expf(score[j] - m) : 0.f;
      s += score[j];
    }
    const float inv = 1.f / warp_sum(s);
#pragma unroll
    for (int j = 0; j < kVPT; ++j) score[j] *= inv;
  } else {
#pragma unroll
    for (int j = 0; j < kVPT; ++j) score[j] = 1.f / (1.f + __expf(-score[j]));
  }
#pragma unroll
  for (int j = 0; j < kVPT; ++j) {
    const int e = j * 32 + lane;
    float c = kNegInf;
    if (e < p.experts) {
      c = score[j];
      if (p.bias != nullptr) {
        c += p.bias_fp32 ? static_cast<const float*>(p.bias)[e]
                         : dtype_trait<fp32_t>::from(static_cast<const T*>(p.bias)[e]);
      }
    }
    choice[j] = c;
  }

  if (p.groups > 1 && p.topk_group < p.groups) {
    const int per_group = p.experts / p.groups;
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      const int e = j * 32 + lane;
      if (e < p.experts) staged[warp][e] = choice[j];
    }
    __syncwarp();
    if (lane < p.groups) {  // lane g scores group g: its best, or with a bias its two best, selection scores
      const float* g = &staged[warp][lane * per_group];
      float first = kNegInf, second = kNegInf;
      for (int i = 0; i < per_group; ++i) {
        const float v = g[i];
        if (v > first) {
          second = first;
          first = v;
        } else if (v > second) {
          second = v;
        }
      }
      group_score[warp][lane] = p.bias != nullptr ? first + second : first;
    }
    __syncwarp();
    float gv = lane < p.groups ? group_score[warp][lane] : kNegInf;
    bool kept = false;
    for (int r = 0; r < p.topk_group; ++r) {
      float v = lane < p.groups && !kept ? gv : kNegInf;
      int i = lane < p.groups && !kept ? lane : INT32_MAX;
      warp_argmax(v, i);
      if (i == lane) kept = true;
    }
    const unsigned kept_mask = __ballot_sync(0xffffffffu, kept);
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      const int e = j * 32 + lane;
      if (e < p.experts && !((kept_mask >> (e / per_group)) & 1u)) choice[j] = kNegInf;
    }
  }

  device::PDLTriggerSecondary();
  float chosen_weight = 0.f;  // lane r keeps the r-th choice's weight (topk <= 32)
  int chosen_id = 0;
  for (int r = 0; r < p.topk; ++r) {
    float v = kNegInf;
    int i = INT32_MAX;
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      const int e = j * 32 + lane;
      // Taken and masked experts hold NaN-free -inf: compare on (value, index) with a valid-index guard.
      if (e < p.experts && choice[j] != kNegInf && better(choice[j], e, v, i)) {
        v = choice[j];
        i = e;
      }
    }
    warp_argmax(v, i);
    if (i == INT32_MAX) {  // fewer candidates than topk (cannot happen for valid arguments): lowest untaken
      i = 0;
    }
    float w = 0.f;
#pragma unroll
    for (int j = 0; j < kVPT; ++j) {
      if (j * 32 + lane == i) {
        w = score[j];
        choice[j] = kNegInf;
      }
    }
    w = warp_sum(w);  // only the owner contributes
    if (lane == r) {
      chosen_weight = w;
      chosen_id = i;
    }
  }
  float factor = p.scale;
  if (p.renormalize) {
    const float total = warp_sum(lane < p.topk ? chosen_weight : 0.f);
    factor = total > 0.f ? p.scale / total : p.scale;
  }
  if (lane < p.topk) {
    p.weights[token * p.topk + lane] = chosen_weight * factor;
    p.ids[token * p.topk + lane] = chosen_id;
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
    RuntimeCheck(experts >= 1 && experts <= kMaxExperts, "moe routing: gating_output must have 1 to ", kMaxExperts,
                 " experts (columns), got ", experts);
    RuntimeCheck(topk >= 1 && topk <= 32 && topk <= experts, "moe routing: topk must be in [1, min(32, experts = ",
                 experts, ")], got ", topk);
    RuntimeCheck(num_expert_group >= 1 && num_expert_group <= kMaxGroups && experts % num_expert_group == 0,
                 "moe routing: num_expert_group must be in [1, ", kMaxGroups, "] and divide the experts (", experts,
                 "), got ", num_expert_group);
    RuntimeCheck(topk_group >= 1 && topk_group <= num_expert_group,
                 "moe routing: topk_group must be in [1, num_expert_group = ", num_expert_group, "], got ", topk_group);
    RuntimeCheck(topk <= topk_group * (experts / num_expert_group),
                 "moe routing: topk (", topk, ") exceeds the experts of topk_group groups (",
                 topk_group * (experts / num_expert_group), ")");
    RuntimeCheck(std::isfinite(routed_scaling_factor), "moe routing: routed_scaling_factor must be finite, got ",
                 routed_scaling_factor);
    const void* bias = nullptr;
    bool bias_fp32 = true;
    if (correction_bias.has_value()) {
      TensorMatcher({E}).with_device<kDLCUDA>(device).with_dtype<fp32_t, T>().verify(*correction_bias,
                                                                                     "correction_bias");
      bias = (*correction_bias).data_ptr();
      bias_fp32 = is_type<fp32_t>((*correction_bias).dtype());
    }
    const int64_t tokens = N.unwrap();
    RuntimeCheck(tokens < (int64_t{1} << 31) * kWarpsPerBlock, "moe routing: too many tokens: ", tokens);
    if (tokens == 0 || has_no_data(weights)) return;  // nothing to do, or a fake call's checks alone
    const DLDevice dev = device.unwrap();
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
        static_cast<float>(routed_scaling_factor)};
    const auto grid = static_cast<uint32_t>(div_ceil(tokens, int64_t{kWarpsPerBlock}));
    const bool pdl = runtime::resolve_pdl(enable_pdl, dev.device_id);
    auto go = [&](auto kernel) { LaunchKernel(grid, kWarpsPerBlock * 32, dev).enable_pdl(pdl)(kernel, p); };
    if (softmax) {
      dispatch<true>(experts, go);
    } else {
      dispatch<false>(experts, go);
    }
  }

 private:
  template <bool kSoftmax, typename Go>
  static void dispatch(int64_t experts, Go&& go) {
    if (experts <= 32) {
      go(route_kernel<T, 1, kSoftmax>);
    } else if (experts <= 64) {
      go(route_kernel<T, 2, kSoftmax>);
    } else if (experts <= 128) {
      go(route_kernel<T, 4, kSoftmax>);
    } else if (experts <= 256) {
      go(route_kernel<T, 8, kSoftmax>);
    } else {
      go(route_kernel<T, 16, kSoftmax>);
    }
  }
};

}  // namespace jit_kernel::moe
