// kv_store: write new tokens' K/V rows into a paged KV cache at given slots.
//
//   store:  k_cache[loc[i]] = q(k[i]), v_cache[loc[i]] = q(v[i])          (SGLang set_kv_buffer,
//                                                                            vLLM reshape_and_cache_flash)
//   mla:    kv_buffer[loc[i], :Dn] = q(nope[i]), kv_buffer[loc[i], Dn:] = q(rope[i])  (SGLang set_mla_kv_buffer)
//
// q is a plain copy when the cache has the activation dtype, and fp8_e4m3(clamp(x * (1 / scale), -448,
// 448)) for a float8_e4m3fn cache (as per_tensor_quant_fp8: within one fp8 ulp of x / scale; the
// scale from a float32 device tensor of one element, or a host float).
//
// Layout: every tensor is seen as rows (rank 2 [rows, width] or rank 3 [rows, heads, head_dim]) whose
// elements are contiguous inside a row; the row stride is arbitrary (k/v may be views of a fused qkv
// tensor, a cache a view of a [layers, slots, ...] buffer). Config = (activation dtype, cache dtype);
// row widths, strides and the index dtype are run-time, so one translation unit serves every model.
//
// Work split: stream 0 = K (or MLA's nope part), stream 1 = V (or the rope part, written into the same
// buffer row at offset Dn). One warp per (token, stream) row, or, when a token's two rows together
// are at most kUnroll vectors per lane (MLA 512 + 64 bf16), one warp per token for both. Each lane
// moves 16-byte input vectors, kUnroll of them in flight before any store. Small launches (decode)
// instead split each row into chunks of one vector per lane on grid y, in 128-thread blocks: more
// warps in flight for the same bytes (see kChunkedMaxWarpsPerSm). Long launches of tokens whose two
// rows share a warp (MLA) take the flat kernel, 4 vectors per thread in token-major order (see
// kFlatMinTokens). A row that is not made of aligned
// vectors (width, pointer or stride not a multiple of the vector) takes the scalar instance of the
// same kernel.
//
// Indices: a slot outside [0, num_slots) is skipped in the kernel (no fault, nothing written for that
// row); the Python layer raises IndexError for it first under JIT_KERNEL_CHECK_INDICES=1. Duplicate
// slots: the writers race; which one wins is undefined, per vector (16 bytes of input, or one element
// on the scalar path): every vector of the row comes whole from one of the writers, but a row may mix
// writers.
#pragma once

#include "quant/fp8_store.cuh"

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
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cuda_fp8.h>
#include <type_traits>

