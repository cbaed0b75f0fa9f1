// Fixture: the capabilities sglang 0.5.23 (and 0.5.16) kernels use beyond renames, spelled the way
// those kernels spell them: warp scans and lane helpers, fast_mod_div_u32_t, the fast activations,
// unpack / ReductionTrait / reduce_vec, warp::load_bytes, TensorMatcher::ensure_alignment and the
// per-device runtime setters. It must build unchanged; the gpu tests check the results.
//
// Functions (namespace compat_caps):
//   warp_scan<T>, fast_div, activations, reduce_rows, copy_rows<kBytes>, check_aligned, smem_copy

#include <sgl_kernel/math.cuh>
#include <sgl_kernel/runtime.cuh>
#include <sgl_kernel/tensor.h>
#include <sgl_kernel/type.cuh>
#include <sgl_kernel/utils.cuh>
#include <sgl_kernel/utils.h>
#include <sgl_kernel/vec.cuh>
#include <sgl_kernel/warp.cuh>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>
#include <limits>

namespace compat_caps {

using device::math::fast_mod_div_u32_t;
using tvm::ffi::TensorView;

// ---- fast_mod_div_u32_t on the host, at compile time: the divisors and dividends at the edges.
constexpr uint32_t kDivisors[] = {
    1, 2, 3, 5, 7, 10, 64, 100, 641, 1000003, 0x7fffffffu, 0x80000000u, 0x80000001u, 0xfffffffeu, 0xffffffffu};
constexpr uint32_t kDividends[] = {
    0,
    1,
    2,
    6,
    63,
    64,
    65,
    99999,
    1u << 20,
    0x7ffffffeu,
    0x7fffffffu,
    0x80000000u,
    0xc0000001u,
    0xfffffffeu,
    0xffffffffu};
constexpr bool fast_div_exact() {
  for (const auto d : kDivisors) {
    const auto fast = fast_mod_div_u32_t{d};
    if (static_cast<uint32_t>(fast) != d) return false;
    for (const auto base : kDividends) {
      for (const uint32_t n : {base, base - 1, d - 1, d, d + 1, 2 * d - 1, 2 * d}) {
        const uint2 both = device::math::div(n, fast);
        if (n / fast != n / d || n % fast != n % d || both.x != n / d || both.y != n % d) return false;
      }
    }
  }
  return true;
}
static_assert(fast_div_exact(), "fast_mod_div_u32_t must divide exactly");

static_assert(
    device::warp::LoadStorePattern::get_vec_bytes<576, device::warp::LoadStorePattern::WARP_UNIFORM_16B>() == 4);
static_assert(
    device::warp::LoadStorePattern::get_vec_bytes<1024, device::warp::LoadStorePattern::WARP_UNIFORM_16B>() == 16);
static_assert(device::warp::LoadStorePattern::get_vec_bytes<40, device::LoadStoreBytes::MAX_PORTABLE>() == 8);
static_assert(DTypeTrait<fp8_e4m3_t>::kFloatMax == 448.0f && DTypeTrait<fp16_t>::kFloatMax == 65504.0f);
static_assert(DTypeTrait<fp32_t>::kFloatMax == std::numeric_limits<float>::max());
static_assert(DTypeTrait<bf16_t>::kFloatMax == 0x1.fep127f && DTypeTrait<fp8_e5m2_t>::kFloatMax == 57344.0f);
static_assert(DTypeTrait<bf16x2_t>::kVecSize == 2 && std::is_same_v<DTypeTrait<fp16x2_t>::unpacked_t, fp16_t>);

// ---- warp scans: out[i, :] for element i (lane i % 32 of warp i / 32).
template <typename T>
__global__ void warp_scan_kernel(const T* __restrict__ x, T* __restrict__ out) {
  using namespace device;
  const auto i = blockIdx.x * blockDim.x + threadIdx.x;
  const T v = x[i];
  T* row = out + i * 8;
  row[0] = warp::inclusive_sum(v);                                  // prefix sums of the warp
  row[1] = warp::inclusive_sum<8>(v);                               // ... of each group of 8 lanes
  row[2] = warp::inclusive_max<32>(v, warp::get_lane_id());         // prefix maxima
  row[3] = warp::inclusive_min<16>(v, threadIdx.x % 16);            // ... minima per 16 lanes
  row[4] = warp::inclusive_reduce<ReductionOp::SUM, 32, 32, 1>(v);  // suffix sums of the warp
  row[5] = warp::broadcast<8>(v, 3);                                // lane 3 of each group of 8
  row[6] = static_cast<T>(get_lane_id() == threadIdx.x % 32 ? warp::get_lane_id<8>() : 99u);
  row[7] = static_cast<T>(warp::elect_one_lane() ? 1 : 0);  // one lane per warp
}

template <typename T>
void warp_scan(TensorView x, TensorView out) {
  using namespace host;
  auto N = SymbolicSize{"n"};
  auto device = SymbolicDevice{};
  TensorMatcher({N}).with_device<kDLCUDA>(device).with_dtype<T>().verify(x, "x");
  TensorMatcher({N, 8}).with_device<kDLCUDA>(device).with_dtype<T>().verify(out, "out");
  RuntimeCheck(N.unwrap() % 128 == 0, "n must be a multiple of 128");
  if (N.unwrap() == 0) return;
  LaunchKernel(N.unwrap() / 128, 128, device.unwrap())(
      warp_scan_kernel<T>, static_cast<const T*>(x.data_ptr()), static_cast<T*>(out.data_ptr()));
}

// ---- fast_mod_div_u32_t on the device: out[i] = {n[i] / d, n[i] % d} for n in [0, 2^32).
__global__ void fast_div_kernel(
    const int64_t* __restrict__ n, int64_t* __restrict__ out, fast_mod_div_u32_t d, int64_t count) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  const auto value = static_cast<uint32_t>(n[i]);
  const auto [quotient, remainder] = device::math::div(value, d);
  out[2 * i] = value / d == quotient ? int64_t{quotient} : int64_t{-1};  // -1: the operators disagree
  out[2 * i + 1] = value % d == remainder ? int64_t{remainder} : int64_t{-1};
}

