// decode_linear_fp8: the fp8 block-scaled GEMM of a decode step, for M = 1 to 16 rows.
//
//   out[m, n] = sum over k-blocks b of (sum_{k in block b} q[m, k] * w[n, k]) * in_scale[m, b] * w_scale[n / 128, b]
//               (+ bias[n]),
//
// q and w float8 e4m3, one float32 scale per 1 x 128 group of an input row (what
// per_token_group_quant_fp8 and the fused norm + group-quant ops produce) and per 128 x 128 block of
// the weight (DeepSeek-V3's and transformers' FP8Linear `weight_scale_inv`), fp32 accumulation, one
// rounding to T (fp16 or bf16). Memory bound: the weight is read once, at one byte an element.
//
// decode_linear.cuh's design with fp8 operands. One mma.sync.m16n8k32 (e4m3 x e4m3, fp32
// accumulators, sm_89+) multiplies 16 input rows (A; the rows past M are zeros) by 8 weight rows (B)
// over 32 k. A thread's fragments hold 4 consecutive k-slots per register: A's a0 / a2 (row g) and B's
// b0 / b1 cover slots 4t .. 4t + 3 and 16 + 4t .. 16 + 4t + 3; as in the bf16 kernel, those 8 slots
// are mapped to 8 consecutive k of the thread's 16-byte load, the same map for A and B (a sum over k
// does not depend on the order of its terms): a thread loads 16 k at 16t of a 64-wide step, words 0
// and 1 feed the step's first mma, words 2 and 3 its second. Loads go straight into the fragments.
//
// Scales. A warp's unit of work is one k-block of 128 (two steps): its mmas accumulate into fresh
// fp32 partial sums, which are then added to the running accumulators times in_scale[row, b] *
// w_scale[n0 / 128, b] (a block's 32 columns lie in one 128-row weight block). The weight's scales
// are read with the weight (before the PDL wait), the input's after it.
//
// Work split and reduction as decode_linear (its helpers): a block owns 32 columns, its warps take
// every kWarps-th k-block of the block's range, a cluster of 2, 4 or 8 blocks (sm_90+) splits the
// k-blocks further where the column blocks alone would not fill the GPU; the sums run in a fixed order
// (warps, then the cluster's blocks), so a call gives the same bits every time. K is a multiple of 16:
// a last k-block shorter than 128 reads zeros past K (16-byte granularity).
#pragma once

#include <sgl_kernel/runtime.cuh>
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>

#include <dlpack/dlpack.h>
#include <gemm/decode_linear.cuh>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>

#include <cstdint>
#include <type_traits>

namespace jit_kernel::gemm::fp8 {

inline constexpr int64_t kBlockK = 128;  // k per scale block (of the input's groups and the weight's blocks)
inline constexpr int64_t kBlockN = 128;  // weight rows per scale block
inline constexpr int64_t kStep = 64;     // k per step: a thread's 16 bytes at 16t
inline constexpr uint32_t kStepsPerBlock = kBlockK / kStep;
static_assert(kBlockN % kColumns == 0, "a block's columns lie in one weight scale block");

// k-blocks in flight per thread: each is kTiles * 2 16-byte weight loads (128 bytes; 64 KiB per SM at
// two blocks) and kRows / 8 * 2 input loads, with its partial sums beside the running ones. A second
// one spills the 8-row kernel at the 128 registers that two blocks per SM leave.
inline constexpr uint32_t kUnroll = 1;

struct Params {
  void* out;
  const void* input;
  const void* weight;
  const float* input_scale;
  const float* weight_scale;
  const void* bias;  // nullptr: no bias
  int64_t out_stride;
  int64_t input_stride;
  int64_t input_scale_stride[2];   // row, k-block
  int64_t weight_scale_stride[2];  // n-block, k-block
  int64_t bias_stride;
  int64_t m, n, k;
  uint32_t blocks;      // ceil(k / 128)
  uint32_t split_log2;  // log2 of the blocks per cluster, each a share of the k-blocks
  bool bias_fp32;       // bias is float32 (else T)
};

namespace detail {

// d += a (16 x 32 e4m3, row-major fragment) * b (32 x 8 e4m3, column-major fragment), fp32. With
// kTop, only rows 0 .. 7 are kept (d[0], d[1]): rows 8 .. 15 of A are zeros (the 8-row kernel), so
// their accumulators start at 0 and their results are dropped (registers free at once).
template <bool kTop = false>
SGL_DEVICE void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 890)
  if constexpr (kTop) {
    float drop0, drop1;
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %10, %10};"
        : "+f"(d[0]), "+f"(d[1]), "=f"(drop0), "=f"(drop1)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.f));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
