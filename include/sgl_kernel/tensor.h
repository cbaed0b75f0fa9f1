/// \file tensor.h
/// \brief Declarative validation of `tvm::ffi::TensorView` arguments.
///
/// \code
///   auto N = SymbolicSize{"num_tokens"};
///   auto D = SymbolicSize{"hidden_size"};
///   auto device = SymbolicDevice{};
///   TensorMatcher({N, D})  //
///       .with_strides({D, 1})
///       .with_dtype<fp16_t, bf16_t>()
///       .with_device<kDLCUDA>(device)
///       .verify(input)
///       .verify(output, "output");
///   const int64_t num_tokens = N.unwrap();
/// \endcode
///
/// Most kernels take rows: `TensorMatcher::cuda_rows<T>({N, D}, device).verify(input, "input")`
/// matches a CUDA tensor of `T` whose last dimension is contiguous and whose rows may sit at any
/// stride (a slice of a wider buffer).
///
/// Matching rules:
/// - A shape or stride entry is a literal (must match exactly), `-1` (matches
///   anything, independently for every tensor) or a `SymbolicSize`: the first
///   tensor binds it, every later use must agree. Symbols tie tensors together.
/// - Without `with_strides` the tensor must be contiguous. Strides of size-1
///   dimensions are never compared (PyTorch reports arbitrary values there);
///   an unbound stride symbol is still bound from them so `unwrap()` works.
/// - All tensors verified by one chain share one dtype and one device, even
///   without a symbol: a chain describes tensors of the same kind, and a kernel
///   fed tensors from two GPUs would fault.
/// - `with_dtype<Ts...>` / `with_device<Codes...>` restrict the allowed values;
///   they can be combined with a symbol to bind the result.
///
/// A failed match throws `host::PanicError` with this message (two lines):
///
///     Tensor match failed for [ '<name>': ]Tensor<4, 16>[strides=<16, 1>, dtype=float32, device=cpu] at <file>:<line>
///     - Root cause: <cause>
///
/// where `<cause>` is one of
///
///     Rank mismatch: expected 2 but got 3
///     Size mismatch for shape#1('hidden_size'): expected 8 but got 16
///     Size mismatch for shape#1('head_dim'): expected one of [64, 128] but got 96
///     Stride mismatch for stride#0('kv_stride'): expected 32 but got 64
///     Tensor is not contiguous: expected strides <16, 1> but got <1, 4>
///     Dtype mismatch: expected float16 but got float32
///     Dtype mismatch: expected one of [float16, bfloat16] but got float32
///     Device mismatch: expected cuda but got cpu
///     Device mismatch: expected cuda:0 but got cuda:1
///
/// (`('name')` is left out for unnamed symbols and literals.)

#pragma once

#include <sgl_kernel/dtype.h>
#include <sgl_kernel/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>

#ifdef __CUDACC__
#include <sgl_kernel/utils.cuh>  // fp16_t, bf16_t, ... for with_dtype<...>
#endif

