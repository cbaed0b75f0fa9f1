// vec.cuh: AlignedVector of 2..32 bytes, typed and untyped pointers, evict-first loads and stores,
// predicated stores.
#include <sgl_kernel/vec.cuh>

#include <cstdint>

namespace {

template <typename T, std::size_t N>
__global__ void roundtrip(const T* src, T* dst, const void* raw_src, void* raw_dst, T value) {
  using vec_t = device::AlignedVector<T, N>;
  static_assert(sizeof(vec_t) == sizeof(T) * N && alignof(vec_t) == sizeof(T) * N);
  vec_t v;
  v.load(src, threadIdx.x);
  const vec_t& cv = v;
  vec_t w;
  w.fill(value);
#pragma unroll
  for (std::size_t i = 0; i < vec_t::size(); ++i) w[i] = cv[i];
  w.store(dst, threadIdx.x);
  w.load(raw_src);
  w.store(raw_dst, 1);
  *w.data() = *cv.data();
  if constexpr (sizeof(vec_t) <= 16) {
    w.load_evict_first(src, threadIdx.x);
    w.store_evict_first(raw_dst, threadIdx.x);
  }
  if constexpr (sizeof(vec_t) == 4 || sizeof(vec_t) == 8 || sizeof(vec_t) == 16) {
    w.store_if(threadIdx.x % 2 == 0, dst, threadIdx.x);
  }
}

}  // namespace

void launch_vec(const void* src, void* dst) {
  roundtrip<fp16_t, 8><<<1, 32>>>(static_cast<const fp16_t*>(src), static_cast<fp16_t*>(dst), src, dst, fp16_t{});
  roundtrip<bf16x2_t, 4><<<1, 32>>>(static_cast<const bf16x2_t*>(src), static_cast<bf16x2_t*>(dst), src, dst, {});
  roundtrip<float, 8><<<1, 32>>>(static_cast<const float*>(src), static_cast<float*>(dst), src, dst, 1.0f);
  roundtrip<float, 2><<<1, 32>>>(static_cast<const float*>(src), static_cast<float*>(dst), src, dst, 1.0f);
  roundtrip<fp16_t, 2><<<1, 32>>>(static_cast<const fp16_t*>(src), static_cast<fp16_t*>(dst), src, dst, fp16_t{});
  roundtrip<uint8_t, 2><<<1, 32>>>(static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), src, dst, 0);
}
