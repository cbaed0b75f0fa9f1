// Fixture: the HiCache KV-cache transfer kernel of the walkthrough of SGLang's JIT kernel system
// (§0x3.1-0x3.3). The walkthrough shows excerpts; the code it shows is kept as written. Marked
// "[filled in]" are only the pieces the excerpts leave out (mem_package_t, store_vec, the params
// struct, the template head and the launch variables).
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>

#include <dlpack/dlpack.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

// ---- §0x3.1 -----------------------------------------------------------------
namespace device::warp {

namespace details {
  // [filled in] the package one lane moves per step
  template <std::size_t kBytes, std::size_t kUnit>
  using mem_package_t = std::conditional_t<kUnit == 16, uint4, std::conditional_t<kUnit == 8, uint2, uint1>>;

  // 非缓存加载(使用.cs修饰符)
  __always_inline __device__ auto load_nc(const uint4* __restrict__ src) -> uint4 {
    uint32_t tmp0, tmp1, tmp2, tmp3;
    asm volatile(
      "ld.global.cs.v4.b32 {%0,%1,%2,%3},[%4];"
      : "=r"(tmp0), "=r"(tmp1), "=r"(tmp2), "=r"(tmp3)
      : "l"(src)
    );
    return uint4{tmp0, tmp1, tmp2, tmp3};
  }

  __always_inline __device__ void store_nc(uint4* __restrict__ dst, const uint4& value) {
    uint32_t tmp0 = value.x, tmp1 = value.y, tmp2 = value.z, tmp3 = value.w;
    asm volatile(
      "st.global.cs.v4.b32 [%0],{%1,%2,%3,%4};"
      :: "l"(dst), "r"(tmp0), "r"(tmp1), "r"(tmp2), "r"(tmp3)
    );
  }
}

template <std::size_t kBytes, std::size_t kUnit, std::size_t kThreads>
__always_inline __device__ auto load_vec(const void* __restrict__ src) {
  using Package = details::mem_package_t<kBytes, kUnit>;
  constexpr auto kBytesPerLoop = sizeof(Package) * kThreads;
  constexpr auto kLoopCount = kBytes / kBytesPerLoop;

  const auto src_packed = static_cast<const Package*>(src);
  const auto lane_id = threadIdx.x % kThreads;
  device_vec<Package, kLoopCount> vec;

  #pragma unroll kLoopCount
  for (std::size_t i = 0; i < kLoopCount; ++i) {
    const auto j = i * kThreads + lane_id;
    vec.data[i] = details::load_nc(src_packed + j);
  }

  return vec;
}

// [filled in] the store counterpart the seed uses but does not show
template <std::size_t kBytes, std::size_t kUnit, std::size_t kThreads, typename Tp>
__always_inline __device__ void store_vec(void* __restrict__ dst, const Tp& vec) {
  using Package = details::mem_package_t<kBytes, kUnit>;
  constexpr auto kLoopCount = kBytes / (sizeof(Package) * kThreads);
  const auto dst_packed = static_cast<Package*>(dst);
  const auto lane_id = threadIdx.x % kThreads;
  #pragma unroll kLoopCount
  for (std::size_t i = 0; i < kLoopCount; ++i) {
    details::store_nc(dst_packed + i * kThreads + lane_id, vec.data[i]);
  }
}

}  // namespace device::warp