namespace host {

/// \brief Whether `t` has no data behind it: an empty tensor, or a FakeTensor. torch.compile's
/// fake implementations call the launchers on FakeTensors for their checks alone, so a launcher
/// returns when its output has no data, after its checks and before any CUDA call.
inline auto has_no_data(const tvm::ffi::TensorView& t) -> bool {
  return t.data_ptr() == nullptr;
}

/// \brief `a.device() == b.device()`: the same device type and id. In `host` (as in sglang's headers),
///        found by kernels that say `using namespace host;`.
inline constexpr auto operator==(DLDevice lhs, DLDevice rhs) -> bool {
  return lhs.device_type == rhs.device_type && lhs.device_id == rhs.device_id;
}

namespace details {

/// \brief Device id meaning "any device of this type" in an allowed-device list.
inline constexpr int32_t kAnyDeviceId = -1;

inline constexpr auto same_device(DLDevice a, DLDevice b) -> bool {
  return a == b;
}

/// \brief Does `device` satisfy `option` (whose id may be `kAnyDeviceId`)?
inline constexpr auto device_matches(DLDevice option, DLDevice device) -> bool {
  return option.device_type == device.device_type &&
         (option.device_id == kAnyDeviceId || option.device_id == device.device_id);
}

inline auto device_type_name(DLDeviceType type) -> std::string {
  switch (type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda";
    case kDLCUDAHost: return "cuda_host";
    case kDLCUDAManaged: return "cuda_managed";
    case kDLROCM: return "rocm";
    case kDLROCMHost: return "rocm_host";
    case kDLOpenCL: return "opencl";
    case kDLVulkan: return "vulkan";
    case kDLMetal: return "metal";
    case kDLOneAPI: return "oneapi";
    default: return "device_type(" + std::to_string(static_cast<int>(type)) + ")";
  }
}

/// \brief `cpu`, `cuda_host`, `cuda:1`; a wildcard id prints only the type (`cuda`).
inline auto device_name(DLDevice device) -> std::string {
  auto name = device_type_name(device.device_type);
  // CPU and pinned host memory have a single address space: their id carries no information.
  const bool host_memory =
      device.device_type == kDLCPU || device.device_type == kDLCUDAHost || device.device_type == kDLROCMHost;
  if (!host_memory && device.device_id != kAnyDeviceId) name += ":" + std::to_string(device.device_id);
  return name;
}

/// \brief Printable wrappers, so values can be streamed into messages.
struct DTypeName {
  DLDataType dtype;
  friend auto operator<<(std::ostream& os, DTypeName d) -> std::ostream& {
    return os << dtype_name(d.dtype);
  }
};

struct DeviceName {
  DLDevice device;
  friend auto operator<<(std::ostream& os, DeviceName d) -> std::ostream& {
    return os << device_name(d.device);
  }
};

struct SizeName {
  int64_t value;
  friend auto operator<<(std::ostream& os, SizeName s) -> std::ostream& {
    return os << s.value;
  }
};

/// \brief A fixed-capacity list: option sets and matcher shapes live on the
/// stack, so checking a launch never allocates.
template <typename T, std::size_t kCapacity>
class InlineList {
 public:
  constexpr InlineList() = default;

  auto push_back(const T& value, const DebugInfo& where) -> void {
    if (m_size == kCapacity) {
      details::fail("Panic", ErrorKind::RuntimeError, where, "at most ", kCapacity, " entries are supported here");
    }
    m_data[m_size++] = value;
  }

  auto assign(std::initializer_list<T> values, const DebugInfo& where) -> void {
    m_size = 0;
    for (const auto& value : values) push_back(value, where);
  }

  constexpr auto size() const -> std::size_t {
    return m_size;
  }
  constexpr auto empty() const -> bool {
    return m_size == 0;
  }
  constexpr auto begin() const -> const T* {
    return m_data.data();
  }
  constexpr auto end() const -> const T* {
    return m_data.data() + m_size;
  }
  constexpr auto operator[](std::size_t i) const -> const T& {
    return m_data[i];
  }

