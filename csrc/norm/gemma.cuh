// Gemma's RMSNorm: out = T(x * rsqrt(mean(x^2) + eps) * (1 + w)), computed in fp32 with the
// weight applied as (1 + float(w)) and one rounding at the end, as transformers' GemmaRMSNorm
// (`(x.float() * rrms) * (1.0 + weight.float())`, then `.type_as(x)`). The fused form stores
// residual = T(input + residual) and normalises that stored value into input, as
// fused_add_rmsnorm does.
//
// Template parameter: T (fp16_t, bf16_t, fp32_t). D is a run-time value: the rows are reduced as
// rmsnorm reduces rows of that shape (epilogue_row.cuh's row kernels with the (1 + w) epilogue).
#pragma once

#include "epilogue_row.cuh"

namespace jit_kernel::norm {

template <typename T>
struct GemmaRMSNorm {
  // out = gemma_rmsnorm(input) (rows [N, D], unit last stride; out may be input); weight [D].
  static void rmsnorm(
      tvm::ffi::TensorView out,
      tvm::ffi::TensorView input,
      tvm::ffi::TensorView weight,
      double eps,
      tvm::ffi::Optional<bool> enable_pdl) {
    run(out, "out", input, tvm::ffi::Optional<tvm::ffi::TensorView>(), weight, eps, enable_pdl);
  }

  // residual = T(input + residual); input = gemma_rmsnorm(residual).
  static void fused_add(
      tvm::ffi::TensorView input,
      tvm::ffi::TensorView residual,
      tvm::ffi::TensorView weight,
      double eps,
      tvm::ffi::Optional<bool> enable_pdl) {
    run(input, "input", input, residual, weight, eps, enable_pdl);
  }

 private:
  static void run(
      tvm::ffi::TensorView out,
      const char* out_name,
      tvm::ffi::TensorView input,
      tvm::ffi::Optional<tvm::ffi::TensorView> residual,
      tvm::ffi::TensorView weight,
      double eps,
      tvm::ffi::Optional<bool> enable_pdl) {
    using namespace host;
    auto N = SymbolicSize{"num_tokens"};
    auto D = SymbolicSize{"hidden_size"};
    auto device = SymbolicDevice{};
    NormRows<T> r(input, residual, tvm::ffi::Optional<tvm::ffi::TensorView>(out), out_name, weight, eps, N, D, device);
    check_rows(residual.has_value() ? "gemma_fused_add_rmsnorm" : "gemma_rmsnorm", r.rows);
    if (r.rows == 0 || has_no_data(out)) return;  // nothing to do, or a fake call's checks alone
    EpiArgs a{};
    a.normed_aligned = r.normed_aligned;
    launch_fused_or_not<Epi::kGemma, T, 0>(r.p, a, device.unwrap(), enable_pdl);
  }
};

}  // namespace jit_kernel::norm
