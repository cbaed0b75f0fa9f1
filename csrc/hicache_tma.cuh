// hicache through the bulk-copy engine (cp.async.bulk, sm_90+): the same transfers as
// hicache.cuh, for rows that come in page-aligned runs.
//
//   for every i:  k_dst[indices_dst[i]] = k_src[indices_src[i]]   (and the same for v)
//
// Work is cut into chunks of kRows consecutive index positions (of K or V); kRows is the
// largest power of two whose rows fit a 32 KiB stage. Each block owns a ring of shared-memory
// stages. Warp 0 loads: for a chunk whose source rows are one contiguous run (a page, when the
// caller's page size is a multiple of kRows) one bulk copy brings the whole chunk; otherwise each
// row is its own bulk copy. Warps 1..kStoreWarps store: a chunk whose destination rows are one
// contiguous run leaves in one bulk copy, any other is written row by row with 16-byte stores.
// Either way the result is the same bytes as the register kernel's; the runs only decide how
// many copies the engine issues, so any index list is moved correctly.
//
// Exports (one config = (row bytes, rows per stage); int32 and int64 indices), with the register
// kernel's arguments:
//   run_one      (k_dst, v_dst, indices_dst, k_src, v_src, indices_src, block_quota)
//   run_one_mla  (dst, indices_dst, src, indices_src, block_quota)
// One layer only: the all-layer forms' pointer tables do not say whether the caches are on the
// GPU, and between two GPU caches the register kernel is the one taken (docs/design/hicache.md).
#pragma once

#include "hicache.cuh"

#include <sgl_kernel/mbarrier.cuh>
#include <sgl_kernel/runtime.cuh>
#include <sgl_kernel/utils.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace jit_kernel::hicache::tma {

inline constexpr uint32_t kMaxStageBytes = 32 * 1024;
inline constexpr uint32_t kMaxRows = 128;  // 4 index pairs per loader lane
inline constexpr uint32_t kStoreWarps = 4;
inline constexpr uint32_t kThreads = (1 + kStoreWarps) * device::kWarpThreads;
inline constexpr uint32_t kMaxStages = 32;
inline constexpr uint32_t kMaxPendingStores = 7;  // cp.async.bulk.wait_group.read takes 0..7
// The ring takes at most this much shared memory, whatever the device allows: six 32 KiB stages
// keep enough bytes in flight per SM, and leave room for an L1 share.
inline constexpr std::size_t kMaxRingBytes = 192 * 1024;

/// \brief Rows per stage for rows of `row_bytes`: the largest power of two up to kMaxRows whose
/// rows fit kMaxStageBytes; 0 when one row does not fit (those rows take the register kernel).
/// `hicache_tma_stage_rows` in python/jit_kernel/engine/families.py computes the same.
inline constexpr auto stage_rows(std::size_t row_bytes) -> uint32_t {
  if (row_bytes == 0 || row_bytes > kMaxStageBytes) return 0;
  uint32_t rows = 1;
  while (rows * 2 <= kMaxRows && rows * 2 * row_bytes <= kMaxStageBytes) rows *= 2;
  return rows;
}

/// \brief A transfer as the kernel sees it: base addresses and strides (bytes between rows) per
/// tensor (K then V).
struct Params {
  const void* src[2];
  void* dst[2];
  const void* indices_src;
  const void* indices_dst;
  int64_t length;
  int64_t src_stride[2];
  int64_t dst_stride[2];
  uint32_t num_stages;
};

/// \brief The shared-memory layout of one block: the stages (128-byte aligned), then per stage the
/// destination rows of its chunk and whether they are one run, then the barriers.
template <uint32_t kBytes, uint32_t kRows>
struct Ring {
  static constexpr uint32_t kStageBytes = (kRows * kBytes + 127) / 128 * 128;
  static constexpr std::size_t kPerStage =
      kStageBytes + kRows * sizeof(int64_t) + sizeof(uint32_t) + 2 * sizeof(uint64_t);

  static constexpr auto bytes(uint32_t stages) -> std::size_t {
    return std::size_t{stages} * (kStageBytes + kRows * sizeof(int64_t)) + 2 * std::size_t{stages} * sizeof(uint64_t) +
           std::size_t{stages} * sizeof(uint32_t);
  }

