/// \file utils.h
/// \brief Host-side essentials for kernel launchers. Plain C++20: no CUDA needed.
///
/// - `DebugInfo`: the caller's source location, captured by a default argument.
/// - `PanicError`: the exception every check throws. It derives from `std::runtime_error` and
///   carries an `ErrorKind`; exports made by `load_jit` (see `export.h`) raise it in Python as
///   that kind: `RuntimeCheck` and `TensorMatcher` failures as `ValueError` (a dtype mismatch as
///   `TypeError`), `Panic` / `CHECK_CUDA` as `RuntimeError`.
/// - `panic` / `Panic`: throw unconditionally; `RuntimeCheck`: throw unless a condition holds.
/// - `irange`, `div_ceil`, `pointer::offset`, `dtype_bytes`.
///
/// Error message format (one line; the arguments are streamed with `operator<<`):
///
///     Runtime check failed at <file>:<line>: <args...>     (RuntimeCheck)
///     Panic at <file>:<line>: <args...>                    (Panic, panic)
///
/// `<file>` is the basename of the caller's source file. Without arguments the
/// message ends after `<line>`. g++ reports the line of the call itself; in code
/// compiled by nvcc, a call spread over several lines (a `TensorMatcher` chain)
/// reports the first line of its statement.

#pragma once

#include <sgl_kernel/source_location.h>

#include <dlpack/dlpack.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <ranges>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

// Small helpers that kernels may also call from device code.
#ifdef __CUDACC__
#define SGL_HOST_DEVICE __host__ __device__ inline
#else
#define SGL_HOST_DEVICE inline
#endif

namespace host {

/// \brief Where a check was written. Declare it as a defaulted parameter
/// (`DebugInfo where = {}`) and it records the caller's file and line.
struct DebugInfo : public std::source_location {
  DebugInfo(std::source_location location = std::source_location::current()) : std::source_location(location) {}

  /// \brief The file name without its directories: `my_kernel.cuh`.
  auto file_basename() const -> std::string_view {
    const auto path = std::string_view{file_name()};
    const auto slash = path.find_last_of("/\\");
    return slash == std::string_view::npos ? path : path.substr(slash + 1);
  }
};

/// \brief Thrown by every failed check. `what()` is the full message;
/// `cause()` is only the part that explains the failure (without the
/// "... at file:line: " prefix), so callers can nest it in a larger report.
/// \brief The Python exception a failure maps to: a bad argument (`ValueError`), an argument of
/// the wrong type or dtype (`TypeError`), or a failure that is not the caller's (`RuntimeError`).
enum class ErrorKind { RuntimeError, ValueError, TypeError };

inline constexpr auto error_kind_name(ErrorKind kind) -> const char* {
  switch (kind) {
    case ErrorKind::ValueError: return "ValueError";
    case ErrorKind::TypeError: return "TypeError";
    default: return "RuntimeError";
  }
}

class PanicError : public std::runtime_error {
 public:
  PanicError(std::string message, std::string cause, ErrorKind kind = ErrorKind::RuntimeError)
      : std::runtime_error(std::move(message)), m_cause(std::move(cause)), m_kind(kind) {}

  auto cause() const noexcept -> const std::string& {
    return m_cause;
  }

  auto kind() const noexcept -> ErrorKind {
    return m_kind;
  }

