/// \file utils.cuh
/// \brief CUDA essentials: dtype aliases, `SGL_DEVICE`, small device helpers,
/// PDL hooks, and on the host `RuntimeDeviceCheck` and `LaunchKernel`.
///
/// `RuntimeDeviceCheck` messages follow `utils.h`:
///
///     CUDA error at <file>:<line>: <cudaErrorName> (<description>)

#pragma once

#include <sgl_kernel/ffi.h>  // host::ffi: sglang's utils.cuh provides it (0.5.16 on)
#include <sgl_kernel/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cstddef>
#include <cstdint>
#include <cuda.h>  // driver API types: sglang's headers provide them to the kernels that include them
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <optional>
#include <type_traits>
#include <utility>

// Element types, named by width so kernels read the same for every dtype.
using fp32_t = float;
using fp16_t = __half;
using bf16_t = __nv_bfloat16;
using fp8_e4m3_t = __nv_fp8_e4m3;
using fp8_e5m2_t = __nv_fp8_e5m2;

// Packed pairs (and quads) used for vectorized math.
using fp32x2_t = float2;
using fp16x2_t = __half2;
using bf16x2_t = __nv_bfloat162;
using fp8x2_e4m3_t = __nv_fp8x2_e4m3;
using fp8x2_e5m2_t = __nv_fp8x2_e5m2;
using fp32x4_t = float4;
using fp8x4_e4m3_t = __nv_fp8x4_e4m3;
using fp8x4_e5m2_t = __nv_fp8x4_e5m2;

/// \brief Qualifier for device helper functions.
#define SGL_DEVICE __forceinline__ __device__
/// \brief Same, callable from host code too.
#define SGL_DEVICE_HOST __forceinline__ __device__ __host__

/// \brief Read-only (non-coherent cache) load, as sglang.jit_kernel kernels spell it.
#define SGLANG_LDG(arg) __ldg(arg)

/// \brief DLPack's device types for "the GPU" and "pinned host memory", as sglang.jit_kernel
/// kernels spell them (upstream maps them to ROCm there; this library targets CUDA only).
inline constexpr auto kDLGPU = kDLCUDA;
inline constexpr auto kDLGPUHost = kDLCUDAHost;

/**
 * \brief `SGL_CUDA_ARCH`: the compute capability a translation unit is built for (900 for sm_90a),
 * the same number in the host and the device pass, so that `#if` on it and template arguments
 * derived from it agree on both sides.
 *
 * sglang's `load_jit` passes `-DSGL_CUDA_ARCH=...`; ours does not need to: without it the lowest
 * arch of the build is used (nvcc's `__CUDA_ARCH_LIST__`, defined in both passes). With several
 * archs every one of them then takes the oldest arch's path, which is correct on all of them.
 * `__CUDA_ARCH__` is not used for this: it differs between passes, so a host-side
 * `kernel<kMaxVecBytes>` would name an instantiation the device pass never built.
 */
#if !defined(SGL_CUDA_ARCH)
#if defined(__CUDA_ARCH_LIST__)
#define SGL_DETAIL_FIRST_ARCH(first, ...) first
#define SGL_DETAIL_LOWEST_ARCH(...) SGL_DETAIL_FIRST_ARCH(__VA_ARGS__, 0)
#define SGL_CUDA_ARCH SGL_DETAIL_LOWEST_ARCH(__CUDA_ARCH_LIST__)
#else
#define SGL_CUDA_ARCH 0
#endif
#endif

/// \brief Feature tests on `SGL_CUDA_ARCH`, usable in `#if` and in host code.
#define SGL_ARCH_HOPPER_OR_GREATER (SGL_CUDA_ARCH >= 900)
#define SGL_ARCH_BLACKWELL_OR_GREATER ((SGL_CUDA_ARCH >= 1000) && (CUDART_VERSION >= 12090))