namespace jit_kernel::kv_store {

using fp8::store_fp8;

inline constexpr uint32_t kThreads = 256;  // 8 row tasks per block
inline constexpr int kUnroll = 4;          // vectors per lane in flight
// Chunked launches (one vector per lane per warp, rows split on grid y, 128-thread blocks) while
// they need at most this many warps per SM: a small (decode) launch gets more warps in flight for
// the same bytes; a large one keeps more loads in flight per warp unchunked (kUnroll vectors per
// lane). See docs/design/kv-store.md.
inline constexpr uint32_t kChunkedThreads = 128;
inline constexpr int64_t kChunkedMaxWarpsPerSm = 8;
// Blocks per SM the registers must allow: 4 (<= 64 registers: 32 warps per SM, 64 KiB of loads in
// flight) for plain caches. fp8 caches take 2: at 4, ptxas spills values of the conversion to local
// memory (docs/design/kv-store.md).
template <typename C>
inline constexpr int kMinBlocks = std::is_same_v<C, fp8_e4m3_t> ? 2 : 4;
// fp8 caches: the scale is inverted after the row's loads are issued, not before them (see
// kInvertAfterLoads), by every split launch and by joint launches (MLA) from this many tokens on;
// joint launches of fewer tokens invert it first. In a split launch an inversion before the loads
// holds the row's loads behind the division's branch. See docs/design/kv-store.md.
inline constexpr int64_t kInvertAfterLoadsTokens = 2048;
// Joint launches (a token's two rows in one warp: MLA's 512 + 64) of 16-byte vectors take the flat
// kernel from this many tokens on (fp8 caches from 4096 tokens, plain caches from 16384); split
// launches (8 x 128 k and v) never take it. Where the bounds come from: docs/design/kv-store.md.
template <typename C>
inline constexpr int64_t kFlatMinTokens = std::is_same_v<C, fp8_e4m3_t> ? 4096 : 16384;
inline constexpr uint32_t kFlatThreads = 256;
inline constexpr int kFlatUnroll = 4;                        // vectors per thread, kFlatThreads apart
inline constexpr double kMinScale = 1.1754943508222875e-38;  // 2^-126, the least normal float

// One stream of rows: source row `i` goes to destination row `loc[i]`.
struct Stream {
  const void* src;
  int64_t src_stride;  // elements of the activation dtype
  void* dst;
  int64_t dst_stride;  // elements of the cache dtype
  int64_t width;       // elements per row
  int64_t num_slots;   // destination rows
  const float* scale;  // fp8 caches: the scale tensor, or nullptr for `scale_value`
  float scale_value;
};

struct Params {
  Stream stream[2];
  const void* loc;
  int64_t loc_stride;
  int64_t num_tokens;
  bool joint;  // one task per token for both streams (short rows), else one per token and stream
};

template <typename C>
inline constexpr bool kIsFp8 = std::is_same_v<C, fp8_e4m3_t>;

template <typename C>
SGL_DEVICE float stream_scale(const Stream& s) {
  if constexpr (kIsFp8<C>) return s.scale != nullptr ? *s.scale : s.scale_value;
  return 1.f;
}

SGL_DEVICE bool in_range(int64_t slot, const Stream& s) {
  return slot >= 0 && slot < s.num_slots;
}

// One warp per task. Split mode (kJoint false): task 2 * token + j is row `token` of stream j.
// Joint mode: task `token` moves the token's rows of both streams, as one run of vectors (stream 0's,
// then stream 1's), so that short rows (MLA's 64-wide rope part) keep every lane busy.
// The source loads do not depend on the slot: they are issued together with the slot's load, and
// the slot is first needed by the stores (one memory latency per task, not two).
// kInvertAfterLoads (fp8 caches): the scale's reciprocal is computed once the row's loads are issued,
// so a warp waits on one memory latency, not on the scale's and then the row's.
// kChunked: a warp moves one chunk of its row, one vector per lane: vectors blockIdx.y * 32 + lane
// (the launch has a chunk per 32 vectors on grid y). Otherwise a warp walks its whole row, kUnroll
// vectors per lane per round (why a chunk is one vector per lane: docs/design/kv-store.md).
// kJoint is p.joint as a template argument: split launches then carry none of the joint mode's
// per-vector stream selects, and compile to far fewer instructions and registers (see
// docs/design/kv-store.md).
template <typename T, typename C, typename Idx, int kN, bool kJoint, bool kInvertAfterLoads, bool kChunked>
__global__ void __launch_bounds__(kThreads, kMinBlocks<C>) store_kernel(const __grid_constant__ Params p) {
  static_assert(kIsFp8<C> || std::is_same_v<T, C>, "a plain cache has the activation dtype");
  using InVec = device::AlignedVector<T, kN>;
  constexpr int kU = kChunked ? 1 : kUnroll;
  constexpr int64_t kWarps = (kChunked ? kChunkedThreads : kThreads) / 32;
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (task >= (kJoint ? p.num_tokens : 2 * p.num_tokens)) return;
  // Addresses from the parameters alone, before the wait: under PDL they overlap the previous kernel.
  const int64_t token = kJoint ? task : task >> 1;
  const Stream& s0 = kJoint ? p.stream[0] : p.stream[task & 1];
  const Stream& s1 = p.stream[1];
  const T* src0 = static_cast<const T*>(s0.src) + token * s0.src_stride;
  const T* src1 = static_cast<const T*>(s1.src) + token * s1.src_stride;
  const int64_t n0 = s0.width / kN;
  const int64_t total = kJoint ? n0 + s1.width / kN : n0;
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  const auto raw_slot = static_cast<const Idx*>(p.loc)[token * p.loc_stride];
  // fp8: x * (1 / scale), as per_tensor_quant_fp8 (within one fp32 ulp of x / scale).
  float scale0 = 1.f, scale1 = 1.f, inv0 = 1.f, inv1 = 1.f;
  if constexpr (kInvertAfterLoads) {
    scale0 = stream_scale<C>(s0);
    scale1 = kJoint ? stream_scale<C>(s1) : scale0;
  } else {
    inv0 = 1.f / stream_scale<C>(s0);
    inv1 = kJoint ? 1.f / stream_scale<C>(s1) : inv0;
  }
  const int64_t start = kChunked ? static_cast<int64_t>(blockIdx.y) * 32 + lane : lane;
  for (int64_t base = start; base < total; base += kChunked ? total : 32 * kUnroll) {
    InVec x[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t i = base + u * 32;
      if (i < total) x[u].load(i < n0 ? src0 : src1, i < n0 ? i : i - n0);
    }
    if constexpr (kInvertAfterLoads) {
      inv0 = 1.f / scale0;
      inv1 = 1.f / scale1;
    }
    // Out-of-range slots are skipped per stream (see the top of this file).
    const auto slot = static_cast<int64_t>(raw_slot);
    const bool ok0 = in_range(slot, s0);
    const bool ok1 = kJoint && in_range(slot, s1);
    C* dst0 = static_cast<C*>(s0.dst) + slot * s0.dst_stride;
    C* dst1 = static_cast<C*>(s1.dst) + slot * s1.dst_stride;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t i = base + u * 32;
      const bool first = i < n0;
      const bool ok = i < total && (first ? ok0 : ok1);
      C* dst = first ? dst0 : dst1;
      const int64_t j = first ? i : i - n0;
      // Vectors: predicated stores (store_if), no branch for the compiler to sink the loads into
      // behind the slot's check (which would put the row's latency after the slot's).
      if constexpr (kIsFp8<C>) {
        const float inv = first ? inv0 : inv1;
        float y[kN];
        device::to_floats(x[u], y);
#pragma unroll
        for (int e = 0; e < kN; ++e) y[e] *= inv;
        if constexpr (kN > 1) {
          fp8::pack_fp8(y).store_if(ok, dst, j);
        } else if (ok) {
          store_fp8<kN>(dst + j * kN, y);
        }
      } else if constexpr (kN > 1) {
        x[u].store_if(ok, dst, j);
      } else if (ok) {
        x[u].store(dst, j);
      }
    }
  }
}

