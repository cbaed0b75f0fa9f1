// hicache: gather/scatter of KV-cache rows between GPU memory and (pinned) host memory.
//
//   for every i:  k_dst[indices_dst[i]] = k_src[indices_src[i]]   (and the same for v)
//
// One row is one token's slice of one layer, kElementSize bytes. A group of 32 / kUnroll lanes
// moves one row with 16-byte streaming (`.cs`) loads and stores: all loads of a row (of K and
// V, when they fit in registers) are issued before its first store, so that a group keeps
// kElementSize bytes per tensor in flight, which is what hides the PCIe latency of host memory.
// The grid is capped by a run-time block quota so that a background copy leaves the SMs to the
// model's compute. Row sizes that are a multiple of 16 bytes all work; when the row splits
// evenly over the group's lanes (every multiple of 128 bytes with the default unroll) no lane
// is ever predicated off.
//
// Exports (one config = one translation unit = every export below, int32 and int64 indices):
//   run_one      (k_dst, v_dst, indices_dst, k_src, v_src, indices_src, block_quota)
//   run_one_mla  (dst, indices_dst, src, indices_src, block_quota)
//   run_all      (k_ptr_dst, v_ptr_dst, indices_dst, k_ptr_src, v_ptr_src, indices_src,
//                 src_stride_bytes, dst_stride_bytes, block_quota)
//   run_all_mla  (ptr_dst, indices_dst, ptr_src, indices_src, src_stride_bytes, dst_stride_bytes,
//                 block_quota)
#pragma once

#include <sgl_kernel/runtime.cuh>
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>
#include <sgl_kernel/warp.cuh>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>
#include <string_view>
#include <utility>

namespace jit_kernel::hicache {

inline constexpr std::size_t kVecBytes = 16;

/// \brief One row of kBytes moved by kLanes lanes, 16 bytes per lane per round. Lane `l` owns
/// 16-byte units l, l + kLanes, ...; every round is one contiguous kLanes * 16-byte access.
template <std::size_t kBytes, std::size_t kLanes>
struct Row {
  static_assert(kBytes % kVecBytes == 0, "hicache: the element size must be a multiple of 16 bytes");
  static constexpr std::size_t kUnits = kBytes / kVecBytes;
  static constexpr std::size_t kRounds = (kUnits + kLanes - 1) / kLanes;
  static constexpr bool kExact = kUnits % kLanes == 0;  // no lane is predicated off
  using Vec = device::device_vec<uint4, kRounds>;

  SGL_DEVICE static auto load(const void* src, uint32_t lane) -> Vec {
    const auto units = static_cast<const uint4*>(src);
    Vec vec;
#pragma unroll
    for (std::size_t r = 0; r < kRounds; ++r) {
      const auto u = r * kLanes + lane;
      if (kExact || u < kUnits) vec.data[r] = device::warp::details::load_cs(units + u);
    }
    return vec;
  }

