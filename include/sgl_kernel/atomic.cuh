/// \file atomic.cuh
/// \brief Atomic float max/min without a compare-and-swap loop.

#pragma once

#include <sgl_kernel/utils.cuh>

namespace device::atomic {

// IEEE floats of one sign order like their bit patterns: as signed ints for
// non-negative values, and in reverse as unsigned ints for negative ones
// (sign bit set). So one integer atomic gives the right float result for any
// current value. NaN inputs give unspecified results.

/// \brief `*addr = max(*addr, value)` atomically; returns the old value.
SGL_DEVICE float max(float* addr, float value) {
  return value >= 0.0f ? __int_as_float(atomicMax(reinterpret_cast<int*>(addr), __float_as_int(value)))
                       : __uint_as_float(atomicMin(reinterpret_cast<unsigned int*>(addr), __float_as_uint(value)));
}

/// \brief `*addr = min(*addr, value)` atomically; returns the old value.
SGL_DEVICE float min(float* addr, float value) {
  return value >= 0.0f ? __int_as_float(atomicMin(reinterpret_cast<int*>(addr), __float_as_int(value)))
                       : __uint_as_float(atomicMax(reinterpret_cast<unsigned int*>(addr), __float_as_uint(value)));
}

}  // namespace device::atomic