// The flat kernel's view of a joint launch: units (token, vector) in token-major order, a token's
// stream-0 vectors then its stream-1 vectors; unit g is token g / per_token, vector g % per_token.
struct FlatUnits {
  uint32_t per_token;  // vectors per token, both streams
  uint32_t n0;         // of which stream 0's
  uint32_t count;      // num_tokens * per_token
  uint32_t step_tok;   // kFlatThreads units = step_tok tokens + step_vec vectors
  uint32_t step_vec;
};

// Flat: thread `first` moves units first + u * kFlatThreads (u < kFlatUnroll), so a warp's lanes
// read consecutive vectors whatever the row width (MLA's 72 vectors fill a warp's 4 rounds to 56%
// in the row-walking kernel, here every lane). All loads first, unconditionally (a unit past the
// end reloads the previous one), then the stores, predicated: no branch for ptxas to sink a load
// into. One division per thread; the next units step by (step_tok, step_vec).
template <typename T, typename C, typename Idx>
__global__ void __launch_bounds__(kFlatThreads) flat_store_kernel(const __grid_constant__ Params p, const FlatUnits f) {
  constexpr int kN = 16 / sizeof(T);
  using InVec = device::AlignedVector<T, kN>;
  const uint32_t first = blockIdx.x * (kFlatThreads * kFlatUnroll) + threadIdx.x;
  if (first >= f.count) return;
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  const float scale0 = stream_scale<C>(p.stream[0]), scale1 = stream_scale<C>(p.stream[1]);
  InVec x[kFlatUnroll];
  Idx raw_slot[kFlatUnroll];
  uint32_t vec[kFlatUnroll];
  uint32_t token = first / f.per_token, v = first - token * f.per_token;
#pragma unroll
  for (int u = 0; u < kFlatUnroll; ++u) {
    if (u > 0 && first + u * kFlatThreads < f.count) {
      token += f.step_tok;
      v += f.step_vec;
      if (v >= f.per_token) v -= f.per_token, ++token;
    }
    vec[u] = v;
    // Fields by selects, not p.stream[second]: a per-lane index into the parameters is a slow
    // indexed constant load.
    const bool second = v >= f.n0;
    const auto* src = static_cast<const T*>(second ? p.stream[1].src : p.stream[0].src);
    const int64_t src_stride = second ? p.stream[1].src_stride : p.stream[0].src_stride;
    x[u].load(src + int64_t{token} * src_stride, second ? v - f.n0 : v);
    raw_slot[u] = static_cast<const Idx*>(p.loc)[int64_t{token} * p.loc_stride];
  }
  // After the loads (see kInvertAfterLoads); the correctly rounded 1 / scale, as 1.f / scale.
  const float inv0 = __frcp_rn(scale0), inv1 = __frcp_rn(scale1);
#pragma unroll
  for (int u = 0; u < kFlatUnroll; ++u) {
    const bool second = vec[u] >= f.n0;
    const auto slot = static_cast<int64_t>(raw_slot[u]);
    const bool ok = first + u * kFlatThreads < f.count && slot >= 0 &&
                    slot < (second ? p.stream[1].num_slots : p.stream[0].num_slots);
    C* dst = static_cast<C*>(second ? p.stream[1].dst : p.stream[0].dst) +
             slot * (second ? p.stream[1].dst_stride : p.stream[0].dst_stride);
    const uint32_t j = second ? vec[u] - f.n0 : vec[u];
    if constexpr (kIsFp8<C>) {
      const float inv = second ? inv1 : inv0;
      float y[kN];
      device::to_floats(x[u], y);
#pragma unroll
      for (int e = 0; e < kN; ++e) y[e] *= inv;
      fp8::pack_fp8(y).store_if(ok, dst, j);
    } else {
      x[u].store_if(ok, dst, j);
    }
  }
}