  uint8_t* base;
  uint32_t stages;

  SGL_DEVICE auto stage(uint32_t s) const -> uint8_t* {
    return base + std::size_t{s} * kStageBytes;
  }
  SGL_DEVICE auto dst_rows(uint32_t s) const -> int64_t* {
    return reinterpret_cast<int64_t*>(base + std::size_t{stages} * kStageBytes) + std::size_t{s} * kRows;
  }
  SGL_DEVICE auto full(uint32_t s) const -> uint64_t* {
    return reinterpret_cast<uint64_t*>(base + std::size_t{stages} * (kStageBytes + kRows * sizeof(int64_t))) + s;
  }
  SGL_DEVICE auto empty(uint32_t s) const -> uint64_t* {
    return full(0) + stages + s;
  }
  SGL_DEVICE auto dst_is_run(uint32_t s) const -> uint32_t* {
    return reinterpret_cast<uint32_t*>(full(0) + 2 * stages) + s;
  }
};

/// \brief Chunk `c` of a transfer: `kRows` index positions from `first` (`rows` of them in the last
/// chunk of a tensor), of tensor `which` (0: K, 1: V).
struct Chunk {
  int64_t first;
  uint32_t rows;
  uint32_t which;
};

template <uint32_t kRows>
SGL_DEVICE auto describe(int64_t c, int64_t chunks_per_tensor, const Params& p) -> Chunk {
  const int64_t first = (c % chunks_per_tensor) * kRows;
  const int64_t left = p.length - first;
  return {first, static_cast<uint32_t>(left < kRows ? left : kRows), static_cast<uint32_t>(c / chunks_per_tensor)};
}

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
/// \brief Waits until at most `n` (<= kMaxPendingStores) of this thread's bulk stores still read
/// shared memory: wait_group.read takes its count as an immediate.
SGL_DEVICE void wait_reads_at_most(uint32_t n) {
  switch (n) {
    case 0: ::device::ptx::bulk_wait_group_read<0>(); break;
    case 1: ::device::ptx::bulk_wait_group_read<1>(); break;
    case 2: ::device::ptx::bulk_wait_group_read<2>(); break;
    case 3: ::device::ptx::bulk_wait_group_read<3>(); break;
    case 4: ::device::ptx::bulk_wait_group_read<4>(); break;
    case 5: ::device::ptx::bulk_wait_group_read<5>(); break;
    case 6: ::device::ptx::bulk_wait_group_read<6>(); break;
    default: ::device::ptx::bulk_wait_group_read<7>(); break;
  }
}
#endif

