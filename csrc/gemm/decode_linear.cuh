// decode_linear: out[M, N] = input[M, K] @ weight[N, K]^T (+ bias[N]) for M = 1 to 16 rows, the
// linear layers of a decode step (GEMV and skinny GEMM). fp16 or bf16 in and out, fp32 accumulation.
// Memory bound: the weight is read once, and that read is the kernel's cost.
//
// Tensor cores, weight as the B operand. One mma.sync.m16n8k16 multiplies 16 rows of the input
// (A, the rows past M are zeros) by 8 columns of the weight (B: 8 rows of `weight`) over 16 k. Each
// thread loads 16 bytes (8 consecutive k) of one weight row and 16 bytes of one or two input rows,
// and those registers are the mma fragments as they are: a sum over k does not depend on the order
// of its terms, so the k-slots a thread holds in the fragments (2t, 2t + 1, 2t + 8, 2t + 9 for lane
// group position t) are mapped to the 8 consecutive elements at 8t of a 32-wide k-step, two mmas a
// step, the same map for A and B. No shuffles, no shared-memory staging: 16-byte loads straight
// into the fragments.
//
// Work split. A block (kWarps warps) owns kColumns = 32 consecutive output columns (kTiles n-tiles of
// 8); its warps take every kWarps-th 32-wide k-step of the block's k range, kUnroll steps (each a
// 16-byte load per tile and per row group) in flight per thread. The weight is read with
// ld.global.nc.L1::no_allocate (not kept in L1, where the input rows stay: every block re-reads them)
// and an L2 prefetch hint of 256 bytes (the run of the row that the block's other warps read next).
// Where the column blocks alone would not cover the GPU (N / 32 below one wave), a thread-block
// cluster of `split` blocks (2, 4 or 8, sm_90+) shares one column block's k range.
//
// Reduction, in a fixed order (the same bits on every call): each warp's fp32 accumulators (the mma
// chain over its k-steps, in step order) go to shared memory; each thread sums its two values over
// the warps in warp order; with a cluster, each block's sums go to its shared memory and, after a
// cluster barrier, block rank r adds the blocks' sums for its share of the columns in rank order
// (distributed shared memory), then the bias (fp32), then one rounding to T. No atomics.
//
// PDL: the first batch of weight loads is issued before the wait on the previous kernel (a layer's
// weight is not the previous kernel's output: that is what the overlap buys); the input and the bias
// are read after it, and the output written after it.
#pragma once

#include <sgl_kernel/runtime.cuh>
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>

#include <algorithm>
#include <cooperative_groups.h>
#include <cstdint>
#include <string>
#include <type_traits>

