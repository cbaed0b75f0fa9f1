// RMSNorm building blocks shared by the rmsnorm and qknorm families.
//
// A norm launch works on up to two "row sets" (q and k for the qk norms, one tensor otherwise).
// A row set is addressed as rows r = outer * inner + i, at element offset outer * s0 + i * s1, so
// the same kernels serve `[N, D]` rows with a token stride and `[N, H, D]` heads with token and
// head strides. Semantics (every path): x = float(input) (fused: r = T(float(input) +
// float(residual)) is stored to residual and x = float(r)); rrms = rsqrt(mean(x^2) + eps);
// out = T(x * rrms * float(weight)). Sums are accumulated in fp32.
//
// kCast (fused only; SGLang's `cast_x_before_out_mul=True`, Hugging Face's `weight *
// x.to(dtype)`): s = float(input) + float(residual) stays unrounded in fp32 (residual still gets
// T(s)); rrms = rsqrt(mean(s^2) + eps); out = T(float(T(s * rrms)) * float(weight)): the
// normalised value is rounded to T before the weight multiply. Callers pass kCast only for 16-bit
// T: in fp32 both roundings are the identity and the default kernels compute the same bits.
#pragma once

#include <sgl_kernel/cta.cuh>
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
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace jit_kernel::norm {

struct RowSet {
  void* out;
  const void* in;
  void* residual;  // nullptr unless fused add
  const void* weight;
  int64_t rows;   // outer * inner
  int64_t inner;  // rows per outer index (heads per token; 1 for plain rows)
  int64_t dim;
  int64_t in_s0, in_s1, out_s0, out_s1, res_s0, res_s1;  // element strides
};

struct Params {
  RowSet set[2];
  int32_t num_sets;
  float eps;
};

template <typename T>
inline constexpr int64_t kVecElems = 16 / static_cast<int64_t>(sizeof(T));

// x = T(x + r) element by element, the fp32 sum rounded to T. kPaired: 16-bit T adds in pairs with
// the packed add (add.rn.f16x2 / bf16x2), one instruction per two elements where the fp32 form takes
// two unpacks, an add and a rounding per element. The value is the same: the fp32 sum of two 16-bit
// floats rounded to T is their correctly rounded sum (fp32's 24 bits are at least 2 * 11 + 2, so
// the second rounding cannot differ from one), which is what the packed add computes.
template <bool kPaired, typename T, std::size_t kN>
SGL_DEVICE void add_rounded(device::AlignedVector<T, kN>& x, const device::AlignedVector<T, kN>& r) {
  if constexpr (kPaired && sizeof(T) == 2 && kN % 2 == 0) {
    using T2 = packed_t<T>;
    auto* xs = reinterpret_cast<T2*>(&x);
    const auto* rs = reinterpret_cast<const T2*>(&r);
#pragma unroll
    for (std::size_t j = 0; j < kN / 2; ++j) xs[j] = __hadd2(xs[j], rs[j]);
  } else {
#pragma unroll
    for (std::size_t j = 0; j < kN; ++j) {
      x[j] = dtype_trait<T>::from(dtype_trait<fp32_t>::from(x[j]) + dtype_trait<fp32_t>::from(r[j]));
    }
  }
}

// sum += the squares of x's elements in order (kPaired: unpacked a pair at a time).
template <bool kPaired, typename T, std::size_t kN>
SGL_DEVICE void add_squares(const device::AlignedVector<T, kN>& x, float& sum) {
  if constexpr (kPaired) {
    float f[kN];
    device::to_floats(x, f);
#pragma unroll
    for (std::size_t j = 0; j < kN; ++j) sum += f[j] * f[j];
  } else {
#pragma unroll
    for (std::size_t j = 0; j < kN; ++j) {
      const float f = dtype_trait<fp32_t>::from(x[j]);
      sum += f * f;
    }
  }
}

// cta::all_reduce_sum's total from the per-warp partials smem[0, kWarps) (stored before a
// barrier), computed by each thread from shared memory: the second butterfly's additions in its
// order (lanes i and i + off for off = 16, 8, ..., 1, lanes from kWarps on holding 0), bit for bit
// its result without its five shuffle round trips. An addition of a zero lane is skipped: exact for
// every partial but -0, which a sum of squares never is.
template <int kWarps>
SGL_DEVICE float sum_warp_partials(const float* smem) {
  static_assert(kWarps >= 1 && kWarps <= 32);
  float a[kWarps];
#pragma unroll
  for (int i = 0; i < kWarps; ++i) a[i] = smem[i];
  const auto level = [&]<int kOff>() {
#pragma unroll
    for (int i = 0; i < kOff; ++i) {
      if (i + kOff < kWarps) a[i] = a[i] + a[i + kOff];
    }
  };
  level.template operator()<16>();
  level.template operator()<8>();
  level.template operator()<4>();
  level.template operator()<2>();
  level.template operator()<1>();
  return a[0];
}

// What normalize_row does with each normalised vector y (T, rounded once): an epilogue policy,
// called as epilogue(out, y, v, k) for the row's vector number v, held in slot k < kPer (a
// constant once the loop is unrolled). The default stores y to `out`; other policies (epilogue_row.cuh)
// quantise it, or keep it for a reduction they run after normalize_row returns; a policy with a
// load_with_row() has it called under the row's own predicate just before the row's loads, so
// ptxas issues that load with them (a load of its own is scheduled after the first use of the row,
// a second memory round trip per launch). kWeightPlusOne: the
// weight multiplies as (1 + float(w)) in fp32 (Gemma's RMSNorm: x * rrms * (1 + w), one rounding).
struct StoreRow {
  static constexpr bool kWeightPlusOne = false;
  template <typename T, typename Vec>
  SGL_DEVICE void operator()(T* out, const Vec& y, int64_t v, int /*k*/) const {
    y.store(out, v);
  }
};

SGL_DEVICE void row_offsets(const RowSet& s, int64_t row, int64_t& in_off, int64_t& out_off, int64_t& res_off) {
  const int64_t outer = s.inner == 1 ? row : row / s.inner;
  const int64_t i = row - outer * s.inner;
  in_off = outer * s.in_s0 + i * s.in_s1;
  out_off = outer * s.out_s0 + i * s.out_s1;
  res_off = outer * s.res_s0 + i * s.res_s1;
}

// What a caller of normalize_row asks of it (docs/design/norm.md has who asks what), written with
// designated initialisers: normalize_row<T, kPer, RowOptions{.fused = true, .early_weight = true}>.
struct RowOptions {
  // residual = T(input + residual) is stored to `res` and normalised.
  bool fused = false;
  // The weight is loaded with the row: one round trip less on the critical path of a launch of few
  // rows; with many rows, bandwidth needs occupancy instead and the weight is loaded after the
  // reduction (not live across it).
  bool early_weight = false;
  // SGLang's cast_x_before_out_mul rounding (fused only; see the top of this file): the unrounded
  // fp32 sums stay in registers for the output.
  bool cast = false;
  // Two vectors a thread, each vector's squares summed on their own: `reduce` takes the two sums, to
  // combine them in the order of a reduction over one vector a thread.
  bool slot_sums = false;
  // The residual add and the squares of 16-bit T a pair at a time (add_rounded, add_squares): the
  // same values in other code; the epilogue kernels take it, rmsnorm's own kernels keep the element
  // form (docs/design/norm.md).
  bool paired = false;
};

// One row held in registers, so the input is read once: this thread's vectors are number
// lane + k * group of the row, k < kPer, those below nvec (`exact`: all of them, no bounds check).
// Every load (input, residual, weight) is issued before the first use of any of them: one memory
// round trip before the reduction however many vectors a thread holds (a residual store between
// two loads would order them, and each would wait for the one before). `reduce` sums over every
// thread that holds part of the row. Callers make every argument but the row a constant where they
// can; this is inlined. `epilogue`: what becomes of each normalised vector (StoreRow: stored to
// `out`).
template <typename T, int kPer, RowOptions kOptions, typename Reduce, typename Epilogue = StoreRow>
SGL_DEVICE void normalize_row(
    const T* in,
    T* out,
    T* res,
    const T* weight,
    int64_t lane,
    int64_t group,
    int64_t nvec,
    bool exact,
    float inv_dim,
    float eps,
    Reduce reduce,
    Epilogue&& epilogue = Epilogue{}) {
  constexpr bool kFused = kOptions.fused;
  constexpr bool kEarlyWeight = kOptions.early_weight;
  constexpr bool kCast = kOptions.cast;
  constexpr bool kSlotSums = kOptions.slot_sums;
  constexpr bool kPairedAdd = kOptions.paired;
  static_assert(!kCast || kFused, "cast is a fused-add variant");
  constexpr bool kWeightPlusOne = std::remove_cvref_t<Epilogue>::kWeightPlusOne;
  static_assert(!kCast || !kWeightPlusOne, "cast has no (1 + w) form");
  using Vec = device::AlignedVector<T, kVecElems<T>>;
  constexpr int kN = static_cast<int>(kVecElems<T>);
  Vec x[kPer], w[kPer], r[kFused ? kPer : 1];
  float s[kCast ? kPer : 1][kCast ? kN : 1];  // kCast: the unrounded sums
  {
    // The loads go to 32-bit words and are unpacked to T only once all are issued: unpacked at
    // each load, ptxas may recycle a loaded register for the next load's address, and that load
    // then waits for the first one's data (a second round trip before the reduction).
    using Raw = device::AlignedVector<uint32_t, sizeof(Vec) / sizeof(uint32_t)>;
    Raw xr[kPer], wr[kPer], rr[kFused ? kPer : 1];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int64_t v = lane + k * group;
      if (exact || v < nvec) {
        if constexpr (requires { epilogue.load_with_row(); }) {
          if (k == 0) epilogue.load_with_row();
        }
        if constexpr (kEarlyWeight) wr[k].load(weight, v);
        xr[k].load(in, v);
        if constexpr (kFused) rr[k].load(res, v);
      }
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      __builtin_memcpy(&x[k], &xr[k], sizeof(Vec));
      if constexpr (kEarlyWeight) __builtin_memcpy(&w[k], &wr[k], sizeof(Vec));
      if constexpr (kFused) __builtin_memcpy(&r[k], &rr[k], sizeof(Vec));
    }
  }
  static_assert(!kSlotSums || (kPer == 2 && !kCast), "slot_sums: two vectors a thread, no cast");
  float sum = 0.f;
  float slot_sum[kSlotSums ? kPer : 1] = {};
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t v = lane + k * group;
    if (exact || v < nvec) {
      if constexpr (kCast) {
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          s[k][j] = dtype_trait<fp32_t>::from(x[k][j]) + dtype_trait<fp32_t>::from(r[k][j]);
          x[k][j] = dtype_trait<T>::from(s[k][j]);
          sum += s[k][j] * s[k][j];
        }
        x[k].store(res, v);
      } else {
        if constexpr (kFused) {
          add_rounded<kPairedAdd>(x[k], r[k]);
          x[k].store(res, v);
        }
        add_squares<kPairedAdd>(x[k], kSlotSums ? slot_sum[k] : sum);
      }
    }
  }
  float total;
  if constexpr (kSlotSums) {
    total = reduce(slot_sum[0], slot_sum[1]);
  } else {
    total = reduce(sum);
  }
  const float rrms = rsqrtf(total * inv_dim + eps);
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t v = lane + k * group;
    if (exact || v < nvec) {
      if constexpr (!kEarlyWeight) w[k].load(weight, v);
      float f[kN];
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        if constexpr (kCast) {
          const float n = dtype_trait<fp32_t>::from(dtype_trait<T>::from(s[k][j] * rrms));
          f[j] = n * dtype_trait<fp32_t>::from(w[k][j]);
        } else if constexpr (kWeightPlusOne) {
          const float scale = 1.f + dtype_trait<fp32_t>::from(w[k][j]);
          f[j] = dtype_trait<fp32_t>::from(x[k][j]) * rrms * scale;
        } else {
          f[j] = dtype_trait<fp32_t>::from(x[k][j]) * rrms * dtype_trait<fp32_t>::from(w[k][j]);
        }
      }
      Vec y;
      device::from_floats(y, f);
      epilogue(out, y, v, k);
    }
  }
}