namespace device {

inline constexpr uint32_t kWarpThreads = 32;
inline constexpr uint32_t kFullMask = 0xffffffffu;
/// \brief Upstream's other name for `kWarpThreads`.
inline constexpr uint32_t kWarpSize = kWarpThreads;

/// \brief Widest vector one load or store may move on every arch of this build: 32 bytes
/// (256-bit) from Blackwell with CUDA >= 12.9, otherwise 16. See `SGL_CUDA_ARCH`.
inline constexpr std::size_t kMaxVecBytes = SGL_ARCH_BLACKWELL_OR_GREATER ? 32 : 16;

/// \brief `div_ceil` is the host one (`__host__ __device__`): a using-declaration, so that
/// device code finds it unqualified and `using namespace host; using namespace device;` still agree.
using ::host::div_ceil;

/// \brief Programmatic dependent launch (PDL), first half: block until the
/// preceding kernel in the stream has completed and its memory is visible.
/// Put it before the first global read or write that may touch that kernel's
/// data. A no-op below sm_90 or when `kUsePDL` is false, and returns at once
/// when the launch did not enable PDL.
template <bool kUsePDL = true>
SGL_DEVICE void PDLWaitPrimary() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  if constexpr (kUsePDL) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/// \brief PDL, second half: once every block of this grid has called it (or
/// exited), the next kernel in the stream, if launched with PDL, may start and
/// run up to its `PDLWaitPrimary`. Correctness never depends on where it is
/// called: the next kernel's wait still waits for this grid to complete.
template <bool kUsePDL = true>
SGL_DEVICE void PDLTriggerSecondary() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  if constexpr (kUsePDL) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// \brief Read element `offset` of type `T` from an untyped pointer.
template <typename T>
SGL_DEVICE auto load_as(const void* ptr, int64_t offset = 0) -> T {
  return static_cast<const T*>(ptr)[offset];
}

/// \brief Write element `offset` of type `T`. `T` must be spelled out
/// (`store_as<fp16_t>(...)`): deducing it from `value` would silently store a float.
template <typename T>
SGL_DEVICE void store_as(void* ptr, std::type_identity_t<T> value, int64_t offset = 0) {
  static_cast<T*>(ptr)[offset] = value;
}

/// \brief `device::pointer::offset` is the host one: it is `__host__ __device__`
/// under nvcc. An alias (rather than a copy) keeps `using namespace host;`
/// and `using namespace device;` in one scope unambiguous.
namespace pointer = ::host::pointer;

/// \brief Lets ptxas spill registers to shared memory instead of local memory in the calling
/// kernel (a PTX pragma, CUDA 13 on); a no-op with older toolkits and in the host pass.
SGL_DEVICE void enable_smem_spilling() {
#if defined(__CUDA_ARCH__) && CUDART_VERSION >= 13000
  asm volatile(".pragma \"enable_smem_spilling\";");
#endif
}

/**
 * \brief This thread's lane within its group of `kNumThreads` consecutive lanes (a power of two,
 *        at most 32); the warp lane by default (sglang 0.5.23).
 *
 * Reads `%laneid` rather than computing `threadIdx.x % 32`: one register read, which ptxas folds
 * into address arithmetic. The two agree whenever `blockDim.x` is a multiple of 32.
 */
template <uint32_t kNumThreads = kWarpThreads>
SGL_DEVICE uint32_t get_lane_id() {
  static_assert(kNumThreads > 0 && kNumThreads <= kWarpThreads && (kNumThreads & (kNumThreads - 1)) == 0);
  uint32_t lane;
  asm("mov.u32 %0, %%laneid;" : "=r"(lane));
  return lane % kNumThreads;
}

/// \brief Plain register array, e.g. the per-thread payload of warp-wide copies.
template <typename T, std::size_t N>
struct device_vec {
  T data[N];
};

}  // namespace device

/// `namespace sglang` layout (sglang >= 0.5.23), see `utils.h`: `sglang::device` forwards to
/// `::device`, and the element types and device-type names are visible as `sglang::fp16_t` etc.
namespace sglang {
namespace device {
using namespace ::device;
}  // namespace device
using ::bf16_t;
using ::bf16x2_t;
using ::fp16_t;
using ::fp16x2_t;
using ::fp32_t;
using ::fp32x2_t;
using ::fp32x4_t;
using ::fp8_e4m3_t;
using ::fp8_e5m2_t;
using ::fp8x2_e4m3_t;
using ::fp8x2_e5m2_t;
using ::fp8x4_e4m3_t;
using ::fp8x4_e5m2_t;
using ::kDLGPU;
using ::kDLGPUHost;
}  // namespace sglang

/// \brief `CHECK_CUDA(cudaFuncSetAttribute(...)) << "while ...";` throws `host::PanicError`
/// ("Panic at <file>:<line>: cudaErrorX (<description>) while ...") unless the call returned
/// `cudaSuccess` (sglang 0.5.23's stream-style check; `RuntimeDeviceCheck` is the function form).
#ifndef CHECK_CUDA  // a common name: a kernel's own definition, seen first, wins
#define CHECK_CUDA(EXPR)                                                                                          \
  if (const ::cudaError_t sgl_check_cuda_status = (EXPR); sgl_check_cuda_status == ::cudaSuccess) [[likely]] {    \
  } else                                                                                                          \
    SGL_PANIC << ::cudaGetErrorName(sgl_check_cuda_status) << " (" << ::cudaGetErrorString(sgl_check_cuda_status) \
              << ") "