namespace jit_kernel::gemm {

inline constexpr uint32_t kWarps = 8;
inline constexpr uint32_t kThreads = kWarps * device::kWarpThreads;
inline constexpr uint32_t kTiles = 4;  // n-tiles of 8 columns a block owns
inline constexpr int64_t kColumns = kTiles * 8;
inline constexpr int64_t kStep = 32;                  // k per step: a thread's 16 bytes at 8t
inline constexpr uint32_t kValues = kTiles * 4 * 32;  // a block's fp32 results: 16 rows x 32 columns
inline constexpr uint32_t kMaxSplit = 8;              // blocks of a cluster along k (portable size)
inline constexpr uint32_t kBlocksPerSm = 2;           // __launch_bounds__: at most 128 registers
inline constexpr int64_t kMinStepsPerBlock = kWarps;  // a cluster's block gives every warp a step
static_assert(kValues == 2 * kThreads, "each thread finishes two adjacent columns of one row");

// k-steps in flight per thread: each holds kTiles 16-byte weight loads and kRows / 8 input loads
// (192 bytes of weight per thread, 96 KiB per SM at two blocks; four steps spill the 8-row kernel
// at the 128 registers two blocks per SM leave).
inline constexpr uint32_t kUnroll = 3;

struct Params {
  void* out;
  const void* input;
  const void* weight;
  const void* bias;  // nullptr: no bias
  int64_t out_stride;
  int64_t input_stride;
  int64_t bias_stride;
  int64_t m, n, k;
  uint32_t steps;       // ceil(k / kStep)
  uint32_t split_log2;  // log2 of the blocks per cluster, each a share of the k-steps
};

namespace detail {

// 16 bytes of the weight where `ok`, else zeros: read once, so not allocated in L1; a miss fetches
// 256 bytes into L2. Predicated, not branched: a thread's loads all issue before any is used.
SGL_DEVICE uint4 load_weight(const void* ptr, bool ok) {
  uint4 v = make_uint4(0, 0, 0, 0);
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %5, 0;\n\t"
      "@p ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
      : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
      : "l"(ptr), "r"(static_cast<uint32_t>(ok)));
  return v;
}

// 16 bytes of an input row where `ok`, else zeros: every block reads the input rows, so they stay
// in L1. The "memory" clobber keeps the load after the PDL wait (the previous kernel wrote them).
SGL_DEVICE uint4 load_input(const void* ptr, bool ok) {
  uint4 v = make_uint4(0, 0, 0, 0);
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %5, 0;\n\t"
      "@p ld.global.nc.L1::evict_last.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
      : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)
      : "l"(ptr), "r"(static_cast<uint32_t>(ok))
      : "memory");
  return v;
}

template <uint32_t kWord>
SGL_DEVICE uint32_t word(const uint4& v) {
  if constexpr (kWord == 0) return v.x;
  if constexpr (kWord == 1) return v.y;
  if constexpr (kWord == 2) return v.z;
  return v.w;
}

// d += a (16 x 16, row-major fragment) * b (16 x 8, column-major fragment), fp32 accumulators.
template <typename T>
SGL_DEVICE void mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// Result values v and v + 1 of a block (v even) are one row's two adjacent columns: value v is
// accumulator j = v % 4 of lane (v % 128) / 4 in n-tile v / 128, i.e. row lane / 4 (+ 8 for j = 2)
// and column 8 * tile + 2 * (lane % 4) (+ 1 for the odd value), as the mma's C fragment holds them.
template <typename T>
SGL_DEVICE void store_pair(const Params& p, int64_t n0, uint32_t v, float first, float second) {
  const uint32_t lane = (v % 128) / 4;
  const int64_t row = lane / 4 + (v % 4 == 2 ? 8 : 0);
  const int64_t col = n0 + 8 * (v / 128) + 2 * (lane % 4);
  if (row >= p.m || col >= p.n) return;
  T* out = static_cast<T*>(p.out) + row * p.out_stride;
  if (p.bias != nullptr) {
    const T* bias = static_cast<const T*>(p.bias);
    first += dtype_trait<fp32_t>::from(bias[col * p.bias_stride]);
    if (col + 1 < p.n) second += dtype_trait<fp32_t>::from(bias[(col + 1) * p.bias_stride]);
  }
  out[col] = dtype_trait<T>::from(first);
  if (col + 1 < p.n) out[col + 1] = dtype_trait<T>::from(second);
}

// log2 of the blocks per cluster for `groups` column blocks of `steps` k-steps on a GPU that holds
// `wave` blocks at once: the largest split of 1, 2, 4 or 8 that keeps the grid within one wave and
// gives every warp of a block a step; 1 where the column blocks alone fill the GPU.
constexpr uint32_t split_log2(int64_t groups, int64_t steps, int64_t wave) {
  uint32_t log2 = 0;
  while ((1u << log2) < kMaxSplit && (groups << (log2 + 1)) <= wave && steps >= (kMinStepsPerBlock << (log2 + 1))) {
    ++log2;
  }
  return log2;
}