// Rows of whole, aligned 16-byte vectors whose dim is known only at run time: one block per row,
// at most kPer vectors per thread (blocks of up to 512 threads), single pass, weight loaded with
// the row (its main use is launches of few rows, e.g. qknorm_across_heads with q and k of
// different widths).
template <typename T, int kPer, bool kFused, bool kCast = false>
__global__ void __launch_bounds__(512) bounded_row_kernel(const Params p) {
  __shared__ float smem[32];
  const RowSet& s = p.set[blockIdx.y];
  if (blockIdx.x >= s.rows) return;  // whole block: the sets may differ in rows
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  int64_t in_off, out_off, res_off;
  row_offsets(s, blockIdx.x, in_off, out_off, res_off);
  const auto reduce = [&](float v) { return device::cta::all_reduce_sum(v, smem); };
  normalize_row<T, kPer, RowOptions{.fused = kFused, .early_weight = true, .cast = kCast}>(
      static_cast<const T*>(s.in) + in_off,
      static_cast<T*>(s.out) + out_off,
      kFused ? static_cast<T*>(s.residual) + res_off : nullptr,
      static_cast<const T*>(s.weight),
      threadIdx.x,
      blockDim.x,
      s.dim / kVecElems<T>,
      false,
      1.f / static_cast<float>(s.dim),
      p.eps,
      reduce);
}