template <typename T, typename C>
struct KvStore {
  static_assert(std::is_same_v<T, C> || kIsFp8<C>, "the cache is in the activation dtype or float8_e4m3fn");
  static constexpr int kVec = 16 / sizeof(T);

  // A tensor seen as rows: rank 2 [rows, width] or rank 3 [rows, heads, head_dim], contiguous rows.
  struct Rows {
    void* ptr;
    int64_t rows;
    int64_t stride;
    int64_t width;
  };

  template <typename D>
  static Rows as_rows(
      const char* op,
      tvm::ffi::TensorView t,
      const char* name,
      host::SymbolicSize& rows,
      host::SymbolicDevice& device) {
    using namespace host;
    const int rank = t.dim();
    RuntimeCheck(
        rank == 2 || rank == 3,
        op,
        ": ",
        name,
        " must have 2 dimensions [rows, width] or 3 [rows, heads, head_dim], got ",
        rank);
    if (rank == 2) {
      TensorMatcher::cuda_rows<D>({rows, -1}, device).verify(t, name);
    } else {
      auto head_dim = SymbolicSize{"head_dim"};
      TensorMatcher({rows, -1, head_dim})
          .with_strides({-1, head_dim, 1})
          .with_device<kDLCUDA>(device)
          .with_dtype<D>()
          .verify(t, name);
    }
    const int64_t n = t.size(0);
    return {t.data_ptr(), n, n > 1 ? t.stride(0) : 0, rank == 2 ? t.size(1) : t.size(1) * t.size(2)};
  }