void fast_div(TensorView n, TensorView out, int64_t divisor) {
  using namespace host;
  auto N = SymbolicSize{"n"};
  auto device = SymbolicDevice{};
  TensorMatcher({N}).with_dtype<int64_t>().with_device<kDLCUDA>(device).verify(n, "n");
  TensorMatcher({N, 2}).with_dtype<int64_t>().with_device<kDLCUDA>(device).verify(out, "out");
  RuntimeCheck(divisor >= 1 && divisor <= 0xffffffffll, "divisor out of range: ", divisor);
  if (N.unwrap() == 0) return;
  LaunchKernel(div_ceil(N.unwrap(), 256), 256, device.unwrap())(
      fast_div_kernel,
      static_cast<const int64_t*>(n.data_ptr()),
      static_cast<int64_t*>(out.data_ptr()),
      fast_mod_div_u32_t{static_cast<uint32_t>(divisor)},
      N.unwrap());
}

// ---- fast activations: out[i] = {sigmoid, silu, softplus}(x[i]).
__global__ void activations_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t count) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= count) return;
  out[3 * i] = device::math::sigmoid_fast(x[i]);
  out[3 * i + 1] = device::math::silu_fast(x[i]);
  out[3 * i + 2] = device::math::softplus_fast(x[i]);
}

void activations(TensorView x, TensorView out) {
  using namespace host;
  auto N = SymbolicSize{"n"};
  auto device = SymbolicDevice{};
  TensorMatcher({N}).with_dtype<float>().with_device<kDLCUDA>(device).verify(x, "x");
  TensorMatcher({N, 3}).with_dtype<float>().with_device<kDLCUDA>(device).verify(out, "out");
  if (N.unwrap() == 0) return;
  LaunchKernel(div_ceil(N.unwrap(), 256), 256, device.unwrap())(
      activations_kernel, static_cast<const float*>(x.data_ptr()), static_cast<float*>(out.data_ptr()), N.unwrap());
}

// ---- packed sums: x is [3, n] bf16; out is [3, n]: {fp32-accumulated sum (reduce_vec), bf16 sum
// (reduce_vec<false>), lane-wise max through unpack + ReductionTrait}.
__global__ void reduce_rows_kernel(const bf16x2_t* __restrict__ x, bf16x2_t* __restrict__ out, int64_t pairs) {
  using namespace device;
  using Vec = AlignedVector<bf16x2_t, 2>;
  const int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;  // vector index
  if (v * 2 >= pairs) return;
  Vec rows[3];
  for (int r = 0; r < 3; ++r) rows[r].load(x + r * pairs, v);
  reduce_vec(rows).store(out, v);
  reduce_vec<false>(rows).store(out + pairs, v);
  Vec top;
  for (int j = 0; j < 2; ++j) {
    bf16x2_t m = rows[0][j];
    for (int r = 1; r < 3; ++r) {
      // lane by lane through unpack, the way 0.5.16 kernels reach a packed value's halves
      const auto& lanes = unpack(rows[r][j]);
      auto& mine = unpack(m);
      for (int k = 0; k < 2; ++k) mine[k] = ReductionTrait<ReductionOp::MAX, bf16_t>::reduce(mine[k], lanes[k]);
    }
    top[j] = ReductionTrait<ReductionOp::MAX, bf16x2_t>::reduce(m, rows[0][j]);
  }
  top.store(out + 2 * pairs, v);
}

