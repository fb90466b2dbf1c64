// flashext online softmax: torch glue. Checks the input (for the CUDA kernel and for tracing
// alike: see common.h), builds OnlineSoftmaxParams (flashext/online_softmax.h) and launches on the
// current stream. Schema: registration.cpp; the public function: flashext/softmax.py.
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common.h"
#include "flashext/online_softmax.h"

namespace flashext_torch {
namespace {

constexpr const char* kOnlineSoftmax = "flashext.online_softmax";

at::Tensor online_softmax(const at::Tensor& x) {
  check_float_cuda_tensor(kOnlineSoftmax, x, "x");
  FX_CHECK(x.dim() >= 1, kOnlineSoftmax, ": argument 'x' must have at least one dimension, got a scalar");
  at::Tensor y = at::empty_symint(x.sym_sizes(), x.options());
  if (is_meta(x) || y.numel() == 0) return y;
  const c10::cuda::CUDAGuard guard(x.device());
  const RowView view = row_view(x);
  flashext::OnlineSoftmaxParams p;
  p.x = view.tensor.data_ptr();
  p.y = y.data_ptr();
  p.rows = view.rows;
  p.cols = view.cols;
  p.x_row_stride = view.row_stride;
  p.y_row_stride = view.cols;
  p.dtype = to_kernel_dtype(x.scalar_type());
  check_launch(kOnlineSoftmax, flashext::run_online_softmax(p, current_stream(x)));
  return y;
}

}  // namespace

// CUDA tensors run the kernel; CPU tensors reach the same checks, which refuse them by name; meta
// (fake) tensors get every check but the device ones.
TORCH_LIBRARY_IMPL(flashext, CUDA, m) { m.impl("online_softmax", &online_softmax); }
TORCH_LIBRARY_IMPL(flashext, CPU, m) { m.impl("online_softmax", &online_softmax); }
TORCH_LIBRARY_IMPL(flashext, Meta, m) { m.impl("online_softmax", &online_softmax); }

}  // namespace flashext_torch