 private:
  std::array<T, kCapacity> m_data{};
  std::size_t m_size = 0;
};

inline constexpr std::size_t kMaxOptions = 16;
inline constexpr std::size_t kMaxRank = 8;

/// \brief Prints "X" for one option and "one of [X, Y]" for several.
template <typename Printable, typename T, std::size_t N>
inline auto describe_options(const InlineList<T, N>& options) -> std::string {
  std::ostringstream os;
  if (options.size() == 1) {
    os << Printable{options[0]};
    return std::move(os).str();
  }
  os << "one of [";
  for (std::size_t i = 0; i < options.size(); ++i) {
    if (i > 0) os << ", ";
    os << Printable{options[i]};
  }
  os << "]";
  return std::move(os).str();
}

/// \brief A mismatch found while matching: the message is only the root cause;
/// `TensorMatcher::verify` adds the tensor and the call site.
/// A dtype mismatch is a `TypeError` in Python, every other mismatch a `ValueError`.
[[noreturn]] inline void mismatch(std::string cause, ErrorKind kind = ErrorKind::ValueError) {
  auto message = cause;
  throw PanicError(std::move(message), std::move(cause), kind);
}

class SizeRef;

}  // namespace details

class TensorMatcher;

// ---------------------------------------------------------------------------
// Symbols
// ---------------------------------------------------------------------------

/**
 * \brief A named dimension (or stride). It is unbound until a `TensorMatcher`
 *        sees it or `set_value` pins it; afterwards every use must agree.
 *
 * \note The annotation is kept as a `std::string_view`: pass a string literal
 *       (or anything that outlives the symbol).
 */
class SymbolicSize {
 public:
  SymbolicSize(std::string_view annotation = {}) : m_annotation(annotation) {}
  SymbolicSize(const SymbolicSize&) = delete;
  SymbolicSize& operator=(const SymbolicSize&) = delete;

  auto name() const -> std::string_view {
    return m_annotation;
  }

  auto has_value() const -> bool {
    return m_value.has_value();
  }

  auto get_value() const -> std::optional<int64_t> {
    return m_value;
  }

  /// \brief Pin the value before matching (e.g. a compile-time hidden size).
  auto set_value(int64_t value, DebugInfo where = {}) -> void {
    if (m_value && *m_value != value) {
      panic(where, describe(), " is already bound to ", *m_value, ", cannot set it to ", value);
    }
    if (!m_options.empty() && !contains(value)) {
      panic(
          where,
          describe(),
          " cannot be ",
          value,
          ": allowed ",
          details::describe_options<details::SizeName>(m_options));
    }
    m_value = value;
  }

  /// \brief Restrict the values this symbol may bind to.
  auto set_options(std::initializer_list<int64_t> options, DebugInfo where = {}) -> void {
    m_options.assign(options, where);
  }

  /// \brief The bound value; panics (reporting the caller) if unbound.
  auto unwrap(DebugInfo where = {}) const -> int64_t {
    if (!m_value) {
      panic(where, "unwrap() on unbound ", describe(), ": verify a tensor with it or call set_value() first");
    }
    return *m_value;
  }

 private:
  friend class TensorMatcher;

  auto describe() const -> std::string {
    return m_annotation.empty() ? std::string{"SymbolicSize"} : "SymbolicSize('" + std::string{m_annotation} + "')";
  }

  auto contains(int64_t value) const -> bool {
    for (const auto option : m_options) {
      if (option == value) return true;
    }
    return false;
  }

  /// \brief Binds `value` if unbound (and allowed); true if the symbol now holds `value`.
  auto try_match(int64_t value) -> bool {
    if (m_value) return *m_value == value;
    if (!m_options.empty() && !contains(value)) return false;
    m_value = value;
    return true;
  }

  /// \brief What `try_match` wanted: the bound value, else the allowed options.
  auto expected() const -> std::string {
    return m_value ? std::to_string(*m_value) : details::describe_options<details::SizeName>(m_options);
  }

  std::optional<int64_t> m_value;
  std::string_view m_annotation;
  details::InlineList<int64_t, details::kMaxOptions> m_options;
};

/// \brief A dtype shared by several tensors; optionally restricted with `set_options`.
class SymbolicDType {
 public:
  SymbolicDType() = default;
  SymbolicDType(const SymbolicDType&) = delete;
  SymbolicDType& operator=(const SymbolicDType&) = delete;

  auto has_value() const -> bool {
    return m_value.has_value();
  }

  auto get_value() const -> std::optional<DLDataType> {
    return m_value;
  }

  auto set_value(DLDataType value, DebugInfo where = {}) -> void {
    if (m_value && !details::same_dtype(*m_value, value)) {
      panic(
          where,
          "SymbolicDType is already bound to ",
          details::DTypeName{*m_value},
          ", cannot set it to ",
          details::DTypeName{value});
    }
    if (!allows(value)) {
      panic(
          where,
          "SymbolicDType cannot be ",
          details::DTypeName{value},
          ": allowed ",
          details::describe_options<details::DTypeName>(m_options));
    }
    m_value = value;
  }