#endif

namespace host {

/// \brief Throws `PanicError` if `error` is not `cudaSuccess`.
///
/// It also clears CUDA's last-error slot first: a failed call (a bad launch
/// configuration, say) leaves its error there, and the next unrelated check,
/// e.g. PyTorch's after its own launch, would report it again.
inline void RuntimeDeviceCheck(cudaError_t error, DebugInfo where = {}) {
  if (error == cudaSuccess) [[likely]]
    return;
  cudaGetLastError();
  details::fail(
      "CUDA error", ErrorKind::RuntimeError, where, cudaGetErrorName(error), " (", cudaGetErrorString(error), ")");
}

/// \brief Checks (and clears) the last CUDA error, e.g. right after a `<<<...>>>` launch.
inline void RuntimeDeviceCheck(DebugInfo where = {}) {
  RuntimeDeviceCheck(cudaGetLastError(), where);
}

/**
 * \brief Launches a kernel through `cudaLaunchKernelEx` and checks the result.
 *
 * \code
 *   LaunchKernel(num_blocks, num_threads, device.unwrap())(kernel, params);
 *   LaunchKernel(grid, block, stream, smem_bytes).enable_pdl(kUsePDL)(kernel, a, b);
 * \endcode
 *
 * Built from a `DLDevice`, it launches on PyTorch's current stream for that
 * device (`resolve_device`) and makes that device current for the launch,
 * restoring the caller's device afterwards: a kernel must run where its
 * tensors are, even when the caller's current device is another GPU.
 * Dynamic shared memory above the 48 KiB default is opted into automatically.
 * Errors name the line that built the launcher.
 */
class LaunchKernel {
 public:
  explicit LaunchKernel(
      dim3 grid_dim, dim3 block_dim, DLDevice device, std::size_t dynamic_smem_bytes = 0, DebugInfo where = {})
      : m_config(make_config(grid_dim, block_dim, resolve_device(device, where), dynamic_smem_bytes)),
        m_device_id(device.device_id),
        m_where(where) {}

  explicit LaunchKernel(
      dim3 grid_dim, dim3 block_dim, cudaStream_t stream, std::size_t dynamic_smem_bytes = 0, DebugInfo where = {})
      : m_config(make_config(grid_dim, block_dim, stream, dynamic_smem_bytes)), m_where(where) {}

  LaunchKernel(const LaunchKernel&) = delete;
  LaunchKernel& operator=(const LaunchKernel&) = delete;

  /// \brief PyTorch's current stream on `device` (as tvm-ffi recorded it for this call).
  static auto resolve_device(DLDevice device, DebugInfo where = {}) -> cudaStream_t {
    RuntimeCheck(
        where,
        device.device_type == kDLCUDA || device.device_type == kDLCUDAManaged,
        "LaunchKernel needs a CUDA device, got device_type=",
        static_cast<int>(device.device_type));
    return static_cast<cudaStream_t>(TVMFFIEnvGetStream(device.device_type, device.device_id));
  }

  /// \brief Allow the next kernel in the stream to overlap with this one's tail
  /// (programmatic stream serialization, sm_90+). Pair with `PDLWaitPrimary`.
  auto enable_pdl(bool enabled = true) -> LaunchKernel& {
    m_pdl = enabled;
    return *this;
  }

  /// \brief Launch as a cooperative grid: every block is resident at once, so
  /// `cooperative_groups::this_grid().sync()` may be used. The grid must not
  /// exceed what fits (`runtime::get_blocks_per_sm` times the SM count).
  auto enable_cooperative(bool enabled = true) -> LaunchKernel& {
    m_cooperative = enabled;
    return *this;
  }

  /// \brief Group the (1-D) grid into clusters of `size` blocks (sm_90+), which
  /// may sync with `cooperative_groups::this_cluster().sync()` and read each
  /// other's shared memory. The grid must be a multiple of `size`; above 8 the
  /// kernel must allow non-portable cluster sizes.
  auto enable_cluster(unsigned size) -> LaunchKernel& {
    m_cluster = dim3(size, 1, 1);
    return *this;
  }

