// flashext GeLU epilogues: what every GeLU kernel shares — the launch arguments, the per-element
// epilogue (gelu(z) forward, g · gelu'(z) backward) and the one dtype switch of the family.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../common/gelu_math.h"
#include "../common/macros.h"
#include "../common/vec.cuh"
#include "flashext/common.h"

namespace flashext {
namespace gelu_detail {

// What one flat launch (add_gelu_kernel) reads and writes; grad_out is null in the forward pass.
struct FlatArgs {
  const void* grad_out;
  const void* x;
  const void* y;
  void* dst;
  int64_t n;
  bool tanh_form;
};

// What one rows × cols launch (bias_gelu_kernel, bias_gelu_bwd_one_pass_kernel) reads and writes.
struct RowColArgs {
  const void* grad_out;  // rows × cols contiguous, backward only
  const void* x;  // rows × cols, row stride x_row_stride
  const void* bias;  // cols
  void* dst;  // rows × cols contiguous
  float* partial;  // grid_y × cols, two-kernel backward only
  int64_t rows;
  int64_t cols;
  int64_t x_row_stride;
  int64_t rows_per_block;
  bool tanh_form;
  void* grad_bias;  // cols, one-pass backward only
};

// gelu(z) forward, g · gelu'(z) backward, for results of type T (gelu_math.h).
// The form is a template parameter: a runtime branch kept both forms' registers live and made the
// 16-bit kernels spill. The exact form of a 16-bit result takes the erff-free Φ (one exponential,
// one reciprocal; within one rounding step of the exact value for every 16-bit z): with erff the
// 16-bit bias kernels were issue-bound. fp32 results keep erff (memory-bound, and 24-bit accurate).
template <typename T, bool kBackward, bool kTanh>
FX_DEVICE float gelu_epilogue(float z, float g) {
  if constexpr (kBackward) {
    if constexpr (kTanh) return g * gelu_tanh_grad(z);
    else if constexpr (sizeof(T) == 2) return g * gelu_erf_16_grad(z);
    else return g * gelu_erf_grad(z);
  } else {
    if constexpr (kTanh) return gelu_tanh(z);
    else if constexpr (sizeof(T) == 2) return gelu_erf_16<std::is_same_v<T, __nv_bfloat16>>(z);
    else return gelu_erf(z);
  }
}

// Calls fn(T{}) with the storage type of dtype.
template <typename Fn>
cudaError_t dispatch_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(float{});
    case DType::kFloat16: return fn(__half{});
    case DType::kBFloat16: return fn(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace gelu_detail
}  // namespace flashext