  /// \brief Restrict to C++ types: `set_options<fp16_t, bf16_t>()`.
  template <has_dl_dtype... Ts>
  auto set_options(DebugInfo where = {}) -> void {
    set_options({dl_dtype_v<Ts>...}, where);
  }

  auto set_options(std::initializer_list<DLDataType> options, DebugInfo where = {}) -> void {
    m_options.assign(options, where);
  }

  auto unwrap(DebugInfo where = {}) const -> DLDataType {
    if (!m_value) panic(where, "unwrap() on unbound SymbolicDType: verify a tensor with it or call set_value() first");
    return *m_value;
  }

  /// \brief Bind to `value`, or check that it is the bound dtype (and an allowed one), outside a
  /// matcher: sglang's `dtype.verify(t.dtype())`. Throws `PanicError` naming the caller.
  auto verify(DLDataType value, DebugInfo where = {}) -> void {
    try {
      match(value);
    } catch (const PanicError& error) {
      details::fail("Runtime check failed", error.kind(), where, error.cause());
    }
  }

  /// \brief Dispatch helper: `if (dtype.is_type<fp16_t>()) ...` (false while unbound).
  template <has_dl_dtype T>
  auto is_type() const -> bool {
    return m_value && ::host::is_type<T>(*m_value);
  }

 private:
  friend class TensorMatcher;

  auto allows(DLDataType value) const -> bool {
    if (m_options.empty()) return true;
    for (const auto option : m_options) {
      if (details::same_dtype(option, value)) return true;
    }
    return false;
  }

  auto match(DLDataType value) -> void {
    if (m_value) {
      if (!details::same_dtype(*m_value, value)) {
        details::mismatch(
            "Dtype mismatch: expected " + details::dtype_name(*m_value) + " but got " + details::dtype_name(value),
            ErrorKind::TypeError);
      }
      return;
    }
    if (!allows(value)) {
      details::mismatch(
          "Dtype mismatch: expected " + details::describe_options<details::DTypeName>(m_options) + " but got " +
              details::dtype_name(value),
          ErrorKind::TypeError);
    }
    m_value = value;
  }

  std::optional<DLDataType> m_value;
  details::InlineList<DLDataType, details::kMaxOptions> m_options;
};

/// \brief A device shared by several tensors. Binding records type and id, so
/// all tensors must sit on the same GPU; options may leave the id open.
class SymbolicDevice {
 public:
  SymbolicDevice() = default;
  SymbolicDevice(const SymbolicDevice&) = delete;
  SymbolicDevice& operator=(const SymbolicDevice&) = delete;

  auto has_value() const -> bool {
    return m_value.has_value();
  }

  auto get_value() const -> std::optional<DLDevice> {
    return m_value;
  }

  auto set_value(DLDevice value, DebugInfo where = {}) -> void {
    if (m_value && !details::same_device(*m_value, value)) {
      panic(
          where,
          "SymbolicDevice is already bound to ",
          details::DeviceName{*m_value},
          ", cannot set it to ",
          details::DeviceName{value});
    }
    if (!allows(value)) {
      panic(
          where,
          "SymbolicDevice cannot be ",
          details::DeviceName{value},
          ": allowed ",
          details::describe_options<details::DeviceName>(m_options));
    }
    m_value = value;
  }

  /// \brief Restrict to device types, any id: `set_options<kDLCUDA>()`.
  template <DLDeviceType... Codes>
  auto set_options(DebugInfo where = {}) -> void {
    set_options({DLDevice{Codes, details::kAnyDeviceId}...}, where);
  }

  /// \brief Restrict to devices; an id of -1 allows any device of that type.
  auto set_options(std::initializer_list<DLDevice> options, DebugInfo where = {}) -> void {
    m_options.assign(options, where);
  }

