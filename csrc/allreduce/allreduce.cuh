// custom_all_reduce: an all-reduce over the GPUs of one host through buffers every rank maps by
// CUDA IPC (python/jit_kernel/distributed.py allocates and shares them), and the same all-reduce
// fused with the residual add and RMSNorm (and an fp8 quantisation of its output: a static
// per-tensor scale, or dynamic scales per group of 64 or 128 elements of a token).
//
//   all_reduce                  (out, x, peers, rank, algo, error, timeout_ns, half_bytes, inputs)
//   fused_add_rmsnorm           (x, residual, weight, eps, peers, rank, kper, error, timeout_ns, half_bytes)
//   fused_add_rmsnorm_quant_fp8 (q, x, residual, weight, scale, eps, peers, rank, kper, error, ...)
//   fused_add_rmsnorm_per_token_group_quant_fp8
//                               (q, s, x, residual, weight, group_size, eps, quant_eps, scale_ue8m0,
//                                peers, rank, kper, error, ...)
//   ipc_alloc, ipc_free, ipc_handle, ipc_open, ipc_close, signal_bytes: the regions (host only)
//   ipc_input_handle: the IPC handle of the allocation holding a captured input (host only)
//
// Every rank owns two regions that the others map:
// - data: two halves of `half_bytes` each. A call copies its input into the half of its epoch's
//   parity (the copy-in: the kernel's first phase, so no input address needs registering, and a
//   CUDA graph replays with whatever its captured input holds);
// - signal (kSignalWords uint32 words): the epoch (the number of calls made), the count of blocks
//   done with the current call, a sticky error word, and the arrival flags
//   flags[phase][block][from_rank].
//
// `peers` is a CPU int64 tensor [2, W]: row 0 the data regions' device addresses, row 1 the signal
// regions'. The call's epoch e lives in device memory (read by every block at the start, advanced
// by the last block to finish), so a CUDA graph replay advances it as an eager call does.
//
// Registered inputs (all_reduce only; python/jit_kernel/distributed.py, graph_inputs="register"):
// `inputs` is 0 (copy-in) or the device address of a slot of a table, one slot per captured call,
// holding kMaxRanks addresses: where this process reads each rank's input of that call (its own
// input, and the peers' inputs through the IPC mappings of their allocations), filled by the host
// after capture. A call whose slot is filled on this rank skips the copy-in and reads every rank's
// input in place (the host fills a slot on every rank or on none, so the ranks agree); the
// protocol is the same code either way, only the address each rank's data is read from
// (BlockState::src) differs. Reading a peer's input in place adds one rule: no rank may leave the
// call, after which its stream may overwrite its input, before every peer has finished reading it.
// Two-shot reads the inputs only before its second barrier, which gives that; one-shot adds a
// barrier at its end (phase 1). The host registers no one-shot call whose output overlaps its input
// (the rank would overwrite its input while the peers read it) and no two-shot call whose output
// overlaps its input other than exactly (in place, each rank writes only its own slice before the
// second barrier); those calls copy in.
//
// A barrier (phase p): every block stores e into flags[p][block][rank] of every rank (release,
// system scope, after the block's writes), then thread i < W polls its own flags[p][block][i] until
// it is at least e (acquire). A peer is at most one call ahead (it cannot pass its next barrier
// without this rank), and flags only grow, so a flag left from an earlier call is never mistaken for
// this one's. The data half alternates with e's parity: this call's copy never overwrites what a
// peer still reads of the previous call, and a peer that reached this call's barrier has finished
// the call before the previous one (its calls run in stream order).
//
// Algorithms (the same choice on every rank: python/jit_kernel/ops/allreduce.py):
// - one-shot: copy, barrier, then every rank reads every rank's data and sums it (registered:
//   barrier, read and sum every rank's input, barrier);
// - two-shot: copy, barrier, rank r reduces slice r of the data into its own region (registered:
//   of the inputs), barrier, then every rank gathers slice s from rank s's region.
// Every element is summed in fp32 in rank order 0 .. W-1 and rounded once to T, whichever the
// algorithm and the rank: every rank gets the same bits, the bits of a float32 rank-order sum.
//
// Bounded waits (as csrc/stream_wait.cuh's bounded wait): a poll gives up after timeout_ns of
// %globaltimer time, ORs the missing ranks' bits into the sticky device error word, sets
// `error[rank]` for each (pinned host memory, kMaxRanks words, read by the host without a sync), and the block
// skips the rest of the call. A block that finds the sticky word set skips its waits: after a
// timeout every later call finishes at once, with undefined output, and the host refuses the
// communicator. Nothing traps (a trap poisons the CUDA context).
#pragma once

#include "../norm/common.cuh"
#include "../norm/norm_quant.cuh"
#include "../quant/per_tensor_fp8.cuh"