  static const char* shape_of(tvm::ffi::TensorView t, std::string& out) {
    out = "[";
    for (int i = 1; i < t.dim(); ++i) out += (i > 1 ? ", " : "") + std::to_string(t.size(i));
    out += "]";
    return out.c_str();
  }

  // A row of `src` must fit a row of `cache`: the same (heads, head_dim) when both have rank 3, else
  // the same width.
  static void check_fit(
      const char* op,
      tvm::ffi::TensorView src,
      const char* src_name,
      tvm::ffi::TensorView cache,
      const char* cache_name) {
    bool fits = true;
    if (src.dim() == 3 && cache.dim() == 3) {
      fits = src.size(1) == cache.size(1) && src.size(2) == cache.size(2);
    } else {
      int64_t a = 1, b = 1;
      for (int i = 1; i < src.dim(); ++i) a *= src.size(i);
      for (int i = 1; i < cache.dim(); ++i) b *= cache.size(i);
      fits = a == b;
    }
    std::string s, c;
    host::RuntimeCheck(
        fits,
        op,
        ": rows of ",
        src_name,
        " ",
        shape_of(src, s),
        " do not match the rows of ",
        cache_name,
        " ",
        shape_of(cache, c));
  }

  // fp8 caches: the scale pointer (nullptr: use `value`), checked; other caches ignore scales.
  static const float* scale_of(
      const char* op,
      const tvm::ffi::Optional<tvm::ffi::TensorView>& tensor,
      const tvm::ffi::Optional<double>& value,
      const char* name,
      const char* cache_name,
      bool required,
      host::SymbolicDevice& device,
      float& out_value) {
    using namespace host;
    out_value = 1.f;
    if constexpr (!kIsFp8<C>) {
      return nullptr;
    } else {
      if (tensor.has_value()) {
        TensorMatcher({1}).with_dtype<fp32_t>().with_device<kDLCUDA>(device).verify(*tensor, name);
        return static_cast<const float*>((*tensor).data_ptr());
      }
      if (value.has_value()) {
        const double v = *value;
        RuntimeCheck(
            std::isfinite(v) && v >= kMinScale, op, ": ", name, " must be a finite float of at least 2^-126, got ", v);
        out_value = static_cast<float>(v);
        return nullptr;
      }
      RuntimeCheck(
          !required,
          op,
          ": ",
          cache_name,
          " is float8_e4m3fn, so ",
          name,
          " is required (a float32 tensor of one element, or a float)");
      return nullptr;
    }
  }

  static tvm::ffi::TensorView check_loc(
      const char* op,
      tvm::ffi::TensorView loc,
      const char* name,
      host::SymbolicSize& tokens,
      host::SymbolicDevice& device) {
    using namespace host;
    TensorMatcher({tokens}).with_strides({-1}).with_dtype<int32_t, int64_t>().with_device<kDLCUDA>(device).verify(
        loc, name);
    return loc;
  }

  static bool vector_ok(const Stream& s) {
    constexpr auto in_bytes = sizeof(T) * kVec;
    constexpr auto out_bytes = sizeof(C) * kVec;
    return s.width % kVec == 0 && reinterpret_cast<uint64_t>(s.src) % in_bytes == 0 &&
           (s.src_stride * sizeof(T)) % in_bytes == 0 && reinterpret_cast<uint64_t>(s.dst) % out_bytes == 0 &&
           (s.dst_stride * sizeof(C)) % out_bytes == 0;
  }