  SGL_DEVICE static void store(void* dst, const Vec& vec, uint32_t lane) {
    const auto units = static_cast<uint4*>(dst);
#pragma unroll
    for (std::size_t r = 0; r < kRounds; ++r) {
      const auto u = r * kLanes + lane;
      if (kExact || u < kUnits) device::warp::details::store_cs(units + u, vec.data[r]);
    }
  }
};

/// \brief Per-thread register budget for payload: half of what __launch_bounds__(kThreads, 1)
/// leaves (the rest holds addresses and indices). K and V are loaded together when both fit.
template <std::size_t kThreads>
inline constexpr std::size_t kPayloadRegs = 65536 / kThreads / 2;

template <std::size_t kBytes, std::size_t kLanes, std::size_t kThreads, bool kHasV>
SGL_DEVICE void copy_row(void* k_dst, const void* k_src, void* v_dst, const void* v_src, uint32_t lane) {
  using R = Row<kBytes, kLanes>;
  if constexpr (kHasV && 2 * R::kRounds * 4 <= kPayloadRegs<kThreads>) {
    const auto k = R::load(k_src, lane);
    const auto v = R::load(v_src, lane);
    R::store(k_dst, k, lane);
    R::store(v_dst, v, lane);
  } else {
    R::store(k_dst, R::load(k_src, lane), lane);
    if constexpr (kHasV) R::store(v_dst, R::load(v_src, lane), lane);
  }
}

struct OneLayerParams {
  void* k_dst;
  void* v_dst;
  const void* k_src;
  const void* v_src;
  const void* indices_dst;
  const void* indices_src;
  int64_t length;
  int64_t k_dst_stride;  // bytes between rows
  int64_t v_dst_stride;
  int64_t k_src_stride;
  int64_t v_src_stride;
};

struct AllLayerParams {
  const uint64_t* k_dst;  // [num_layers] base addresses
  const uint64_t* v_dst;
  const uint64_t* k_src;
  const uint64_t* v_src;
  const void* indices_dst;
  const void* indices_src;
  int64_t length;
  int64_t num_layers;
  int64_t dst_stride;  // bytes between rows, the same for every layer
  int64_t src_stride;
};

template <typename Index>
SGL_DEVICE auto load_index(const void* indices, int64_t i) -> int64_t {
  return static_cast<int64_t>(__ldg(static_cast<const Index*>(indices) + i));
}

template <typename Index, std::size_t kBytes, std::size_t kUnroll, std::size_t kThreads, bool kHasV>
__global__ __launch_bounds__(kThreads, 1) void one_layer_kernel(const __grid_constant__ OneLayerParams p) {
  constexpr uint32_t kLanes = device::kWarpThreads / kUnroll;
  const uint32_t groups_per_block = blockDim.x / kLanes;  // kThreads, or fewer for a short transfer
  const uint32_t lane = threadIdx.x % kLanes;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * groups_per_block;
  // Launched with programmatic dependent launch where the device has it (sm_90+): wait for the
  // previous kernel before the first memory access, so the launch overlaps its tail (see
  // docs/benchmarks.md).
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * groups_per_block + threadIdx.x / kLanes; i < p.length;
       i += stride) {
    const auto s = load_index<Index>(p.indices_src, i);
    const auto d = load_index<Index>(p.indices_dst, i);
    using host::pointer::offset;
    copy_row<kBytes, kLanes, kThreads, kHasV>(
        offset(p.k_dst, d * p.k_dst_stride),
        offset(p.k_src, s * p.k_src_stride),
        kHasV ? offset(p.v_dst, d * p.v_dst_stride) : nullptr,
        kHasV ? offset(p.v_src, s * p.v_src_stride) : nullptr,
        lane);
  }
}

// Work item w = layer * length + i: every (layer, row) pair is one unit of work, so a short
// index list still spreads over the whole grid.
template <typename Index, std::size_t kBytes, std::size_t kUnroll, std::size_t kThreads, bool kHasV>
__global__ __launch_bounds__(kThreads, 1) void all_layer_kernel(const __grid_constant__ AllLayerParams p) {
  constexpr uint32_t kLanes = device::kWarpThreads / kUnroll;
  const uint32_t groups_per_block = blockDim.x / kLanes;  // kThreads, or fewer for a short transfer
  const uint32_t lane = threadIdx.x % kLanes;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * groups_per_block;
  const int64_t total = p.length * p.num_layers;
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  for (int64_t w = static_cast<int64_t>(blockIdx.x) * groups_per_block + threadIdx.x / kLanes; w < total; w += stride) {
    const int64_t layer = w / p.length;
    const int64_t i = w - layer * p.length;
    const auto s = load_index<Index>(p.indices_src, i);
    const auto d = load_index<Index>(p.indices_dst, i);
    const auto so = s * p.src_stride;
    const auto dof = d * p.dst_stride;
    auto* k_dst = reinterpret_cast<char*>(__ldg(reinterpret_cast<const unsigned long long*>(p.k_dst) + layer)) + dof;
    auto* k_src =
        reinterpret_cast<const char*>(__ldg(reinterpret_cast<const unsigned long long*>(p.k_src) + layer)) + so;
    char* v_dst = nullptr;
    const char* v_src = nullptr;
    if constexpr (kHasV) {
      v_dst = reinterpret_cast<char*>(__ldg(reinterpret_cast<const unsigned long long*>(p.v_dst) + layer)) + dof;
      v_src = reinterpret_cast<const char*>(__ldg(reinterpret_cast<const unsigned long long*>(p.v_src) + layer)) + so;
    }
    copy_row<kBytes, kLanes, kThreads, kHasV>(k_dst, k_src, v_dst, v_src, lane);
  }
}