#include <sgl_kernel/cta.cuh>
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>
#include <sgl_kernel/vec.cuh>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <cstdint>
#include <cuda.h>
#include <cuda_runtime.h>

namespace jit_kernel::allreduce {

inline constexpr int kMaxRanks = 8;
inline constexpr int kMaxBlocks = 128;
inline constexpr int kThreads = 512;
// Signal region layout (uint32 words).
inline constexpr int kEpochWord = 0;
inline constexpr int kDoneWord = 1;
inline constexpr int kErrorWord = 2;
inline constexpr int kFlagsWord = 32;
inline constexpr int kPhases = 2;
inline constexpr int64_t kSignalWords = kFlagsWord + kPhases * kMaxBlocks * kMaxRanks;

enum Algo : int32_t { kOneShot = 0, kTwoShot = 1 };

// One slot of the registered-inputs table: rank r's input of one captured call, as this process
// addresses it (nullptr: not registered, the call copies in).
struct RankInputs {
  const char* ptr[kMaxRanks];
};
static_assert(sizeof(RankInputs) == 8 * kMaxRanks, "python/jit_kernel/distributed.py writes int64 rows");

struct Peers {
  char* data[kMaxRanks];
  uint32_t* signal[kMaxRanks];
  int32_t rank;
  int32_t world;
  int32_t* host_error;  // pinned host memory, one word per rank (the same address on the device: unified addressing)
  uint64_t timeout_ns;
  int64_t half_bytes;
  const RankInputs* inputs;  // this call's slot, or nullptr (copy-in)
};

SGL_DEVICE uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

SGL_DEVICE void store_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

SGL_DEVICE uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

SGL_DEVICE uint32_t* flag(uint32_t* signal, int phase, int block, int from) {
  return signal + kFlagsWord + (phase * kMaxBlocks + block) * kMaxRanks + from;
}

// What a block shares: the call's epoch, whether the call failed, whether it reads the inputs in
// place, and where it reads rank r's data.
struct BlockState {
  uint32_t epoch;
  int failed;
  int registered;
  const char* src[kMaxRanks];  // rank r's registered input, or its data half of this epoch
};

// Reads the epoch, the sticky error word and the call's slot (thread 0), for the whole block.
SGL_DEVICE void begin(const Peers& p, BlockState& s) {
  if (threadIdx.x == 0) {
    const uint32_t* mine = p.signal[p.rank];
    s.epoch = static_cast<const volatile uint32_t*>(mine)[kEpochWord] + 1;
    s.failed = static_cast<const volatile uint32_t*>(mine)[kErrorWord] != 0;
    const bool registered = p.inputs != nullptr && p.inputs->ptr[p.rank] != nullptr;
    s.registered = registered;
    const int64_t offset = static_cast<int64_t>(s.epoch & 1) * p.half_bytes;
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r) {
      if (r < p.world) s.src[r] = registered ? p.inputs->ptr[r] : p.data[r] + offset;
    }
  }
  __syncthreads();
}

// The barrier of `phase` for this block (see the top of the file). Returns false, in every thread,
// when the call failed (a peer did not arrive in time now or in an earlier call).
SGL_DEVICE bool barrier(const Peers& p, BlockState& s, int phase) {
  __syncthreads();  // the block's writes of this phase are done
  const uint32_t e = s.epoch;
  const int t = static_cast<int>(threadIdx.x);
  bool missing = false;
  if (t < p.world && !s.failed) {
    __threadfence_system();
    store_release(flag(p.signal[t], phase, blockIdx.x, p.rank), e);
    const uint32_t* mine = flag(p.signal[p.rank], phase, blockIdx.x, t);
    const uint64_t start = global_timer_ns();
    uint32_t sleep_ns = 8;
    while (static_cast<int32_t>(load_acquire(mine) - e) < 0) {
      if (global_timer_ns() - start >= p.timeout_ns) {
        missing = true;
        break;
      }
      __nanosleep(sleep_ns);
      sleep_ns = sleep_ns < 256 ? sleep_ns * 2 : sleep_ns;
    }
    if (missing) {
      atomicOr(p.signal[p.rank] + kErrorWord, 1u << t);
      static_cast<volatile int32_t*>(p.host_error)[t] = 1;  // a plain store: no atomic on host memory
      __threadfence_system();
    }
  }
  const int failed = __syncthreads_or(missing || s.failed);
  if (threadIdx.x == 0) s.failed = failed;
  return failed == 0;
}

// The last block to finish advances the epoch for the next call.
SGL_DEVICE void end(const Peers& p, const BlockState& s) {
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t* mine = p.signal[p.rank];
    __threadfence();
    if (atomicAdd(mine + kDoneWord, 1u) == gridDim.x - 1) {
      mine[kDoneWord] = 0;
      static_cast<volatile uint32_t*>(mine)[kEpochWord] = s.epoch;
      __threadfence();
    }
  }
}

