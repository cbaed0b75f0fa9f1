// hicache write-back of whole pages to pinned host memory, and load-back from page-unified host pages.
//
// Write-back (device -> pinned host), for host layouts whose pages are contiguous byte ranges. Two
// ways, one result (the host bytes; the staging buffer's contents are unspecified afterwards):
//
//   direct stores (the default)  one kernel reads each row of the layer-first device pools and
//                 stores it into its host page through the page's device alias (mapped pinned
//                 memory), under a block quota: no staging, no copy-engine copies, one launch per
//                 kLaunchPages pages. Like the register kernel's, stores from 2 blocks of 1024
//                 threads saturate PCIe, whatever the order of the host pages; the copy engine
//                 pays a fixed cost per copy, once per run of consecutive host pages, which pages
//                 of a few hundred KiB do not hide.
//   staged copies  a gather kernel packs whole pages into the caller's device staging buffer in
//                 the host page's own byte order, then the copy engine moves each run of
//                 consecutive host pages with one cudaMemcpyAsync (no SM time during the copy).
//                 Pages beyond the staging buffer's capacity go in further chunks, all in this one
//                 call, on the current stream (the next chunk's gather waits for the previous
//                 chunk's copies in stream order, so the staging buffer is reused safely).
//
//   lf_pf         device pools layer-first ([token, row] per layer, through pointer tables);
//                 host page-first: dst[token, layer, row], a page = page_size tokens of every layer.
//                 src_indices / dst_indices are TOKEN indices (page_size per page, the first of
//                 each page is read: page j is tokens src_indices[j * page_size] + t, t < page_size).
//   page_unified  host pages (page, head_group, layer, 2, page_size, head_in_group, dim), K = 0,
//                 V = 1; MLA (page, layer, page_size, dim). src_pages / dst_pages are PAGE ids.
//
// Load-back (pinned host -> device), page_unified only: one layer of the host pages straight into
// the device pool's rows (token, head_group * head_in_group * dim), the SMs reading host memory
// through its device alias, under a block quota. src_indices are host TOKEN indices (page =
// index / page_size), dst_indices device token indices; an index out of range is skipped.
//
// Row sizes are run-time values (multiples of 16 bytes), so the one prebuilt config serves every
// shape. Exports (no template parameters); block_quota 0 = two blocks per SM, staged_copies 0 =
// direct stores, 1 = staging buffer and copy engine:
//   lf_pf            (k_ptr_src, v_ptr_src, src_indices, dst_indices, staging_k, staging_v, dst_k, dst_v,
//                     page_size, element_size, block_quota, staged_copies)
//   lf_pf_mla        (ptr_src, src_indices, dst_indices, staging, dst, page_size, element_size, block_quota,
//                     staged_copies)
//   pu_write         (k_ptr_src, v_ptr_src, src_pages, dst_pages, staging, dst, block_quota, staged_copies)
//   pu_write_mla     (ptr_src, src_pages, dst_pages, staging, dst, block_quota, staged_copies)
//   pu_load          (k_cache_dst, v_cache_dst, src, src_indices, dst_indices, layer_id, block_quota)
//   pu_load_mla      (cache_dst, src, src_indices, dst_indices, layer_id, block_quota)
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
#include <vector>

namespace jit_kernel::hicache_pages {

inline constexpr int64_t kVecBytes = 16;
inline constexpr uint32_t kUnroll = 4;  // 16-byte loads a lane has in flight
// Host pages one direct-store launch writes: their first host token (page-first) or page id
// (page-unified) travel in the kernel's parameters (2 KiB of the 4 KiB), so the call needs neither
// device memory for them nor a host-to-device copy, and a CUDA graph can capture it.
inline constexpr int64_t kLaunchPages = 256;
inline constexpr uint32_t kDirectThreads = 1024;

/// \brief Copies one row of `units` 16-byte units with the `group` lanes of a row group (`lane` of
/// them), each lane issuing up to kUnroll loads before its stores. Streaming loads (`.cs`): a
/// source row is read once, and the device pool it comes from stays in L2 for attention.
SGL_DEVICE void copy_row(uint4* dst, const uint4* src, uint32_t units, uint32_t lane, uint32_t group) {
  for (uint32_t u = lane; u < units; u += kUnroll * group) {
    uint4 v[kUnroll];
#pragma unroll
    for (uint32_t k = 0; k < kUnroll; ++k) {
      if (u + k * group < units) v[k] = device::warp::details::load_cs(src + u + k * group);
    }
#pragma unroll
    for (uint32_t k = 0; k < kUnroll; ++k) {
      if (u + k * group < units) dst[u + k * group] = v[k];
    }
  }
}

/// \brief Where row r of a layer-first -> page-first write-back comes from. Rows are in the host
/// pages' order: row (j * page_size + t) * layers + l of tensor `which` is layer l's row
/// src_indices[(first_page + j) * page_size] + t.
template <typename Index>
struct LfPfSource {
  const uint64_t* tables[2];  // K, V per-layer base addresses
  const Index* src_indices;
  int64_t first_page;
  int64_t page_size;
  int64_t layers;
  int64_t row_bytes;
  int64_t rows_per_tensor;  // pages * page_size * layers
  int64_t tensors;          // 2 (K, V), or 1 for MLA