  auto unwrap(DebugInfo where = {}) const -> DLDevice {
    if (!m_value) panic(where, "unwrap() on unbound SymbolicDevice: verify a tensor with it or call set_value() first");
    return *m_value;
  }

  /// \brief Bind to `value`, or check that it is the bound device (and an allowed one), outside a
  /// matcher: sglang's `device.verify(t.device())`. Throws `PanicError` naming the caller.
  auto verify(DLDevice value, DebugInfo where = {}) -> void {
    try {
      match(value);
    } catch (const PanicError& error) {
      details::fail("Runtime check failed", error.kind(), where, error.cause());
    }
  }

 private:
  friend class TensorMatcher;

  auto allows(DLDevice value) const -> bool {
    if (m_options.empty()) return true;
    for (const auto option : m_options) {
      if (details::device_matches(option, value)) return true;
    }
    return false;
  }

  auto match(DLDevice value) -> void {
    if (m_value) {
      if (!details::same_device(*m_value, value)) {
        details::mismatch(
            "Device mismatch: expected " + details::device_name(*m_value) + " but got " + details::device_name(value));
      }
      return;
    }
    if (!allows(value)) {
      details::mismatch(
          "Device mismatch: expected " + details::describe_options<details::DeviceName>(m_options) + " but got " +
          details::device_name(value));
    }
    m_value = value;
  }

  std::optional<DLDevice> m_value;
  details::InlineList<DLDevice, details::kMaxOptions> m_options;
};

// ---------------------------------------------------------------------------
// TensorMatcher
// ---------------------------------------------------------------------------

namespace details {

/// \brief One shape or stride entry: a literal, `-1`, or a reference to a symbol.
class SizeRef {
 public:
  SizeRef() = default;  // a wildcard
  SizeRef(SymbolicSize& symbol) : m_symbol(&symbol) {}
  // Any integer type, so `{-1, D}`, `{kDim}` and `{n, 1}` all work without casts.
  template <std::integral I>
  SizeRef(I value) : m_value(static_cast<int64_t>(value)) {}

  auto symbol() const -> SymbolicSize* {
    return m_symbol;
  }
  auto value() const -> int64_t {
    return m_value;
  }
  auto is_wildcard() const -> bool {
    return m_symbol == nullptr && m_value == kWildcard;
  }
  /// \brief A literal, or a symbol that already has a value.
  auto is_known() const -> bool {
    return m_symbol == nullptr ? m_value != kWildcard : m_symbol->has_value();
  }

  static constexpr int64_t kWildcard = -1;

 private:
  SymbolicSize* m_symbol = nullptr;
  int64_t m_value = kWildcard;
};

}  // namespace details

/// \brief See the file comment. A temporary: build, chain and verify in one expression.
class TensorMatcher {
 private:
  using SizeRef = details::SizeRef;
  using SizeList = details::InlineList<SizeRef, details::kMaxRank>;

 public:
  explicit TensorMatcher(std::initializer_list<SizeRef> shape, DebugInfo where = {}) {
    m_shape.assign(shape, where);
  }
  TensorMatcher(const TensorMatcher&) = delete;
  TensorMatcher& operator=(const TensorMatcher&) = delete;

  /// \brief A matcher for `reference`'s exact shape, of any rank: elementwise ops take tensors of
  ///        any shape, and callers need not flatten them into a view first (a view costs a
  ///        microsecond of host time per call). `TensorMatcher::same_shape_as(src).verify(src,
  ///        "src").verify(out, "out")`: a rank or size difference names `out`.
  static auto same_shape_as(const tvm::ffi::TensorView& reference, DebugInfo where = {}) -> TensorMatcher {
    return TensorMatcher(reference, where);
  }