#else
  __trap();  // the launcher refuses devices below sm_89
#endif
}

// A scale where `ok`, else 0 (rows past M, k-blocks past the range): a plain load, kept in L1 (every
// block of the grid reads the same input scales). The "memory" clobber keeps an input scale's load
// after the PDL wait.
SGL_DEVICE float load_scale(const float* ptr, bool ok) {
  float v = 0.f;
  asm volatile(
      "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %2, 0;\n\t"
      "@p ld.global.nc.f32 %0, [%1];\n\t}"
      : "+f"(v)
      : "l"(ptr), "r"(static_cast<uint32_t>(ok))
      : "memory");
  return v;
}

// Values v and v + 1 of a block: one row's two adjacent columns (gemm::detail::store_pair's map),
// with the bias (T or float32) added in fp32, then one rounding to T.
template <typename T>
SGL_DEVICE void store_pair(const Params& p, int64_t n0, uint32_t v, float first, float second) {
  const uint32_t lane = (v % 128) / 4;
  const int64_t row = lane / 4 + (v % 4 == 2 ? 8 : 0);
  const int64_t col = n0 + 8 * (v / 128) + 2 * (lane % 4);
  if (row >= p.m || col >= p.n) return;
  T* out = static_cast<T*>(p.out) + row * p.out_stride;
  if (p.bias != nullptr) {
    auto bias = [&](int64_t c) {
      return p.bias_fp32 ? static_cast<const float*>(p.bias)[c * p.bias_stride]
                         : dtype_trait<fp32_t>::from(static_cast<const T*>(p.bias)[c * p.bias_stride]);
    };
    first += bias(col);
    if (col + 1 < p.n) second += bias(col + 1);
  }
  out[col] = dtype_trait<T>::from(first);
  if (col + 1 < p.n) out[col + 1] = dtype_trait<T>::from(second);
}

}  // namespace detail

// 10 * major + minor of device `device_id` (89 for sm_89), asked once per device.
inline auto compute_capability(int device_id) -> int {
  struct Tag;
  return host::runtime::detail::per_device<Tag>(device_id, {}, [](int id) {
    int major = 0, minor = 0;
    host::RuntimeDeviceCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, id));
    host::RuntimeDeviceCheck(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, id));
    return 10 * major + minor;
  });
}

template <uint32_t kRows, typename T>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) decode_linear_fp8_kernel(const Params p) {
  constexpr uint32_t kU = kUnroll;
  constexpr uint32_t kGroups = kRows / 8;  // input rows a thread loads: g, and g + 8 for 16 rows
  constexpr uint32_t kS = kStepsPerBlock;

  const uint32_t lane = threadIdx.x % device::kWarpThreads;
  const uint32_t warp = threadIdx.x / device::kWarpThreads;
  const uint32_t g = lane / 4, t = lane % 4;
  const uint32_t split = 1u << p.split_log2;
  const uint32_t rank = blockIdx.x & (split - 1);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x >> p.split_log2) * kColumns;
  // This block's k-blocks: [blocks * rank / split, blocks * (rank + 1) / split).
  const int64_t begin = (int64_t{p.blocks} * rank) >> p.split_log2;
  const int64_t end = (int64_t{p.blocks} * (rank + 1)) >> p.split_log2;

  // This thread's pointers at the warp's first k-block (first = begin + warp), advanced by kU *
  // kWarps k-blocks an iteration, so that every load of an iteration sits at a constant offset:
  // weight row n0 + 8c + g of each n-tile c and input rows g (and g + 8), each at byte 16t of a
  // step; their scales at the k-block. Rows past the end are never loaded (pointers stay in bounds).
  int64_t first = begin + warp;
  const char* w_ptr[kTiles];
  bool w_ok[kTiles];
#pragma unroll
  for (uint32_t c = 0; c < kTiles; ++c) {
    const int64_t n = n0 + 8 * c + g;
    w_ok[c] = n < p.n;
    w_ptr[c] = static_cast<const char*>(p.weight) + (w_ok[c] ? n : 0) * p.k + first * kBlockK + 16 * t;
  }
  const char* x_ptr[kGroups];
  const float* xs_ptr[kGroups];
  bool x_ok[kGroups];