  /// \brief Clusters of `dims` blocks, for multi-dimensional grids (sglang's spelling:
  /// `enable_cluster({1, kClusterSize})`). Each grid dimension must be a multiple of `dims`'.
  auto enable_cluster(dim3 dims) -> LaunchKernel& {
    m_cluster = dims;
    return *this;
  }

  /// \brief Ask the scheduler to spread each cluster's blocks over as many SMs as it can
  /// (`cudaClusterSchedulingPolicySpread`) rather than place them as it prefers (it may put
  /// several of a cluster's blocks on one SM where they fit).
  auto spread_clusters(bool enabled = true) -> LaunchKernel& {
    m_spread_clusters = enabled;
    return *this;
  }

  /// \brief Launch options in one call, as sglang (0.5.16 on) writes them:
  /// `.config({.use_pdl = true, .cluster_dim = dim3{1, 4}}).launch(kernel, args...)`.
  struct KernelConfig {
    bool use_pdl = false;
    std::optional<dim3> cluster_dim = std::nullopt;
  };

  auto config(const KernelConfig& options) -> LaunchKernel& {
    if (options.use_pdl) enable_pdl(true);
    if (options.cluster_dim) enable_cluster(*options.cluster_dim);
    return *this;
  }

  /// \brief The same as calling the launcher: `launch(kernel, args...)`.
  template <typename Kernel, typename... Args>
  auto launch(Kernel&& kernel, Args&&... args) const -> void {
    (*this)(std::forward<Kernel>(kernel), std::forward<Args>(args)...);
  }

  template <typename Kernel, typename... Args>
  auto operator()(Kernel&& kernel, Args&&... args) const -> void {
    const CurrentDevice guard{m_device_id, m_where};
    auto config = m_config;
    cudaLaunchAttribute attributes[4]{};
    unsigned int count = 0;
    if (m_pdl) {
      attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attributes[count++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (m_cooperative) {
      attributes[count].id = cudaLaunchAttributeCooperative;
      attributes[count++].val.cooperative = 1;
    }
    if (m_cluster.x * m_cluster.y * m_cluster.z > 1) {
      attributes[count].id = cudaLaunchAttributeClusterDimension;
      attributes[count].val.clusterDim.x = m_cluster.x;
      attributes[count].val.clusterDim.y = m_cluster.y;
      attributes[count++].val.clusterDim.z = m_cluster.z;
      if (m_spread_clusters) {
        attributes[count].id = cudaLaunchAttributeClusterSchedulingPolicyPreference;
        attributes[count++].val.clusterSchedulingPolicyPreference = cudaClusterSchedulingPolicySpread;
      }
    }
    config.attrs = count > 0 ? attributes : nullptr;
    config.numAttrs = count;
    if (config.dynamicSmemBytes > kDefaultSmemLimit) {
      RuntimeDeviceCheck(
          cudaFuncSetAttribute(
              kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(config.dynamicSmemBytes)),
          m_where);
    }
    RuntimeDeviceCheck(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), m_where);
  }

 private:
  static constexpr std::size_t kDefaultSmemLimit = 48 * 1024;

  /// \brief Makes `device_id` current for its lifetime (if it is not already);
  /// `-1` means "leave the current device alone" (stream-based launches).
  class CurrentDevice {
   public:
    CurrentDevice(int device_id, const DebugInfo& where) {
      if (device_id < 0) return;
      RuntimeDeviceCheck(cudaGetDevice(&m_previous), where);
      if (m_previous == device_id) return;
      RuntimeDeviceCheck(cudaSetDevice(device_id), where);
      m_switched = true;
    }
    CurrentDevice(const CurrentDevice&) = delete;
    CurrentDevice& operator=(const CurrentDevice&) = delete;
    ~CurrentDevice() {
      if (m_switched) cudaSetDevice(m_previous);  // cannot throw from here; restoring rarely fails
    }

   private:
    int m_previous = -1;
    bool m_switched = false;
  };

  static auto make_config(dim3 grid_dim, dim3 block_dim, cudaStream_t stream, std::size_t smem) -> cudaLaunchConfig_t {
    auto config = cudaLaunchConfig_t{};
    config.gridDim = grid_dim;
    config.blockDim = block_dim;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    config.attrs = nullptr;
    config.numAttrs = 0;
    return config;
  }

  cudaLaunchConfig_t m_config;
  int m_device_id = -1;
  bool m_pdl = false;
  bool m_cooperative = false;
  dim3 m_cluster{1, 1, 1};
  bool m_spread_clusters = false;
  DebugInfo m_where;
};

}  // namespace host
