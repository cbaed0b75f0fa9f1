// What the attention kernels share: the constants that move log-sum-exps between base e and base 2.
#pragma once

namespace jit_kernel::attention {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

}  // namespace jit_kernel::attention
