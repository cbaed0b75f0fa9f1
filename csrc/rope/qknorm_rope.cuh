// fused_qknorm_rope: per-head RMSNorm of q and k (Qwen3 / Llama-4 style), then rotary embedding,
// in place, one read and one write of every q and k element.
//
// Semantics: exactly fused_inplace_qknorm (csrc/norm/qknorm.cuh) followed by
// apply_rope_with_cos_sin_cache_inplace: n = T(x * rsqrt(mean(x^2) + eps) * w) over the whole head
// (sum in fp32), the normalised value ROUNDED TO T, then every rotary pair of n rotated in fp32 from
// float(n) (common.cuh's `rotate`) and rounded once more. Elements beyond rotary_dim are normalised
// only. A token whose position is outside [0, max_pos) is normalised and not rotated.
//
// Template parameter: T only. The head size picks the kernel at run time: the fast kernel
// (D == rotary_dim in 64, 128, 256, 16-bit T, aligned 16-byte vectors) gives each head kLanes lanes
// (NeoX: one vector from each half per lane; GPT-J: one vector per lane), reduced with warp shuffles
// over the kL lanes. Anything else (partial rotary, other D, misaligned or odd strides) takes the
// generic kernel: one warp per head, scalar accesses, two passes over the head (the second hits L1).
#pragma once

#include "common.cuh"

namespace jit_kernel::rope {

template <typename T>
SGL_DEVICE float norm_round(T x, T w, float rrms) {
  // The qknorm kernels' expression, rounded to T as the two-launch path stores it.
  return dtype_trait<fp32_t>::from(
      dtype_trait<T>::from(dtype_trait<fp32_t>::from(x) * rrms * dtype_trait<fp32_t>::from(w)));
}

template <typename T, int64_t kHeadDim, bool kNeox>
struct FastShape {
  static constexpr int kV = kVecElems<T>;
  static constexpr int kP = kNeox ? kV : kV / 2;  // pairs per lane
  static constexpr uint32_t kLanes = static_cast<uint32_t>(kNeox ? kHeadDim / (2 * kV) : kHeadDim / kV);
  static_assert(kHeadDim % (2 * kV) == 0, "specialised head dims must be whole 16-byte vector pairs");
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "a head must fit one warp");
  static constexpr uint32_t kThreads = 256;
  static constexpr uint32_t kHeadsPerBlock = kThreads / kLanes;
};

// Launches of up to kEarlyWeightMaxHeads heads load the weights with the head, one memory latency
// less per thread; larger ones after the reduction, so the weights are not live across the data's
// DRAM latency (fewer registers, one more CTA per SM on sm_90a). The alternatives to this rule:
// docs/design/rope.md.
inline constexpr int64_t kEarlyWeightMaxHeads = 65536;