inline constexpr int64_t kBoundedMaxThreads = 512;

// Generic path: any dim, one block per row (grid-stride over rows), two passes over the row
// (the second one hits L1/L2). kN = 1 is the scalar path for rows that are not whole 16-byte
// vectors or are misaligned; kN = kVecElems<T> moves 16 bytes per access, for rows longer than
// bounded_row_kernel holds. kCast (fused): the second pass needs the unrounded sums, so the first
// pass only reads, and the second reads input and residual again and writes both.
template <typename T, int kN, bool kCast = false>
__global__ void generic_kernel(const Params p) {
  using device::AlignedVector;
  using Vec = AlignedVector<T, kN>;
  __shared__ float smem[32];
  const RowSet& s = p.set[blockIdx.y];
  const int64_t nvec = s.dim / kN;
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  for (int64_t row = blockIdx.x; row < s.rows; row += gridDim.x) {
    int64_t in_off, out_off, res_off;
    row_offsets(s, row, in_off, out_off, res_off);
    const T* in = static_cast<const T*>(s.in) + in_off;
    T* out = static_cast<T*>(s.out) + out_off;
    T* res = s.residual == nullptr ? nullptr : static_cast<T*>(s.residual) + res_off;
    float sum = 0.f;
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
      Vec x;
      x.load(in, v);
      if constexpr (kCast) {
        Vec r;
        r.load(res, v);
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          const float f = dtype_trait<fp32_t>::from(x[j]) + dtype_trait<fp32_t>::from(r[j]);
          sum += f * f;
        }
        continue;
      }
      if (res != nullptr) {
        Vec r;
        r.load(res, v);
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          x[j] = dtype_trait<T>::from(dtype_trait<fp32_t>::from(x[j]) + dtype_trait<fp32_t>::from(r[j]));
        }
        x.store(res, v);
      }
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        const float f = dtype_trait<fp32_t>::from(x[j]);
        sum += f * f;
      }
    }
    device::cta::reduce_sum(sum, smem);
    __syncthreads();
    const float rrms = rsqrtf(smem[0] / static_cast<float>(s.dim) + p.eps);
    if constexpr (kCast) {
      for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
        Vec x, r, w, y;
        x.load(in, v);
        r.load(res, v);
        w.load(static_cast<const T*>(s.weight), v);
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          const float f = dtype_trait<fp32_t>::from(x[j]) + dtype_trait<fp32_t>::from(r[j]);
          r[j] = dtype_trait<T>::from(f);
          const float n = dtype_trait<fp32_t>::from(dtype_trait<T>::from(f * rrms));
          y[j] = dtype_trait<T>::from(n * dtype_trait<fp32_t>::from(w[j]));
        }
        r.store(res, v);
        y.store(out, v);
      }
      __syncthreads();  // smem is reused by the next row
      continue;
    }
    const T* src = res != nullptr ? res : in;
    for (int64_t v = threadIdx.x; v < nvec; v += blockDim.x) {
      Vec x, w, y;
      x.load(src, v);
      w.load(static_cast<const T*>(s.weight), v);
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        y[j] = dtype_trait<T>::from(dtype_trait<fp32_t>::from(x[j]) * rrms * dtype_trait<fp32_t>::from(w[j]));
      }
      y.store(out, v);
    }
    __syncthreads();  // smem is reused by the next row
  }
}

