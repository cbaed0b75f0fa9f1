// GPU cases for the `gpu`-marked tests of tests/test_headers.py: each launcher
// validates its tensors with TensorMatcher, launches with LaunchKernel and
// exercises one header, so the tests can compare against PyTorch.
//
// Functions (namespace gpu_cases):
//   block_reduce, atomic_extrema, vec_scale, cast_from_float, cast_to_float,
//   math_ops, stream_copy, fill_index, pdl_chain, big_smem, runtime_info,
//   bad_launch, cluster_reduce, warp_exchange, absmax_nonneg, store_if, bulk_ring, device_address

#include <sgl_kernel/atomic.cuh>
#include <sgl_kernel/cluster.cuh>
#include <sgl_kernel/cta.cuh>
#include <sgl_kernel/math.cuh>
#include <sgl_kernel/mbarrier.cuh>
#include <sgl_kernel/runtime.cuh>
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/tile.cuh>
#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>
#include <sgl_kernel/vec.cuh>
#include <sgl_kernel/warp.cuh>

#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>

#include <cmath>
#include <cstdint>

namespace gpu_cases {

using tvm::ffi::TensorView;

inline constexpr uint32_t kBlock = 256;

// ---- cta.cuh / warp.cuh: out[b] = [sum, max, min, absmax, sum(x[32:64]), sum(x[8:16])] of row b

__global__ void block_reduce_kernel(const float* x, float* out) {
  using namespace device;
  __shared__ float smem[32];
  const float v = x[blockIdx.x * blockDim.x + threadIdx.x];
  float* row = out + blockIdx.x * 6;
  cta::reduce_sum(v, smem);
  __syncthreads();
  if (threadIdx.x == 0) row[0] = smem[0];
  __syncthreads();
  cta::reduce_max(v, smem, -INFINITY);
  __syncthreads();
  if (threadIdx.x == 0) row[1] = smem[0];
  __syncthreads();
  cta::reduce_min(v, smem, INFINITY);
  __syncthreads();
  if (threadIdx.x == 0) row[2] = smem[0];
  __syncthreads();
  cta::reduce_max(math::abs(v), smem);
  __syncthreads();
  if (threadIdx.x == 0) row[3] = smem[0];
  const float warp_sum = warp::reduce_sum(v);
  if (threadIdx.x == 32) row[4] = warp_sum;
  const float group_sum = warp::reduce_sum<float, 8>(v);
  if (threadIdx.x == 8) row[5] = group_sum;
}

// x [rows, kBlock] float -> out [rows, kOutWidth] float, one block of kBlock threads per row.
template <int64_t kOutWidth>
void launch_per_row(void (*kernel)(const float*, float*), TensorView x, TensorView out) {
  using namespace host;
  auto B = SymbolicSize{"rows"};
  auto device = SymbolicDevice{};
  TensorMatcher({B, kBlock}).with_dtype<float>().with_device<kDLCUDA>(device).verify(x);
  TensorMatcher({B, kOutWidth}).with_dtype<float>().with_device(device).verify(out);
  LaunchKernel(B.unwrap(), kBlock, device.unwrap())(
      kernel, static_cast<const float*>(x.data_ptr()), static_cast<float*>(out.data_ptr()));
}

inline void block_reduce(TensorView x, TensorView out) {
  launch_per_row<6>(block_reduce_kernel, x, out);
}

// ---- warp.cuh reduce_max_nonneg and cta.cuh all_reduce_max_nonneg (redux.sync on the bits of
// absolute values): out[b] = [block max seen by thread 0, by the last thread, max over warp 1]

__global__ void absmax_nonneg_kernel(const float* x, float* out) {
  using namespace device;
  __shared__ float smem[32];
  const float v = fabsf(x[blockIdx.x * blockDim.x + threadIdx.x]);
  float* row = out + blockIdx.x * 3;
  const float block = cta::all_reduce_max_nonneg(v, smem);
  if (threadIdx.x == 0) row[0] = block;
  if (threadIdx.x == blockDim.x - 1) row[1] = block;
  const float warp = warp::reduce_max_nonneg(v);
  if (threadIdx.x == 63) row[2] = warp;
}

inline void absmax_nonneg(TensorView x, TensorView out) {
  launch_per_row<3>(absmax_nonneg_kernel, x, out);
}

// ---- vec.cuh store_if: thread t of the block stores its 4-, 8- and 16-byte vectors of x into out
// where t % 3 != 0 (rows of 256 floats: 64 x 16, 128 x 8 and 256 x 4 bytes; out untouched elsewhere).

__global__ void store_if_kernel(const float* x, float* out) {
  using namespace device;
  const int t = threadIdx.x;
  const bool ok = t % 3 != 0;
  const float* src = x + blockIdx.x * 256;
  float* dst = out + blockIdx.x * 768;
  AlignedVector<float, 4> v4;
  AlignedVector<float, 2> v2;
  AlignedVector<float, 1> v1;
  if (t < 64) v4.load(src, t);
  if (t < 128) v2.load(src, t);
  v1.load(src, t);
  if (t < 64) v4.store_if(ok, dst, t);
  if (t < 128) v2.store_if(ok, dst + 256, t);
  v1.store_if(ok, dst + 512, t);
}

inline void store_if(TensorView x, TensorView out) {
  using namespace host;
  auto B = SymbolicSize{"rows"};
  auto device = SymbolicDevice{};
  TensorMatcher({B, 256}).with_dtype<float>().with_device<kDLCUDA>(device).verify(x);
  TensorMatcher({B, 768}).with_dtype<float>().with_device(device).verify(out);
  LaunchKernel(B.unwrap(), 256, device.unwrap())(
      store_if_kernel, static_cast<const float*>(x.data_ptr()), static_cast<float*>(out.data_ptr()));
}

// ---- cta.cuh all_reduce_* and cluster.cuh: clusters of kClusterSize rows; out[b] = [sum, max] over
// the cluster of row b (every block writes its own copy), then the block's own sum.

inline constexpr unsigned kClusterSize = 4;

__global__ void cluster_reduce_kernel(const float* x, float* out) {
  using namespace device;
  __shared__ float smem[32];
  __shared__ float sums[kClusterSize];
  __shared__ float maxima[kClusterSize];
  const float v = x[blockIdx.x * blockDim.x + threadIdx.x];
  const float block_sum = cta::all_reduce_sum(v, smem);
  __syncthreads();  // smem is reused
  const float block_max = cta::all_reduce_max(v, smem, -INFINITY);
  const float sum = cluster::all_reduce<kClusterSize>(block_sum, sums, [](float a, float b) { return a + b; });
  const float max = cluster::all_reduce<kClusterSize>(block_max, maxima, [](float a, float b) { return fmaxf(a, b); });
  if (threadIdx.x == 0) {
    out[blockIdx.x * 4 + 0] = sum;
    out[blockIdx.x * 4 + 1] = max;
    out[blockIdx.x * 4 + 2] = block_sum;
    out[blockIdx.x * 4 + 3] = static_cast<float>(cluster::block_rank());
  }
}

inline void cluster_reduce(TensorView x, TensorView out) {
  using namespace host;
  auto B = SymbolicSize{"rows"};
  auto device = SymbolicDevice{};
  TensorMatcher({B, kBlock}).with_dtype<float>().with_device<kDLCUDA>(device).verify(x);
  TensorMatcher({B, 4}).with_dtype<float>().with_device(device).verify(out);
  RuntimeCheck(B.unwrap() % kClusterSize == 0, "rows must be a multiple of ", kClusterSize);
  LaunchKernel(B.unwrap(), kBlock, device.unwrap())
      .enable_cluster(kClusterSize)(
          cluster_reduce_kernel, static_cast<const float*>(x.data_ptr()), static_cast<float*>(out.data_ptr()));
}

// ---- cluster.cuh WarpExchange: each row of 512 values over a cluster of 4 blocks of 128 threads;
// out[r] = [its sum, its absolute maximum (two rounds)]; the same row's sum by cta::all_reduce_sum
// over one block of 512 threads into out[r][2] (the exchange promises those bits).

__global__ void warp_exchange_kernel(const float* x, float* out) {
  __shared__ device::cluster::WarpExchange<kClusterSize, 4, 2> exchange;
  exchange.init();
  const unsigned row = blockIdx.x / kClusterSize;
  const float v = x[row * 512 + device::cluster::block_rank() * 128 + threadIdx.x];
  const float sum = exchange.all_reduce_sum<0>(v);
  const float max = exchange.all_reduce_max_nonneg<1>(fabsf(v));
  if (device::cluster::block_rank() == 1 && threadIdx.x == 37) {  // any thread: all agree
    out[row * 3 + 0] = sum;
    out[row * 3 + 1] = max;
  }
}

__global__ void block_sum_kernel(const float* x, float* out) {
  __shared__ float smem[32];
  const float sum = device::cta::all_reduce_sum(x[blockIdx.x * 512 + threadIdx.x], smem);
  if (threadIdx.x == 0) out[blockIdx.x * 3 + 2] = sum;
}

inline void warp_exchange(TensorView x, TensorView out) {
  using namespace host;
  auto B = SymbolicSize{"rows"};
  auto device = SymbolicDevice{};
  TensorMatcher({B, 512}).with_dtype<float>().with_device<kDLCUDA>(device).verify(x);
  TensorMatcher({B, 3}).with_dtype<float>().with_device(device).verify(out);
  const auto* in = static_cast<const float*>(x.data_ptr());
  auto* dst = static_cast<float*>(out.data_ptr());
  LaunchKernel(B.unwrap() * kClusterSize, 128, device.unwrap()).enable_cluster(kClusterSize)(warp_exchange_kernel, in, dst);
  LaunchKernel(B.unwrap(), 512, device.unwrap())(block_sum_kernel, in, dst);
}

// ---- atomic.cuh: out = [max(x), min(x)], starting from out's values

__global__ void atomic_extrema_kernel(const float* x, float* out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  device::atomic::max(out, x[i]);
  device::atomic::min(out + 1, x[i]);
}

inline void atomic_extrema(TensorView x, TensorView out) {
  using namespace host;
  auto N = SymbolicSize{"n"};
  auto device = SymbolicDevice{};
  TensorMatcher({N}).with_dtype<float>().with_device<kDLCUDA>(device).verify(x);
  TensorMatcher({2}).with_dtype<float>().with_device(device).verify(out);
  const auto n = N.unwrap();
  LaunchKernel(div_ceil(n, int64_t{kBlock}), kBlock, device.unwrap())(
      atomic_extrema_kernel, static_cast<const float*>(x.data_ptr()), static_cast<float*>(out.data_ptr()), n);
}

// ---- vec.cuh / tile.cuh / type.cuh: dst = src * 2 through packed fp32 math

template <typename T>
__global__ void vec_scale_kernel(void* dst, const void* src, int64_t num_vecs) {
  using namespace device;
  using vec_t = AlignedVector<packed_t<T>, 4>;
  const auto mem = tile::Memory<vec_t>::cta();
  for (int64_t k = 0; mem.in_bound(num_vecs, k); ++k) {
    vec_t v = mem.load(src, k);
#pragma unroll
    for (std::size_t i = 0; i < vec_t::size(); ++i) {
      const auto f = cast<fp32x2_t>(v[i]);
      v[i] = cast<packed_t<T>>(fp32x2_t{f.x * 2.0f, f.y * 2.0f});
    }
    mem.store(dst, v, k);
  }
}

inline void vec_scale(TensorView dst, TensorView src) {
  using namespace host;
  auto N = SymbolicSize{"n"};
  auto dtype = SymbolicDType{};
  auto device = SymbolicDevice{};
  TensorMatcher({N}).with_dtype<fp16_t, bf16_t>(dtype).with_device<kDLCUDA>(device).verify(dst).verify(src);
  const auto n = N.unwrap();
  RuntimeCheck(n % 8 == 0, "vec_scale needs a multiple of 8 elements, got ", n);
  const auto kernel = dtype.is_type<fp16_t>() ? vec_scale_kernel<fp16_t> : vec_scale_kernel<bf16_t>;
  LaunchKernel(1, kBlock, device.unwrap())(kernel, dst.data_ptr(), src.data_ptr(), n / 8);
}

// ---- type.cuh: float -> fp16 / bf16 / fp8 and back

__global__ void cast_from_float_kernel(const float* src, fp16_t* h, bf16_t* b, fp8_e4m3_t* q, int64_t n) {
  using device::cast;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  h[i] = cast<fp16_t>(src[i]);
  b[i] = dtype_trait<bf16_t>::from(src[i]);
  q[i] = cast<fp8_e4m3_t>(src[i]);
}

inline void cast_from_float(TensorView src, TensorView h, TensorView b, TensorView q) {
  using namespace host;
  auto N = SymbolicSize{"n"};
  auto device = SymbolicDevice{};
  TensorMatcher({N}).with_dtype<float>().with_device<kDLCUDA>(device).verify(src);
  TensorMatcher({N}).with_dtype<fp16_t>().with_device(device).verify(h);
  TensorMatcher({N}).with_dtype<bf16_t>().with_device(device).verify(b);
  TensorMatcher({N}).with_dtype<fp8_e4m3_t>().with_device(device).verify(q);
  const auto n = N.unwrap();
  LaunchKernel(div_ceil(n, int64_t{kBlock}), kBlock, device.unwrap())(
      cast_from_float_kernel,
      static_cast<const float*>(src.data_ptr()),
      static_cast<fp16_t*>(h.data_ptr()),
      static_cast<bf16_t*>(b.data_ptr()),
      static_cast<fp8_e4m3_t*>(q.data_ptr()),
      n);
}

__global__ void cast_to_float_kernel(const fp16_t* h, const bf16_t* b, const fp8_e4m3_t* q, float* out, int64_t n) {
  using device::cast;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = cast<fp32_t>(h[i]);
  out[n + i] = cast<fp32_t>(b[i]);
  out[2 * n + i] = cast<fp32_t>(q[i]);
}

inline void cast_to_float(TensorView h, TensorView b, TensorView q, TensorView out) {
  using namespace host;
  auto N = SymbolicSize{"n"};
  auto device = SymbolicDevice{};
  TensorMatcher({N}).with_dtype<fp16_t>().with_device<kDLCUDA>(device).verify(h);
  TensorMatcher({N}).with_dtype<bf16_t>().with_device(device).verify(b);
  TensorMatcher({N}).with_dtype<fp8_e4m3_t>().with_device(device).verify(q);
  TensorMatcher({3, N}).with_dtype<float>().with_device(device).verify(out);
  const auto n = N.unwrap();
  LaunchKernel(div_ceil(n, int64_t{kBlock}), kBlock, device.unwrap())(
      cast_to_float_kernel,
      static_cast<const fp16_t*>(h.data_ptr()),
      static_cast<const bf16_t*>(b.data_ptr()),
      static_cast<const fp8_e4m3_t*>(q.data_ptr()),
      static_cast<float*>(out.data_ptr()),
      n);
}

// ---- math.cuh: out = [abs, sqrt|x|, rsqrt(|x|+1), exp, sin, cos, max(x, 0), min(x, 0)] of x

__global__ void math_ops_kernel(const float* x, float* out, int64_t n) {
  using namespace device;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = x[i];
  out[i] = math::abs(v);
  out[n + i] = math::sqrt(math::abs(v));
  out[2 * n + i] = math::rsqrt(math::abs(v) + 1.0f);
  out[3 * n + i] = math::exp(v);
  out[4 * n + i] = math::sin(v);
  out[5 * n + i] = math::cos(v);
  out[6 * n + i] = math::max(v, 0.0f);
  out[7 * n + i] = cast<float>(math::min(cast<fp16_t>(v), cast<fp16_t>(0.0f)));
}

inline void math_ops(TensorView x, TensorView out) {
  using namespace host;
  auto N = SymbolicSize{"n"};
  auto device = SymbolicDevice{};
  TensorMatcher({N}).with_dtype<float>().with_device<kDLCUDA>(device).verify(x);
  TensorMatcher({8, N}).with_dtype<float>().with_device(device).verify(out);
  const auto n = N.unwrap();
  LaunchKernel(div_ceil(n, int64_t{kBlock}), kBlock, device.unwrap())(
      math_ops_kernel, static_cast<const float*>(x.data_ptr()), static_cast<float*>(out.data_ptr()), n);
}

// ---- warp.cuh streaming copies: rows of 512 bytes, by whole warps and by 8-lane groups

template <std::size_t kThreads>
__global__ void stream_copy_kernel(void* dst, const void* src, int64_t rows) {
  using namespace device;
  constexpr std::size_t kRowBytes = 512;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kThreads;
  if (row >= rows) return;
  const auto offset = row * static_cast<int64_t>(kRowBytes);
  if constexpr (kThreads == kWarpThreads) {
    warp::copy<kRowBytes>(pointer::offset(dst, offset), pointer::offset(src, offset));
  } else {
    const auto vec = warp::load_vec<kRowBytes, 16, kThreads>(pointer::offset(src, offset));
    warp::store_vec<kRowBytes, 16, kThreads>(pointer::offset(dst, offset), vec);
  }
}

inline void stream_copy(TensorView dst, TensorView src, int64_t group_threads) {
  using namespace host;
  auto R = SymbolicSize{"rows"};
  auto device = SymbolicDevice{};
  TensorMatcher({R, 512}).with_dtype<uint8_t>().with_device<kDLCUDA>(device).verify(dst).verify(src);
  const auto rows = R.unwrap();
  const auto blocks = div_ceil(rows * group_threads, int64_t{kBlock});
  RuntimeCheck(group_threads == 32 || group_threads == 8, "group_threads must be 32 or 8");
  const auto kernel = group_threads == 32 ? stream_copy_kernel<32> : stream_copy_kernel<8>;
  LaunchKernel(blocks, kBlock, device.unwrap())(kernel, dst.data_ptr(), src.data_ptr(), rows);
}

// ---- utils.cuh: launching on the tensors' device, PDL, large dynamic shared memory

__global__ void fill_index_kernel(int32_t* x, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = static_cast<int32_t>(i);
}

// Returns the caller's current device after the launch (it must be unchanged).
inline auto fill_index(TensorView x) -> int64_t {
  using namespace host;
  auto N = SymbolicSize{"n"};
  auto device = SymbolicDevice{};
  TensorMatcher({N}).with_dtype<int32_t>().with_device<kDLCUDA>(device).verify(x);
  const auto n = N.unwrap();
  LaunchKernel(div_ceil(n, int64_t{kBlock}), kBlock, device.unwrap())(
      fill_index_kernel, static_cast<int32_t*>(x.data_ptr()), n);
  int current = -1;
  RuntimeDeviceCheck(cudaGetDevice(&current));
  return current;
}

__global__ void pdl_producer(int32_t* x, int64_t n) {
  device::PDLWaitPrimary();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = static_cast<int32_t>(i);
  device::PDLTriggerSecondary();
}

__global__ void pdl_consumer(int32_t* x, int64_t n) {
  device::PDLWaitPrimary();  // the producer's writes are visible after this
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1;
  device::PDLTriggerSecondary();
}

inline void pdl_chain(TensorView x) {
  using namespace host;
  auto N = SymbolicSize{"n"};
  auto device = SymbolicDevice{};
  TensorMatcher({N}).with_dtype<int32_t>().with_device<kDLCUDA>(device).verify(x);
  const auto n = N.unwrap();
  const auto blocks = div_ceil(n, int64_t{kBlock});
  auto* data = static_cast<int32_t*>(x.data_ptr());
  LaunchKernel(blocks, kBlock, device.unwrap()).enable_pdl()(pdl_producer, data, n);
  LaunchKernel(blocks, kBlock, device.unwrap()).enable_pdl()(pdl_consumer, data, n);
}

// Reverses x (1024 floats) through 96 KiB of dynamic shared memory: needs the opt-in above 48 KiB.
__global__ void big_smem_kernel(float* x) {
  extern __shared__ float smem[];
  constexpr unsigned kStride = 96 * 1024 / sizeof(float) / 1024;  // spread over all 96 KiB
  smem[threadIdx.x * kStride] = x[threadIdx.x];
  __syncthreads();
  x[threadIdx.x] = smem[(blockDim.x - 1 - threadIdx.x) * kStride];
}

inline void big_smem(TensorView x) {
  using namespace host;
  auto device = SymbolicDevice{};
  TensorMatcher({1024}).with_dtype<float>().with_device<kDLCUDA>(device).verify(x);
  LaunchKernel(1, 1024, device.unwrap(), 96 * 1024)(big_smem_kernel, static_cast<float*>(x.data_ptr()));
}

// ---- runtime.cuh: [sm_count, cc_major, runtime_version, blocks_per_sm, available_smem]

inline auto runtime_info(int64_t device_id) -> tvm::ffi::Array<int64_t> {
  using namespace host;
  const auto id = static_cast<int>(device_id);
  RuntimeDeviceCheck(cudaSetDevice(id));
  return {
      runtime::get_sm_count(id),
      runtime::get_cc_major(id),
      runtime::get_runtime_version(),
      runtime::get_blocks_per_sm(block_reduce_kernel, kBlock),
      static_cast<int64_t>(runtime::get_available_dynamic_smem_per_block(block_reduce_kernel, 1, kBlock)),
  };
}

// ---- mbarrier.cuh + runtime::get_device_accessible_ptr: dst = src (uint8, a multiple of 16 bytes)
// through a 3-stage shared-memory ring: thread 0 fills stages with bulk loads, thread 32 drains them
// with bulk stores. src and dst may each be GPU or pinned host memory.

__global__ void bulk_ring_kernel(const uint8_t* src, uint8_t* dst, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  using namespace device::ptx;
  constexpr uint32_t kStages = 3;
  constexpr uint32_t kStage = 8192;
  __shared__ alignas(128) uint8_t ring[kStages][kStage];
  __shared__ uint64_t full[kStages];
  __shared__ uint64_t empty[kStages];
  if (threadIdx.x == 0) {
    for (uint32_t s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 1);
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  const uint32_t chunks = host::div_ceil(bytes, kStage);
  for (uint32_t c = 0; c < chunks; ++c) {
    const uint32_t s = c % kStages;
    const uint32_t phase = (c / kStages) & 1;
    const uint32_t n = min(kStage, bytes - c * kStage);
    if (threadIdx.x == 0) {
      mbar_wait_parity(&empty[s], phase ^ 1);
      mbar_arrive_expect_tx(&full[s], n);
      bulk_g2s(ring[s], src + c * kStage, n, &full[s]);
    } else if (threadIdx.x == 32) {
      mbar_wait_parity(&full[s], phase);
      bulk_s2g(dst + c * kStage, ring[s], n);
      bulk_commit_group();
      bulk_wait_group_read<0>();
      mbar_arrive(&empty[s]);
    }
  }
  if (threadIdx.x == 32) bulk_wait_group<0>();
#else
  (void)src, (void)dst, (void)bytes;
  __trap();
#endif
}

inline void bulk_ring(TensorView dst, TensorView src, int64_t device_id) {
  using namespace host;
  auto n = SymbolicSize{"bytes"};
  // One matcher each: the two may live on different devices (GPU and pinned host).
  TensorMatcher({n}).with_dtype<uint8_t>().with_device<kDLCUDA, kDLCPU, kDLCUDAHost>().verify(dst, "dst");
  TensorMatcher({n}).with_dtype<uint8_t>().with_device<kDLCUDA, kDLCPU, kDLCUDAHost>().verify(src, "src");
  RuntimeCheck(n.unwrap() % 16 == 0, "bulk_ring: a multiple of 16 bytes, got ", n.unwrap());
  auto* to = static_cast<uint8_t*>(runtime::get_device_accessible_ptr(dst, "dst"));
  const auto* from = static_cast<const uint8_t*>(runtime::get_device_accessible_ptr(src, "src"));
  const auto device = DLDevice{kDLCUDA, static_cast<int32_t>(device_id)};
  LaunchKernel(1, 64, device)(bulk_ring_kernel, from, to, static_cast<uint32_t>(n.unwrap()));
}

inline auto device_address(TensorView t) -> int64_t {
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(host::runtime::get_device_accessible_ptr(t, "t")));
}

// ---- RuntimeDeviceCheck through LaunchKernel: 2048 threads per block is invalid.

inline void bad_launch(TensorView x) {
  using namespace host;
  auto device = SymbolicDevice{};
  TensorMatcher({-1}).with_dtype<int32_t>().with_device<kDLCUDA>(device).verify(x);
  auto* data = static_cast<int32_t*>(x.data_ptr());
  LaunchKernel(1, 2048, device.unwrap())(fill_index_kernel, data, int64_t{0});  // @line:bad_launch
}

}  // namespace gpu_cases