/// \brief A CUDA cache must be on the indices' GPU (host caches are checked by device_address).
inline void check_same_gpu(const tvm::ffi::TensorView& t, std::string_view name, DLDevice gpu) {
  using namespace host;
  const auto where = t.device();
  RuntimeCheck(
      where.device_type != kDLCUDA || where.device_id == gpu.device_id,
      "hicache: '",
      name,
      "' is on cuda:",
      where.device_id,
      " but the indices are on cuda:",
      gpu.device_id);
}

/// \brief A cache tensor's address as the GPU sees it (`runtime::get_device_accessible_ptr`): CUDA
/// memory on the indices' GPU as is, page-locked host memory through its device alias. Pageable
/// memory would fault the GPU, so it is refused with an error that names the argument.
inline auto device_address(const tvm::ffi::TensorView& t, std::string_view name, DLDevice gpu) -> void* {
  check_same_gpu(t, name, gpu);
  return host::runtime::get_device_accessible_ptr(t, name);
}

inline void check_aligned(const void* ptr, int64_t stride_bytes, std::string_view name) {
  using namespace host;
  RuntimeCheck(
      reinterpret_cast<uintptr_t>(ptr) % kVecBytes == 0,
      "hicache: '",
      name,
      "' must start at a 16-byte aligned address");
  RuntimeCheck(
      stride_bytes % static_cast<int64_t>(kVecBytes) == 0,
      "hicache: the row stride of '",
      name,
      "' must be a multiple of 16 bytes, got ",
      stride_bytes);
}

/// \brief The two index tensors of a transfer, validated: (length, is_int32, device).
struct Indices {
  int64_t length;
  bool is_int32;
  DLDevice device;
};

inline auto check_indices(const tvm::ffi::TensorView& dst, const tvm::ffi::TensorView& src) -> Indices {
  using namespace host;
  auto length = SymbolicSize{"num_indices"};
  auto dtype = SymbolicDType{};
  auto device = SymbolicDevice{};
  TensorMatcher({length})  //
      .with_dtype<int32_t, int64_t>(dtype)
      .with_device<kDLCUDA>(device)
      .verify(dst, "indices_dst")
      .verify(src, "indices_src");
  return {length.unwrap(), dtype.is_type<int32_t>(), device.unwrap()};
}

/// \brief Binds the row size of a cache (viewed as [rows, dim]) and checks it is `row_bytes`.
inline void check_cache_pair(
    const tvm::ffi::TensorView& k,
    const tvm::ffi::TensorView* v,
    std::string_view k_name,
    std::string_view v_name,
    host::SymbolicDType& dtype,
    std::size_t row_bytes) {
  using namespace host;
  auto dim = SymbolicSize{"element_dim"};
  if (v == nullptr) {
    TensorMatcher({-1, dim})  //
        .with_strides({-1, 1})
        .with_dtype(dtype)
        .with_device<kDLCUDA, kDLCUDAHost, kDLCPU>()
        .verify(k, k_name);
  } else {
    TensorMatcher({-1, dim})  //
        .with_strides({-1, 1})
        .with_dtype(dtype)
        .with_device<kDLCUDA, kDLCUDAHost, kDLCPU>()
        .verify(k, k_name)
        .verify(*v, v_name);
  }
  const auto bytes = static_cast<int64_t>(dim.unwrap() * dtype_bytes(dtype.unwrap()));
  RuntimeCheck(
      bytes == static_cast<int64_t>(row_bytes),
      "hicache: rows of '",
      k_name,
      "' are ",
      bytes,
      " bytes but this kernel was built for ",
      row_bytes);
}