  /**
   * \brief A matcher for a CUDA tensor of `shape` made of rows: the last dimension contiguous
   *        (unit stride), every other dimension at any stride, so a kernel reads each row with
   *        vector loads and the rows may be a slice of a wider buffer. The dtype is one of `Ts`,
   *        the device binds `device`. Shorthand for
   *        `TensorMatcher(shape).with_strides({-1, ..., -1, 1}).with_device<kDLCUDA>(device)
   *        .with_dtype<Ts...>()`, and verified the same way:
   *        `TensorMatcher::cuda_rows<T>({N, D}, device).verify(input, "input")`.
   */
  template <has_dl_dtype... Ts>
  static auto cuda_rows(std::initializer_list<SizeRef> shape, SymbolicDevice& device, DebugInfo where = {})
      -> TensorMatcher {
    static_assert(sizeof...(Ts) > 0, "cuda_rows<Ts...>() needs at least one type");
    return TensorMatcher(shape, {dl_dtype_v<Ts>...}, device, where);
  }

  /// \brief Expected strides (in elements). Omit to require a contiguous tensor.
  auto with_strides(std::initializer_list<SizeRef> strides, DebugInfo where = {}) && -> TensorMatcher&& {
    RuntimeCheck(where, !m_has_strides, "with_strides() was already given");
    RuntimeCheck(
        where,
        strides.size() == m_shape.size(),
        "with_strides() got ",
        strides.size(),
        " entries for a rank-",
        m_shape.size(),
        " shape");
    m_strides.assign(strides, where);
    m_has_strides = true;
    return std::move(*this);
  }

  /// \brief Allowed dtypes (`Ts`), optionally binding `symbol`; `with_dtype(symbol)` alone only binds.
  template <has_dl_dtype... Ts>
  auto with_dtype(SymbolicDType& symbol, DebugInfo where = {}) && -> TensorMatcher&& {
    set_dtype_options<Ts...>(where);
    m_dtype_symbol = &symbol;
    return std::move(*this);
  }

  template <has_dl_dtype... Ts>
  auto with_dtype(DebugInfo where = {}) && -> TensorMatcher&& {
    static_assert(sizeof...(Ts) > 0, "with_dtype<Ts...>() needs at least one type");
    set_dtype_options<Ts...>(where);
    return std::move(*this);
  }

  /// \brief Allowed device types (`Codes`, any id), optionally binding `symbol`.
  template <DLDeviceType... Codes>
  auto with_device(SymbolicDevice& symbol, DebugInfo where = {}) && -> TensorMatcher&& {
    set_device_options<Codes...>(where);
    m_device_symbol = &symbol;
    return std::move(*this);
  }

  template <DLDeviceType... Codes>
  auto with_device(DebugInfo where = {}) && -> TensorMatcher&& {
    static_assert(sizeof...(Codes) > 0, "with_device<Codes...>() needs at least one device type");
    set_device_options<Codes...>(where);
    return std::move(*this);
  }

  /**
   * \brief Require the data pointer, and the byte stride of every dimension but the last, to be
   *        multiples of `bytes` (a power of two), e.g. the vector width of a kernel's 16-byte
   *        loads. Size-1 dimensions are exempt: their stride is never used. The last dimension is
   *        the one the vectors run along; its stride and size stay the shape's and strides' rule.
   */
  auto ensure_alignment(int64_t bytes, DebugInfo where = {}) && -> TensorMatcher&& {
    RuntimeCheck(where, m_alignment == 0, "ensure_alignment() was already given");
    RuntimeCheck(where, bytes > 0 && (bytes & (bytes - 1)) == 0, "ensure_alignment(", bytes, "): not a power of two");
    m_alignment = bytes;
    return std::move(*this);
  }

  /// \brief Check `view`; throws `PanicError` naming the caller's line on mismatch.
  auto verify(tvm::ffi::TensorView view, DebugInfo where = {}) && -> TensorMatcher&& {
    verify_impl(view, {}, where);
    return std::move(*this);
  }

  /// \brief Same, and the message names the tensor: "Tensor match failed for 'k_cache': ...".
  auto verify(tvm::ffi::TensorView view, std::string_view name, DebugInfo where = {}) && -> TensorMatcher&& {
    verify_impl(view, name, where);
    return std::move(*this);
  }