// A vector of kN elements of T read from a peer's region at L2 (ld.global.cg: the peers write it
// while this kernel runs, so no L1 line of it may be used).
template <typename T, int kN>
using Vec = device::AlignedVector<T, kN>;

template <typename T, int kN>
SGL_DEVICE Vec<T, kN> load_cg(const char* base, int64_t unit) {
  constexpr int kBytes = static_cast<int>(sizeof(T)) * kN;
  Vec<T, kN> v;
  if constexpr (kBytes == 16) {
    const uint4 bits = __ldcg(reinterpret_cast<const uint4*>(base) + unit);
    __builtin_memcpy(&v, &bits, 16);
  } else if constexpr (kBytes == 4) {
    const unsigned int bits = __ldcg(reinterpret_cast<const unsigned int*>(base) + unit);
    __builtin_memcpy(&v, &bits, 4);
  } else {
    static_assert(kBytes == 2, "16-, 4- or 2-byte units");
    const unsigned short bits = __ldcg(reinterpret_cast<const unsigned short*>(base) + unit);
    __builtin_memcpy(&v, &bits, 2);
  }
  return v;
}

// The sum of unit `unit` over every rank's data (s.src[r] + offset: its registered input or its
// data half), in fp32 in rank order, rounded once.
template <typename T, int kN>
SGL_DEVICE Vec<T, kN> sum_ranks(const Peers& p, const BlockState& s, int64_t offset, int64_t unit) {
  float acc[kN];
  {
    const Vec<T, kN> v = load_cg<T, kN>(s.src[0] + offset, unit);
#pragma unroll
    for (int j = 0; j < kN; ++j) acc[j] = dtype_trait<fp32_t>::from(v[j]);
  }
  for (int r = 1; r < p.world; ++r) {
    const Vec<T, kN> v = load_cg<T, kN>(s.src[r] + offset, unit);
#pragma unroll
    for (int j = 0; j < kN; ++j) acc[j] = acc[j] + dtype_trait<fp32_t>::from(v[j]);
  }
  Vec<T, kN> out;
#pragma unroll
  for (int j = 0; j < kN; ++j) out[j] = dtype_trait<T>::from(acc[j]);
  return out;
}

template <typename T, int kN>
SGL_DEVICE void copy_units(char* dst, const T* src, int64_t begin, int64_t end) {
  for (int64_t u = begin + threadIdx.x; u < end; u += blockDim.x) {
    Vec<T, kN> v;
    v.load(src, u);
    v.store(dst, u);
  }
}

// One-shot and two-shot over `units` vectors of kN elements.
template <typename T, int kN, int kAlgo>
__global__ void __launch_bounds__(kThreads) all_reduce_kernel(const Peers p, T* out, const T* in, int64_t units) {
  __shared__ BlockState s;
  begin(p, s);
  const int64_t offset = static_cast<int64_t>(s.epoch & 1) * p.half_bytes;
  char* mine = p.data[p.rank] + offset;
  const int64_t blocks = gridDim.x;
  if constexpr (kAlgo == kOneShot) {
    const int64_t chunk = (units + blocks - 1) / blocks;
    const int64_t lo = std::min(units, blockIdx.x * chunk), hi = std::min(units, lo + chunk);
    if (!s.registered) copy_units<T, kN>(mine, in, lo, hi);
    if (barrier(p, s, 0)) {
      for (int64_t u = lo + threadIdx.x; u < hi; u += blockDim.x) sum_ranks<T, kN>(p, s, 0, u).store(out, u);
      // Registered: the peers read this rank's input in place; no rank leaves before they are done.
      if (s.registered) barrier(p, s, 1);
    }
  } else {
    // Slice r = [r * slice, (r + 1) * slice) of the units, reduced by rank r; block b owns part b
    // of every slice.
    const int64_t slice = (units + p.world - 1) / p.world;
    const int64_t chunk = (slice + blocks - 1) / blocks;
    const auto part = [&](int r, int64_t& lo, int64_t& hi) {
      const int64_t slice_lo = std::min(units, r * slice), slice_hi = std::min(units, slice_lo + slice);
      lo = std::min(slice_hi, slice_lo + blockIdx.x * chunk);
      hi = std::min(slice_hi, lo + chunk);
    };
    if (!s.registered) {
      for (int r = 0; r < p.world; ++r) {
        int64_t lo, hi;
        part(r, lo, hi);
        copy_units<T, kN>(mine, in, lo, hi);
      }
    }
    int64_t lo, hi;
    part(p.rank, lo, hi);
    if (barrier(p, s, 0)) {
      for (int64_t u = lo + threadIdx.x; u < hi; u += blockDim.x) {
        const Vec<T, kN> v = sum_ranks<T, kN>(p, s, 0, u);
        v.store(mine, u);  // no peer reads this rank's slice before the next barrier
        v.store(out, u);   // registered and in place: this rank's slice, which no peer reads
      }
      if (barrier(p, s, 1)) {
        for (int r = 0; r < p.world; ++r) {
          if (r == p.rank) continue;
          part(r, lo, hi);
          for (int64_t u = lo + threadIdx.x; u < hi; u += blockDim.x) {
            load_cg<T, kN>(p.data[r] + offset, u).store(out, u);
          }
        }
      }
    }
  }
  end(p, s);
}