  struct Position {
    int64_t which;      // K or V
    int64_t in_tensor;  // the row's index in its tensor's part of the launch
    int64_t page;       // j, the launch's page
    int64_t t;          // the token in its page
    int64_t layer;
  };

  // Returns false for a row past the end.
  SGL_DEVICE auto find(int64_t r, Position& at, const uint4*& src) const -> bool {
    at.which = r / rows_per_tensor;
    if (at.which >= tensors) return false;
    at.in_tensor = r - at.which * rows_per_tensor;
    const int64_t token = at.in_tensor / layers;  // j * page_size + t
    at.layer = at.in_tensor - token * layers;
    at.page = token / page_size;
    at.t = token - at.page * page_size;
    const int64_t start = static_cast<int64_t>(__ldg(src_indices + (first_page + at.page) * page_size));
    const auto base = reinterpret_cast<const uint8_t*>(
        __ldg(reinterpret_cast<const unsigned long long*>(tables[at.which]) + at.layer));
    src = reinterpret_cast<const uint4*>(base + (start + at.t) * row_bytes);
    return true;
  }
};

/// \brief Row r of the lf_pf staging buffer: LfPfSource's row r, at staging[which] row in_tensor.
template <typename Index>
struct LfPfRows {
  LfPfSource<Index> source;
  uint8_t* staging[2];

  SGL_DEVICE auto locate(int64_t r, uint4*& dst, const uint4*& src) const -> bool {
    typename LfPfSource<Index>::Position at;
    if (!source.find(r, at, src)) return false;
    dst = reinterpret_cast<uint4*>(staging[at.which] + at.in_tensor * source.row_bytes);
    return true;
  }
};

/// \brief Row r of the page-unified staging buffer, in the host page's order (page j, group g,
/// layer l, kv, token t): the group's row of token src_pages[j] * page_size + t of layer l.
template <typename Index>
struct PageUnifiedRows {
  const uint64_t* tables[2];
  uint8_t* staging;
  const Index* src_pages;
  int64_t groups;
  int64_t layers;
  int64_t components;  // 2 (K, V), or 1 for MLA
  int64_t page_size;
  int64_t group_bytes;
  int64_t rows;  // pages * groups * layers * components * page_size

  SGL_DEVICE auto locate(int64_t r, uint4*& dst, const uint4*& src) const -> bool {
    if (r >= rows) return false;
    int64_t rest = r;
    const int64_t t = rest % page_size;
    rest /= page_size;
    const int64_t kv = rest % components;
    rest /= components;
    const int64_t layer = rest % layers;
    rest /= layers;
    const int64_t g = rest % groups;
    const int64_t page = rest / groups;
    const int64_t token = static_cast<int64_t>(__ldg(src_pages + page)) * page_size + t;
    const auto base =
        reinterpret_cast<const uint8_t*>(__ldg(reinterpret_cast<const unsigned long long*>(tables[kv]) + layer));
    src = reinterpret_cast<const uint4*>(base + (token * groups + g) * group_bytes);
    dst = reinterpret_cast<uint4*>(staging + r * group_bytes);
    return true;
  }
};

/// \brief Row r of a direct page-first write-back: LfPfSource's row r, stored at host token
/// dst_first[j] + t, layer l (through the host cache's device alias).
template <typename Index>
struct LfPfHostRows {
  LfPfSource<Index> source;
  uint8_t* host[2];  // device aliases of the pinned host caches
  int64_t dst_first[kLaunchPages];

  SGL_DEVICE auto locate(int64_t r, uint4*& dst, const uint4*& src) const -> bool {
    typename LfPfSource<Index>::Position at;
    if (!source.find(r, at, src)) return false;
    const int64_t host_row = (dst_first[at.page] + at.t) * source.layers + at.layer;
    dst = reinterpret_cast<uint4*>(host[at.which] + host_row * source.row_bytes);
    return true;
  }
};

/// \brief Row r of a direct page-unified write-back: PageUnifiedRows' row r of the launch's page j
/// = r / rows_per_page, stored in host page dst_pages[j] (through the host pages' device alias).
template <typename Index>
struct PageUnifiedHostRows {
  PageUnifiedRows<Index> gather;  // src_pages and rows: this launch's pages
  uint8_t* host;
  int64_t rows_per_page;
  int64_t dst_pages[kLaunchPages];

  SGL_DEVICE auto locate(int64_t r, uint4*& dst, const uint4*& src) const -> bool {
    if (!gather.locate(r, dst, src)) return false;
    const int64_t page = r / rows_per_page;
    dst = reinterpret_cast<uint4*>(
        host + (dst_pages[page] * rows_per_page + (r - page * rows_per_page)) * gather.group_bytes);
    return true;
  }
};

/// \brief Row r of a page-unified load-back: item i = r % items of component kv of group g, the
/// group's row of host token src_indices[i] of `layer` into device token dst_indices[i]. An index
/// out of range leaves its row alone.
template <typename Index>
struct LoadBackRows {
  const uint8_t* src;  // device alias of the host pages
  uint8_t* dst[2];     // device pool rows of K, V
  const Index* src_indices;
  const Index* dst_indices;
  int64_t items;
  int64_t groups;
  int64_t layers;
  int64_t components;
  int64_t page_size;
  int64_t layer;
  int64_t group_bytes;
  int64_t src_tokens;  // host pages * page_size
  int64_t dst_tokens;
  int64_t dst_stride;  // bytes between device rows
  int64_t rows;        // items * groups * components