 private:
  TensorMatcher(const tvm::ffi::TensorView& reference, const DebugInfo& where) {
    for (int32_t i = 0; i < reference.dim(); ++i) m_shape.push_back(SizeRef(reference.size(i)), where);
  }

  /// \brief `cuda_rows`' matcher, configured in place: a matcher is neither copied nor moved.
  TensorMatcher(
      std::initializer_list<SizeRef> shape,
      std::initializer_list<DLDataType> dtypes,
      SymbolicDevice& device,
      const DebugInfo& where)
      : TensorMatcher(shape, where) {
    RuntimeCheck(where, shape.size() > 0, "cuda_rows() needs a shape of rank 1 or more");
    for (std::size_t i = 0; i + 1 < shape.size(); ++i) m_strides.push_back(SizeRef{}, where);
    m_strides.push_back(SizeRef{1}, where);
    m_has_strides = true;
    set_device_options<kDLCUDA>(where);
    m_device_symbol = &device;
    m_has_dtype = true;
    m_chain_dtype.set_options(dtypes, where);
  }

  template <has_dl_dtype... Ts>
  auto set_dtype_options(const DebugInfo& where) -> void {
    RuntimeCheck(where, !m_has_dtype, "with_dtype() was already given");
    m_has_dtype = true;
    if constexpr (sizeof...(Ts) > 0) m_chain_dtype.set_options({dl_dtype_v<Ts>...}, where);
  }

  template <DLDeviceType... Codes>
  auto set_device_options(const DebugInfo& where) -> void {
    RuntimeCheck(where, !m_has_device, "with_device() was already given");
    m_has_device = true;
    if constexpr (sizeof...(Codes) > 0) m_chain_device.set_options({DLDevice{Codes, details::kAnyDeviceId}...}, where);
  }

  auto verify_impl(const tvm::ffi::TensorView& view, std::string_view name, const DebugInfo& where) -> void {
    try {
      match(view);
    } catch (const PanicError& error) {
      std::ostringstream os;
      os << "Tensor match failed for ";
      if (!name.empty()) os << "'" << name << "': ";
      os << "Tensor" << sizes(view) << "[strides=" << strides(view) << ", dtype=" << details::dtype_name(view.dtype())
         << ", device=" << details::device_name(view.device()) << "] at " << where.file_basename() << ':'
         << where.line() << "\n- Root cause: " << error.cause();
      throw PanicError(std::move(os).str(), error.cause(), error.kind());
    }
  }

  auto match(const tvm::ffi::TensorView& view) -> void {
    const auto rank = static_cast<std::size_t>(view.dim());
    if (rank != m_shape.size()) {
      details::mismatch(
          "Rank mismatch: expected " + std::to_string(m_shape.size()) + " but got " + std::to_string(rank));
    }
    for (std::size_t i = 0; i < rank; ++i) {
      match_entry(m_shape[i], view.size(i), "Size mismatch", "shape", i);
    }
    if (m_has_strides) {
      for (std::size_t i = 0; i < rank; ++i) {
        // A size-1 dim's stride is meaningless: never compare it, only use it to bind.
        if (view.size(i) == 1 && (m_strides[i].is_known() || m_strides[i].is_wildcard())) continue;
        match_entry(m_strides[i], view.stride(i), "Stride mismatch", "stride", i);
      }
    } else if (!view.is_contiguous()) {
      details::mismatch(
          "Tensor is not contiguous: expected strides " + contiguous_strides(view) + " but got " + strides(view));
    }
    match_symbol(m_dtype_symbol, m_chain_dtype, view.dtype());
    match_symbol(m_device_symbol, m_chain_device, view.device());
    if (m_alignment != 0) match_alignment(view);
  }