// What the fused kernel makes of the normalised rows, besides storing them to x.
enum class Quant : int {
  kNone,    // nothing
  kStatic,  // q = fp8 e4m3 with a static per-tensor scale
  kGroup,   // q and s: dynamic fp8 e4m3 per group of a row
};

// What becomes of each normalised vector y of the fused kernel (normalize_row's epilogue, see
// StoreRow in csrc/norm/common.cuh) for kNone and kStatic: stored to x, and with kQuant also
// quantised to fp8 e4m3 with a static per-tensor scale by per_tensor_quant_fp8's own expression
// (quant::quantise_vec) into q. kGroup takes norm_quant.cuh's own epilogue policy instead.
template <bool kQuant>
struct FusedEpilogue {
  static constexpr bool kWeightPlusOne = false;
  uint8_t* q;  // this row of q (kQuant)
  float inv_scale;
  template <typename T, typename Vec>
  SGL_DEVICE void operator()(T* out, const Vec& y, int64_t v, int /*k*/) const {
    y.store(out, v);
    if constexpr (kQuant) quant::quantise_vec(q, v, y, inv_scale);
  }
};

// residual = T(all_reduce(x) + residual); x = rmsnorm(residual) * weight, over rows of `dim`
// elements (whole 16-byte vectors, contiguous). Block b owns rows b, b + G, ...: it copies them,
// meets the peers once, then each row's sum goes to x and normalize_row (csrc/norm/common.cuh)
// runs on it with the lanes, block size and kPer of the bounded row kernel that
// fused_add_rmsnorm launches for these rows, so the row's reduction and rounding are the same.
// Quant::kStatic: q (fp8 e4m3, [rows, dim]) = fp8(clamp(x / *a.scale)) as well.
// Quant::kGroup: q and the scales a.s as fused_add_rmsnorm_per_token_group_quant_fp8 makes them,
// by its own epilogue policy (norm::Policy<Epi::kGroup>, csrc/norm/norm_quant.cuh) on the same
// normalised vectors: it needs slot k of a lane to be vector lane + k * blockDim.x with blockDim.x
// a multiple of 32 (a group is adjacent lanes of one warp) and every lane of the block to reach
// finish(), which a whole block's row loop gives.
template <typename T, int kPer, Quant kQuant>
__global__ void __launch_bounds__(kThreads) fused_add_rmsnorm_kernel(
    const Peers p, T* x, T* residual, const T* weight, int64_t rows, int64_t dim, float eps, const norm::EpiArgs a) {
  constexpr int kN = static_cast<int>(norm::kVecElems<T>);
  __shared__ BlockState s;
  __shared__ float smem[32];
  begin(p, s);
  const int64_t offset = static_cast<int64_t>(s.epoch & 1) * p.half_bytes;
  char* mine = p.data[p.rank] + offset;
  const int64_t nvec = dim / kN;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    copy_units<T, kN>(mine, x, row * nvec, (row + 1) * nvec);
  }
  if (barrier(p, s, 0)) {
    const auto reduce = [&](float v) { return device::cta::all_reduce_sum(v, smem); };
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
      T* x_row = x + row * dim;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        const int64_t v = threadIdx.x + k * blockDim.x;
        // The same thread reads these vectors back in normalize_row: no barrier needed.
        if (v < nvec) sum_ranks<T, kN>(p, s, row * nvec * 16, v).store(x_row, v);
      }
      constexpr auto kOptions = norm::RowOptions{.fused = true, .early_weight = true};
      const auto normalize = [&](auto&& epilogue) {
        norm::normalize_row<T, kPer, kOptions>(
            x_row,
            x_row,
            residual + row * dim,
            weight,
            threadIdx.x,
            blockDim.x,
            nvec,
            false,
            1.f / static_cast<float>(dim),
            eps,
            reduce,
            epilogue);
      };
      if constexpr (kQuant == Quant::kGroup) {
        norm::Policy<norm::Epi::kGroup, T, kPer> epilogue(a, row, dim, threadIdx.x);
        normalize(epilogue);
        epilogue.finish([](float m) { return m; });  // the group kind takes no row maximum
      } else {
        constexpr bool kStatic = kQuant == Quant::kStatic;
        normalize(
            FusedEpilogue<kStatic>{kStatic ? a.q + row * dim : nullptr, kStatic ? quant::inverse(*a.scale) : 0.f});
      }
      __syncthreads();  // smem is reused by the next row
    }
  }
  end(p, s);
}