#pragma unroll
  for (uint32_t h = 0; h < kGroups; ++h) {
    const int64_t r = g + 8 * h;
    x_ok[h] = r < p.m;
    x_ptr[h] = static_cast<const char*>(p.input) + (x_ok[h] ? r : 0) * p.input_stride + first * kBlockK + 16 * t;
    xs_ptr[h] = p.input_scale + (x_ok[h] ? r : 0) * p.input_scale_stride[0] + first * p.input_scale_stride[1];
  }
  const float* ws_ptr = p.weight_scale + (n0 / kBlockN) * p.weight_scale_stride[0] + first * p.weight_scale_stride[1];
  const int64_t xs_step = int64_t{kWarps} * p.input_scale_stride[1];  // between a thread's k-blocks
  const int64_t ws_step = int64_t{kWarps} * p.weight_scale_stride[1];
  // What is left of the block's range past the pointers: k-blocks, and bytes of a row past 16t (32 bits:
  // the launcher bounds K below 2^31).
  int32_t blocks_left = static_cast<int32_t>(end - first);
  int32_t bytes_left = static_cast<int32_t>(p.k - first * kBlockK - 16 * t);

  uint4 w[kU][kS][kTiles];
  uint4 x[kU][kS][kGroups];
  float ws[kU];
  float xs[kU][kGroups];
  // A thread's 16 bytes of step s of its u-th k-block exist where the k-block is in range and they
  // start below K.
  auto chunk_ok = [&](uint32_t u, uint32_t s) {
    return static_cast<int32_t>(u * kWarps) < blocks_left &&
           static_cast<int32_t>(u * kWarps * kBlockK + s * kStep) < bytes_left;
  };
  auto load_weights = [&]() {
#pragma unroll
    for (uint32_t u = 0; u < kU; ++u) {
#pragma unroll
      for (uint32_t s = 0; s < kS; ++s) {
        const bool ok = chunk_ok(u, s);
#pragma unroll
        for (uint32_t c = 0; c < kTiles; ++c) {
          w[u][s][c] = gemm::detail::load_weight(w_ptr[c] + (u * kWarps * kBlockK + s * kStep), ok && w_ok[c]);
        }
      }
      ws[u] = static_cast<int32_t>(u * kWarps) < blocks_left ? __ldg(ws_ptr + u * ws_step) : 0.f;
    }
  };
  auto load_inputs = [&]() {
#pragma unroll
    for (uint32_t u = 0; u < kU; ++u) {
#pragma unroll
      for (uint32_t s = 0; s < kS; ++s) {
        const bool ok = chunk_ok(u, s);
#pragma unroll
        for (uint32_t h = 0; h < kGroups; ++h) {
          x[u][s][h] = gemm::detail::load_input(x_ptr[h] + (u * kWarps * kBlockK + s * kStep), ok && x_ok[h]);
        }
      }
      const bool in_range = static_cast<int32_t>(u * kWarps) < blocks_left;
#pragma unroll
      for (uint32_t h = 0; h < kGroups; ++h) xs[u][h] = in_range && x_ok[h] ? xs_ptr[h][u * xs_step] : 0.f;
    }
  };
  auto advance = [&]() {
    constexpr int64_t kBytes = int64_t{kU} * kWarps * kBlockK;
#pragma unroll
    for (uint32_t c = 0; c < kTiles; ++c) w_ptr[c] += kBytes;
#pragma unroll
    for (uint32_t h = 0; h < kGroups; ++h) {
      x_ptr[h] += kBytes;
      xs_ptr[h] += kU * xs_step;
    }
    ws_ptr += kU * ws_step;
    blocks_left -= static_cast<int32_t>(kU * kWarps);
    bytes_left -= static_cast<int32_t>(kBytes);
  };

  float acc[kTiles][4];