  auto match_alignment(const tvm::ffi::TensorView& view) const -> void {
    const auto address = reinterpret_cast<std::uintptr_t>(view.data_ptr());
    if (address % static_cast<std::uintptr_t>(m_alignment) != 0) {
      details::mismatch(
          "Misaligned data pointer: expected a multiple of " + std::to_string(m_alignment) + " bytes but got " +
          std::to_string(address) + " (" + std::to_string(address % m_alignment) + " past it)");
    }
    const auto element_bytes = static_cast<int64_t>(dtype_bytes(view.dtype()));
    for (int32_t i = 0; i + 1 < view.dim(); ++i) {
      if (view.size(i) == 1 || (view.stride(i) * element_bytes) % m_alignment == 0) continue;
      details::mismatch(
          "Misaligned stride for dim#" + std::to_string(i) + ": expected a multiple of " + std::to_string(m_alignment) +
          " bytes but got " + std::to_string(view.stride(i) * element_bytes) + " (" + std::to_string(view.stride(i)) +
          " elements)");
    }
  }

  /// \brief Compare one shape/stride entry against the tensor's value. The
  /// message is only built on a mismatch: this runs for every launch.
  static auto match_entry(const SizeRef& ref, int64_t actual, const char* headline, const char* kind, std::size_t i)
      -> void {
    if (ref.is_wildcard()) return;
    const auto symbol = ref.symbol();
    if (symbol != nullptr ? symbol->try_match(actual) : ref.value() == actual) return;
    auto what = std::string{headline} + " for " + kind + "#" + std::to_string(i);
    if (symbol != nullptr && !symbol->name().empty()) what += "('" + std::string{symbol->name()} + "')";
    const auto expected = symbol != nullptr ? symbol->expected() : std::to_string(ref.value());
    details::mismatch(what + ": expected " + expected + " but got " + std::to_string(actual));
  }

  /// \brief Without a user symbol the chain symbol checks its options and binds.
  /// With one, the chain's options are checked too, but after a bound symbol's
  /// value, so the message says "expected float16" rather than "one of [...]".
  template <typename Symbol, typename Value>
  static auto match_symbol(Symbol* user, Symbol& chain, Value value) -> void {
    if (user == nullptr) return chain.match(value);
    if (!user->has_value() && !chain.allows(value)) chain.match(value);  // throws
    user->match(value);
    if (!chain.allows(value)) chain.match(value);  // throws
  }

  /// \brief "<a, b, c>" from `rank` values.
  template <typename Get>
  static auto angle_list(int32_t rank, Get get) -> std::string {
    std::ostringstream os;
    os << "<";
    for (int32_t i = 0; i < rank; ++i) os << (i > 0 ? ", " : "") << get(i);
    os << ">";
    return std::move(os).str();
  }

  static auto sizes(const tvm::ffi::TensorView& view) -> std::string {
    return angle_list(view.dim(), [&](int32_t i) { return view.size(i); });
  }

  static auto strides(const tvm::ffi::TensorView& view) -> std::string {
    return angle_list(view.dim(), [&](int32_t i) { return view.stride(i); });
  }

  static auto contiguous_strides(const tvm::ffi::TensorView& view) -> std::string {
    std::array<int64_t, details::kMaxRank> expected{};
    int64_t stride = 1;
    for (int32_t i = view.dim() - 1; i >= 0; --i) {
      expected[i] = stride;
      stride *= view.size(i);
    }
    return angle_list(view.dim(), [&](int32_t i) { return expected[i]; });
  }

  SizeList m_shape;
  SizeList m_strides;
  bool m_has_strides = false;
  bool m_has_dtype = false;
  bool m_has_device = false;
  // Implicit per-chain symbols: they hold the `with_*<...>` options and, when
  // the user gives no symbol, bind so that all tensors of the chain agree.
  SymbolicDType m_chain_dtype;
  SymbolicDevice m_chain_device;
  SymbolicDType* m_dtype_symbol = nullptr;
  SymbolicDevice* m_device_symbol = nullptr;
  int64_t m_alignment = 0;  // bytes; 0: not asked
};

}  // namespace host
