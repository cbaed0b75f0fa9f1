// Rotary position embedding with a cos/sin cache: the parts shared by `rope` (rope.cuh) and
// `qknorm_rope` (qknorm_rope.cuh).
//
// Layout (FlashInfer's / sgl-kernel's apply_rope_with_cos_sin_cache_inplace):
// - positions `[tokens]`, int32 or int64, any element stride;
// - query `[tokens, q_heads * head_size]` or `[tokens, q_heads, head_size]`, key likewise with
//   kv_heads; token (and head) strides are free, the elements of a head are contiguous. q and k may
//   be strided views of one fused qkv tensor, or the 64-wide rope part of MLA heads (q[..., 512:]);
// - cos_sin_cache `[max_pos, rotary_dim]`, fp32 or the activation dtype, any row stride: cos in
//   the first half of each row, sin in the second.
//
// Semantics, in fp32 and rounded once: with c = cos[pos][i], s = sin[pos][i], half = rotary_dim / 2,
// every pair (a, b) of a head — NeoX: (x[i], x[i + half]); GPT-J: (x[2i], x[2i + 1]), i < half —
// becomes (a * c - b * s, b * c + a * s). Elements at and beyond rotary_dim are untouched.
//
// Positions outside [0, max_pos): the token's rotation is skipped (rope: q and k of that token are
// not written; qknorm_rope: normalised, not rotated). Never read out of bounds. The op checks them
// and raises IndexError when JIT_KERNEL_CHECK_INDICES=1.
#pragma once

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
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace jit_kernel::rope {

// The widest head the kernels take (and the widest rotary part).
inline constexpr int64_t kMaxHeadSize = 1024;  // rope: at most 512 units (threads) per head

struct Params {
  void* q;
  void* k;
  int64_t q_heads, k_heads;
  int64_t q_s0, q_s1, k_s0, k_s1;  // element strides: token, head
  const void* positions;
  int64_t pos_stride;
  const void* cache;
  int64_t cache_stride;  // elements per cache row
  int64_t max_pos;
  int64_t tokens;
  int32_t rot_dim;
  int32_t half;
  int32_t head_dim;
  bool pos_i64;
  bool cache_f32;
  bool cache_vec;  // rows 16-byte aligned: cos/sin may be read in vectors
  // qknorm_rope
  const void* q_weight;
  const void* k_weight;
  float eps;
};

template <typename T>
inline constexpr int kVecElems = static_cast<int>(16 / sizeof(T));

SGL_DEVICE int64_t load_position(const Params& p, int64_t token) {
  return p.pos_i64 ? static_cast<const int64_t*>(p.positions)[token * p.pos_stride]
                   : static_cast<int64_t>(static_cast<const int32_t*>(p.positions)[token * p.pos_stride]);
}

// The cache row of `pos` (a valid position), as bytes.
template <typename T>
SGL_DEVICE const void* cache_row(const Params& p, int64_t pos) {
  const int64_t elem = p.cache_f32 ? 4 : static_cast<int64_t>(sizeof(T));
  return static_cast<const char*>(p.cache) + pos * p.cache_stride * elem;
}

template <typename T>
SGL_DEVICE float load_cache(const Params& p, const void* row, int64_t i) {
  return p.cache_f32 ? static_cast<const float*>(row)[i] : dtype_trait<fp32_t>::from(static_cast<const T*>(row)[i]);
}

// cos[i0, i0 + kP) and sin[i0, i0 + kP) of a cache row: 16-byte (or kP-wide) loads when the host
// found the rows aligned (p.cache_vec), else one element at a time.
template <typename T, int kP>
SGL_DEVICE void load_cos_sin(const Params& p, const void* row, int64_t i0, float (&c)[kP], float (&s)[kP]) {
  if (p.cache_vec && p.cache_f32) {
    const auto* f = static_cast<const float*>(row);
    constexpr int kW = kP < 4 ? kP : 4;  // floats per load
#pragma unroll
    for (int j = 0; j < kP; j += kW) {
      device::AlignedVector<float, kW> cv, sv;
      cv.load(f + i0 + j);
      sv.load(f + p.half + i0 + j);
#pragma unroll
      for (int e = 0; e < kW; ++e) {
        c[j + e] = cv[e];
        s[j + e] = sv[e];
      }
    }
  } else if (p.cache_vec) {
    const auto* t = static_cast<const T*>(row);
    device::AlignedVector<T, kP> cv, sv;
    cv.load(t + i0);
    sv.load(t + p.half + i0);
#pragma unroll
    for (int j = 0; j < kP; ++j) {
      c[j] = dtype_trait<fp32_t>::from(cv[j]);
      s[j] = dtype_trait<fp32_t>::from(sv[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kP; ++j) {
      c[j] = load_cache<T>(p, row, i0 + j);
      s[j] = load_cache<T>(p, row, p.half + i0 + j);
    }
  }
}

// One pair: (a, b) -> (a c - b s, b c + a s). Every kernel rotates through this function, with the
// roundings spelled out (no contraction left to the compiler), so the fused and the two-launch
// paths compute the same bits from the same inputs.
SGL_DEVICE void rotate(float a, float b, float c, float s, float& out_a, float& out_b) {
  out_a = __fmaf_rn(a, c, -__fmul_rn(b, s));
  out_b = __fmaf_rn(b, c, __fmul_rn(a, s));
}

// Head `h` (q heads first, then k heads) of `token`.
template <typename T>
SGL_DEVICE T* head_ptr(const Params& p, int64_t token, int64_t h) {
  return h < p.q_heads ? static_cast<T*>(p.q) + token * p.q_s0 + h * p.q_s1
                       : static_cast<T*>(p.k) + token * p.k_s0 + (h - p.q_heads) * p.k_s1;
}

// ---------------------------------------------------------------------------------------------
// Host side: argument rules, shared by both families.

struct HeadView {
  void* ptr;
  int64_t heads, s0, s1;
};

// query / key: `[N, H * head_size]` (unit last stride) or `[N, H, head_size]` (unit last stride).
template <typename T>
inline HeadView verify_heads(
    tvm::ffi::TensorView t,
    const char* name,
    int64_t head_size,
    host::SymbolicSize& tokens,
    host::SymbolicDevice& device) {
  using namespace host;
  HeadView v{};
  if (t.dim() == 2) {
    TensorMatcher::cuda_rows<T>({tokens, -1}, device).verify(t, name);
    RuntimeCheck(
        t.size(1) % head_size == 0,
        name,
        " must be [num_tokens, num_heads * head_size]: its last dimension ",
        t.size(1),
        " is not a multiple of head_size=",
        head_size);
    v.heads = t.size(1) / head_size;
    v.s1 = head_size;
  } else if (t.dim() == 3) {
    TensorMatcher::cuda_rows<T>({tokens, -1, head_size}, device).verify(t, name);
    v.heads = t.size(1);
    v.s1 = t.stride(1);
  } else {
    RuntimeCheck(
        false,
        name,
        " must be [num_tokens, num_heads * head_size] or [num_tokens, num_heads, head_size], got ",
        t.dim(),
        " dimension(s)");
  }
  v.ptr = t.data_ptr();
  v.s0 = t.stride(0);
  // Sizes of 1 report arbitrary strides; they are never used, so zero them (keeps alignment checks honest).
  if (t.size(0) <= 1) v.s0 = 0;
  if (v.heads <= 1) v.s1 = 0;
  return v;
}

// Every rule of the common arguments; fills everything of Params but the launch geometry.
template <typename T>
inline Params make_params(
    tvm::ffi::TensorView positions,
    tvm::ffi::TensorView query,
    tvm::ffi::TensorView key,
    int64_t head_size,
    tvm::ffi::TensorView cos_sin_cache,
    host::SymbolicDevice& device) {
  using namespace host;
  RuntimeCheck(
      head_size >= 2 && head_size <= kMaxHeadSize && head_size % 2 == 0,
      "head_size must be even and in [2, ",
      kMaxHeadSize,
      "], got ",
      head_size);
  auto N = SymbolicSize{"num_tokens"};
  auto P = SymbolicSize{"max_position"};
  auto R = SymbolicSize{"rotary_dim"};
  const HeadView q = verify_heads<T>(query, "query", head_size, N, device);
  const HeadView k = verify_heads<T>(key, "key", head_size, N, device);
  TensorMatcher({N}).with_strides({-1}).with_device<kDLCUDA>(device).with_dtype<int32_t, int64_t>().verify(
      positions, "positions");
  TensorMatcher::cuda_rows<fp32_t, T>({P, R}, device).verify(cos_sin_cache, "cos_sin_cache");
  const int64_t rot = R.unwrap();
  RuntimeCheck(
      rot >= 2 && rot % 2 == 0 && rot <= head_size,
      "cos_sin_cache must be [max_position, rotary_dim] with rotary_dim even and in [2, head_size=",
      head_size,
      "], got rotary_dim=",
      rot);
  Params p{};
  p.q = q.ptr;
  p.k = k.ptr;
  p.q_heads = q.heads;
  p.k_heads = k.heads;
  p.q_s0 = q.s0;
  p.q_s1 = q.s1;
  p.k_s0 = k.s0;
  p.k_s1 = k.s1;
  p.positions = positions.data_ptr();
  p.pos_stride = positions.size(0) <= 1 ? 0 : positions.stride(0);
  p.pos_i64 = positions.dtype().bits == 64;
  p.cache = cos_sin_cache.data_ptr();
  p.cache_stride = cos_sin_cache.stride(0);
  p.cache_f32 = cos_sin_cache.dtype().code == kDLFloat && cos_sin_cache.dtype().bits == 32;
  const int64_t row_bytes = p.cache_stride * (cos_sin_cache.dtype().bits / 8);
  p.cache_vec = reinterpret_cast<uint64_t>(p.cache) % 16 == 0 && (P.unwrap() <= 1 || row_bytes % 16 == 0);
  p.max_pos = P.unwrap();
  p.tokens = N.unwrap();
  p.rot_dim = static_cast<int32_t>(rot);
  p.half = static_cast<int32_t>(rot / 2);
  p.head_dim = static_cast<int32_t>(head_size);
  return p;
}

// Whether q and k heads can be moved in aligned 16-byte vectors of kVecElems<T> elements.
template <typename T>
inline bool heads_vector_aligned(const Params& p) {
  const int64_t v = kVecElems<T>;
  auto ok = [](const void* ptr) { return reinterpret_cast<uint64_t>(ptr) % 16 == 0; };
  return ok(p.q) && ok(p.k) && p.q_s0 % v == 0 && p.q_s1 % v == 0 && p.k_s0 % v == 0 && p.k_s1 % v == 0;
}

}  // namespace jit_kernel::rope
