// flashext GeLU epilogues: torch-free launch API.
//
//   add_gelu:   out = gelu(x + y)                      x, y, out: n elements, dense
//   bias_gelu:  out = gelu(x + bias[col])              x: rows × cols (row stride given), bias: cols
//   backward:   grad_in = grad_out · gelu'(z)          z = x + y or x + bias
//               grad_bias[col] = Σ_rows grad_in[row, col]
//
// gelu(z) = z·Φ(z) = ½·z·(1 + erf(z/√2))                        (approximate = kNone)
//         ≈ ½·z·(1 + tanh(√(2/π)·(z + 0.044715·z³)))           (approximate = kTanh)
//
// All math is fp32 whatever the storage type; indices are 64-bit. Every launch goes on the
// given stream, allocates nothing and returns the launch's cudaError_t (cudaErrorInvalidValue
// for negative sizes, a row stride below cols, or a backward that needs a workspace and has none).
// How the calls are cut into blocks is private to the kernels: csrc/kernels/gelu/plan.h.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "flashext/common.h"

namespace flashext {

enum class GeluApprox : int32_t { kNone = 0, kTanh = 1 };

struct AddGeluParams {
  const void* x = nullptr;
  const void* y = nullptr;
  void* out = nullptr;  // may alias x or y (each element is read before it is written)
  int64_t n = 0;
  DType dtype = DType::kFloat32;
  GeluApprox approximate = GeluApprox::kNone;
};

struct AddGeluBwdParams {
  const void* grad_out = nullptr;
  const void* x = nullptr;
  const void* y = nullptr;
  void* grad_in = nullptr;  // d/dx = d/dy = grad_out · gelu'(x + y)
  int64_t n = 0;
  DType dtype = DType::kFloat32;
  GeluApprox approximate = GeluApprox::kNone;
};

struct BiasGeluParams {
  const void* x = nullptr;  // rows × cols, element (r, c) at x[r * x_row_stride + c]
  const void* bias = nullptr;  // cols, contiguous
  void* out = nullptr;  // rows × cols, contiguous (row stride = cols)
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t x_row_stride = 0;
  DType dtype = DType::kFloat32;
  GeluApprox approximate = GeluApprox::kNone;
};

struct BiasGeluBwdParams {
  const void* grad_out = nullptr;  // rows × cols, contiguous
  const void* x = nullptr;  // rows × cols, row stride x_row_stride
  const void* bias = nullptr;  // cols
  void* grad_x = nullptr;  // rows × cols, contiguous
  void* grad_bias = nullptr;  // cols, in the storage dtype
  float* workspace = nullptr;  // bias_gelu_bwd_workspace_bytes(...) bytes of fp32 partial sums
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t x_row_stride = 0;
  DType dtype = DType::kFloat32;
  GeluApprox approximate = GeluApprox::kNone;
};

// Bytes of fp32 workspace run_bias_gelu_bwd needs for this call (partial column sums of the
// two-kernel backward); 0 when the call runs in one pass or is empty. Computed for the current
// device: call it on the device that will run the backward.
size_t bias_gelu_bwd_workspace_bytes(const BiasGeluBwdParams& params);

cudaError_t run_add_gelu_fwd(const AddGeluParams& params, cudaStream_t stream);
cudaError_t run_add_gelu_bwd(const AddGeluBwdParams& params, cudaStream_t stream);
cudaError_t run_bias_gelu_fwd(const BiasGeluParams& params, cudaStream_t stream);
cudaError_t run_bias_gelu_bwd(const BiasGeluBwdParams& params, cudaStream_t stream);

}  // namespace flashext