// The fixed-order reduction of a kernel whose warps each hold fp32 accumulators `acc` for the
// block's 16 x 32 values (the mma C fragments of its kTiles n-tiles): the block's sum over its warps
// in warp order, then, with a cluster of `split` blocks, the sum over the blocks in rank order
// through distributed shared memory. `store(v, first, second)` finishes values v and v + 1 (v even;
// see store_pair) once, in the thread that holds their total. Every thread of the block calls it.
template <typename Store>
SGL_DEVICE void reduce_and_store(const float (&acc)[kTiles][4], uint32_t split, uint32_t rank, Store&& store) {
  __shared__ alignas(16) float partial[kWarps][kValues];
  __shared__ alignas(16) float reduced[kValues];
  const uint32_t lane = threadIdx.x % device::kWarpThreads;
  const uint32_t warp = threadIdx.x / device::kWarpThreads;
  // The block's sum over its warps, in warp order: thread i finishes values 2i and 2i + 1.
#pragma unroll
  for (uint32_t c = 0; c < kTiles; ++c) {
    *reinterpret_cast<float4*>(&partial[warp][c * 128 + lane * 4]) =
        make_float4(acc[c][0], acc[c][1], acc[c][2], acc[c][3]);
  }
  __syncthreads();
  const uint32_t v = 2 * threadIdx.x;
  float2 sum = *reinterpret_cast<const float2*>(&partial[0][v]);
#pragma unroll
  for (uint32_t i = 1; i < kWarps; ++i) {
    const float2 part = *reinterpret_cast<const float2*>(&partial[i][v]);
    sum.x += part.x;
    sum.y += part.y;
  }
  if (split == 1) {
    store(v, sum.x, sum.y);
    return;
  }
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  // The cluster's sum over its blocks, in rank order: block `rank` finishes its share of the values.
  auto cluster = cooperative_groups::this_cluster();
  *reinterpret_cast<float2*>(&reduced[v]) = sum;
  cluster.sync();
  const uint32_t pairs = kValues / 2 / split;
  if (threadIdx.x < pairs) {
    const uint32_t pair = rank * pairs + threadIdx.x;
    float2 total = *reinterpret_cast<const float2*>(cluster.map_shared_rank(&reduced[2 * pair], 0u));
    for (uint32_t q = 1; q < split; ++q) {
      const float2 part = *reinterpret_cast<const float2*>(cluster.map_shared_rank(&reduced[2 * pair], q));
      total.x += part.x;
      total.y += part.y;
    }
    store(2 * pair, total.x, total.y);
  }
  cluster.sync();  // no block exits while another still reads its shared memory
#else
  __trap();  // the launchers split k over a cluster on sm_90+ only
#endif
}

}  // namespace detail

template <uint32_t kRows, typename T>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) decode_linear_kernel(const Params p) {
  constexpr uint32_t kU = kUnroll;
  constexpr uint32_t kGroups = kRows / 8;  // input rows a thread loads: g, and g + 8 for 16 rows
  constexpr int64_t kStepBytes = kStep * sizeof(T);

  const uint32_t lane = threadIdx.x % device::kWarpThreads;
  const uint32_t warp = threadIdx.x / device::kWarpThreads;
  const uint32_t g = lane / 4, t = lane % 4;
  const uint32_t split = 1u << p.split_log2;
  const uint32_t rank = blockIdx.x & (split - 1);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x >> p.split_log2) * kColumns;
  // This block's k-steps: [steps * rank / split, steps * (rank + 1) / split), in 32 bits (the
  // launcher bounds steps * split).
  const int64_t begin = (p.steps * rank) >> p.split_log2;
  const int64_t end = (p.steps * (rank + 1)) >> p.split_log2;

  // This thread's rows: weight row n0 + 8c + g of each n-tile c, input rows g (and g + 8), each at
  // element 8t of a step. Rows past the end are never loaded (their pointers stay in bounds).
  const char* w_row[kTiles];
  bool w_ok[kTiles];