#pragma unroll
  for (uint32_t c = 0; c < kTiles; ++c) acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f;

  load_weights();  // before the wait: the weight and its scales are not the previous kernel's output
  // The wait in a branch of its own (blocks is never 0): ptxas hoists an unconditional wait above
  // the loads before it, which would serialise them behind the previous kernel.
  if (p.blocks != 0) device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  load_inputs();
  while (true) {
#pragma unroll
    for (uint32_t u = 0; u < kU; ++u) {
      float part[kTiles][4];
#pragma unroll
      for (uint32_t c = 0; c < kTiles; ++c) part[c][0] = part[c][1] = part[c][2] = part[c][3] = 0.f;
#pragma unroll
      for (uint32_t s = 0; s < kS; ++s) {
        // The step's first mma uses words 0 and 1 of each 16-byte load (k 16t .. 16t + 7), its
        // second words 2 and 3; a0 / a2 row g, a1 / a3 row g + 8 (zeros for the 8-row kernel).
        const uint32_t a0 = gemm::detail::word<0>(x[u][s][0]), a2 = gemm::detail::word<1>(x[u][s][0]);
        const uint32_t a4 = gemm::detail::word<2>(x[u][s][0]), a6 = gemm::detail::word<3>(x[u][s][0]);
        uint32_t a1 = 0, a3 = 0, a5 = 0, a7 = 0;
        if constexpr (kGroups == 2) {
          a1 = gemm::detail::word<0>(x[u][s][1]), a3 = gemm::detail::word<1>(x[u][s][1]);
          a5 = gemm::detail::word<2>(x[u][s][1]), a7 = gemm::detail::word<3>(x[u][s][1]);
        }
#pragma unroll
        for (uint32_t c = 0; c < kTiles; ++c) {
          const uint4& b = w[u][s][c];
          detail::mma_e4m3<kGroups == 1>(part[c], a0, a1, a2, a3, gemm::detail::word<0>(b), gemm::detail::word<1>(b));
          detail::mma_e4m3<kGroups == 1>(part[c], a4, a5, a6, a7, gemm::detail::word<2>(b), gemm::detail::word<3>(b));
        }
      }
      // C fragment: values 0 and 1 are row g, values 2 and 3 row g + 8.
      const float scale0 = xs[u][0] * ws[u];
      const float scale1 = kGroups == 2 ? xs[u][kGroups - 1] * ws[u] : 0.f;
#pragma unroll
      for (uint32_t c = 0; c < kTiles; ++c) {
        acc[c][0] = __fmaf_rn(part[c][0], scale0, acc[c][0]);
        acc[c][1] = __fmaf_rn(part[c][1], scale0, acc[c][1]);
        acc[c][2] = __fmaf_rn(part[c][2], scale1, acc[c][2]);
        acc[c][3] = __fmaf_rn(part[c][3], scale1, acc[c][3]);
      }
    }
    advance();
    if (blocks_left <= 0) break;
    load_weights();
    load_inputs();
  }

  gemm::detail::reduce_and_store(acc, split, rank, [&](uint32_t v, float first_value, float second_value) {
    detail::store_pair<T>(p, n0, v, first_value, second_value);
  });
}

// The launcher. `input` [M, K] fp8 e4m3 (rows at any stride that keeps them on 16 bytes, unit inner
// stride); `input_scale` float32 [M, ceil(K / 128)] at any strides (row-major, column-major, a padded
// column-major buffer); `weight` [N, K] fp8 e4m3 contiguous; `weight_scale` float32
// [ceil(N / 128), ceil(K / 128)] at any strides; `bias` [N] (T or float32, any stride) or none; `out`
// [M, N] of T, rows with unit inner stride; one GPU of sm_89 or newer. 0 <= M <= kRows, K a positive
// multiple of 16.
template <uint32_t kRows, typename T>
struct DecodeLinearFp8 {
  static_assert(kRows == 8 || kRows == 16, "decode_linear_fp8: 8- or 16-row kernels");
  static_assert(std::is_same_v<T, bf16_t> || std::is_same_v<T, fp16_t>, "decode_linear_fp8: fp16 or bf16 out");