/// \brief The tensors of a transfer: the caches of one layer, or the per-layer tables of their base
/// addresses (all-layer calls); v_dst and v_src are nullptr for the single cache of MLA.
struct TransferTensors {
  const tvm::ffi::TensorView& k_dst;
  const tvm::ffi::TensorView* v_dst;
  const tvm::ffi::TensorView& indices_dst;
  const tvm::ffi::TensorView& k_src;
  const tvm::ffi::TensorView* v_src;
  const tvm::ffi::TensorView& indices_src;
};

/// \brief Checks the caches of a one-layer call (rows of `row_bytes`, on the indices' GPU or in host
/// memory) and returns its indices. Touches no data: a fake call (torch.compile) runs it too.
template <bool kHasV>
inline auto check_one_layer(const TransferTensors& c, std::size_t row_bytes) -> Indices {
  const auto& [k_dst, v_dst, indices_dst, k_src, v_src, indices_src] = c;
  const auto idx = check_indices(indices_dst, indices_src);
  auto dtype = host::SymbolicDType{};
  check_cache_pair(k_dst, v_dst, kHasV ? "k_cache_dst" : "cache_dst", "v_cache_dst", dtype, row_bytes);
  check_cache_pair(k_src, v_src, kHasV ? "k_cache_src" : "cache_src", "v_cache_src", dtype, row_bytes);
  check_same_gpu(k_dst, kHasV ? "k_cache_dst" : "cache_dst", idx.device);
  check_same_gpu(k_src, kHasV ? "k_cache_src" : "cache_src", idx.device);
  if constexpr (kHasV) {
    check_same_gpu(*v_dst, "v_cache_dst", idx.device);
    check_same_gpu(*v_src, "v_cache_src", idx.device);
  }
  return idx;
}

/// \brief The kernel's view of a checked one-layer call: device addresses (host caches through their
/// device alias) and byte strides, each checked for 16-byte alignment.
template <bool kHasV>
inline auto resolve_one_layer(const TransferTensors& c, const Indices& idx) -> OneLayerParams {
  const auto& [k_dst, v_dst, indices_dst, k_src, v_src, indices_src] = c;
  auto p = OneLayerParams{};
  p.length = idx.length;
  p.indices_dst = indices_dst.data_ptr();
  p.indices_src = indices_src.data_ptr();
  const auto elem = static_cast<int64_t>(host::dtype_bytes(k_dst.dtype()));
  p.k_dst = device_address(k_dst, kHasV ? "k_cache_dst" : "cache_dst", idx.device);
  p.k_src = device_address(k_src, kHasV ? "k_cache_src" : "cache_src", idx.device);
  p.k_dst_stride = k_dst.stride(0) * elem;
  p.k_src_stride = k_src.stride(0) * elem;
  check_aligned(p.k_dst, p.k_dst_stride, kHasV ? "k_cache_dst" : "cache_dst");
  check_aligned(p.k_src, p.k_src_stride, kHasV ? "k_cache_src" : "cache_src");
  if constexpr (kHasV) {
    p.v_dst = device_address(*v_dst, "v_cache_dst", idx.device);
    p.v_src = device_address(*v_src, "v_cache_src", idx.device);
    p.v_dst_stride = v_dst->stride(0) * elem;
    p.v_src_stride = v_src->stride(0) * elem;
    check_aligned(p.v_dst, p.v_dst_stride, "v_cache_dst");
    check_aligned(p.v_src, p.v_src_stride, "v_cache_src");
  }
  return p;
}