 private:
  std::string m_cause;
  ErrorKind m_kind;
};

namespace details {

template <typename... Args>
inline auto stream_to_string(Args&&... args) -> std::string {
  if constexpr (sizeof...(Args) == 0) {
    return {};
  } else {
    std::ostringstream os;
    (os << ... << std::forward<Args>(args));
    return std::move(os).str();
  }
}

/// \brief Throws `PanicError("<headline> at <file>:<line>[: <args...>]", kind)`.
template <typename... Args>
[[noreturn]] inline void fail(std::string_view headline, ErrorKind kind, const DebugInfo& where, Args&&... args) {
  auto cause = stream_to_string(std::forward<Args>(args)...);
  std::ostringstream os;
  os << headline << " at " << where.file_basename() << ':' << where.line();
  if (!cause.empty()) os << ": " << cause;
  throw PanicError(std::move(os).str(), std::move(cause), kind);
}

}  // namespace details

/// \brief Throws a `PanicError` ("Panic at <file>:<line>: <args...>").
template <typename... Args>
[[noreturn]] inline void panic(DebugInfo where, Args&&... args) {
  details::fail("Panic", ErrorKind::RuntimeError, where, std::forward<Args>(args)...);
}

/**
 * \brief Runtime assertion. Throws `PanicError` when `condition` is false;
 *        the remaining arguments are streamed into the message.
 *
 * \code
 *   RuntimeCheck(n > 0, "n must be positive, got ", n);
 *   RuntimeCheck(where, n > 0, "n must be positive");  // report `where` instead of this line
 * \endcode
 *
 * It is a class template (used through its deduction guides) only so that a
 * defaulted `DebugInfo` can follow the variadic message arguments.
 * \note Write the condition as an expression: `RuntimeCheck(ok);` with a plain
 *       variable would declare a variable named `ok`. Use `RuntimeCheck(ok, "...")`.
 */
template <typename... Args>
struct RuntimeCheck {
  template <typename Cond>
  explicit RuntimeCheck(Cond&& condition, Args&&... args, DebugInfo where = {}) {
    if (static_cast<bool>(condition)) [[likely]]
      return;
    details::fail("Runtime check failed", ErrorKind::ValueError, where, std::forward<Args>(args)...);
  }

  template <typename Cond>
  explicit RuntimeCheck(DebugInfo where, Cond&& condition, Args&&... args) {
    if (static_cast<bool>(condition)) [[likely]]
      return;
    details::fail("Runtime check failed", ErrorKind::ValueError, where, std::forward<Args>(args)...);
  }
};

template <typename Cond, typename... Args>
explicit RuntimeCheck(Cond&&, Args&&...) -> RuntimeCheck<Args...>;

template <typename Cond, typename... Args>
explicit RuntimeCheck(DebugInfo, Cond&&, Args&&...) -> RuntimeCheck<Args...>;

/**
 * \brief Throws unconditionally: `Panic("unsupported dtype ", dtype);`
 *
 * Like `RuntimeCheck`, a class template so the call site is captured; also
 * accepts an explicit `DebugInfo` first. The destructor is `[[noreturn]]` so
 * the compiler knows a `Panic(...)` statement ends the control flow (no
 * "missing return" warnings after it); it never runs because the constructor throws.
 */
template <typename... Args>
struct Panic {
  [[noreturn]] explicit Panic(Args&&... args, DebugInfo where = {}) {
    details::fail("Panic", ErrorKind::RuntimeError, where, std::forward<Args>(args)...);
  }

  [[noreturn]] explicit Panic(DebugInfo where, Args&&... args)
    requires(sizeof...(Args) > 0)
  {
    details::fail("Panic", ErrorKind::RuntimeError, where, std::forward<Args>(args)...);
  }