inline auto make_peers(
    const tvm::ffi::TensorView& peers,
    int64_t rank,
    int64_t error,
    int64_t timeout_ns,
    int64_t half_bytes,
    host::DebugInfo where = {}) -> Peers {
  using namespace host;
  auto world = SymbolicSize{"world_size"};
  TensorMatcher({2, world}).with_dtype<int64_t>().with_device<kDLCPU>().verify(peers, "peers");
  const int64_t w = world.unwrap();
  RuntimeCheck(
      where, w >= 2 && w <= kMaxRanks, "custom_all_reduce: world size must be in [2, ", kMaxRanks, "], got ", w);
  RuntimeCheck(where, rank >= 0 && rank < w, "custom_all_reduce: rank ", rank, " out of range for world size ", w);
  RuntimeCheck(where, timeout_ns > 0, "custom_all_reduce: timeout must be > 0 ns, got ", timeout_ns);
  RuntimeCheck(where, half_bytes > 0 && half_bytes % 16 == 0, "custom_all_reduce: bad buffer size ", half_bytes);
  Peers p{};
  const auto* addr = static_cast<const int64_t*>(peers.data_ptr());
  if (addr != nullptr) {  // a fake call has no data
    const int64_t s0 = peers.stride(0), s1 = peers.stride(1);
    for (int64_t r = 0; r < w; ++r) {
      p.data[r] = reinterpret_cast<char*>(addr[r * s1]);
      p.signal[r] = reinterpret_cast<uint32_t*>(addr[s0 + r * s1]);
    }
  }
  p.rank = static_cast<int32_t>(rank);
  p.world = static_cast<int32_t>(w);
  p.host_error = reinterpret_cast<int32_t*>(error);
  p.timeout_ns = static_cast<uint64_t>(timeout_ns);
  p.half_bytes = half_bytes;
  return p;
}

inline uint32_t grid_for(int64_t work) {
  return static_cast<uint32_t>(std::clamp<int64_t>(host::div_ceil(work, int64_t{kThreads}), 1, kMaxBlocks));
}

template <typename T>
struct CustomAllReduce {
  // out = the sum of every rank's x (contiguous, the same shape and dtype on every rank; out may be
  // x). algo: 0 one-shot, 1 two-shot. inputs: 0 (copy-in), or the device address of this call's
  // slot of the registered-inputs table (a RankInputs; see the top of the file).
  static void all_reduce(
      tvm::ffi::TensorView out,
      tvm::ffi::TensorView x,
      tvm::ffi::TensorView peers,
      int64_t rank,
      int64_t algo,
      int64_t error,
      int64_t timeout_ns,
      int64_t half_bytes,
      int64_t inputs) {
    using namespace host;
    auto device = SymbolicDevice{};
    TensorMatcher::same_shape_as(x).with_device<kDLCUDA>(device).with_dtype<T>().verify(x, "x").verify(out, "out");
    Peers p = make_peers(peers, rank, error, timeout_ns, half_bytes);
    RuntimeCheck(algo == kOneShot || algo == kTwoShot, "custom_all_reduce: unknown algorithm ", algo);
    RuntimeCheck(
        inputs >= 0 && inputs % static_cast<int64_t>(alignof(RankInputs)) == 0,
        "custom_all_reduce: bad registered-inputs slot address ",
        inputs);
    p.inputs = reinterpret_cast<const RankInputs*>(inputs);
    const int64_t n = x.numel();
    const int64_t bytes = n * static_cast<int64_t>(sizeof(T));
    RuntimeCheck(bytes <= half_bytes, "custom_all_reduce: ", bytes, " bytes exceed the buffer's ", half_bytes);
    if (n == 0 || has_no_data(out)) return;
    const DLDevice dev = device.unwrap();
    constexpr int kN = 16 / static_cast<int>(sizeof(T));
    // The unit (a 16-byte vector or one element) depends on the size only, never on an address:
    // every rank must split the data into the same units and blocks.
    const bool vec = bytes % 16 == 0;
    if (vec) {
      for (const void* ptr : {x.data_ptr(), out.data_ptr()}) {
        RuntimeCheck(
            reinterpret_cast<uintptr_t>(ptr) % 16 == 0, "custom_all_reduce: x and out must be 16-byte aligned");
      }
    }
    auto* o = static_cast<T*>(out.data_ptr());
    const auto* i = static_cast<const T*>(x.data_ptr());
    const auto launch = [&]<int kVec>() {
      const int64_t units = n / kVec;
      const int64_t work = algo == kTwoShot ? host::div_ceil(units, int64_t{p.world}) : units;
      const uint32_t grid = grid_for(work);
      if (algo == kTwoShot) {
        LaunchKernel(grid, kThreads, dev)(all_reduce_kernel<T, kVec, kTwoShot>, p, o, i, units);
      } else {
        LaunchKernel(grid, kThreads, dev)(all_reduce_kernel<T, kVec, kOneShot>, p, o, i, units);
      }
    };
    if (vec) {
      launch.template operator()<kN>();
    } else {
      launch.template operator()<1>();
    }
  }