void reduce_rows(TensorView x, TensorView out) {
  using namespace host;
  auto N = SymbolicSize{"n"};
  auto device = SymbolicDevice{};
  TensorMatcher({3, N}).with_dtype<bf16_t>().with_device<kDLCUDA>(device).verify(x, "x");
  TensorMatcher({3, N}).with_dtype<bf16_t>().with_device<kDLCUDA>(device).verify(out, "out");
  RuntimeCheck(N.unwrap() % 4 == 0, "n must be a multiple of 4");
  const auto pairs = N.unwrap() / 2;
  if (pairs == 0) return;
  LaunchKernel(div_ceil(pairs / 2, 128), 128, device.unwrap())(
      reduce_rows_kernel, static_cast<const bf16x2_t*>(x.data_ptr()), static_cast<bf16x2_t*>(out.data_ptr()), pairs);
}

// ---- warp row copies (load_bytes / store_bytes), one warp per row of kBytes; rows 16-byte aligned.
template <int64_t kBytes>
__global__ void copy_rows_kernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, int64_t stride) {
  using namespace device;
  using enum warp::LoadStorePattern::type;
  const int64_t row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const auto lanes = warp::load_bytes<kBytes, WARP_UNIFORM_16B>(src + row * stride);
  warp::store_bytes<kBytes, WARP_UNIFORM_16B>(dst + row * stride, lanes);
}

template <int64_t kBytes>
void copy_rows(TensorView src, TensorView dst) {
  using namespace host;
  using device::warp::LoadStorePattern;
  constexpr auto kAlign = LoadStorePattern::get_vec_bytes<kBytes, LoadStorePattern::WARP_UNIFORM_16B>();
  auto R = SymbolicSize{"rows"};
  auto S = SymbolicSize{"stride"};
  auto device = SymbolicDevice{};
  TensorMatcher({R, -1})
      .with_strides({S, 1})
      .with_dtype<uint8_t>()
      .with_device<kDLCUDA>(device)
      .ensure_alignment(kAlign)
      .verify(src, "src");
  TensorMatcher({R, -1})
      .with_strides({S, 1})
      .with_dtype<uint8_t>()
      .with_device<kDLCUDA>(device)
      .ensure_alignment(kAlign)
      .verify(dst, "dst");
  RuntimeCheck(
      src.size(1) >= kBytes && R.unwrap() % 4 == 0, "rows must be a multiple of 4, at least ", kBytes, " bytes");
  if (R.unwrap() == 0) return;
  LaunchKernel(R.unwrap() / 4, 128, device.unwrap())(
      copy_rows_kernel<kBytes>,
      static_cast<const uint8_t*>(src.data_ptr()),
      static_cast<uint8_t*>(dst.data_ptr()),
      S.unwrap());
}

// ---- ensure_alignment alone, on any device: the matcher's verdict, nothing launched.
inline void check_aligned(TensorView x, int64_t alignment) {
  using namespace host;
  TensorMatcher({-1, -1}).with_strides({-1, 1}).with_device<kDLCPU, kDLCUDA>().ensure_alignment(alignment).verify(
      x, "x");
}

// ---- per-device dynamic shared memory: a raw <<<>>> launch (LaunchKernel would opt in by itself)
// of a kernel that stages `bytes` through shared memory. Returns the opt-in limit of the device.
__global__ void smem_copy_kernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst, int64_t bytes) {
  extern __shared__ uint8_t staged[];
  for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) staged[i] = src[i];
  __syncthreads();
  for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = staged[bytes - 1 - i];
}

inline auto smem_copy(TensorView src, TensorView dst) -> int64_t {
  using namespace host;
  auto N = SymbolicSize{"bytes"};
  auto device = SymbolicDevice{};
  TensorMatcher({N}).with_dtype<uint8_t>().with_device<kDLCUDA>(device).verify(src, "src");
  TensorMatcher({N}).with_dtype<uint8_t>().with_device<kDLCUDA>(device).verify(dst, "dst");
  const auto bytes = static_cast<std::size_t>(N.unwrap());
  constexpr auto kernel = smem_copy_kernel;
  runtime::set_max_dynamic_smem_per_device<kernel>(device.unwrap(), bytes);
  runtime::init_per_device(
      device.unwrap().device_id, [] { runtime::set_smem_carveout(kernel, cudaSharedmemCarveoutMaxShared); });
  const auto stream = LaunchKernel::resolve_device(device.unwrap());
  smem_copy_kernel<<<1, 256, bytes, stream>>>(
      static_cast<const uint8_t*>(src.data_ptr()), static_cast<uint8_t*>(dst.data_ptr()), N.unwrap());
  RuntimeDeviceCheck();
  return static_cast<int64_t>(runtime::get_max_smem_per_block(device.unwrap().device_id));
}

}  // namespace compat_caps