  static void run(
      tvm::ffi::TensorView out,
      tvm::ffi::TensorView input_q,
      tvm::ffi::TensorView input_scale,
      tvm::ffi::TensorView weight,
      tvm::ffi::TensorView weight_scale,
      tvm::ffi::Optional<tvm::ffi::TensorView> bias,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    auto rows = SymbolicSize{"rows"};
    auto in_features = SymbolicSize{"in_features"};
    auto out_features = SymbolicSize{"out_features"};
    auto k_blocks = SymbolicSize{"k_blocks"};
    auto n_blocks = SymbolicSize{"n_blocks"};
    auto input_stride = SymbolicSize{"input_row_stride"};
    auto device = SymbolicDevice{};
    TensorMatcher({rows, in_features})
        .with_strides({input_stride, 1})
        .with_device<kDLCUDA>(device)
        .with_dtype<fp8_e4m3_t>()
        .verify(input_q, "input_q");
    TensorMatcher({out_features, in_features})
        .with_device<kDLCUDA>(device)
        .with_dtype<fp8_e4m3_t>()
        .verify(weight, "weight");
    const int64_t m = rows.unwrap(), n = out_features.unwrap(), k = in_features.unwrap();
    RuntimeCheck(
        k > 0 && k % 16 == 0,
        "decode_linear_fp8: in_features (input_q's and weight's last dimension) must be a positive multiple of 16, "
        "got ",
        k);
    RuntimeCheck(k < (int64_t{1} << 31), "decode_linear_fp8: in_features must be below 2^31, got ", k);
    RuntimeCheck(
        n <= int64_t{kColumns} * 0x7fffffff / kMaxSplit,
        "decode_linear_fp8: out_features too large for the grid, got ",
        n);
    k_blocks.set_value(div_ceil(k, kBlockK));
    n_blocks.set_value(div_ceil(n, kBlockN));
    auto is0 = SymbolicSize{"input_scale_stride0"};
    auto is1 = SymbolicSize{"input_scale_stride1"};
    TensorMatcher({rows, k_blocks})
        .with_strides({is0, is1})
        .with_device<kDLCUDA>(device)
        .with_dtype<fp32_t>()
        .verify(input_scale, "input_scale");
    auto ws0 = SymbolicSize{"weight_scale_stride0"};
    auto ws1 = SymbolicSize{"weight_scale_stride1"};
    TensorMatcher({n_blocks, k_blocks})
        .with_strides({ws0, ws1})
        .with_device<kDLCUDA>(device)
        .with_dtype<fp32_t>()
        .verify(weight_scale, "weight_scale");
    const void* bias_ptr = nullptr;
    int64_t bias_stride = 0;
    bool bias_fp32 = false;
    if (bias.has_value()) {
      auto stride = SymbolicSize{"bias_stride"};
      auto bias_dtype = SymbolicDType{};
      TensorMatcher({out_features})
          .with_strides({stride})
          .with_device<kDLCUDA>(device)
          .with_dtype<T, fp32_t>(bias_dtype)
          .verify(*bias, "bias");
      bias_ptr = (*bias).data_ptr();
      bias_stride = stride.unwrap();
      bias_fp32 = bias_dtype.is_type<fp32_t>();
    }
    TensorMatcher::cuda_rows<T>({rows, out_features}, device).verify(out, "out");
    const int64_t x_stride = input_stride.unwrap();
    RuntimeCheck(m <= kRows, "decode_linear_fp8: input_q must have at most ", kRows, " rows for this kernel, got ", m);
    RuntimeCheck(
        reinterpret_cast<uintptr_t>(input_q.data_ptr()) % 16 == 0 && (m <= 1 || x_stride % 16 == 0),
        "decode_linear_fp8: input_q's rows must start on 16-byte boundaries (an aligned pointer, a row stride that "
        "is a multiple of 16), got row stride ",
        x_stride);
    RuntimeCheck(
        reinterpret_cast<uintptr_t>(weight.data_ptr()) % 16 == 0,
        "decode_linear_fp8: weight must start on a 16-byte boundary");
    if (m == 0 || n == 0 || has_no_data(out)) return;  // the fake (torch.compile) call ends here: checks only

    const DLDevice dev = device.unwrap();
    const int arch = compute_capability(dev.device_id);
    RuntimeCheck(arch >= 89, "decode_linear_fp8: the kernel needs fp8 tensor cores (sm_89 or newer), got sm_", arch);
    Params p{};
    p.out = out.data_ptr();
    p.input = input_q.data_ptr();
    p.weight = weight.data_ptr();
    p.input_scale = static_cast<const float*>(input_scale.data_ptr());
    p.weight_scale = static_cast<const float*>(weight_scale.data_ptr());
    p.bias = bias_ptr;
    p.out_stride = m > 1 ? out.stride(0) : 0;
    p.input_stride = m > 1 ? x_stride : 0;
    p.input_scale_stride[0] = m > 1 ? is0.unwrap() : 0;
    p.input_scale_stride[1] = is1.unwrap();
    p.weight_scale_stride[0] = n_blocks.unwrap() > 1 ? ws0.unwrap() : 0;
    p.weight_scale_stride[1] = ws1.unwrap();
    p.bias_stride = bias_stride;
    p.bias_fp32 = bias_fp32;
    p.m = m;
    p.n = n;
    p.k = k;
    p.blocks = static_cast<uint32_t>(k_blocks.unwrap());
    const int64_t groups = div_ceil(n, kColumns);
    const int64_t wave = int64_t{runtime::sm_count(dev.device_id)} * kBlocksPerSm;
    p.split_log2 = runtime::has_clusters(dev.device_id) ? gemm::detail::split_log2(groups, p.blocks, wave) : 0;
    const bool pdl = runtime::resolve_pdl(enable_pdl, dev.device_id);
    LaunchKernel(static_cast<uint32_t>(groups << p.split_log2), kThreads, dev)
        .enable_cluster(1u << p.split_log2)
        .enable_pdl(pdl)(decode_linear_fp8_kernel<kRows, T>, p);
  }
};

}  // namespace jit_kernel::gemm::fp8