  // residual = T(all_reduce(x) + residual); x = rmsnorm(residual) * weight. x and residual are
  // contiguous [N, D] rows of whole, aligned 16-byte vectors, D / (16 / sizeof(T)) <= 4 * 512
  // vectors; kper is the vectors per thread of fused_add_rmsnorm's row kernel for D (1, 2 or 4).
  static void fused_add_rmsnorm(
      tvm::ffi::TensorView x,
      tvm::ffi::TensorView residual,
      tvm::ffi::TensorView weight,
      double eps,
      tvm::ffi::TensorView peers,
      int64_t rank,
      int64_t kper,
      int64_t error,
      int64_t timeout_ns,
      int64_t half_bytes) {
    const auto no_outputs = [](host::SymbolicSize&, host::SymbolicSize&, host::SymbolicDevice&) {
      return norm::EpiArgs{};
    };
    run_fused<Quant::kNone>(x, residual, weight, eps, peers, rank, kper, error, timeout_ns, half_bytes, no_outputs);
  }

  // fused_add_rmsnorm, and q = fp8 e4m3 of the normalised rows with the static scale `scale` (a
  // float32 [1] on the device; q: [N, D] float8_e4m3fn, contiguous).
  static void fused_add_rmsnorm_quant_fp8(
      tvm::ffi::TensorView q,
      tvm::ffi::TensorView x,
      tvm::ffi::TensorView residual,
      tvm::ffi::TensorView weight,
      tvm::ffi::TensorView scale,
      double eps,
      tvm::ffi::TensorView peers,
      int64_t rank,
      int64_t kper,
      int64_t error,
      int64_t timeout_ns,
      int64_t half_bytes) {
    const auto outputs = [&](host::SymbolicSize& N, host::SymbolicSize& D, host::SymbolicDevice& device) {
      using namespace host;
      TensorMatcher({N, D}).with_device<kDLCUDA>(device).with_dtype<fp8_e4m3_t>().verify(q, "out");
      TensorMatcher({1}).with_device<kDLCUDA>(device).with_dtype<float>().verify(scale, "scale");
      norm::EpiArgs a{};
      a.q = static_cast<uint8_t*>(q.data_ptr());
      a.scale = static_cast<const float*>(scale.data_ptr());
      return a;
    };
    run_fused<Quant::kStatic>(x, residual, weight, eps, peers, rank, kper, error, timeout_ns, half_bytes, outputs);
  }

  // fused_add_rmsnorm, and the normalised rows quantised as fused_add_rmsnorm_per_token_group_quant_fp8
  // quantises them (csrc/norm/norm_quant.cuh, the same device code): output_q [N, D]
  // float8_e4m3fn (contiguous) and output_s of every layout that op takes (float32 [N, D /
  // group_size] row- or column-major, TMA-padded too, or int32 packed UE8M0 exponents with
  // scale_ue8m0), group_size 64 or 128, quant_eps the scale's floor. x is left normalised.
  static void fused_add_rmsnorm_per_token_group_quant_fp8(
      tvm::ffi::TensorView output_q,
      tvm::ffi::TensorView output_s,
      tvm::ffi::TensorView x,
      tvm::ffi::TensorView residual,
      tvm::ffi::TensorView weight,
      int64_t group_size,
      double eps,
      double quant_eps,
      bool scale_ue8m0,
      tvm::ffi::TensorView peers,
      int64_t rank,
      int64_t kper,
      int64_t error,
      int64_t timeout_ns,
      int64_t half_bytes) {
    const auto outputs = [&](host::SymbolicSize& N, host::SymbolicSize& D, host::SymbolicDevice& device) {
      using namespace host;
      constexpr const char* kOp = "custom_all_reduce_fused_add_rmsnorm_per_token_group_quant_fp8";
      TensorMatcher({N, D}).with_device<kDLCUDA>(device).with_dtype<fp8_e4m3_t>().verify(output_q, "output_q");
      norm::EpiArgs a{};
      norm::group_scale_args<T>(kOp, "x", output_s, N, device, D.unwrap(), group_size, quant_eps, scale_ue8m0, a);
      a.q = static_cast<uint8_t*>(output_q.data_ptr());
      a.q_aligned = reinterpret_cast<uintptr_t>(a.q) % norm::kVecElems<T> == 0;
      a.normed_aligned = true;  // x, 16-byte aligned (checked before the launch)
      return a;
    };
    run_fused<Quant::kGroup>(x, residual, weight, eps, peers, rank, kper, error, timeout_ns, half_bytes, outputs);
  }