template <typename Index, uint32_t kBytes, uint32_t kRows, bool kHasV>
__global__ __launch_bounds__(kThreads, 1) void transfer_kernel(const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using namespace device;
  static_assert(kBytes % 16 == 0 && kRows >= 1 && kRows <= kMaxRows && (kRows & (kRows - 1)) == 0);
  static_assert(kRows * kBytes <= kMaxStageBytes);
  constexpr uint32_t kPerLane = (kRows + kWarpThreads - 1) / kWarpThreads;
  constexpr uint32_t kUnits = kBytes / 16;  // 16-byte units per row

  extern __shared__ __align__(128) uint8_t smem[];
  const Ring<kBytes, kRows> ring{smem, p.num_stages};
  const uint32_t warp = threadIdx.x / kWarpThreads;
  const uint32_t lane = threadIdx.x % kWarpThreads;

  if (threadIdx.x == 0) {
    for (uint32_t s = 0; s < ring.stages; ++s) {
      ptx::mbar_init(ring.full(s), kWarpThreads);                 // every loader lane publishes its rows
      ptx::mbar_init(ring.empty(s), kStoreWarps * kWarpThreads);  // every storer thread releases
    }
    ptx::fence_mbarrier_init();
  }
  __syncthreads();
  PDLWaitPrimary();  // the indices and caches may come from the previous kernel
  PDLTriggerSecondary();

  const int64_t chunks_per_tensor = div_ceil(p.length, static_cast<int64_t>(kRows));
  const int64_t num_chunks = chunks_per_tensor * (kHasV ? 2 : 1);
  const auto* indices_src = static_cast<const Index*>(p.indices_src);
  const auto* indices_dst = static_cast<const Index*>(p.indices_dst);

  if (warp == 0) {
    // ---- loader: each lane holds the index pairs of rows lane, lane + 32, ... of the chunk
    // The next chunk's indices are loaded before this chunk waits for its stage, so that their
    // latency overlaps the wait instead of adding to every chunk.
    const auto load_indices = [&](int64_t c, Chunk& chunk, int64_t (&src)[kPerLane], int64_t (&dst)[kPerLane]) {
      if (c >= num_chunks) return;
      chunk = describe<kRows>(c, chunks_per_tensor, p);
#pragma unroll
      for (uint32_t j = 0; j < kPerLane; ++j) {
        const uint32_t r = lane + j * kWarpThreads;
        src[j] = r < chunk.rows ? static_cast<int64_t>(__ldg(indices_src + chunk.first + r)) : 0;
        dst[j] = r < chunk.rows ? static_cast<int64_t>(__ldg(indices_dst + chunk.first + r)) : 0;
      }
    };
    Chunk next{};
    int64_t next_src[kPerLane];
    int64_t next_dst[kPerLane];
    load_indices(blockIdx.x, next, next_src, next_dst);
    uint32_t it = 0;
    for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x, ++it) {
      const Chunk chunk = next;
      int64_t src[kPerLane];
      int64_t dst[kPerLane];
#pragma unroll
      for (uint32_t j = 0; j < kPerLane; ++j) {
        src[j] = next_src[j];
        dst[j] = next_dst[j];
      }
      load_indices(c + gridDim.x, next, next_src, next_dst);
      // A run: row r of the chunk is row first + r, on that side.
      const int64_t src0 = __shfl_sync(kFullMask, src[0], 0);
      const int64_t dst0 = __shfl_sync(kFullMask, dst[0], 0);
      bool src_run = true, dst_run = true;
#pragma unroll
      for (uint32_t j = 0; j < kPerLane; ++j) {
        const uint32_t r = lane + j * kWarpThreads;
        src_run &= r >= chunk.rows || src[j] == src0 + r;
        dst_run &= r >= chunk.rows || dst[j] == dst0 + r;
      }
      const bool src_whole = __all_sync(kFullMask, src_run) && p.src_stride[chunk.which] == kBytes;
      const bool dst_whole = __all_sync(kFullMask, dst_run) && p.dst_stride[chunk.which] == kBytes;

      const uint32_t s = it % ring.stages;
      ptx::mbar_wait_parity(ring.empty(s), ((it / ring.stages) & 1) ^ 1);  // a fresh stage passes at once
      int64_t* const rows = ring.dst_rows(s);
#pragma unroll
      for (uint32_t j = 0; j < kPerLane; ++j) {
        const uint32_t r = lane + j * kWarpThreads;
        if (r < chunk.rows) rows[r] = dst[j];
      }
      if (lane == 0) *ring.dst_is_run(s) = dst_whole;
      // Each lane's arrival releases its own writes above; lane 0's also counts the bytes to come.
      if (lane == 0) {
        ptx::mbar_arrive_expect_tx(ring.full(s), chunk.rows * kBytes);
      } else {
        ptx::mbar_arrive(ring.full(s));
      }
      __syncwarp();  // the expected bytes are counted before any copy can complete

      const auto* const base = static_cast<const uint8_t*>(p.src[chunk.which]);
      const int64_t stride = p.src_stride[chunk.which];
      uint8_t* const stage = ring.stage(s);
      if (src_whole) {
        if (lane == 0) ptx::bulk_g2s(stage, base + src0 * stride, chunk.rows * kBytes, ring.full(s));
      } else {
#pragma unroll
        for (uint32_t j = 0; j < kPerLane; ++j) {
          const uint32_t r = lane + j * kWarpThreads;
          if (r < chunk.rows) ptx::bulk_g2s(stage + r * kBytes, base + src[j] * stride, kBytes, ring.full(s));
        }
      }
    }
  } else {
    // ---- storers
    constexpr uint32_t kStoreThreads = kStoreWarps * kWarpThreads;
    constexpr uint32_t kUnroll = 4;
    const uint32_t tid = threadIdx.x - kWarpThreads;
    // Thread 0 only: its bulk stores whose stages are not yet released, the chunks of iterations
    // oldest .. oldest + pending - 1. Up to half the ring stays with stores in flight, the rest
    // with loads.
    const uint32_t max_pending = ring.stages / 2 < kMaxPendingStores ? ring.stages / 2 : kMaxPendingStores;
    uint32_t pending = 0;
    uint32_t oldest = 0;
    uint32_t it = 0;
    for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x, ++it) {
      const Chunk chunk = describe<kRows>(c, chunks_per_tensor, p);
      const uint32_t s = it % ring.stages;
      ptx::mbar_wait_parity(ring.full(s), (it / ring.stages) & 1);
      auto* const base = static_cast<uint8_t*>(p.dst[chunk.which]);
      const int64_t stride = p.dst_stride[chunk.which];
      const int64_t* const rows = ring.dst_rows(s);
      const uint8_t* const stage = ring.stage(s);

      // Each storer thread releases the stage itself, after its own last read of it.
      const bool dst_is_run = *ring.dst_is_run(s) != 0;

      if (dst_is_run) {
        // One bulk store. Thread 0 releases the stage once the engine has read it, a few chunks
        // later, so that several stores are in flight; the other threads have nothing to do and
        // release it now.
        if (tid == 0) {
          ptx::bulk_s2g(base + rows[0] * stride, stage, chunk.rows * kBytes);
          ptx::bulk_commit_group();
          if (pending++ == 0) oldest = it;
          if (pending > max_pending) {
            wait_reads_at_most(max_pending);
            ptx::mbar_arrive(ring.empty(oldest++ % ring.stages));
            --pending;
          }
        } else {
          ptx::mbar_arrive(ring.empty(s));
        }
        continue;
      }
      if (tid == 0 && pending > 0) {
        ptx::bulk_wait_group_read<0>();
        for (; pending > 0; --pending) ptx::mbar_arrive(ring.empty(oldest++ % ring.stages));
      }
      // Row by row: unit u of the chunk is 16-byte unit u % kUnits of row u / kUnits.
      const uint32_t units = chunk.rows * kUnits;
      const auto* from = reinterpret_cast<const uint4*>(stage);
      uint32_t u = tid;
      for (; u + (kUnroll - 1) * kStoreThreads < units; u += kUnroll * kStoreThreads) {
        uint4 v[kUnroll];
#pragma unroll
        for (uint32_t k = 0; k < kUnroll; ++k) v[k] = from[u + k * kStoreThreads];
#pragma unroll
        for (uint32_t k = 0; k < kUnroll; ++k) {
          const uint32_t unit = u + k * kStoreThreads;
          auto* to = reinterpret_cast<uint4*>(base + rows[unit / kUnits] * stride) + unit % kUnits;
          warp::details::store_cs(to, v[k]);
        }
      }
      for (; u < units; u += kStoreThreads) {
        auto* to = reinterpret_cast<uint4*>(base + rows[u / kUnits] * stride) + u % kUnits;
        warp::details::store_cs(to, from[u]);
      }
      ptx::mbar_arrive(ring.empty(s));
    }
    // The CTA's shared memory must outlive the engine's reads of it; the global writes need no
    // wait: the grid's completion makes them visible to whatever runs after it.
    if (tid == 0) ptx::bulk_wait_group_read<0>();
  }