#pragma unroll
  for (uint32_t c = 0; c < kTiles; ++c) {
    const int64_t n = n0 + 8 * c + g;
    w_ok[c] = n < p.n;
    w_row[c] = static_cast<const char*>(p.weight) + ((w_ok[c] ? n : 0) * p.k + 8 * t) * int64_t{sizeof(T)};
  }
  const char* x_row[kGroups];
  bool x_ok[kGroups];
#pragma unroll
  for (uint32_t h = 0; h < kGroups; ++h) {
    const int64_t r = g + 8 * h;
    x_ok[h] = r < p.m;
    x_row[h] = static_cast<const char*>(p.input) + ((x_ok[h] ? r : 0) * p.input_stride + 8 * t) * int64_t{sizeof(T)};
  }

  uint4 w[kU][kTiles];
  uint4 x[kU][kGroups];
  // Steps first, first + kWarps, ... of this warp; a thread's 8 elements exist where 8t < k - 32 s.
  auto step_ok = [&](int64_t s) { return s < end && s * kStep + 8 * t < p.k; };
  auto load_weights = [&](int64_t first) {
#pragma unroll
    for (uint32_t u = 0; u < kU; ++u) {
      const int64_t s = first + int64_t{u} * kWarps;
      const bool ok = step_ok(s);
#pragma unroll
      for (uint32_t c = 0; c < kTiles; ++c) w[u][c] = detail::load_weight(w_row[c] + s * kStepBytes, ok && w_ok[c]);
    }
  };
  auto load_inputs = [&](int64_t first) {
#pragma unroll
    for (uint32_t u = 0; u < kU; ++u) {
      const int64_t s = first + int64_t{u} * kWarps;
      const bool ok = step_ok(s);
#pragma unroll
      for (uint32_t h = 0; h < kGroups; ++h) x[u][h] = detail::load_input(x_row[h] + s * kStepBytes, ok && x_ok[h]);
    }
  };

  float acc[kTiles][4];
#pragma unroll
  for (uint32_t c = 0; c < kTiles; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;

  int64_t first = begin + warp;
  load_weights(first);  // before the wait: the weight is not the previous kernel's output
  // The wait in a branch of its own (steps is never 0): ptxas hoists an unconditional wait above
  // the loads before it, which would serialise them behind the previous kernel.
  if (p.steps != 0) device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  load_inputs(first);
  while (true) {
#pragma unroll
    for (uint32_t u = 0; u < kU; ++u) {
      // Step half 0 uses words 0 and 1 of each 16-byte load (k 8t .. 8t + 3), half 1 words 2 and 3.
      const uint32_t a0 = detail::word<0>(x[u][0]), a2 = detail::word<1>(x[u][0]);
      const uint32_t a4 = detail::word<2>(x[u][0]), a6 = detail::word<3>(x[u][0]);
      uint32_t a1 = 0, a3 = 0, a5 = 0, a7 = 0;
      if constexpr (kGroups == 2) {
        a1 = detail::word<0>(x[u][1]), a3 = detail::word<1>(x[u][1]);
        a5 = detail::word<2>(x[u][1]), a7 = detail::word<3>(x[u][1]);
      }
#pragma unroll
      for (uint32_t c = 0; c < kTiles; ++c) {
        detail::mma<T>(acc[c], a0, a1, a2, a3, detail::word<0>(w[u][c]), detail::word<1>(w[u][c]));
        detail::mma<T>(acc[c], a4, a5, a6, a7, detail::word<2>(w[u][c]), detail::word<3>(w[u][c]));
      }
    }
    first += int64_t{kU} * kWarps;
    if (first >= end) break;
    load_weights(first);
    load_inputs(first);
  }

  detail::reduce_and_store(
      acc, split, rank, [&](uint32_t v, float first, float second) { detail::store_pair<T>(p, n0, v, first, second); });
}

