/// \file runtime.cuh
/// \brief Host-side queries of the CUDA runtime (occupancy, device
/// properties), each checked with `RuntimeDeviceCheck`.
///
/// They cost a driver call each. Results that cannot change are cached per device
/// (`sm_count`, `has_clusters`): a function-local `static` would keep the first
/// device's answer for every device of the process. What reads each query, and typical values:
/// docs/design/runtime.md.

#pragma once

#include <sgl_kernel/utils.cuh>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>

namespace host::runtime {

/// \brief How many blocks of `kernel` fit on one SM at once (on the current device).
template <typename Kernel>
inline auto get_blocks_per_sm(Kernel&& kernel, int32_t block_dim, std::size_t dynamic_smem = 0, DebugInfo where = {})
    -> uint32_t {
  int num_blocks = 0;
  RuntimeDeviceCheck(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&num_blocks, kernel, block_dim, dynamic_smem), where);
  return static_cast<uint32_t>(num_blocks);
}

/// \brief Number of SMs of device `device_id`.
inline auto get_sm_count(int device_id, DebugInfo where = {}) -> uint32_t {
  int count = 0;
  RuntimeDeviceCheck(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device_id), where);
  return static_cast<uint32_t>(count);
}

/// The caches below are function-local statics of inline templates: with default visibility g++
/// makes them STB_GNU_UNIQUE, one copy in the process for every module (shared library) that
/// instantiates them, and a cache that guards a setting of one module's copy of a kernel (an
/// attribute opt-in) would skip it for another module's copy. Hidden, each module keeps its own,
/// however the module is built (docs/design/runtime.md).
#define SGL_MODULE_LOCAL __attribute__((visibility("hidden")))

namespace detail {

inline constexpr int kMaxDevices = 64;

/// One answer per device, asked once: `ask(device_id)` must return a value > 0.
template <typename Tag, typename Ask>
SGL_MODULE_LOCAL inline auto per_device(int device_id, DebugInfo where, Ask&& ask) -> int {
  static std::array<std::atomic<int>, kMaxDevices> cache{};  // 0: not asked yet
  RuntimeCheck(where, device_id >= 0 && device_id < kMaxDevices, "device id ", device_id, " out of range");
  int known = cache[device_id].load(std::memory_order_relaxed);
  if (known == 0) {
    known = ask(device_id);
    cache[device_id].store(known, std::memory_order_relaxed);
  }
  return known;
}

}  // namespace detail

/// \brief Number of SMs of device `device_id`, cached per device: cheap enough to ask on every launch.
inline auto sm_count(int device_id, DebugInfo where = {}) -> uint32_t {
  struct Tag;
  return static_cast<uint32_t>(
      detail::per_device<Tag>(device_id, where, [&](int id) { return static_cast<int>(get_sm_count(id, where)); }));
}

/// \brief L2 cache size of device `device_id` in bytes, cached per device.
inline auto l2_cache_bytes(int device_id, DebugInfo where = {}) -> std::size_t {
  struct Tag;
  return static_cast<std::size_t>(detail::per_device<Tag>(device_id, where, [&](int id) {
    int bytes = 0;
    RuntimeDeviceCheck(cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, id), where);
    return bytes;
  }));
}

/// \brief Threads resident per SM at full occupancy, cached per device: one wave of a launch is
/// `sm_count * max_threads_per_sm` threads.
inline auto max_threads_per_sm(int device_id, DebugInfo where = {}) -> uint32_t {
  struct Tag;
  return static_cast<uint32_t>(detail::per_device<Tag>(device_id, where, [&](int id) {
    int threads = 0;
    RuntimeDeviceCheck(cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor, id), where);
    return threads;
  }));
}

/// \brief Major compute capability of device `device_id` (9 for sm_90).
inline auto get_cc_major(int device_id, DebugInfo where = {}) -> int {
  int major = 0;
  RuntimeDeviceCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_id), where);
  return major;
}

/// \brief Whether device `device_id` runs thread-block clusters (sm_90+), cached
/// per device: cheap enough to ask on every launch.
inline auto has_clusters(int device_id, DebugInfo where = {}) -> bool {
  struct Tag;
  return detail::per_device<Tag>(device_id, where, [&](int id) { return get_cc_major(id, where) >= 9 ? 2 : 1; }) == 2;
}

/// \brief Whether device `device_id` has programmatic dependent launch (sm_90+, as clusters).
inline auto supports_pdl(int device_id, DebugInfo where = {}) -> bool {
  return has_clusters(device_id, where);
}