  template <typename Idx, bool kInvertAfterLoads, bool kChunked>
  static void launch_kernel(const Params& p, bool vec, DLDevice dev, bool pdl, uint32_t chunks) {
    const int64_t tasks = p.joint ? p.num_tokens : 2 * p.num_tokens;
    constexpr uint32_t threads = kChunked ? kChunkedThreads : kThreads;
    const dim3 grid(static_cast<uint32_t>(host::div_ceil(tasks, int64_t{threads / 32})), chunks);
    const auto kernel = p.joint ? (vec ? store_kernel<T, C, Idx, kVec, true, kInvertAfterLoads, kChunked>
                                       : store_kernel<T, C, Idx, 1, true, kInvertAfterLoads, kChunked>)
                                : (vec ? store_kernel<T, C, Idx, kVec, false, kInvertAfterLoads, kChunked>
                                       : store_kernel<T, C, Idx, 1, false, kInvertAfterLoads, kChunked>);
    host::LaunchKernel(grid, threads, dev).enable_pdl(pdl)(kernel, p);
  }

  template <typename Idx>
  static void launch_idx(const Params& p, bool vec, DLDevice dev, bool pdl) {
    const int64_t tasks = p.joint ? p.num_tokens : 2 * p.num_tokens;
    const int64_t w0 = p.stream[0].width, w1 = p.stream[1].width;
    const int64_t chunks = host::div_ceil((p.joint ? w0 + w1 : std::max(w0, w1)) / (vec ? kVec : 1), int64_t{32});
    if (tasks * chunks <= kChunkedMaxWarpsPerSm * host::runtime::sm_count(dev.device_id)) {
      return launch_kernel<Idx, false, true>(p, vec, dev, pdl, static_cast<uint32_t>(chunks));
    }
    if (p.joint && vec && p.num_tokens >= kFlatMinTokens<C>) {
      const auto n0 = static_cast<uint32_t>(w0 / kVec), per_token = static_cast<uint32_t>((w0 + w1) / kVec);
      // Unit indices, and first + u * kFlatThreads past the last one, fit 32 bits.
      if (p.num_tokens * per_token <= UINT32_MAX - kFlatThreads * kFlatUnroll) {
        const FlatUnits f{
            per_token,
            n0,
            static_cast<uint32_t>(p.num_tokens * per_token),
            kFlatThreads / per_token,
            kFlatThreads % per_token};
        const auto blocks =
            static_cast<uint32_t>(host::div_ceil(int64_t{f.count}, int64_t{kFlatThreads * kFlatUnroll}));
        return host::LaunchKernel(blocks, kFlatThreads, dev).enable_pdl(pdl)(flat_store_kernel<T, C, Idx>, p, f);
      }
    }
    if constexpr (kIsFp8<C>) {
      if (!p.joint || p.num_tokens >= kInvertAfterLoadsTokens)
        return launch_kernel<Idx, true, false>(p, vec, dev, pdl, 1);
    }
    launch_kernel<Idx, false, false>(p, vec, dev, pdl, 1);
  }

  // `loc` has no data for 0 tokens and for FakeTensors (torch.compile's fakes run the checks above
  // and return here, before any CUDA call).
  static void launch(
      Params& p, tvm::ffi::TensorView loc, DLDataType loc_dtype, DLDevice dev, tvm::ffi::Optional<bool> enable_pdl) {
    if (p.num_tokens == 0 || host::has_no_data(loc) || p.stream[0].width + p.stream[1].width == 0) return;
    const bool pdl = host::runtime::resolve_pdl(enable_pdl, dev.device_id);
    const bool vec = vector_ok(p.stream[0]) && vector_ok(p.stream[1]);
    // Both rows in one warp when they fill at most one round of kUnroll vectors per lane together
    // (MLA's 512 + 64: 72 vectors); longer rows get a warp each (8 x 128 heads: 2 x 128 vectors).
    const int kn = vec ? kVec : 1;
    p.joint = (p.stream[0].width + p.stream[1].width) / kn <= 32 * kUnroll;
    if (host::is_type<int32_t>(loc_dtype)) {
      launch_idx<int32_t>(p, vec, dev, pdl);
    } else {
      launch_idx<int64_t>(p, vec, dev, pdl);
    }
  }