namespace detail {

// A tensor of rows: `count` rows of `width` elements, `stride` elements apart, the last dimension
// contiguous (a dimension of one is laid out at any stride). `ok` is false where the leading
// dimensions do not collapse into one stride or the last one is not contiguous.
struct Rows {
  int64_t count = 0, width = 0, stride = 0;
  bool ok = false;
};

inline Rows rows_of(const tvm::ffi::TensorView& t) {
  const int32_t ndim = t.ndim();
  if (ndim == 0) return {};
  Rows rows{t.numel() / std::max<int64_t>(t.size(ndim - 1), 1), t.size(ndim - 1), 0, true};
  rows.ok = t.size(ndim - 1) <= 1 || t.stride(ndim - 1) == 1;
  int64_t next = -1;  // the stride the dimension above the last one seen must have to collapse
  for (int32_t d = ndim - 2; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (next < 0) {
      rows.stride = t.stride(d);
    } else if (t.stride(d) != next) {
      rows.ok = false;
    }
    next = t.stride(d) * t.size(d);
  }
  if (next < 0) rows.stride = rows.width;  // one row
  return rows;
}

inline bool aligned16(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

// `(d0, d1, ...)`: the first `dims` sizes of `t`, then `last` where it is given (>= 0).
inline std::string shape_text(const tvm::ffi::TensorView& t, int32_t dims, int64_t last = -1) {
  std::string text = "(";
  for (int32_t d = 0; d < dims; ++d) text += (d ? ", " : "") + std::to_string(t.size(d));
  if (last >= 0) text += (dims ? ", " : "") + std::to_string(last);
  return text + ")";
}

}  // namespace detail

// Weights of more bytes than this go to cuBLAS: at that size cuBLAS streams them at least as fast as
// the kernel's column blocks (docs/design/decode-gemm.md).
inline constexpr int64_t kMaxWeightBytes = int64_t{128} << 20;

// The launcher: out = input @ weight^T (+ bias) where the kernel serves the arguments, returning
// true; false, with nothing launched or written, where it does not (the op then calls cuBLAS). This
// is the rule, and the one place it is written: the op reads only the device and the dtype (which
// picks T, fp16 or bf16) before it calls here, and the row count where it allocates `out`, so as not
// to allocate for a call it would decline.
//
// Served: `input` [..., K] of 1 to kMaxRows rows whose leading dimensions collapse into one stride,
// the last one contiguous, rows starting on 16 bytes (an aligned pointer, a row stride that is a
// multiple of 8 where there are several rows); `weight` [N, K] of T, contiguous, on 16 bytes, of at most
// kMaxWeightBytes; K a positive multiple of 8; `bias` [N] of T at any stride, or none. Errors, naming
// the tensor: tensors off the GPU or on different GPUs, and `out` that is not input's leading
// dimensions by N in T, in rows with a contiguous last dimension.
template <typename T>
struct DecodeLinear {
  static_assert(std::is_same_v<T, bf16_t> || std::is_same_v<T, fp16_t>, "decode_linear: fp16 or bf16");
  static constexpr int64_t kMaxRows = 16;

  static bool serves(
      const tvm::ffi::TensorView& input,
      const detail::Rows& x,
      const tvm::ffi::TensorView& weight,
      const tvm::ffi::Optional<tvm::ffi::TensorView>& bias) {
    using host::is_type;
    if (weight.ndim() != 2 || !is_type<T>(weight.dtype()) || !is_type<T>(input.dtype())) return false;
    const int64_t n = weight.size(0), k = weight.size(1);
    if (x.count < 1 || x.count > kMaxRows) return false;
    if (k == 0 || k % 8 != 0 || x.width != k || !x.ok || !weight.is_contiguous()) return false;
    if (n * k * int64_t{sizeof(T)} > kMaxWeightBytes) return false;
    if (!detail::aligned16(weight.data_ptr()) || !detail::aligned16(input.data_ptr())) return false;
    if (x.count > 1 && x.stride % 8 != 0) return false;
    if (bias.has_value() && ((*bias).ndim() != 1 || !is_type<T>((*bias).dtype()))) return false;
    return true;
  }