/// \brief An op's `enable_pdl` argument (`Optional<bool>`, `std::optional<bool>`): the caller's
/// choice, or, when unset, on where the device has it. Decided here, per device and cached, so
/// that the Python call path does not look the device up.
template <typename OptionalBool>
inline auto resolve_pdl(const OptionalBool& requested, int device_id, DebugInfo where = {}) -> bool {
  return requested.has_value() ? *requested : supports_pdl(device_id, where);
}

/// \brief CUDA runtime version, e.g. 13000 for 13.0.
inline auto get_runtime_version(DebugInfo where = {}) -> int {
  int version = 0;
  RuntimeDeviceCheck(cudaRuntimeGetVersion(&version), where);
  return version;
}

/// \brief Dynamic shared memory left per block when `num_blocks` blocks of
/// `block_size` threads of `kernel` share an SM (on the current device).
template <typename Kernel>
inline auto get_available_dynamic_smem_per_block(Kernel&& kernel, int num_blocks, int block_size, DebugInfo where = {})
    -> std::size_t {
  std::size_t bytes = 0;
  RuntimeDeviceCheck(cudaOccupancyAvailableDynamicSMemPerBlock(&bytes, kernel, num_blocks, block_size), where);
  return bytes;
}

/// \brief Lets `kernel` launch with up to `bytes` of dynamic shared memory (above 48 KiB needs this
/// opt-in) on the current device. See `set_max_dynamic_smem_per_device` for the cached form.
template <typename Kernel>
inline void set_max_dynamic_smem(Kernel kernel, std::size_t bytes, DebugInfo where = {}) {
  RuntimeDeviceCheck(
      cudaFuncSetAttribute(
          reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
      where);
}

/// \brief Preferred shared-memory share of the L1/shared split for `kernel` on the current device,
/// in percent (or `cudaSharedmemCarveoutMaxShared` / `MaxL1` / `Default`).
template <typename Kernel>
inline void set_smem_carveout(Kernel kernel, int percent, DebugInfo where = {}) {
  RuntimeDeviceCheck(
      cudaFuncSetAttribute(
          reinterpret_cast<const void*>(kernel), cudaFuncAttributePreferredSharedMemoryCarveout, percent),
      where);
}

/// \brief Most shared memory one block may use on device `device_id`: with the opt-in above
/// or, with `opt_in = false`, without it (48 KiB). Cached per device.
inline auto get_max_smem_per_block(int device_id, bool opt_in = true, DebugInfo where = {}) -> std::size_t {
  struct OptIn;
  struct Default;
  const auto ask = [&](cudaDeviceAttr attribute) {
    return [&, attribute](int id) {
      int bytes = 0;
      RuntimeDeviceCheck(cudaDeviceGetAttribute(&bytes, attribute, id), where);
      return bytes;
    };
  };
  return static_cast<std::size_t>(
      opt_in ? detail::per_device<OptIn>(device_id, where, ask(cudaDevAttrMaxSharedMemoryPerBlockOptin))
             : detail::per_device<Default>(device_id, where, ask(cudaDevAttrMaxSharedMemoryPerBlock)));
}

/**
 * \brief The address at which a kernel reaches `tensor`'s data: its own address for GPU memory
 *        (`cuda`, `cuda_managed`), the device alias of page-locked host memory (`cpu` for a
 *        pinned torch tensor, `cuda_host`).
 *
 * Host memory must be pinned (`pin_memory=True`) or registered with `cudaHostRegister`; the alias
 * is looked up with `cudaPointerGetAttributes`, which also resolves an address inside the
 * allocation (a slice of a pinned pool). Pageable host memory, which the GPU would fault on, and
 * any other device type are refused with a `ValueError` that names `name` (e.g. "src").
 */
inline auto get_device_accessible_ptr(
    const tvm::ffi::TensorView& tensor, std::string_view name = "tensor", DebugInfo where = {}) -> void* {
  void* const data = tensor.data_ptr();
  const auto type = tensor.device().device_type;
  if (type == kDLCUDA || type == kDLCUDAManaged) return data;
  RuntimeCheck(
      where,
      type == kDLCPU || type == kDLCUDAHost,
      "'",
      name,
      "' must be in GPU memory or page-locked host memory, got DLPack device type ",
      static_cast<int>(type));
  if (data == nullptr) return nullptr;  // an empty or fake tensor: nothing to translate
  cudaPointerAttributes attributes{};
  const auto error = cudaPointerGetAttributes(&attributes, data);
  if (error != cudaSuccess) cudaGetLastError();  // clear the sticky slot; treated as pageable below
  RuntimeCheck(
      where,
      error == cudaSuccess && attributes.type == cudaMemoryTypeHost && attributes.devicePointer != nullptr,
      "'",
      name,
      "' is in pageable (unpinned) host memory, which the GPU cannot access: allocate it with "
      "pin_memory=True, call .pin_memory() on it, or register it with cudaHostRegister");
  return attributes.devicePointer;
}

namespace detail {

/// sglang passes a device as a `DLDevice` or as its ordinal.
struct DeviceId {
  DeviceId(DLDevice device) : id(device.device_id) {}
  DeviceId(int32_t device_id) : id(device_id) {}
  int32_t id;
};

/// Runs `fn` with `device_id` as the current device: function attributes are set on the current
/// device, which need not be the tensors' one. Only first calls come here, so the switch is cheap.
template <typename Fn>
inline void on_device(int device_id, const DebugInfo& where, Fn&& fn) {
  int current = 0;
  RuntimeDeviceCheck(cudaGetDevice(&current), where);
  if (current == device_id) return fn();
  RuntimeDeviceCheck(cudaSetDevice(device_id), where);
  try {
    fn();
  } catch (...) {
    cudaSetDevice(current);
    throw;
  }
  RuntimeDeviceCheck(cudaSetDevice(current), where);
}

inline void check_device_id(int device_id, const DebugInfo& where) {
  RuntimeCheck(where, device_id >= 0 && device_id < kMaxDevices, "device id ", device_id, " out of range");
}

}  // namespace detail

/**
 * \brief Runs `fn` (e.g. `set_max_dynamic_smem`, `set_smem_carveout`) once per device, with that
 *        device current; later calls for the device cost one atomic load.
 *
 * "Once" is per call site: each lambda has its own type, hence its own record (`Tag` tells apart
 * call sites that share a function object type). Two threads may both run a first call, so `fn`
 * must be idempotent, as attribute setters are; a throwing `fn` is retried on the next call.
 */
template <typename Tag = void, typename Fn>
SGL_MODULE_LOCAL inline void init_per_device(detail::DeviceId device, Fn&& fn, DebugInfo where = {}) {
  static std::array<std::atomic<bool>, detail::kMaxDevices> done{};
  detail::check_device_id(device.id, where);
  if (done[device.id].load(std::memory_order_acquire)) [[likely]]
    return;
  detail::on_device(device.id, where, std::forward<Fn>(fn));
  done[device.id].store(true, std::memory_order_release);
}

/**
 * \brief `set_max_dynamic_smem(kKernel, bytes)` on `device`, only when `bytes` exceeds what an
 *        earlier call set there: per launch this costs one atomic load.
 *
 * The record is the largest size set so far (per kernel and device), not a "done" flag, so a later
 * launch that needs more shared memory still raises the limit. Raising is serialised so that two
 * first calls cannot leave the smaller limit set behind the larger record.
 */
template <auto kKernel>
SGL_MODULE_LOCAL inline void set_max_dynamic_smem_per_device(
    detail::DeviceId device, std::size_t bytes, DebugInfo where = {}) {
  static std::array<std::atomic<std::size_t>, detail::kMaxDevices> granted{};
  static std::mutex raising;
  detail::check_device_id(device.id, where);
  auto& slot = granted[device.id];
  if (bytes <= slot.load(std::memory_order_acquire)) [[likely]]
    return;
  const std::lock_guard lock{raising};
  if (bytes <= slot.load(std::memory_order_relaxed)) return;
  detail::on_device(device.id, where, [&] { set_max_dynamic_smem(kKernel, bytes, where); });
  slot.store(bytes, std::memory_order_release);
}

/**
 * \brief Largest cluster, in blocks of `block_dim` threads, that `kKernel` can run on `device`,
 *        non-portable sizes (above 8) allowed for the kernel; asked once per kernel and
 *        device (pass the largest block the launches use), 1 where the device has no clusters.
 */
template <auto kKernel>
inline auto max_cluster_size_per_device(detail::DeviceId device, uint32_t block_dim, DebugInfo where = {}) -> int {
  struct Tag;
  return detail::per_device<Tag>(device.id, where, [&](int id) {
    if (!has_clusters(id, where)) return 1;
    int size = 0;
    detail::on_device(id, where, [&] {
      RuntimeDeviceCheck(cudaFuncSetAttribute(kKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1), where);
      auto config = cudaLaunchConfig_t{};
      config.gridDim = dim3(16, 1, 1);
      config.blockDim = dim3(block_dim, 1, 1);
      RuntimeDeviceCheck(cudaOccupancyMaxPotentialClusterSize(&size, kKernel, &config), where);
    });
    return size > 0 ? size : 1;
  });
}

}  // namespace host::runtime