template <typename T, int64_t kHeadDim, bool kNeox, bool kEarlyWeight>
__global__ void __launch_bounds__(256) qknorm_rope_fast_kernel(const __grid_constant__ Params p) {
  using K = FastShape<T, kHeadDim, kNeox>;
  using Vec = device::AlignedVector<T, K::kV>;
  constexpr int kV = K::kV;
  constexpr int kHalf = static_cast<int>(kHeadDim / 2);
  const int64_t heads = p.q_heads + p.k_heads;
  const int64_t flat = static_cast<int64_t>(blockIdx.x) * K::kHeadsPerBlock + threadIdx.x / K::kLanes;
  const uint32_t lane = threadIdx.x % K::kLanes;
  const bool active = flat < p.tokens * heads;
  const int64_t token = active ? flat / heads : 0;
  const int64_t h = flat - token * heads;
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  Vec a, b, wa, wb;
  float c[K::kP], s[K::kP];
  float sum = 0.f;
  T* ptr = nullptr;
  const T* w = nullptr;
  const auto load_weight = [&] {
    wa.load(w + lane * kV);
    if constexpr (kNeox) wb.load(w + kHalf + lane * kV);
  };
  if (active) {
    ptr = head_ptr<T>(p, token, h);
    w = static_cast<const T*>(h < p.q_heads ? p.q_weight : p.k_weight);
    const int64_t pos = load_position(p, token);
    const bool valid = pos >= 0 && pos < p.max_pos;
    a.load(ptr + lane * kV);
    if constexpr (kNeox) b.load(ptr + kHalf + lane * kV);
    if constexpr (kEarlyWeight) load_weight();
    if (valid) {
      load_cos_sin<T, K::kP>(p, cache_row<T>(p, pos), static_cast<int64_t>(lane) * K::kP, c, s);
    } else {
#pragma unroll
      for (int j = 0; j < K::kP; ++j) c[j] = 1.f, s[j] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < kV; ++j) {
      const float f = dtype_trait<fp32_t>::from(a[j]);
      sum += f * f;
      if constexpr (kNeox) {
        const float g = dtype_trait<fp32_t>::from(b[j]);
        sum += g * g;
      }
    }
  }
  // Inactive heads are whole groups of kLanes lanes, so every shuffle partner is present.
  sum = device::warp::reduce_sum<float, K::kLanes>(sum);
  if (!active) return;
  if constexpr (!kEarlyWeight) load_weight();
  const float rrms = rsqrtf(sum * (1.f / static_cast<float>(kHeadDim)) + p.eps);
#pragma unroll
  for (int j = 0; j < K::kP; ++j) {
    float x, y;
    if constexpr (kNeox) {
      rotate(norm_round(a[j], wa[j], rrms), norm_round(b[j], wb[j], rrms), c[j], s[j], x, y);
      a[j] = dtype_trait<T>::from(x);
      b[j] = dtype_trait<T>::from(y);
    } else {
      rotate(norm_round(a[2 * j], wa[2 * j], rrms), norm_round(a[2 * j + 1], wa[2 * j + 1], rrms), c[j], s[j], x, y);
      a[2 * j] = dtype_trait<T>::from(x);
      a[2 * j + 1] = dtype_trait<T>::from(y);
    }
  }
  a.store(ptr + lane * kV);
  if constexpr (kNeox) b.store(ptr + kHalf + lane * kV);
}

inline constexpr uint32_t kGenericThreads = 256;
inline constexpr uint32_t kGenericHeadsPerBlock = kGenericThreads / 32;

// Any D, any rotary_dim, any alignment: one warp per head.
template <typename T>
__global__ void __launch_bounds__(256) qknorm_rope_generic_kernel(const Params p, const bool neox) {
  const int64_t heads = p.q_heads + p.k_heads;
  const int64_t flat = static_cast<int64_t>(blockIdx.x) * kGenericHeadsPerBlock + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  if (flat >= p.tokens * heads) return;  // a whole warp
  const int64_t token = flat / heads;
  const int64_t h = flat - token * heads;
  T* ptr = head_ptr<T>(p, token, h);
  const T* w = static_cast<const T*>(h < p.q_heads ? p.q_weight : p.k_weight);
  float sum = 0.f;
  for (int i = lane; i < p.head_dim; i += 32) {
    const float f = dtype_trait<fp32_t>::from(ptr[i]);
    sum += f * f;
  }
  sum = device::warp::reduce_sum<float>(sum);  // also orders every lane's reads before any write
  const float rrms = rsqrtf(sum * (1.f / static_cast<float>(p.head_dim)) + p.eps);
  const int64_t pos = load_position(p, token);
  const bool valid = pos >= 0 && pos < p.max_pos;
  const void* row = valid ? cache_row<T>(p, pos) : nullptr;
  for (int i = lane; i < p.half; i += 32) {
    const int ia = neox ? i : 2 * i;
    const int ib = neox ? i + p.half : 2 * i + 1;
    float x = norm_round(ptr[ia], w[ia], rrms);
    float y = norm_round(ptr[ib], w[ib], rrms);
    if (valid) {
      const float na = x, nb = y;
      rotate(na, nb, load_cache<T>(p, row, i), load_cache<T>(p, row, p.half + i), x, y);
    }
    ptr[ia] = dtype_trait<T>::from(x);
    ptr[ib] = dtype_trait<T>::from(y);
  }
  for (int i = p.rot_dim + lane; i < p.head_dim; i += 32) {
    ptr[i] = dtype_trait<T>::from(norm_round(ptr[i], w[i], rrms));
  }
}