  [[noreturn]] ~Panic() {
    std::terminate();
  }
};

template <typename... Args>
explicit Panic(Args&&...) -> Panic<Args...>;

template <typename... Args>
explicit Panic(DebugInfo, Args&&...) -> Panic<Args...>;

namespace pointer {

/// \brief Byte-wise (or `T`-wise) offset of an untyped pointer:
/// `offset(ptr, a, b)` is `(char*)ptr + a + b`, `offset<float>(ptr, i)` is `(float*)ptr + i`.
///
/// The result is untyped (`void*` or `const void*`, constness kept), and the offsets never count
/// elements of the pointee: a typed pointer is converted to an untyped one first (below).
template <typename T = char, typename P, std::integral... Offsets>
  requires std::is_same_v<std::remove_const_t<P>, void>
SGL_HOST_DEVICE auto offset(P* ptr, Offsets... offsets) -> P* {
  using Unit = std::conditional_t<std::is_const_v<P>, const T, T>;
  return (static_cast<Unit*>(ptr) + ... + offsets);
}

/// \brief A typed pointer is taken as untyped, as sglang's headers do (`const char*` in, `const
/// void*` out): the offsets still count bytes (or `T`s), never elements of `*ptr`.
template <typename T = char, typename P, std::integral... Offsets>
  requires(!std::is_void_v<std::remove_const_t<P>>)
SGL_HOST_DEVICE auto offset(P* ptr, Offsets... offsets) {
  using Void = std::conditional_t<std::is_const_v<P>, const void, void>;
  return offset<T>(static_cast<Void*>(ptr), offsets...);
}

}  // namespace pointer

/// \brief Ceiling division for non-negative integers: `div_ceil(10, 4) == 3`.
template <std::integral T, std::integral U>
SGL_HOST_DEVICE constexpr auto div_ceil(T a, U b) {
  return (a + b - 1) / b;
}

/// \brief Bytes per element of a DLPack dtype (rounded up for sub-byte types).
inline constexpr auto dtype_bytes(DLDataType dtype) -> std::size_t {
  return (static_cast<std::size_t>(dtype.bits) * dtype.lanes + 7) / 8;
}

/// \brief `static_assert(dependent_false_v<T>, "...")` in the last `if constexpr` branch: only
/// fails for the instantiations that reach it.
template <typename>
inline constexpr bool dependent_false_v = false;

// Short names for the ranges library, as kernels written for sglang.jit_kernel spell them.
namespace stdr = std::ranges;
namespace stdv = std::views;

/// \brief Python-style range `[0, end)`, usable in range-for.
template <std::integral T>
inline auto irange(T end) {
  return std::views::iota(T{0}, std::max(T{0}, end));
}

/// \brief Python-style range `[begin, end)`; empty when `end <= begin`.
template <std::integral T, std::integral U>
inline auto irange(T begin, U end) {
  using V = std::common_type_t<T, U>;
  const auto first = static_cast<V>(begin);
  return std::views::iota(first, std::max(first, static_cast<V>(end)));
}

/**
 * \brief Stream-style panic: `Error{}.stream << "bad size " << n;` throws `PanicError`
 *        ("Panic at <file>:<line>: bad size 7") when the temporary dies, at the end of the
 *        full expression. `CHECK_HOST(cond) << ...` builds on it.
 */
struct Error {
  std::ostringstream stream;

  explicit Error(DebugInfo where = {}) : m_where(where) {}
  Error(const Error&) = delete;
  Error& operator=(const Error&) = delete;

  // Throwing from a destructor is the point here: it must be allowed to leave.
  [[noreturn]] ~Error() noexcept(false) {
    details::fail("Panic", ErrorKind::RuntimeError, m_where, std::move(stream).str());
  }

 private:
  DebugInfo m_where;
};

}  // namespace host

/// \brief `SGL_PANIC << "message " << value;` throws `host::PanicError` naming this line.
#define SGL_PANIC ::host::Error{}.stream

/// \brief `CHECK_HOST(n > 0) << "n = " << n;`: the message is only built when the check fails.
#define CHECK_HOST(COND) \
  if (COND) [[likely]] { \
  } else                 \
    SGL_PANIC

/// sglang 0.5.23 moved this library into `namespace sglang` (`sglang::host::RuntimeCheck`, kernel
/// code inside `namespace sglang { ... }`). Nothing else changed, so `sglang::host` only forwards
/// to `::host`. It is a real namespace, not an alias, because such kernels reopen it
/// (`namespace sglang { namespace host::compress { ... } }`).
namespace sglang::host {
using namespace ::host;
}  // namespace sglang::host
