/// \file export.h
/// \brief `host::ffi_export(f)`: `f` with its `PanicError`s raised as their `ErrorKind` in Python.
///
/// tvm-ffi turns a `tvm::ffi::Error` into the Python exception its kind names, and any other
/// `std::exception` into a `RuntimeError`. `load_jit` and the prebuilt build export every wrapper
/// through `ffi_export`, so a failed `RuntimeCheck` or `TensorMatcher` reaches Python as a
/// `ValueError` (a dtype mismatch as a `TypeError`) with the same message:
///
/// \code
///   TVM_FFI_DLL_EXPORT_TYPED_FUNC(rmsnorm, (host::ffi_export(RMSNorm<4096, bf16_t>::run)));
/// \endcode
///
/// The wrapper has `f`'s exact signature (tvm-ffi reads it for argument conversion), and costs
/// nothing on the path that does not throw.

#pragma once

#include <sgl_kernel/utils.h>

#include <tvm/ffi/error.h>

#include <string>
#include <type_traits>
#include <utility>

namespace host {

namespace details {

/// The signature `R(Args...)` of a function, function pointer or non-generic functor.
template <typename F>
struct Signature : Signature<decltype(&F::operator())> {};
template <typename R, typename... Args>
struct Signature<R (*)(Args...)> {
  using type = R(Args...);
};
template <typename R, typename... Args>
struct Signature<R(Args...)> {
  using type = R(Args...);
};
template <typename C, typename R, typename... Args>
struct Signature<R (C::*)(Args...)> {
  using type = R(Args...);
};
template <typename C, typename R, typename... Args>
struct Signature<R (C::*)(Args...) const> {
  using type = R(Args...);
};

template <typename F, typename Sig>
struct TypedErrors;

template <typename F, typename R, typename... Args>
struct TypedErrors<F, R(Args...)> {
  F function;

  auto operator()(Args... args) const -> R {
    try {
      return function(std::forward<Args>(args)...);
    } catch (const PanicError& error) {
      throw tvm::ffi::Error(error_kind_name(error.kind()), error.what(), "");
    }
  }
};

}  // namespace details

template <typename F>
auto ffi_export(F function) {
  using Decayed = std::decay_t<F>;
  return details::TypedErrors<Decayed, typename details::Signature<Decayed>::type>{std::move(function)};
}

}  // namespace host