#else
  (void)p;
  __trap();  // not reached: the launcher refuses GPUs older than sm_90
#endif
}

/// \brief Whether the device runs bulk copies (sm_90+, as clusters); cached per device.
inline auto has_bulk_copy(int device_id) -> bool {
  return host::runtime::has_clusters(device_id);
}

/// \brief Stages of the ring on this device: as many as fit its shared memory, at most kMaxStages
/// and kMaxRingBytes. Refuses a device that has no bulk copies or no room for two stages.
template <uint32_t kBytes, uint32_t kRows>
inline auto ring_stages(int device_id) -> uint32_t {
  using namespace host;
  using R = Ring<kBytes, kRows>;
  RuntimeCheck(
      has_bulk_copy(device_id),
      "hicache: the bulk-copy (TMA) kernel needs an sm_90+ GPU; cuda:",
      device_id,
      " is older (pass page_size=None to use the register kernel)");
  const auto by_ring = static_cast<uint32_t>(kMaxRingBytes / R::kStageBytes);
  const auto by_device = static_cast<uint32_t>(runtime::get_max_smem_per_block(device_id) / R::kPerStage);
  const auto stages = std::min({kMaxStages, by_ring, by_device});
  RuntimeCheck(stages >= 2, "hicache: cuda:", device_id, " has too little shared memory for the bulk-copy ring");
  return stages;
}

