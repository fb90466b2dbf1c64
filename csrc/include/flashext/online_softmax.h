// flashext online softmax: torch-free launch API.
//
//   y[r, :] = softmax(x[r, :]) = exp(x[r, :] − m) / Σ_j exp(x[r, j] − m),   m = max_j x[r, j]
//
// over the last dim of a rows × cols matrix (row strides given, last dim contiguous), with the
// running max and sum kept online (Milakov & Gimelshein, 2018): one read of x when a row fits the
// block's registers (cols ≤ 32768 fp32, 65536 fp16/bf16), else two. The same results as
// torch.softmax: a row holding NaN or +inf, or only −inf, is all NaN. fp32/fp16/bf16 storage,
// fp32 math.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "flashext/common.h"

namespace flashext {

struct OnlineSoftmaxParams {
  const void* x = nullptr;
  void* y = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t x_row_stride = 0, y_row_stride = 0;
  DType dtype = DType::kFloat32;
};

cudaError_t run_online_softmax(const OnlineSoftmaxParams& params, cudaStream_t stream);

}  // namespace flashext