 private:
  // The fused forms' common checks and launch. `outputs(N, D, device)` checks the outputs of the
  // form once x, residual and weight have bound N, D and the device, and returns their EpiArgs.
  template <Quant kQuant, typename Outputs>
  static void run_fused(
      tvm::ffi::TensorView x,
      tvm::ffi::TensorView residual,
      tvm::ffi::TensorView weight,
      double eps,
      tvm::ffi::TensorView peers,
      int64_t rank,
      int64_t kper,
      int64_t error,
      int64_t timeout_ns,
      int64_t half_bytes,
      const Outputs& outputs) {
    using namespace host;
    auto N = SymbolicSize{"num_tokens"};
    auto D = SymbolicSize{"hidden_size"};
    auto device = SymbolicDevice{};
    TensorMatcher({N, D}).with_device<kDLCUDA>(device).with_dtype<T>().verify(x, "x").verify(residual, "residual");
    TensorMatcher({D}).with_device<kDLCUDA>(device).with_dtype<T>().verify(weight, "weight");
    const norm::EpiArgs a = outputs(N, D, device);
    norm::check_eps_and_dim(eps, D.unwrap(), "x");
    const Peers p = make_peers(peers, rank, error, timeout_ns, half_bytes);
    constexpr int64_t kN = norm::kVecElems<T>;
    const int64_t dim = D.unwrap(), rows = N.unwrap();
    const int64_t nvec = dim / kN;
    RuntimeCheck(dim % kN == 0, "custom_all_reduce: the hidden size must be a multiple of ", kN, ", got ", dim);
    RuntimeCheck(kper == 1 || kper == 2 || kper == 4, "custom_all_reduce: kper must be 1, 2 or 4, got ", kper);
    RuntimeCheck(nvec <= kper * kThreads, "custom_all_reduce: ", nvec, " vectors exceed kper * ", kThreads);
    const int64_t bytes = rows * dim * static_cast<int64_t>(sizeof(T));
    RuntimeCheck(bytes <= half_bytes, "custom_all_reduce: ", bytes, " bytes exceed the buffer's ", half_bytes);
    if (rows == 0 || has_no_data(x)) return;
    for (const void* ptr : {x.data_ptr(), residual.data_ptr(), weight.data_ptr()}) {
      RuntimeCheck(reinterpret_cast<uintptr_t>(ptr) % 16 == 0, "custom_all_reduce: tensors must be 16-byte aligned");
    }
    if constexpr (kQuant == Quant::kStatic) {
      RuntimeCheck(reinterpret_cast<uintptr_t>(a.q) % 16 == 0, "custom_all_reduce: out must be 16-byte aligned");
    }
    const DLDevice dev = device.unwrap();
    // The block size of the bounded row kernel (csrc/norm/common.cuh, launch_bounded).
    const auto threads = static_cast<uint32_t>(div_ceil(div_ceil(nvec, kper), int64_t{32}) * 32);
    const auto grid = static_cast<uint32_t>(std::min<int64_t>(rows, kMaxBlocks));
    auto* xp = static_cast<T*>(x.data_ptr());
    auto* rp = static_cast<T*>(residual.data_ptr());
    const auto* wp = static_cast<const T*>(weight.data_ptr());
    const auto e = static_cast<float>(eps);
    const auto launch = [&]<int kPer>() {
      LaunchKernel(grid, threads, dev)(fused_add_rmsnorm_kernel<T, kPer, kQuant>, p, xp, rp, wp, rows, dim, e, a);
    };
    if (kper == 1) {
      launch.template operator()<1>();
    } else if (kper == 2) {
      launch.template operator()<2>();
    } else {
      launch.template operator()<4>();
    }
  }
};

// CUDA IPC for the communicator's regions, allocated with cudaMalloc (outside torch's caching
// allocator, so that an IPC handle names exactly the region) on the given device.
struct OnDevice {
  explicit OnDevice(int64_t device) {
    host::RuntimeDeviceCheck(cudaGetDevice(&previous));
    if (previous != device) host::RuntimeDeviceCheck(cudaSetDevice(static_cast<int>(device)));
    changed = previous != device;
  }
  ~OnDevice() {
    if (changed) cudaSetDevice(previous);
  }
  int previous = 0;
  bool changed = false;
};