/// \brief Checks the pointer tables and strides of an all-layer call; returns its indices and
/// the number of layers.
template <bool kHasV>
inline auto check_all_layer(
    const TransferTensors& tables, int64_t src_stride_bytes, int64_t dst_stride_bytes, std::size_t row_bytes)
    -> std::pair<Indices, int64_t> {
  using namespace host;
  const auto& [k_ptr_dst, v_ptr_dst, indices_dst, k_ptr_src, v_ptr_src, indices_src] = tables;
  const auto idx = check_indices(indices_dst, indices_src);
  auto layers = SymbolicSize{"num_layers"};
  auto device = SymbolicDevice{};
  device.set_value(idx.device);
  if constexpr (kHasV) {
    TensorMatcher({layers})  //
        .with_dtype<uint64_t>()
        .with_device<kDLCUDA>(device)
        .verify(k_ptr_dst, "k_ptr_dst")
        .verify(*v_ptr_dst, "v_ptr_dst")
        .verify(k_ptr_src, "k_ptr_src")
        .verify(*v_ptr_src, "v_ptr_src");
  } else {
    TensorMatcher({layers})  //
        .with_dtype<uint64_t>()
        .with_device<kDLCUDA>(device)
        .verify(k_ptr_dst, "ptr_dst")
        .verify(k_ptr_src, "ptr_src");
  }
  const auto bytes = static_cast<int64_t>(row_bytes);
  RuntimeCheck(
      src_stride_bytes >= bytes && src_stride_bytes % static_cast<int64_t>(kVecBytes) == 0,
      "hicache: kv_cache_src_stride_bytes must be a multiple of 16 and >= the element size ",
      row_bytes,
      ", got ",
      src_stride_bytes);
  RuntimeCheck(
      dst_stride_bytes >= bytes && dst_stride_bytes % static_cast<int64_t>(kVecBytes) == 0,
      "hicache: kv_cache_dst_stride_bytes must be a multiple of 16 and >= the element size ",
      row_bytes,
      ", got ",
      dst_stride_bytes);
  return {idx, layers.unwrap()};
}

inline void check_block_quota(int64_t block_quota) {
  host::RuntimeCheck(block_quota >= 1, "hicache: block_quota must be >= 1, got ", block_quota);
}

/// \brief A one-layer transfer of rows of `row_bytes`, the part every one-layer kernel shares: checks
/// the call and the block quota, stops for an empty transfer or a fake call (torch.compile: checks
/// alone, no CUDA call), then hands the kernel's view of the call to `launch(params, indices)`.
template <bool kHasV, typename Launch>
inline void transfer_one_layer(
    const TransferTensors& call, std::size_t row_bytes, int64_t block_quota, Launch&& launch) {
  const auto idx = check_one_layer<kHasV>(call, row_bytes);
  check_block_quota(block_quota);
  if (idx.length == 0 || host::has_no_data(call.indices_dst)) return;
  launch(resolve_one_layer<kHasV>(call, idx), idx);
}