namespace {

// [filled in]
struct HicacheKernelParams {
  void* __restrict__ k_cache_dst;
  void* __restrict__ v_cache_dst;
  const void* __restrict__ indices_dst;
  void* __restrict__ k_cache_src;
  void* __restrict__ v_cache_src;
  const void* __restrict__ indices_src;
  std::size_t length;
  std::size_t kv_cache_src_stride;
  std::size_t kv_cache_dst_stride;
  std::size_t num_layers = 0;
};

// ---- §0x3.2 -----------------------------------------------------------------
template <
    std::integral T,
    std::size_t kElementSize,
    std::size_t kUnroll,
    std::size_t kBlockQuota,
    std::size_t kNumThreads,
    std::size_t kMaxOccupancy>
__global__ __launch_bounds__(kNumThreads, kMaxOccupancy)
void hicache_transfer_per_layer(const __grid_constant__ HicacheKernelParams params) {
  using namespace device;

  constexpr auto kWarpThreads = device::kWarpThreads / kUnroll;
  constexpr auto kWarpsPerBlock = kNumThreads / kWarpThreads;
  constexpr auto kWorkers = kWarpsPerBlock * kBlockQuota;
  constexpr auto kGranularity = 128 / kWarpThreads;

  const auto& [
    k_cache_dst, v_cache_dst, indices_dst,
    k_cache_src, v_cache_src, indices_src,
    length, kv_cache_src_stride, kv_cache_dst_stride, _
  ] = params;

  const auto warp_id = blockIdx.x * kWarpsPerBlock + threadIdx.x / kWarpThreads;

  for (auto i = warp_id; i < length; i += kWorkers) {
    const auto pos_src = static_cast<const T*>(indices_src)[i];
    const auto pos_dst = static_cast<const T*>(indices_dst)[i];

    const auto src_k = pointer::offset(k_cache_src, pos_src * kv_cache_src_stride);
    const auto dst_k = pointer::offset(k_cache_dst, pos_dst * kv_cache_dst_stride);
    const auto src_v = pointer::offset(v_cache_src, pos_src * kv_cache_src_stride);
    const auto dst_v = pointer::offset(v_cache_dst, pos_dst * kv_cache_dst_stride);

    const auto vec_k = warp::load_vec<kElementSize, kGranularity, kWarpThreads>(src_k);
    const auto vec_v = warp::load_vec<kElementSize, kGranularity, kWarpThreads>(src_v);
    warp::store_vec<kElementSize, kGranularity, kWarpThreads>(dst_k, vec_k);
    warp::store_vec<kElementSize, kGranularity, kWarpThreads>(dst_v, vec_v);
  }
}

// ---- §0x3.3 -----------------------------------------------------------------
template <  // [filled in] the seed writes `template <...>`
    std::size_t kElementSize,
    std::size_t kUnroll,
    std::size_t kBlockQuota,
    std::size_t kNumThreads,
    std::size_t kMaxOccupancy>
struct HiCacheKernel {
  // [filled in]
  template <typename T>
  static constexpr auto _kernel_one =
      hicache_transfer_per_layer<T, kElementSize, kUnroll, kBlockQuota, kNumThreads, kMaxOccupancy>;

  static void run_one(
      const tvm::ffi::TensorView k_cache_dst,
      const tvm::ffi::TensorView v_cache_dst,
      const tvm::ffi::TensorView indices_dst,
      const tvm::ffi::TensorView k_cache_src,
      const tvm::ffi::TensorView v_cache_src,
      const tvm::ffi::TensorView indices_src) {
    using namespace host;

    auto D = SymbolicSize{"head dimension"};
    auto N = SymbolicSize{"src kv stride"};
    auto M = SymbolicSize{"dst kv stride"};
    auto L = SymbolicSize{"indices length"};
    auto cache_dtype = SymbolicDType{};
    auto indices_dtype = SymbolicDType{};
    auto indices_device = SymbolicDevice{};

    // 验证cache tensor
    TensorMatcher({-1, D})  //
        .with_strides({N, 1})
        .with_dtype(cache_dtype)
        .with_device<kDLCUDA, kDLCUDAHost, kDLCPU>()
        .verify(k_cache_src)
        .verify(v_cache_src);

    TensorMatcher({-1, D})  //
        .with_strides({M, 1})
        .with_dtype(cache_dtype)
        .with_device<kDLCUDA, kDLCUDAHost, kDLCPU>()
        .verify(k_cache_dst)
        .verify(v_cache_dst);

    // 验证indices
    TensorMatcher({L})  //
        .with_dtype<int32_t, int64_t>(indices_dtype)
        .with_device<kDLCUDA>(indices_device)
        .verify(indices_src)
        .verify(indices_dst);

    // 检查编译期和运行时参数一致
    const auto dtype_size = dtype_bytes(cache_dtype.unwrap());
    const auto element_bytes = D.unwrap() * dtype_size;
    RuntimeCheck(kElementSize == element_bytes,
                 "HicacheKernel: cache dimension mismatch.");

    // 启动kernel
    const auto length = static_cast<std::size_t>(L.unwrap());
    constexpr auto kWorkersPerBlock = kNumThreads / (device::kWarpThreads / kUnroll);
    const auto num_blocks = std::min(div_ceil(length, kWorkersPerBlock), kBlockQuota);

    // [filled in]
    const auto device = indices_device.unwrap();
    const auto use_int32 = indices_dtype.unwrap().bits == 32;
    const auto params = HicacheKernelParams{
        .k_cache_dst = k_cache_dst.data_ptr(),
        .v_cache_dst = v_cache_dst.data_ptr(),
        .indices_dst = indices_dst.data_ptr(),
        .k_cache_src = k_cache_src.data_ptr(),
        .v_cache_src = v_cache_src.data_ptr(),
        .indices_src = indices_src.data_ptr(),
        .length = length,
        .kv_cache_src_stride = static_cast<std::size_t>(N.unwrap()) * dtype_size,
        .kv_cache_dst_stride = static_cast<std::size_t>(M.unwrap()) * dtype_size,
    };
    const auto kernel = use_int32 ? _kernel_one<int32_t> : _kernel_one<int64_t>;
    LaunchKernel(num_blocks, kNumThreads, device)(kernel, params);
  }
};

}  // namespace
