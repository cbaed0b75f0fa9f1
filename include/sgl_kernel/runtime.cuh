/// \file runtime.cuh
/// \brief Host-side queries of the CUDA runtime (occupancy, device
/// properties), each checked with `RuntimeDeviceCheck`.
///
/// They cost a driver call each. Results that cannot change are cached per device
/// (`sm_count`, `has_clusters`): a function-local `static` would keep the first
/// device's answer for every device of the process.

#pragma once

#include <sgl_kernel/utils.cuh>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

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

namespace detail {

inline constexpr int kMaxDevices = 64;

/// One answer per device, asked once: `ask(device_id)` must return a value > 0.
template <typename Tag, typename Ask>
inline auto per_device(int device_id, DebugInfo where, Ask&& ask) -> int {
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

/// \brief Major compute capability of device `device_id` (9 on H100).
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

}  // namespace host::runtime