template <typename Index, uint32_t kBytes, uint32_t kRows, bool kHasV>
inline void launch(Params p, int64_t block_quota, DLDevice device) {
  using namespace host;
  p.num_stages = ring_stages<kBytes, kRows>(device.device_id);
  const int64_t chunks = div_ceil(p.length, static_cast<int64_t>(kRows)) * (kHasV ? 2 : 1);
  const auto blocks = static_cast<uint32_t>(std::clamp<int64_t>(chunks, 1, std::min<int64_t>(block_quota, 1 << 30)));
  const auto smem = Ring<kBytes, kRows>::bytes(p.num_stages);
  constexpr auto kernel = transfer_kernel<Index, kBytes, kRows, kHasV>;
  LaunchKernel(blocks, kThreads, device, smem).enable_pdl(runtime::supports_pdl(device.device_id))(kernel, p);
}

}  // namespace jit_kernel::hicache::tma

namespace jit_kernel::hicache {

/// \brief The bulk-copy transfers for rows of kBytes, kRows rows per stage (`tma::stage_rows`).
template <std::size_t kBytes, std::size_t kRows>
struct HiCacheTma {
  static_assert(kBytes > 0 && kBytes % kVecBytes == 0, "hicache: element size must be a positive multiple of 16");
  static_assert(
      kRows >= 1 && kRows <= tma::stage_rows(kBytes) && (kRows & (kRows - 1)) == 0,
      "hicache: stage_rows must be a power of two up to tma::stage_rows(element_size)");
  static constexpr auto kB = static_cast<uint32_t>(kBytes);
  static constexpr auto kR = static_cast<uint32_t>(kRows);

  template <bool kHasV>
  static void launch_one(const TransferTensors& call, int64_t block_quota) {
    const auto launch = [&](const OneLayerParams& r, const Indices& idx) {
      auto p = tma::Params{};
      p.src[0] = r.k_src;
      p.src[1] = r.v_src;
      p.dst[0] = r.k_dst;
      p.dst[1] = r.v_dst;
      p.src_stride[0] = r.k_src_stride;
      p.src_stride[1] = r.v_src_stride;
      p.dst_stride[0] = r.k_dst_stride;
      p.dst_stride[1] = r.v_dst_stride;
      p.indices_src = r.indices_src;
      p.indices_dst = r.indices_dst;
      p.length = r.length;
      if (idx.is_int32) {
        tma::launch<int32_t, kB, kR, kHasV>(p, block_quota, idx.device);
      } else {
        tma::launch<int64_t, kB, kR, kHasV>(p, block_quota, idx.device);
      }
    };
    transfer_one_layer<kHasV>(call, kBytes, block_quota, launch);
  }

  static void run_one(
      tvm::ffi::TensorView k_cache_dst,
      tvm::ffi::TensorView v_cache_dst,
      tvm::ffi::TensorView indices_dst,
      tvm::ffi::TensorView k_cache_src,
      tvm::ffi::TensorView v_cache_src,
      tvm::ffi::TensorView indices_src,
      int64_t block_quota) {
    launch_one<true>({k_cache_dst, &v_cache_dst, indices_dst, k_cache_src, &v_cache_src, indices_src}, block_quota);
  }

  static void run_one_mla(
      tvm::ffi::TensorView cache_dst,
      tvm::ffi::TensorView indices_dst,
      tvm::ffi::TensorView cache_src,
      tvm::ffi::TensorView indices_src,
      int64_t block_quota) {
    launch_one<false>({cache_dst, nullptr, indices_dst, cache_src, nullptr, indices_src}, block_quota);
  }
};

}  // namespace jit_kernel::hicache
