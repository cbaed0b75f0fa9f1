// Host-only cases for tests/test_tensor_matcher.py: every TensorMatcher failure
// kind, RuntimeCheck (both forms), Panic and the small utilities, callable on
// CPU torch tensors. Nothing is exported here; the test wraps each function with
// TVM_FFI_DLL_EXPORT_TYPED_FUNC(name, (matcher_cases::name)).
//
// Functions:
//   size_mismatch, size_literal_mismatch, size_options, rank_mismatch,
//   stride_mismatch, stride_literal_mismatch, not_contiguous, dtype_bound,
//   dtype_symbol_options, dtype_options, dtype_chain, device_type,
//   device_options, device_bound, device_bound_host, named_tensor, cuda_rows_stride,
//   cuda_rows_dtype, cuda_rows_device, cuda_rows_heads, cuda_rows_bind, bind_shared, wildcard,
//   size_one_stride, size_one_binds, unwrap_dtype, unwrap_device,
//   unwrap_unbound, set_value_conflict, runtime_check, runtime_check_at,
//   panic_now, irange_sum, div_ceil, dtype_bytes
//
// The test finds expected line numbers through the `@line:<case>` markers, so
// keep each marker on the line that makes the failing call. g++ reports that
// line; nvcc reports the first line of a multi-line statement, marked `@chain:`.

#include <sgl_kernel/tensor.h>
#include <sgl_kernel/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>