// Whole-16-byte-vector addressing of every pointer and stride of the launch.
inline bool vector_aligned(const Params& p, std::size_t elem_bytes) {
  auto ok = [](uint64_t value) { return value % 16 == 0; };
  for (int i = 0; i < p.num_sets; ++i) {
    const RowSet& s = p.set[i];
    bool good = ok(reinterpret_cast<uint64_t>(s.out)) && ok(reinterpret_cast<uint64_t>(s.in)) &&
                ok(reinterpret_cast<uint64_t>(s.weight)) && ok(s.dim * elem_bytes) && ok(s.in_s0 * elem_bytes) &&
                ok(s.in_s1 * elem_bytes) && ok(s.out_s0 * elem_bytes) && ok(s.out_s1 * elem_bytes);
    if (s.residual != nullptr) {
      good =
          good && ok(reinterpret_cast<uint64_t>(s.residual)) && ok(s.res_s0 * elem_bytes) && ok(s.res_s1 * elem_bytes);
    }
    if (!good) return false;
  }
  return true;
}

inline int64_t max_rows(const Params& p) {
  int64_t rows = 0;
  for (int i = 0; i < p.num_sets; ++i) rows = std::max(rows, p.set[i].rows);
  return rows;
}

template <typename T, bool kFused, int kPer, bool kCast = false>
void launch_bounded(const Params& p, int64_t rows, int64_t max_vecs, DLDevice device, bool enable_pdl) {
  const auto threads = static_cast<uint32_t>(host::div_ceil(host::div_ceil(max_vecs, int64_t{kPer}), int64_t{32}) * 32);
  const dim3 grid(static_cast<uint32_t>(rows), p.num_sets);
  host::LaunchKernel(grid, threads, device).enable_pdl(enable_pdl)(bounded_row_kernel<T, kPer, kFused, kCast>, p);
}