  static void store(
      tvm::ffi::TensorView k,
      tvm::ffi::TensorView v,
      tvm::ffi::TensorView k_cache,
      tvm::ffi::TensorView v_cache,
      tvm::ffi::TensorView out_cache_loc,
      tvm::ffi::Optional<tvm::ffi::TensorView> k_scale,
      tvm::ffi::Optional<tvm::ffi::TensorView> v_scale,
      tvm::ffi::Optional<double> k_scale_value,
      tvm::ffi::Optional<double> v_scale_value,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    constexpr const char* op = "store_kv_cache";
    auto tokens = SymbolicSize{"num_tokens"};
    auto device = SymbolicDevice{};
    auto k_slots = SymbolicSize{"num_slots"};
    auto v_slots = SymbolicSize{"num_slots"};
    const Rows kc = as_rows<C>(op, k_cache, "k_cache", k_slots, device);
    const Rows vc = as_rows<C>(op, v_cache, "v_cache", v_slots, device);
    const Rows kr = as_rows<T>(op, k, "k", tokens, device);
    const Rows vr = as_rows<T>(op, v, "v", tokens, device);
    check_loc(op, out_cache_loc, "out_cache_loc", tokens, device);
    check_fit(op, k, "k", k_cache, "k_cache");
    check_fit(op, v, "v", v_cache, "v_cache");
    float kv = 1.f, vv = 1.f;
    const float* ks = scale_of(op, k_scale, k_scale_value, "k_scale", "k_cache", true, device, kv);
    const float* vs = scale_of(op, v_scale, v_scale_value, "v_scale", "v_cache", true, device, vv);
    Params p{};
    p.stream[0] = {kr.ptr, kr.stride, kc.ptr, kc.stride, kr.width, kc.rows, ks, kv};
    p.stream[1] = {vr.ptr, vr.stride, vc.ptr, vc.stride, vr.width, vc.rows, vs, vv};
    p.loc = out_cache_loc.data_ptr();
    p.loc_stride = out_cache_loc.size(0) > 1 ? out_cache_loc.stride(0) : 0;
    p.num_tokens = tokens.unwrap();
    launch(p, out_cache_loc, out_cache_loc.dtype(), device.unwrap(), enable_pdl);
  }

  static void mla(
      tvm::ffi::TensorView kv_buffer,
      tvm::ffi::TensorView loc,
      tvm::ffi::TensorView cache_k_nope,
      tvm::ffi::TensorView cache_k_rope,
      tvm::ffi::Optional<tvm::ffi::TensorView> scale,
      tvm::ffi::Optional<double> scale_value,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    constexpr const char* op = "set_mla_kv_buffer";
    auto tokens = SymbolicSize{"num_tokens"};
    auto slots = SymbolicSize{"num_slots"};
    auto device = SymbolicDevice{};
    const Rows buf = as_rows<C>(op, kv_buffer, "kv_buffer", slots, device);
    const Rows nope = as_rows<T>(op, cache_k_nope, "cache_k_nope", tokens, device);
    const Rows rope = as_rows<T>(op, cache_k_rope, "cache_k_rope", tokens, device);
    check_loc(op, loc, "loc", tokens, device);
    RuntimeCheck(
        nope.width + rope.width == buf.width,
        op,
        ": the widths of cache_k_nope (",
        nope.width,
        ") and cache_k_rope (",
        rope.width,
        ") must add up to the width of kv_buffer (",
        buf.width,
        ")");
    Params p{};
    float value = 1.f;
    const float* s = scale_of(op, scale, scale_value, "scale", "kv_buffer", false, device, value);
    void* rope_dst = static_cast<C*>(buf.ptr) + nope.width;
    p.stream[0] = {nope.ptr, nope.stride, buf.ptr, buf.stride, nope.width, buf.rows, s, value};
    p.stream[1] = {rope.ptr, rope.stride, rope_dst, buf.stride, rope.width, buf.rows, s, value};
    p.loc = loc.data_ptr();
    p.loc_stride = loc.size(0) > 1 ? loc.stride(0) : 0;
    p.num_tokens = tokens.unwrap();
    launch(p, loc, loc.dtype(), device.unwrap(), enable_pdl);
  }
};

}  // namespace jit_kernel::kv_store