namespace matcher_cases {

using tvm::ffi::TensorView;

inline constexpr DLDataType kFloat16 = {kDLFloat, 16, 1};
inline constexpr DLDataType kBFloat16 = {kDLBfloat, 16, 1};

// ---- failures -------------------------------------------------------------

inline void size_mismatch(TensorView t) {
  using namespace host;
  auto D = SymbolicSize{"hidden_size"};
  D.set_value(8);
  TensorMatcher({-1, D}).verify(t);  // @line:size_mismatch
}

inline void size_literal_mismatch(TensorView t) {
  host::TensorMatcher({4, 8}).verify(t);  // @line:size_literal_mismatch
}

inline void size_options(TensorView t) {
  using namespace host;
  auto D = SymbolicSize{"head_dim"};
  D.set_options({64, 128});
  TensorMatcher({-1, D}).verify(t);  // @line:size_options
}

inline void rank_mismatch(TensorView t) {
  host::TensorMatcher({-1, -1}).verify(t);  // @line:rank_mismatch
}

inline void stride_mismatch(TensorView t) {
  using namespace host;
  auto S = SymbolicSize{"kv_stride"};
  S.set_value(32);
  TensorMatcher({-1, -1})  // @chain:stride_mismatch
      .with_strides({S, 1})
      .verify(t);  // @line:stride_mismatch
}

inline void stride_literal_mismatch(TensorView t) {
  host::TensorMatcher({-1, -1}).with_strides({-1, 1}).verify(t);  // @line:stride_literal_mismatch
}

inline void not_contiguous(TensorView t) {
  host::TensorMatcher({-1, -1}).verify(t);  // @line:not_contiguous
}

inline void dtype_bound(TensorView t) {
  using namespace host;
  auto dtype = SymbolicDType{};
  dtype.set_value(kFloat16);
  TensorMatcher({-1, -1}).with_dtype(dtype).verify(t);  // @line:dtype_bound
}

inline void dtype_symbol_options(TensorView t) {
  using namespace host;
  auto dtype = SymbolicDType{};
  dtype.set_options({kFloat16, kBFloat16});
  TensorMatcher({-1, -1}).with_dtype(dtype).verify(t);  // @line:dtype_symbol_options
}

inline void dtype_options(TensorView t) {
  host::TensorMatcher({-1, -1}).with_dtype<int32_t, int64_t>().verify(t);  // @line:dtype_options
}

// One chain shares its dtype: `b` must have `a`'s dtype.
inline void dtype_chain(TensorView a, TensorView b) {
  host::TensorMatcher({-1}).verify(a).verify(b);  // @line:dtype_chain
}

inline void device_type(TensorView t) {
  host::TensorMatcher({-1, -1}).with_device<kDLCUDA>().verify(t);  // @line:device_type
}

inline void device_options(TensorView t) {
  using namespace host;
  auto device = SymbolicDevice{};
  TensorMatcher({-1, -1}).with_device<kDLCUDA, kDLCUDAHost>(device).verify(t);  // @line:device_options
}

inline void device_bound(TensorView t) {
  using namespace host;
  auto device = SymbolicDevice{};
  device.set_value(DLDevice{kDLCUDA, 0});
  TensorMatcher({-1, -1}).with_device(device).verify(t);  // @line:device_bound
}

// PyTorch exports pinned tensors as `cpu`; a bound symbol still shows the pinned-memory name.
inline void device_bound_host(TensorView t) {
  using namespace host;
  auto device = SymbolicDevice{};
  device.set_value(DLDevice{kDLCUDAHost, 0});
  TensorMatcher({-1, -1}).with_device(device).verify(t);  // @line:device_bound_host
}

inline void named_tensor(TensorView k_cache) {
  using namespace host;
  auto D = SymbolicSize{"hidden_size"};
  D.set_value(8);
  TensorMatcher({-1, D}).verify(k_cache, "k_cache");  // @line:named_tensor
}

// TensorMatcher::cuda_rows: rows of `hidden_size` floats on a CUDA device. Each failure names the
// argument and the caller's line, as the chain it abbreviates does.
inline void cuda_rows_stride(TensorView input) {
  using namespace host;
  auto D = SymbolicSize{"hidden_size"};
  auto device = SymbolicDevice{};
  TensorMatcher::cuda_rows<float>({-1, D}, device).verify(input, "input");  // @line:cuda_rows_stride
}

inline void cuda_rows_dtype(TensorView input) {
  using namespace host;
  auto device = SymbolicDevice{};
  TensorMatcher::cuda_rows<float, double>({-1, -1}, device).verify(input, "input");  // @line:cuda_rows_dtype
}

inline void cuda_rows_device(TensorView out) {
  using namespace host;
  auto device = SymbolicDevice{};
  TensorMatcher::cuda_rows<float>({-1, -1}, device).verify(out, "out");  // @line:cuda_rows_device
}

inline void cuda_rows_heads(TensorView q) {
  using namespace host;
  auto device = SymbolicDevice{};
  TensorMatcher::cuda_rows<float>({-1, -1, 8}, device).verify(q, "q");  // @line:cuda_rows_heads
}

// Success on a GPU: binds [N, D] and the device from strided rows; returns [N, D, device_id].
inline auto cuda_rows_bind(TensorView input, TensorView out) -> tvm::ffi::Array<int64_t> {
  using namespace host;
  auto N = SymbolicSize{"num_tokens"};
  auto D = SymbolicSize{"hidden_size"};
  auto device = SymbolicDevice{};
  TensorMatcher::cuda_rows<float>({N, D}, device).verify(input, "input");
  TensorMatcher::cuda_rows<float>({N, D}, device).verify(out, "out");  // @line:cuda_rows_bind
  return {N.unwrap(), D.unwrap(), device.unwrap().device_id};
}

inline auto unwrap_unbound() -> int64_t {
  auto D = host::SymbolicSize{"head_dim"};
  return D.unwrap();  // @line:unwrap_unbound
}

inline void set_value_conflict() {
  auto D = host::SymbolicSize{"head_dim"};
  D.set_value(64);
  D.set_value(128);  // @line:set_value_conflict
}

inline void runtime_check(int64_t x) {
  host::RuntimeCheck(x > 0, "x must be positive, got ", x);  // @line:runtime_check
}

inline void runtime_check_at(int64_t x) {
  const auto where = host::DebugInfo{};  // @line:runtime_check_at
  host::RuntimeCheck(where, x > 0, "x must be positive");
}

// Returns a value on the success path: a trailing Panic needs no `return`.
inline auto panic_now(int64_t x) -> int64_t {
  if (x == 0) return 0;
  host::Panic("unsupported value ", x);  // @line:panic_now
}

// ---- successes ------------------------------------------------------------

// Symbols unify across tensors and matchers: returns [N, D, row_stride].
inline auto bind_shared(TensorView a, TensorView b, TensorView w) -> tvm::ffi::Array<int64_t> {
  using namespace host;
  auto N = SymbolicSize{"num_tokens"};
  auto D = SymbolicSize{"hidden_size"};
  auto S = SymbolicSize{"row_stride"};
  auto dtype = SymbolicDType{};
  auto device = SymbolicDevice{};
  TensorMatcher({N, D})  // @chain:bind_shared_b
      .with_strides({S, 1})
      .with_dtype<float, double>(dtype)
      .with_device<kDLCPU>(device)
      .verify(a)
      .verify(b);                                                      // @line:bind_shared_b
  TensorMatcher({D}).with_dtype(dtype).with_device(device).verify(w);  // @line:bind_shared_w
  return {N.unwrap(), D.unwrap(), S.unwrap()};
}

// `-1` matches every tensor independently: returns D.
inline auto wildcard(TensorView a, TensorView b) -> int64_t {
  using namespace host;
  auto D = SymbolicSize{"hidden_size"};
  TensorMatcher({-1, D}).verify(a).verify(b);
  return D.unwrap();
}

// Strides of size-1 dims are not compared: a [1, 8] row of a [4, 16] tensor passes.
inline auto size_one_stride(TensorView t) -> int64_t {
  using namespace host;
  auto S = SymbolicSize{"row_stride"};
  S.set_value(8);
  TensorMatcher({1, 8}).with_strides({S, 1}).verify(t);
  TensorMatcher({1, 8}).with_strides({999, 1}).verify(t);
  TensorMatcher({1, 8}).verify(t);  // contiguity ignores size-1 dims too
  return S.unwrap();
}

// ...but an unbound stride symbol is still bound from them, so unwrap() works.
inline auto size_one_binds(TensorView t) -> int64_t {
  using namespace host;
  auto S = SymbolicSize{"row_stride"};
  TensorMatcher({1, -1}).with_strides({S, 1}).verify(t);
  return S.unwrap();
}

// Returns [code, bits, lanes] of the matched dtype.
inline auto unwrap_dtype(TensorView t) -> tvm::ffi::Array<int64_t> {
  using namespace host;
  auto dtype = SymbolicDType{};
  TensorMatcher({-1}).with_dtype<bool, uint8_t, int8_t, int16_t, int32_t, int64_t, float, double>(dtype).verify(t);
  const auto value = dtype.unwrap();
  return {value.code, value.bits, value.lanes};
}

// Returns [device_type, device_id] of the matched device.
inline auto unwrap_device(TensorView t) -> tvm::ffi::Array<int64_t> {
  using namespace host;
  auto device = SymbolicDevice{};
  device.set_options<kDLCPU, kDLCUDA>();
  TensorMatcher({-1}).with_device(device).verify(t);
  const auto value = device.unwrap();
  return {static_cast<int64_t>(value.device_type), value.device_id};
}

// sum(irange(n)) * 1000 + sum(irange(2, n)); both are empty for n <= 0 / n <= 2.
inline auto irange_sum(int64_t n) -> int64_t {
  int64_t a = 0, b = 0;
  for (const auto i : host::irange(n)) a += i;
  for (const auto i : host::irange(2, n)) b += i;
  return a * 1000 + b;
}

inline auto div_ceil(int64_t a, int64_t b) -> int64_t {
  return host::div_ceil(a, b);
}

inline auto dtype_bytes(TensorView t) -> int64_t {
  return static_cast<int64_t>(host::dtype_bytes(t.dtype()));
}

}  // namespace matcher_cases