// A zeroed region of `bytes` on `device`; returns its address.
inline int64_t ipc_alloc(int64_t device, int64_t bytes) {
  using namespace host;
  RuntimeCheck(bytes > 0, "custom_all_reduce: region size must be > 0, got ", bytes);
  OnDevice on(device);
  void* ptr = nullptr;
  RuntimeDeviceCheck(cudaMalloc(&ptr, static_cast<size_t>(bytes)));
  RuntimeDeviceCheck(cudaMemset(ptr, 0, static_cast<size_t>(bytes)));
  RuntimeDeviceCheck(cudaDeviceSynchronize());
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(ptr));
}

inline void ipc_free(int64_t device, int64_t address) {
  OnDevice on(device);
  host::RuntimeDeviceCheck(cudaFree(reinterpret_cast<void*>(address)));
}

// Writes the IPC handle of the region at `address` into `handle` (CPU uint8 [64]).
inline void ipc_handle(int64_t device, int64_t address, tvm::ffi::TensorView handle) {
  using namespace host;
  TensorMatcher({static_cast<int64_t>(sizeof(cudaIpcMemHandle_t))})
      .with_dtype<uint8_t>()
      .with_device<kDLCPU>()
      .verify(handle, "handle");
  OnDevice on(device);
  cudaIpcMemHandle_t h{};
  RuntimeDeviceCheck(cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(address)));
  __builtin_memcpy(handle.data_ptr(), &h, sizeof(h));
}

// Maps another process's region (its handle, CPU uint8 [64]) on `device`; returns its address.
inline int64_t ipc_open(int64_t device, tvm::ffi::TensorView handle) {
  using namespace host;
  TensorMatcher({static_cast<int64_t>(sizeof(cudaIpcMemHandle_t))})
      .with_dtype<uint8_t>()
      .with_device<kDLCPU>()
      .verify(handle, "handle");
  OnDevice on(device);
  cudaIpcMemHandle_t h{};
  __builtin_memcpy(&h, handle.data_ptr(), sizeof(h));
  void* ptr = nullptr;
  RuntimeDeviceCheck(cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess));
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(ptr));
}

inline void ipc_close(int64_t device, int64_t address) {
  OnDevice on(device);
  host::RuntimeDeviceCheck(cudaIpcCloseMemHandle(reinterpret_cast<void*>(address)));
}

// cuMemGetAddressRange, looked up once through the runtime (no link to libcuda).
inline auto address_range_function() -> decltype(&::cuMemGetAddressRange) {
  static const auto fn = [] {
    void* address = nullptr;
    cudaDriverEntryPointQueryResult result{};
    decltype(&::cuMemGetAddressRange) found = nullptr;
    // Version 12000: the _v2 form (size_t sizes).
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &address, 12000, cudaEnableDefault, &result) ==
            cudaSuccess &&
        result == cudaDriverEntryPointSuccess) {
      found = reinterpret_cast<decltype(&::cuMemGetAddressRange)>(address);
    }
    cudaGetLastError();  // a missing symbol is not an error of the caller's next CUDA call
    return found;
  }();
  return fn;
}

// A captured input of the registered variant: [address, address + bytes) on `device`, a piece of
// a larger allocation when torch's caching allocator made it. Writes the IPC handle of that
// allocation (found from its base, cuMemGetAddressRange) into `handle` (CPU uint8 [64]) and
// returns the offset of `address` in it; returns -1, leaving no CUDA error behind, where the
// memory cannot be shared by cudaIpcGetMemHandle (e.g. the virtual-memory allocations of
// expandable segments, or memory of no allocation): the caller copies that call's input in.
inline int64_t ipc_input_handle(int64_t device, int64_t address, int64_t bytes, tvm::ffi::TensorView handle) {
  using namespace host;
  TensorMatcher({static_cast<int64_t>(sizeof(cudaIpcMemHandle_t))})
      .with_dtype<uint8_t>()
      .with_device<kDLCPU>()
      .verify(handle, "handle");
  RuntimeCheck(address > 0 && bytes > 0, "custom_all_reduce: bad input range ", address, " + ", bytes);
  OnDevice on(device);
  RuntimeDeviceCheck(cudaFree(nullptr));  // the device's primary context current for the driver call
  const auto range = address_range_function();
  if (range == nullptr) return -1;
  CUdeviceptr base = 0;
  size_t size = 0;
  if (range(&base, &size, static_cast<CUdeviceptr>(address)) != CUDA_SUCCESS) return -1;
  const auto offset = static_cast<int64_t>(static_cast<CUdeviceptr>(address) - base);
  if (offset < 0 || offset + bytes > static_cast<int64_t>(size)) return -1;
  cudaIpcMemHandle_t h{};
  if (cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  __builtin_memcpy(handle.data_ptr(), &h, sizeof(h));
  return offset;
}

// The signal region's size in bytes (Python allocates it).
inline int64_t signal_bytes() {
  return kSignalWords * static_cast<int64_t>(sizeof(uint32_t));
}

}  // namespace jit_kernel::allreduce