// Launches the fast kernel for head size kHeadDim and style kNeox.
template <typename T, int64_t kHeadDim, bool kNeox>
void launch_fast(const Params& p, int64_t heads, DLDevice dev, bool pdl) {
  using namespace host;
  using K = FastShape<T, kHeadDim, kNeox>;
  const int64_t blocks = div_ceil(heads, static_cast<int64_t>(K::kHeadsPerBlock));
  RuntimeCheck(blocks < (int64_t{1} << 31), "qknorm_rope: too many heads: ", heads);
  LaunchKernel(static_cast<uint32_t>(blocks), K::kThreads, dev)
      .enable_pdl(pdl)(
          heads <= kEarlyWeightMaxHeads ? qknorm_rope_fast_kernel<T, kHeadDim, kNeox, true>
                                        : qknorm_rope_fast_kernel<T, kHeadDim, kNeox, false>,
          p);
}

// Whether the fast kernels serve this call: 16-bit T, head size 64/128/256, full rotary, aligned
// 16-byte vectors everywhere; they are picked at run time (one translation unit per dtype).
template <typename T>
inline bool launch_fast_if_possible(const Params& p, int64_t heads, bool neox, DLDevice dev, bool pdl) {
  if constexpr (sizeof(T) != 2) {
    return false;
  } else {
    auto aligned = [](const void* ptr) { return reinterpret_cast<uint64_t>(ptr) % 16 == 0; };
    if (p.rot_dim != p.head_dim || !heads_vector_aligned<T>(p) || !aligned(p.q_weight) || !aligned(p.k_weight)) {
      return false;
    }
    const auto launch = [&]<int64_t kHeadDim>() {
      neox ? launch_fast<T, kHeadDim, true>(p, heads, dev, pdl) : launch_fast<T, kHeadDim, false>(p, heads, dev, pdl);
    };
    switch (p.head_dim) {
      case 64: launch.template operator()<64>(); return true;
      case 128: launch.template operator()<128>(); return true;
      case 256: launch.template operator()<256>(); return true;
      default: return false;
    }
  }
}

template <typename T>
struct QKNormRope {
  static void run(
      tvm::ffi::TensorView query,
      tvm::ffi::TensorView key,
      tvm::ffi::TensorView q_weight,
      tvm::ffi::TensorView k_weight,
      tvm::ffi::TensorView positions,
      tvm::ffi::TensorView cos_sin_cache,
      double eps,
      bool is_neox,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    auto D = SymbolicSize{"head_size"};
    auto device = SymbolicDevice{};
    TensorMatcher({D}).with_device<kDLCUDA>(device).with_dtype<T>().verify(q_weight, "q_weight");
    TensorMatcher({D}).with_device<kDLCUDA>(device).with_dtype<T>().verify(k_weight, "k_weight");
    RuntimeCheck(eps >= 0, "eps must be >= 0, got ", eps);
    Params p = make_params<T>(positions, query, key, D.unwrap(), cos_sin_cache, device);
    p.q_weight = q_weight.data_ptr();
    p.k_weight = k_weight.data_ptr();
    p.eps = static_cast<float>(eps);
    const int64_t heads = (p.q_heads + p.k_heads) * p.tokens;
    if (heads == 0 || has_no_data(query)) return;  // nothing to do, or a fake call's checks alone
    const auto dev = device.unwrap();
    const bool pdl = runtime::resolve_pdl(enable_pdl, dev.device_id);
    if (launch_fast_if_possible<T>(p, heads, is_neox, dev, pdl)) return;
    const int64_t blocks = div_ceil(heads, static_cast<int64_t>(kGenericHeadsPerBlock));
    RuntimeCheck(blocks < (int64_t{1} << 31), "qknorm_rope: too many heads: ", heads);
    LaunchKernel(static_cast<uint32_t>(blocks), kGenericThreads, dev)
        .enable_pdl(pdl)(qknorm_rope_generic_kernel<T>, p, is_neox);
  }
};

}  // namespace jit_kernel::rope
