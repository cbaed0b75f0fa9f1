/// \file source_location.h
/// \brief Includes `<source_location>` in a way every supported compiler accepts.
///
/// nvcc up to 12.1 does not define `__cpp_consteval`, so libstdc++ hides
/// `std::source_location` from it (and its front end rejects `consteval`).
/// For those versions we pretend the feature exists and spell `consteval` as
/// `constexpr` while the header is parsed, then restore both macros.
/// ref: https://forums.developer.nvidia.com/t/c-20s-source-location-compilation-error-when-using-nvcc-12-1/258026/3

#pragma once

#if defined(__CUDACC__) && !defined(__clang__) && defined(__CUDACC_VER_MAJOR__) && \
    (__CUDACC_VER_MAJOR__ < 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ <= 1))
#pragma push_macro("__cpp_consteval")
#pragma push_macro("consteval")
#undef __cpp_consteval
#define __cpp_consteval 201811L
#define consteval constexpr
#include <source_location>
#pragma pop_macro("consteval")
#pragma pop_macro("__cpp_consteval")
#else
#include <source_location>
#endif

#if !defined(__cpp_lib_source_location)
#error "sgl_kernel needs std::source_location: compile with -std=c++20 (g++ >= 11, nvcc >= 12)"
#endif