  SGL_DEVICE auto locate(int64_t r, uint4*& to, const uint4*& from) const -> bool {
    if (r >= rows) return false;
    const int64_t i = r % items;
    const int64_t cell = r / items;  // g * components + kv
    const int64_t kv = cell % components;
    const int64_t g = cell / components;
    const int64_t s = static_cast<int64_t>(__ldg(src_indices + i));
    const int64_t d = static_cast<int64_t>(__ldg(dst_indices + i));
    if (s < 0 || s >= src_tokens || d < 0 || d >= dst_tokens) return false;
    const int64_t page = s / page_size;
    const int64_t t = s - page * page_size;
    const int64_t offset = ((((page * groups + g) * layers + layer) * components + kv) * page_size + t) * group_bytes;
    from = reinterpret_cast<const uint4*>(src + offset);
    to = reinterpret_cast<uint4*>(dst[kv] + d * dst_stride + g * group_bytes);
    return true;
  }
};

/// \brief Every row of `rows` (rows of `units` 16-byte units), `group` lanes a row (a power of two
/// up to 32), grid-stride.
template <typename Rows>
__global__ void copy_rows_kernel(const __grid_constant__ Rows rows, int64_t num_rows, uint32_t units, uint32_t group) {
  device::PDLWaitPrimary();
  device::PDLTriggerSecondary();
  const uint32_t lane = threadIdx.x % group;
  const int64_t groups_per_block = blockDim.x / group;
  const int64_t stride = groups_per_block * gridDim.x;
  for (int64_t r = blockIdx.x * groups_per_block + threadIdx.x / group; r < num_rows; r += stride) {
    uint4* to = nullptr;
    const uint4* from = nullptr;
    if (rows.locate(r, to, from)) copy_row(to, from, units, lane, group);
  }
}

/// \brief Lanes per row: the power of two that covers a row's units once, capped at a warp.
inline auto lanes_per_row(int64_t units) -> uint32_t {
  uint32_t group = 1;
  while (group < 32 && group * kUnroll < units) group *= 2;
  return group;
}

/// \brief Launches copy_rows_kernel over `num_rows` rows in blocks of `threads`: enough blocks for
/// every row group, at most `max_blocks` (a block quota) or, when it is 0, two per SM. `pdl`: may
/// overlap the previous kernel's tail (the write-back's gathers follow copies, which it cannot).
template <typename Rows>
inline void launch_rows(
    const Rows& rows,
    int64_t num_rows,
    int64_t row_bytes,
    int64_t max_blocks,
    uint32_t threads,
    bool pdl,
    DLDevice device) {
  using namespace host;
  if (num_rows == 0) return;
  const auto units = static_cast<uint32_t>(row_bytes / kVecBytes);
  const uint32_t group = lanes_per_row(units);
  const int64_t groups_per_block = threads / group;
  const int64_t cap = max_blocks > 0 ? max_blocks : 2 * static_cast<int64_t>(runtime::sm_count(device.device_id));
  const auto blocks = static_cast<uint32_t>(std::clamp<int64_t>(div_ceil(num_rows, groups_per_block), 1, cap));
  LaunchKernel(blocks, threads, device)
      .enable_pdl(pdl && runtime::supports_pdl(device.device_id))(copy_rows_kernel<Rows>, rows, num_rows, units, group);
}

/// \brief Copies `count` staging pages (`page_bytes` each, consecutive from `staging`) to the host
/// pages `dst_page(j)` of `host` (page indices, each in range): one cudaMemcpyAsync per run of
/// consecutive host pages.
template <typename DstPage>
inline void copy_pages_to_host(
    const uint8_t* staging, uint8_t* host, int64_t count, int64_t page_bytes, DstPage&& dst_page, cudaStream_t stream) {
  int64_t j = 0;
  while (j < count) {
    const int64_t first = dst_page(j);
    int64_t run = 1;
    while (j + run < count && dst_page(j + run) == first + run) ++run;
    host::RuntimeDeviceCheck(cudaMemcpyAsync(
        host + first * page_bytes, staging + j * page_bytes, run * page_bytes, cudaMemcpyDeviceToHost, stream));
    j += run;
  }
}

/// \brief Makes `device_id` current for its lifetime: the copies are issued on a stream of that GPU.
class OnDevice {
 public:
  explicit OnDevice(int device_id) {
    host::RuntimeDeviceCheck(cudaGetDevice(&m_previous));
    if (m_previous == device_id) {
      m_previous = -1;
    } else {
      host::RuntimeDeviceCheck(cudaSetDevice(device_id));
    }
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;
  ~OnDevice() {
    if (m_previous >= 0) cudaSetDevice(m_previous);
  }

 private:
  int m_previous = -1;
};

/// \brief The write-back, layer-first device pools to page-first host caches.
template <bool kHasV>
inline void lf_pf(
    const tvm::ffi::TensorView& k_ptr_src,
    const tvm::ffi::TensorView* v_ptr_src,
    const tvm::ffi::TensorView& src_indices,
    const tvm::ffi::TensorView& dst_indices,
    const tvm::ffi::TensorView& staging_k,
    const tvm::ffi::TensorView* staging_v,
    const tvm::ffi::TensorView& dst_k,
    const tvm::ffi::TensorView* dst_v,
    int64_t page_size,
    int64_t element_size,
    int64_t block_quota,
    bool staged_copies) {
  using namespace host;
  constexpr std::string_view kStagingK = kHasV ? "staging_k" : "staging";
  constexpr std::string_view kDstK = kHasV ? "dst_k" : "dst";
  constexpr std::string_view kPtrK = kHasV ? "k_ptr_src" : "ptr_src";
  auto capacity = SymbolicSize{"staging tokens"};
  auto layers = SymbolicSize{"num_layers"};
  auto dim = SymbolicSize{"element_dim"};
  auto host_tokens = SymbolicSize{"host tokens"};
  auto tokens = SymbolicSize{"num_tokens"};
  auto dtype = SymbolicDType{};
  auto index_dtype = SymbolicDType{};
  auto device = SymbolicDevice{};
  TensorMatcher({tokens})  //
      .with_dtype<int32_t, int64_t>(index_dtype)
      .with_device<kDLCUDA>(device)
      .verify(src_indices, "src_indices");
  TensorMatcher({tokens}).with_dtype<int64_t>().with_device<kDLCPU>().verify(dst_indices, "dst_indices");
  TensorMatcher({capacity, layers, dim}).with_dtype(dtype).with_device<kDLCUDA>(device).verify(staging_k, kStagingK);
  TensorMatcher({host_tokens, layers, dim}).with_dtype(dtype).with_device<kDLCPU, kDLCUDAHost>().verify(dst_k, kDstK);
  TensorMatcher({layers}).with_dtype<uint64_t>().with_device<kDLCUDA>(device).verify(k_ptr_src, kPtrK);
  if constexpr (kHasV) {
    TensorMatcher({capacity, layers, dim})
        .with_dtype(dtype)
        .with_device<kDLCUDA>(device)
        .verify(*staging_v, "staging_v");
    TensorMatcher({host_tokens, layers, dim})
        .with_dtype(dtype)
        .with_device<kDLCPU, kDLCUDAHost>()
        .verify(*dst_v, "dst_v");
    TensorMatcher({layers}).with_dtype<uint64_t>().with_device<kDLCUDA>(device).verify(*v_ptr_src, "v_ptr_src");
  }
  const auto row_bytes = dim.unwrap() * static_cast<int64_t>(dtype_bytes(dtype.unwrap()));
  RuntimeCheck(page_size >= 1, "hicache: page_size must be a positive int, got ", page_size);
  RuntimeCheck(
      row_bytes > 0 && row_bytes % kVecBytes == 0,
      "hicache: rows of '",
      kStagingK,
      "' must be a positive multiple of 16 bytes, got ",
      row_bytes);
  RuntimeCheck(
      element_size == 0 || element_size == row_bytes,
      "hicache: element_size=",
      element_size,
      " does not match the rows of '",
      kStagingK,
      "' (",
      row_bytes,
      " bytes)");
  RuntimeCheck(
      tokens.unwrap() % page_size == 0,
      "hicache: 'src_indices' holds ",
      tokens.unwrap(),
      " tokens, not whole pages of page_size=",
      page_size);
  RuntimeCheck(
      capacity.unwrap() >= page_size,
      "hicache: '",
      kStagingK,
      "' holds ",
      capacity.unwrap(),
      " tokens, less than one page of page_size=",
      page_size);
  RuntimeCheck(block_quota >= 0, "hicache: block_quota must be positive, got ", block_quota);
  const int64_t pages = tokens.unwrap() / page_size;
  if (pages == 0 || layers.unwrap() == 0 || has_no_data(src_indices)) return;

  auto* const host_k = static_cast<uint8_t*>(runtime::get_device_accessible_ptr(dst_k, kDstK));
  uint8_t* host_v = nullptr;
  if constexpr (kHasV) host_v = static_cast<uint8_t*>(runtime::get_device_accessible_ptr(*dst_v, "dst_v"));
  // The host pages each call writes: first token of page j, in range (the copy engine would write
  // past the host buffer otherwise).
  const auto* dst_tokens = static_cast<const int64_t*>(dst_indices.data_ptr());
  for (int64_t j = 0; j < pages; ++j) {
    const int64_t first = dst_tokens[j * page_size];
    RuntimeCheck(
        first >= 0 && first + page_size <= host_tokens.unwrap(),
        "hicache: dst_indices[",
        j * page_size,
        "] = ",
        first,
        " starts a page of ",
        page_size,
        " tokens outside '",
        kDstK,
        "' (",
        host_tokens.unwrap(),
        " tokens)");
  }

  const auto gpu = device.unwrap();
  const auto stream = LaunchKernel::resolve_device(gpu);
  const OnDevice on_gpu{gpu.device_id};
  const int64_t per_chunk = capacity.unwrap() / page_size;
  const int64_t token_bytes = layers.unwrap() * row_bytes;  // a token of every layer, on both sides
  // The source rows of pages [first_page, first_page + count) of this call.
  const auto source = [&](auto index_type, int64_t first_page, int64_t count) {
    using Index = decltype(index_type);
    auto from = LfPfSource<Index>{};
    from.tables[0] = static_cast<const uint64_t*>(k_ptr_src.data_ptr());
    if constexpr (kHasV) from.tables[1] = static_cast<const uint64_t*>(v_ptr_src->data_ptr());
    from.src_indices = static_cast<const Index*>(src_indices.data_ptr());
    from.first_page = first_page;
    from.page_size = page_size;
    from.layers = layers.unwrap();
    from.row_bytes = row_bytes;
    from.rows_per_tensor = count * page_size * layers.unwrap();
    from.tensors = kHasV ? 2 : 1;
    return from;
  };
  const auto store_direct = [&](auto index_type) {
    using Index = decltype(index_type);
    for (int64_t first_page = 0; first_page < pages; first_page += kLaunchPages) {
      const int64_t count = std::min(kLaunchPages, pages - first_page);
      auto rows = LfPfHostRows<Index>{};
      rows.source = source(Index{}, first_page, count);
      rows.host[0] = host_k;
      if constexpr (kHasV) rows.host[1] = host_v;
      for (int64_t j = 0; j < count; ++j) rows.dst_first[j] = dst_tokens[(first_page + j) * page_size];
      launch_rows(
          rows, rows.source.rows_per_tensor * rows.source.tensors, row_bytes, block_quota, kDirectThreads, true, gpu);
    }
  };
  const auto run_chunks = [&](auto index_type) {
    using Index = decltype(index_type);
    for (int64_t first_page = 0; first_page < pages; first_page += per_chunk) {
      const int64_t count = std::min(per_chunk, pages - first_page);
      auto rows = LfPfRows<Index>{};
      rows.source = source(Index{}, first_page, count);
      rows.staging[0] = static_cast<uint8_t*>(staging_k.data_ptr());
      if constexpr (kHasV) rows.staging[1] = static_cast<uint8_t*>(staging_v->data_ptr());
      launch_rows(rows, rows.source.rows_per_tensor * rows.source.tensors, row_bytes, block_quota, 512, false, gpu);
      const auto dst_page = [&](int64_t j) { return dst_tokens[(first_page + j) * page_size]; };
      // Host pages as runs of tokens: page j starts at token dst_page(j), page_size tokens long.
      const auto copy = [&](const tvm::ffi::TensorView& staging, const tvm::ffi::TensorView& dst) {
        int64_t j = 0;
        while (j < count) {
          const int64_t first = dst_page(j);
          int64_t run = 1;
          while (j + run < count && dst_page(j + run) == first + run * page_size) ++run;
          RuntimeDeviceCheck(cudaMemcpyAsync(
              static_cast<uint8_t*>(dst.data_ptr()) + first * token_bytes,
              static_cast<const uint8_t*>(staging.data_ptr()) + j * page_size * token_bytes,
              run * page_size * token_bytes,
              cudaMemcpyDeviceToHost,
              stream));
          j += run;
        }
      };
      copy(staging_k, dst_k);
      if constexpr (kHasV) copy(*staging_v, *dst_v);
    }
  };
  if (!staged_copies) {
    if (index_dtype.is_type<int32_t>()) {
      store_direct(int32_t{});
    } else {
      store_direct(int64_t{});
    }
  } else if (index_dtype.is_type<int32_t>()) {
    run_chunks(int32_t{});
  } else {
    run_chunks(int64_t{});
  }
}

/// \brief The write-back to page-unified host pages.
template <bool kHasV>
inline void pu_write(
    const tvm::ffi::TensorView& k_ptr_src,
    const tvm::ffi::TensorView* v_ptr_src,
    const tvm::ffi::TensorView& src_pages,
    const tvm::ffi::TensorView& dst_pages,
    const tvm::ffi::TensorView& staging,
    const tvm::ffi::TensorView& dst,
    int64_t block_quota,
    bool staged_copies) {
  using namespace host;
  auto capacity = SymbolicSize{"staging pages"};
  auto host_pages = SymbolicSize{"host pages"};
  auto groups = SymbolicSize{"head groups"};
  auto layers = SymbolicSize{"num_layers"};
  auto page_size = SymbolicSize{"page_size"};
  auto heads = SymbolicSize{"heads per group"};
  auto dim = SymbolicSize{"dim"};
  auto count = SymbolicSize{"num_pages"};
  auto dtype = SymbolicDType{};
  auto index_dtype = SymbolicDType{};
  auto device = SymbolicDevice{};
  TensorMatcher({count})  //
      .with_dtype<int32_t, int64_t>(index_dtype)
      .with_device<kDLCUDA>(device)
      .verify(src_pages, "src_pages");
  TensorMatcher({count}).with_dtype<int64_t>().with_device<kDLCPU>().verify(dst_pages, "dst_pages");
  if constexpr (kHasV) {
    TensorMatcher({capacity, groups, layers, 2, page_size, heads, dim})
        .with_dtype(dtype)
        .with_device<kDLCUDA>(device)
        .verify(staging, "staging");
    TensorMatcher({host_pages, groups, layers, 2, page_size, heads, dim})
        .with_dtype(dtype)
        .with_device<kDLCPU, kDLCUDAHost>()
        .verify(dst, "dst");
  } else {
    groups.set_value(1);
    heads.set_value(1);
    TensorMatcher({capacity, layers, page_size, dim})
        .with_dtype(dtype)
        .with_device<kDLCUDA>(device)
        .verify(staging, "staging");
    TensorMatcher({host_pages, layers, page_size, dim})
        .with_dtype(dtype)
        .with_device<kDLCPU, kDLCUDAHost>()
        .verify(dst, "dst");
  }
  TensorMatcher({layers}).with_dtype<uint64_t>().with_device<kDLCUDA>(device).verify(
      k_ptr_src, kHasV ? "k_ptr_src" : "ptr_src");
  if constexpr (kHasV) {
    TensorMatcher({layers}).with_dtype<uint64_t>().with_device<kDLCUDA>(device).verify(*v_ptr_src, "v_ptr_src");
  }
  const auto elem = static_cast<int64_t>(dtype_bytes(dtype.unwrap()));
  const int64_t group_bytes = heads.unwrap() * dim.unwrap() * elem;
  RuntimeCheck(
      groups.unwrap() > 0 && layers.unwrap() > 0 && page_size.unwrap() > 0 && group_bytes > 0,
      "hicache: every page dimension of 'dst' must be positive");
  RuntimeCheck(
      group_bytes % kVecBytes == 0,
      "hicache: a head group's token row (heads per group x dim) must be a multiple of 16 bytes, got ",
      group_bytes);
  RuntimeCheck(capacity.unwrap() > 0, "hicache: 'staging' must hold at least one page");
  RuntimeCheck(block_quota >= 0, "hicache: block_quota must be positive, got ", block_quota);
  const int64_t pages = count.unwrap();
  if (pages == 0 || has_no_data(src_pages)) return;

  auto* const host_pages_ptr = static_cast<uint8_t*>(runtime::get_device_accessible_ptr(dst, "dst"));
  RuntimeCheck(
      reinterpret_cast<uintptr_t>(staging.data_ptr()) % kVecBytes == 0, "hicache: 'staging' must be 16-byte aligned");
  // Destination pages: in range, and each written once (two copies of one page would race with
  // nothing to order them but the stream, and one of them is the caller's mistake).
  const auto* dst_ids = static_cast<const int64_t*>(dst_pages.data_ptr());
  std::vector<int64_t> sorted(dst_ids, dst_ids + pages);
  for (int64_t j = 0; j < pages; ++j) {
    RuntimeCheck(
        dst_ids[j] >= 0 && dst_ids[j] < host_pages.unwrap(),
        "hicache: dst_pages[",
        j,
        "] = ",
        dst_ids[j],
        " is out of range: it must be in [0, ",
        host_pages.unwrap(),
        ")");
  }
  std::sort(sorted.begin(), sorted.end());
  const auto repeated = std::adjacent_find(sorted.begin(), sorted.end());
  RuntimeCheck(
      repeated == sorted.end(), "hicache: dst_pages holds page ", repeated == sorted.end() ? 0 : *repeated, " twice");

  const auto gpu = device.unwrap();
  const auto stream = LaunchKernel::resolve_device(gpu);
  const OnDevice on_gpu{gpu.device_id};
  const int64_t components = kHasV ? 2 : 1;
  const int64_t rows_per_page = groups.unwrap() * layers.unwrap() * components * page_size.unwrap();
  const int64_t page_bytes = rows_per_page * group_bytes;
  const auto gather_rows = [&](auto index_type, int64_t first, int64_t n) {
    using Index = decltype(index_type);
    auto rows = PageUnifiedRows<Index>{};
    rows.tables[0] = static_cast<const uint64_t*>(k_ptr_src.data_ptr());
    rows.tables[1] = kHasV ? static_cast<const uint64_t*>(v_ptr_src->data_ptr()) : rows.tables[0];
    rows.staging = static_cast<uint8_t*>(staging.data_ptr());
    rows.src_pages = static_cast<const Index*>(src_pages.data_ptr()) + first;
    rows.groups = groups.unwrap();
    rows.layers = layers.unwrap();
    rows.components = components;
    rows.page_size = page_size.unwrap();
    rows.group_bytes = group_bytes;
    rows.rows = n * rows_per_page;
    return rows;
  };
  const auto store_direct = [&](auto index_type) {
    using Index = decltype(index_type);
    for (int64_t first = 0; first < pages; first += kLaunchPages) {
      const int64_t n = std::min(kLaunchPages, pages - first);
      auto rows = PageUnifiedHostRows<Index>{};
      rows.gather = gather_rows(index_type, first, n);
      rows.host = host_pages_ptr;
      rows.rows_per_page = rows_per_page;
      for (int64_t j = 0; j < n; ++j) rows.dst_pages[j] = dst_ids[first + j];
      launch_rows(rows, rows.gather.rows, group_bytes, block_quota, kDirectThreads, true, gpu);
    }
  };
  const auto run_chunks = [&](auto index_type) {
    using Index = decltype(index_type);
    for (int64_t first = 0; first < pages; first += capacity.unwrap()) {
      const int64_t n = std::min(capacity.unwrap(), pages - first);
      const auto rows = gather_rows(Index{}, first, n);
      launch_rows(rows, rows.rows, group_bytes, block_quota, 512, false, gpu);
      copy_pages_to_host(
          static_cast<const uint8_t*>(staging.data_ptr()),
          static_cast<uint8_t*>(dst.data_ptr()),
          n,
          page_bytes,
          [&](int64_t j) { return dst_ids[first + j]; },
          stream);
    }
  };
  if (!staged_copies) {
    if (index_dtype.is_type<int32_t>()) {
      store_direct(int32_t{});
    } else {
      store_direct(int64_t{});
    }
  } else if (index_dtype.is_type<int32_t>()) {
    run_chunks(int32_t{});
  } else {
    run_chunks(int64_t{});
  }
}

/// \brief One layer of page-unified host pages into the device pool.
template <bool kHasV>
inline void pu_load(
    const tvm::ffi::TensorView& k_cache_dst,
    const tvm::ffi::TensorView* v_cache_dst,
    const tvm::ffi::TensorView& src,
    const tvm::ffi::TensorView& src_indices,
    const tvm::ffi::TensorView& dst_indices,
    int64_t layer_id,
    int64_t block_quota) {
  using namespace host;
  auto host_pages = SymbolicSize{"host pages"};
  auto groups = SymbolicSize{"head groups"};
  auto layers = SymbolicSize{"num_layers"};
  auto page_size = SymbolicSize{"page_size"};
  auto heads = SymbolicSize{"heads per group"};
  auto dim = SymbolicSize{"dim"};
  auto row = SymbolicSize{"row elements"};
  auto items = SymbolicSize{"num_indices"};
  auto dtype = SymbolicDType{};
  auto index_dtype = SymbolicDType{};
  auto device = SymbolicDevice{};
  constexpr std::string_view kKDst = kHasV ? "k_cache_dst" : "cache_dst";
  TensorMatcher({-1, row})  //
      .with_strides({-1, 1})
      .with_dtype(dtype)
      .with_device<kDLCUDA>(device)
      .verify(k_cache_dst, kKDst);
  if constexpr (kHasV) {
    TensorMatcher({-1, row}).with_strides({-1, 1}).with_dtype(dtype).with_device<kDLCUDA>(device).verify(
        *v_cache_dst, "v_cache_dst");
    TensorMatcher({host_pages, groups, layers, 2, page_size, heads, dim})
        .with_dtype(dtype)
        .with_device<kDLCPU, kDLCUDAHost, kDLCUDA>()
        .verify(src, "src");
  } else {
    groups.set_value(1);
    heads.set_value(1);
    TensorMatcher({host_pages, layers, page_size, dim})
        .with_dtype(dtype)
        .with_device<kDLCPU, kDLCUDAHost, kDLCUDA>()
        .verify(src, "src");
  }
  TensorMatcher({items})  //
      .with_dtype<int32_t, int64_t>(index_dtype)
      .with_device<kDLCUDA>(device)
      .verify(src_indices, "src_indices")
      .verify(dst_indices, "dst_indices");
  const auto elem = static_cast<int64_t>(dtype_bytes(dtype.unwrap()));
  const int64_t group_bytes = heads.unwrap() * dim.unwrap() * elem;
  RuntimeCheck(
      groups.unwrap() > 0 && layers.unwrap() > 0 && page_size.unwrap() > 0 && group_bytes > 0,
      "hicache: every page dimension of 'src' must be positive");
  RuntimeCheck(
      group_bytes % kVecBytes == 0,
      "hicache: a head group's token row (heads per group x dim) must be a multiple of 16 bytes, got ",
      group_bytes);
  RuntimeCheck(
      row.unwrap() * elem == groups.unwrap() * group_bytes,
      "hicache: rows of '",
      kKDst,
      "' hold ",
      row.unwrap() * elem,
      " bytes, but a token of 'src' holds ",
      groups.unwrap() * group_bytes,
      " per layer and component");
  RuntimeCheck(
      layer_id >= 0 && layer_id < layers.unwrap(),
      "hicache: layer_id=",
      layer_id,
      " is out of range: 'src' holds ",
      layers.unwrap(),
      " layers");
  RuntimeCheck(block_quota >= 1, "hicache: block_quota must be >= 1, got ", block_quota);
  const auto gpu = device.unwrap();
  const auto is_int32 = index_dtype.is_type<int32_t>();
  if (items.unwrap() == 0 || has_no_data(src_indices)) return;

  const auto* from = static_cast<const uint8_t*>(runtime::get_device_accessible_ptr(src, "src"));
  if (src.device().device_type == kDLCUDA) {
    RuntimeCheck(src.device().device_id == gpu.device_id, "hicache: 'src' is on another GPU than 'cache_dst'");
  }
  const int64_t dst_stride = k_cache_dst.stride(0) * elem;
  RuntimeCheck(
      reinterpret_cast<uintptr_t>(from) % kVecBytes == 0 &&
          reinterpret_cast<uintptr_t>(k_cache_dst.data_ptr()) % kVecBytes == 0 && dst_stride % kVecBytes == 0 &&
          (!kHasV || (reinterpret_cast<uintptr_t>(v_cache_dst->data_ptr()) % kVecBytes == 0 &&
                      v_cache_dst->stride(0) * elem == dst_stride)),
      "hicache: 'src' and the destination caches must be 16-byte aligned, with one row stride (a multiple of 16 "
      "bytes)");
  const auto fill = [&](auto index_type) {
    using Index = decltype(index_type);
    auto rows = LoadBackRows<Index>{};
    rows.src = from;
    rows.dst[0] = static_cast<uint8_t*>(k_cache_dst.data_ptr());
    rows.dst[1] = kHasV ? static_cast<uint8_t*>(v_cache_dst->data_ptr()) : rows.dst[0];
    rows.src_indices = static_cast<const Index*>(src_indices.data_ptr());
    rows.dst_indices = static_cast<const Index*>(dst_indices.data_ptr());
    rows.items = items.unwrap();
    rows.groups = groups.unwrap();
    rows.layers = layers.unwrap();
    rows.components = kHasV ? 2 : 1;
    rows.page_size = page_size.unwrap();
    rows.layer = layer_id;
    rows.group_bytes = group_bytes;
    rows.src_tokens = host_pages.unwrap() * page_size.unwrap();
    rows.dst_tokens = k_cache_dst.size(0);
    rows.dst_stride = dst_stride;
    rows.rows = rows.items * rows.groups * rows.components;
    launch_rows(rows, rows.rows, group_bytes, block_quota, 1024, true, gpu);
  };
  if (is_int32) {
    fill(int32_t{});
  } else {
    fill(int64_t{});
  }
}

// ---- exports

inline void run_lf_pf(
    tvm::ffi::TensorView k_ptr_src,
    tvm::ffi::TensorView v_ptr_src,
    tvm::ffi::TensorView src_indices,
    tvm::ffi::TensorView dst_indices,
    tvm::ffi::TensorView staging_k,
    tvm::ffi::TensorView staging_v,
    tvm::ffi::TensorView dst_k,
    tvm::ffi::TensorView dst_v,
    int64_t page_size,
    int64_t element_size,
    int64_t block_quota,
    int64_t staged_copies) {
  lf_pf<true>(
      k_ptr_src,
      &v_ptr_src,
      src_indices,
      dst_indices,
      staging_k,
      &staging_v,
      dst_k,
      &dst_v,
      page_size,
      element_size,
      block_quota,
      staged_copies != 0);
}

inline void run_lf_pf_mla(
    tvm::ffi::TensorView ptr_src,
    tvm::ffi::TensorView src_indices,
    tvm::ffi::TensorView dst_indices,
    tvm::ffi::TensorView staging,
    tvm::ffi::TensorView dst,
    int64_t page_size,
    int64_t element_size,
    int64_t block_quota,
    int64_t staged_copies) {
  lf_pf<false>(
      ptr_src,
      nullptr,
      src_indices,
      dst_indices,
      staging,
      nullptr,
      dst,
      nullptr,
      page_size,
      element_size,
      block_quota,
      staged_copies != 0);
}

inline void run_pu_write(
    tvm::ffi::TensorView k_ptr_src,
    tvm::ffi::TensorView v_ptr_src,
    tvm::ffi::TensorView src_pages,
    tvm::ffi::TensorView dst_pages,
    tvm::ffi::TensorView staging,
    tvm::ffi::TensorView dst,
    int64_t block_quota,
    int64_t staged_copies) {
  pu_write<true>(k_ptr_src, &v_ptr_src, src_pages, dst_pages, staging, dst, block_quota, staged_copies != 0);
}

inline void run_pu_write_mla(
    tvm::ffi::TensorView ptr_src,
    tvm::ffi::TensorView src_pages,
    tvm::ffi::TensorView dst_pages,
    tvm::ffi::TensorView staging,
    tvm::ffi::TensorView dst,
    int64_t block_quota,
    int64_t staged_copies) {
  pu_write<false>(ptr_src, nullptr, src_pages, dst_pages, staging, dst, block_quota, staged_copies != 0);
}

inline void run_pu_load(
    tvm::ffi::TensorView k_cache_dst,
    tvm::ffi::TensorView v_cache_dst,
    tvm::ffi::TensorView src,
    tvm::ffi::TensorView src_indices,
    tvm::ffi::TensorView dst_indices,
    int64_t layer_id,
    int64_t block_quota) {
  pu_load<true>(k_cache_dst, &v_cache_dst, src, src_indices, dst_indices, layer_id, block_quota);
}

inline void run_pu_load_mla(
    tvm::ffi::TensorView cache_dst,
    tvm::ffi::TensorView src,
    tvm::ffi::TensorView src_indices,
    tvm::ffi::TensorView dst_indices,
    int64_t layer_id,
    int64_t block_quota) {
  pu_load<false>(cache_dst, nullptr, src, src_indices, dst_indices, layer_id, block_quota);
}

}  // namespace jit_kernel::hicache_pages