// kCast: the fused-add launch of SGLang's cast_x_before_out_mul (see the top of this file).
template <typename T, bool kCast = false>
void launch_generic(const Params& p, DLDevice device, bool enable_pdl) {
  const int64_t rows = max_rows(p);
  if (rows == 0) return;
  int64_t max_dim = 0;
  for (int i = 0; i < p.num_sets; ++i) max_dim = std::max(max_dim, p.set[i].dim);
  const bool vec = vector_aligned(p, sizeof(T));
  const int64_t units = vec ? max_dim / kVecElems<T> : max_dim;
  if (vec && rows < (int64_t{1} << 31) && units <= 4 * kBoundedMaxThreads) {
    const bool fused = p.set[0].residual != nullptr;
    const auto launch = [&]<int kPer>() {
      if constexpr (kCast) {
        launch_bounded<T, true, kPer, true>(p, rows, units, device, enable_pdl);
      } else if (fused) {
        launch_bounded<T, true, kPer>(p, rows, units, device, enable_pdl);
      } else {
        launch_bounded<T, false, kPer>(p, rows, units, device, enable_pdl);
      }
    };
    if (units <= kBoundedMaxThreads) {
      launch.template operator()<1>();
    } else if (units <= 2 * kBoundedMaxThreads) {
      launch.template operator()<2>();
    } else {
      launch.template operator()<4>();
    }
    return;
  }
  const auto threads = static_cast<uint32_t>(std::clamp<int64_t>(host::div_ceil(units, int64_t{32}) * 32, 32, 512));
  const dim3 grid(static_cast<uint32_t>(std::min<int64_t>(rows, int64_t{1} << 30)), p.num_sets);
  if (vec) {
    host::LaunchKernel(grid, threads, device)
        .enable_pdl(enable_pdl)(generic_kernel<T, static_cast<int>(kVecElems<T>), kCast>, p);
  } else {
    host::LaunchKernel(grid, threads, device).enable_pdl(enable_pdl)(generic_kernel<T, 1, kCast>, p);
  }
}

// The widest row the kernels take (one block per row; the two-pass kernel streams it).
inline constexpr int64_t kMaxDim = int64_t{1} << 20;

// The scalar rules of every norm entry, checked before anything is launched.
inline void check_eps_and_dim(double eps, int64_t dim, const char* tensor, host::DebugInfo where = {}) {
  host::RuntimeCheck(where, eps >= 0, "eps must be >= 0, got ", eps);
  host::RuntimeCheck(
      where, dim >= 1 && dim <= kMaxDim, "the last dimension of ", tensor, " must be in [1, ", kMaxDim, "], got ", dim);
}

// Fills a row set from a [rows, dim] (inner = 1) or [outer, inner, dim] view.
inline RowSet make_rows(tvm::ffi::TensorView out, tvm::ffi::TensorView in, const void* weight) {
  RowSet s{};
  s.out = out.data_ptr();
  s.in = in.data_ptr();
  s.weight = weight;
  const auto rank = in.dim();
  s.dim = in.size(rank - 1);
  if (rank == 2) {
    s.inner = 1;
    s.rows = in.size(0);
    s.in_s0 = in.stride(0);
    s.out_s0 = out.stride(0);
  } else {
    s.inner = in.size(1);
    s.rows = in.size(0) * in.size(1);
    s.in_s0 = in.stride(0);
    s.in_s1 = in.stride(1);
    s.out_s0 = out.stride(0);
    s.out_s1 = out.stride(1);
  }
  return s;
}

}  // namespace jit_kernel::norm