template <std::size_t kBytes, std::size_t kUnroll, std::size_t kThreads>
struct HiCache {
  static_assert(kBytes > 0 && kBytes % kVecBytes == 0, "hicache: element size must be a positive multiple of 16");
  static_assert(kUnroll >= 1 && kUnroll <= 32 && (32 % kUnroll) == 0, "hicache: unroll must divide 32");
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "hicache: num_threads must be a multiple of 32, <= 1024");

  static constexpr std::size_t kLanes = device::kWarpThreads / kUnroll;
  static constexpr std::size_t kGroupsPerBlock = kThreads / kLanes;

  /// \brief The launch of `work` rows: blocks of kThreads, at most `block_quota` of them. A
  /// transfer that would fill fewer blocks than the quota allows is spread over up to `block_quota`
  /// smaller blocks instead: one SM's bandwidth to L2 bounds what a single block moves (see
  /// docs/design/hicache.md).
  struct Shape {
    uint32_t blocks;
    uint32_t threads;
  };
  static auto launch_shape(int64_t work, int64_t block_quota) -> Shape {
    using namespace host;
    const auto groups = static_cast<int64_t>(kGroupsPerBlock);
    if (div_ceil(work, groups) >= block_quota) {
      return {static_cast<uint32_t>(std::min<int64_t>(block_quota, int64_t{1} << 30)), kThreads};
    }
    const auto blocks = std::clamp<int64_t>(work, 1, block_quota);
    const auto lanes = div_ceil(work, blocks) * static_cast<int64_t>(kLanes);
    return {static_cast<uint32_t>(blocks), static_cast<uint32_t>(div_ceil(lanes, int64_t{32}) * 32)};
  }

  template <bool kHasV>
  static void launch_one(const TransferTensors& call, int64_t block_quota) {
    const auto launch = [&](const OneLayerParams& p, const Indices& idx) {
      using namespace host;
      const auto shape = launch_shape(idx.length, block_quota);
      const auto kernel = idx.is_int32 ? one_layer_kernel<int32_t, kBytes, kUnroll, kThreads, kHasV>
                                       : one_layer_kernel<int64_t, kBytes, kUnroll, kThreads, kHasV>;
      LaunchKernel(shape.blocks, shape.threads, idx.device)
          .enable_pdl(runtime::supports_pdl(idx.device.device_id))(kernel, p);
    };
    transfer_one_layer<kHasV>(call, kBytes, block_quota, launch);
  }

  template <bool kHasV>
  static void launch_all(
      const TransferTensors& tables, int64_t src_stride_bytes, int64_t dst_stride_bytes, int64_t block_quota) {
    using namespace host;
    const auto [idx, num_layers] = check_all_layer<kHasV>(tables, src_stride_bytes, dst_stride_bytes, kBytes);
    const auto& [k_ptr_dst, v_ptr_dst, indices_dst, k_ptr_src, v_ptr_src, indices_src] = tables;
    check_block_quota(block_quota);
    const auto shape = launch_shape(idx.length * num_layers, block_quota);
    if (idx.length == 0 || num_layers == 0 || has_no_data(indices_dst)) return;

    auto p = AllLayerParams{};
    p.k_dst = static_cast<const uint64_t*>(k_ptr_dst.data_ptr());
    p.k_src = static_cast<const uint64_t*>(k_ptr_src.data_ptr());
    if constexpr (kHasV) {
      p.v_dst = static_cast<const uint64_t*>(v_ptr_dst->data_ptr());
      p.v_src = static_cast<const uint64_t*>(v_ptr_src->data_ptr());
    }
    p.indices_dst = indices_dst.data_ptr();
    p.indices_src = indices_src.data_ptr();
    p.length = idx.length;
    p.num_layers = num_layers;
    p.dst_stride = dst_stride_bytes;
    p.src_stride = src_stride_bytes;
    const auto kernel = idx.is_int32 ? all_layer_kernel<int32_t, kBytes, kUnroll, kThreads, kHasV>
                                     : all_layer_kernel<int64_t, kBytes, kUnroll, kThreads, kHasV>;
    LaunchKernel(shape.blocks, shape.threads, idx.device)
        .enable_pdl(runtime::supports_pdl(idx.device.device_id))(kernel, p);
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

  static void run_all(
      tvm::ffi::TensorView k_ptr_dst,
      tvm::ffi::TensorView v_ptr_dst,
      tvm::ffi::TensorView indices_dst,
      tvm::ffi::TensorView k_ptr_src,
      tvm::ffi::TensorView v_ptr_src,
      tvm::ffi::TensorView indices_src,
      int64_t src_stride_bytes,
      int64_t dst_stride_bytes,
      int64_t block_quota) {
    launch_all<true>(
        {k_ptr_dst, &v_ptr_dst, indices_dst, k_ptr_src, &v_ptr_src, indices_src},
        src_stride_bytes,
        dst_stride_bytes,
        block_quota);
  }

  static void run_all_mla(
      tvm::ffi::TensorView ptr_dst,
      tvm::ffi::TensorView indices_dst,
      tvm::ffi::TensorView ptr_src,
      tvm::ffi::TensorView indices_src,
      int64_t src_stride_bytes,
      int64_t dst_stride_bytes,
      int64_t block_quota) {
    launch_all<false>(
        {ptr_dst, nullptr, indices_dst, ptr_src, nullptr, indices_src},
        src_stride_bytes,
        dst_stride_bytes,
        block_quota);
  }
};

}  // namespace jit_kernel::hicache
