// type.cuh: every dtype_trait specialization, packed_t and device::cast.
#include <sgl_kernel/type.cuh>

#include <type_traits>

static_assert(std::is_same_v<packed_t<fp32_t>, fp32x2_t>);
static_assert(std::is_same_v<packed_t<fp16_t>, fp16x2_t>);
static_assert(std::is_same_v<packed_t<bf16_t>, bf16x2_t>);
static_assert(std::is_same_v<packed_t<fp32x2_t>, fp32x4_t>);
static_assert(std::is_same_v<packed_t<fp8_e4m3_t>, fp8x2_e4m3_t>);
static_assert(host::is_type<fp16_t>(dtype_trait<fp16_t>::value));
static_assert(dtype_trait<bf16_t>::value.code == kDLBfloat && dtype_trait<bf16_t>::value.bits == 16);
static_assert(dtype_trait<fp8_e4m3_t>::value.code == kDLFloat8_e4m3fn);
static_assert(dtype_trait<fp8_e5m2_t>::value.code == kDLFloat8_e5m2);
static_assert(dtype_trait<fp32_t>::value.bits == 32 && dtype_trait<int64_t>::value.bits == 64);

namespace {

template <typename T>
__device__ T all_math(T x, T y) {
  using trait = dtype_trait<T>;
  return trait::max(trait::min(trait::abs(x), y), trait::sqrt(trait::rsqrt(trait::exp(trait::sin(trait::cos(x))))));
}

__global__ void convert_kernel(const fp16x2_t* a, const bf16x2_t* b, float* out, fp8_e4m3_t* q, fp8x2_e5m2_t* q2) {
  using device::cast;
  const auto i = threadIdx.x;
  const fp32x2_t fa = cast<fp32x2_t>(a[i]);
  const fp32x2_t fb = cast<fp32x2_t, bf16x2_t>(b[i]);
  const fp16x2_t ha = all_math(cast<fp16x2_t>(fb), a[i]);
  const bf16x2_t hb = all_math(cast<bf16x2_t>(fa), cast<bf16x2_t>(a[i]));
  const fp32x2_t sum = all_math(cast<fp32x2_t>(ha), cast<fp32x2_t>(hb));
  const fp16_t h = all_math(cast<fp16_t>(sum.x), cast<fp16_t>(cast<bf16_t>(sum.y)));
  const bf16_t g = all_math(cast<bf16_t>(h), cast<bf16_t, float>(1.5f));
  const float f = all_math(cast<float>(h), cast<float>(g)) + cast<float>(2) + cast<float>(q[i]);
  q[i] = cast<fp8_e4m3_t>(f);
  q2[i] = cast<fp8x2_e5m2_t>(fa);
  out[i] = f + cast<int>(f) + dtype_trait<fp32_t>::from(h);
}

}  // namespace

void launch_convert(const fp16x2_t* a, const bf16x2_t* b, float* out, fp8_e4m3_t* q, fp8x2_e5m2_t* q2) {
  convert_kernel<<<1, 32>>>(a, b, out, q, q2);
}