  static bool run(
      tvm::ffi::TensorView out,
      tvm::ffi::TensorView input,
      tvm::ffi::TensorView weight,
      tvm::ffi::Optional<tvm::ffi::TensorView> bias,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    const detail::Rows x = detail::rows_of(input);
    if (!serves(input, x, weight, bias)) return false;
    const DLDevice dev = input.device();
    RuntimeCheck(
        dev.device_type == kDLCUDA, "decode_linear: input must be a CUDA tensor, got ", details::device_name(dev));
    const auto on_device = [&](const tvm::ffi::TensorView& t, const char* name) {
      RuntimeCheck(
          t.device() == dev,
          "decode_linear: ",
          name,
          " must be on input's device (",
          details::device_name(dev),
          "), got ",
          details::device_name(t.device()));
    };
    on_device(weight, "weight");
    const int64_t m = x.count, n = weight.size(0), k = x.width;
    const void* bias_ptr = nullptr;
    int64_t bias_stride = 0;
    if (bias.has_value()) {
      on_device(*bias, "bias");
      RuntimeCheck(
          (*bias).size(0) == n, "decode_linear: bias must have out_features (", n, ") elements, got ", (*bias).size(0));
      bias_ptr = (*bias).data_ptr();
      bias_stride = (*bias).stride(0);
    }
    // out: input's leading dimensions by N, of T, on the input's GPU, in rows.
    bool out_shape = out.ndim() == std::max<int32_t>(input.ndim(), 1) && out.size(out.ndim() - 1) == n;
    for (int32_t d = 0; out_shape && d + 1 < input.ndim(); ++d) out_shape = out.size(d) == input.size(d);
    RuntimeCheck(
        out_shape,
        "decode_linear: out must have shape ",
        detail::shape_text(input, input.ndim() - 1, n),
        ", got ",
        detail::shape_text(out, out.ndim()));
    if (!is_type<T>(out.dtype())) {
      details::fail(
          "Runtime check failed",
          ErrorKind::TypeError,
          {},
          "decode_linear: out must have input's dtype, got ",
          details::dtype_name(out.dtype()));
    }
    on_device(out, "out");
    const detail::Rows y = detail::rows_of(out);
    RuntimeCheck(
        y.ok, "decode_linear: out must be rows: a contiguous last dimension, the leading dimensions at one stride");
    RuntimeCheck(k < (int64_t{1} << 31), "decode_linear: in_features must be below 2^31, got ", k);
    RuntimeCheck(
        n <= int64_t{kColumns} * 0x7fffffff / kMaxSplit, "decode_linear: out_features too large for the grid, got ", n);
    if (n == 0 || has_no_data(out)) return true;  // the fake (torch.compile) call ends here: checks only

    Params p{};
    p.out = out.data_ptr();
    p.input = input.data_ptr();
    p.weight = weight.data_ptr();
    p.bias = bias_ptr;
    p.out_stride = m > 1 ? y.stride : 0;
    p.input_stride = m > 1 ? x.stride : 0;
    p.bias_stride = bias_stride;
    p.m = m;
    p.n = n;
    p.k = k;
    p.steps = static_cast<uint32_t>(div_ceil(k, kStep));
    const int64_t groups = div_ceil(n, kColumns);
    const int64_t wave = int64_t{runtime::sm_count(dev.device_id)} * kBlocksPerSm;
    p.split_log2 = runtime::has_clusters(dev.device_id) ? detail::split_log2(groups, p.steps, wave) : 0;
    const bool pdl = runtime::resolve_pdl(enable_pdl, dev.device_id);
    const auto kernel = m <= 8 ? decode_linear_kernel<8, T> : decode_linear_kernel<16, T>;
    LaunchKernel(static_cast<uint32_t>(groups << p.split_log2), kThreads, dev)
        .enable_cluster(1u << p.split_log2)
        .enable_pdl(pdl)(kernel, p);
    return true;
  }
};

}  // namespace jit_kernel::gemm
