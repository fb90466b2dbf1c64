// flashext GeLU epilogues: torch glue. Checks inputs (one place for the family, for the CUDA
// kernels and for tracing alike: see common.h), builds the params structs of flashext/gelu.h and
// launches on the current stream. Schemas: registration.cpp.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <string>
#include <tuple>

#include "common.h"
#include "flashext/gelu.h"

namespace flashext_torch {
namespace {

constexpr const char* kAddGelu = "flashext.fused_add_gelu";
constexpr const char* kBiasGelu = "flashext.bias_gelu";

flashext::GeluApprox parse_approximate(const char* fn, std::string_view approximate) {
  if (approximate == "none") return flashext::GeluApprox::kNone;
  if (approximate == "tanh") return flashext::GeluApprox::kTanh;
  fail(fn, ": argument 'approximate' must be 'none' or 'tanh', got '", approximate, "'");
}

// ---- add + GeLU: x, y, grad_out of one shape; dense copies of non-contiguous views ----------

// The checks of every add + GeLU op; returns the parsed `approximate`.
flashext::GeluApprox check_add_gelu_inputs(const char* fn, const at::Tensor& x, const at::Tensor& y,
                                           const at::Tensor* grad_out, std::string_view approximate) {
  check_float_cuda_tensor(fn, x, "x");
  check_same_device_dtype(fn, x, "x", y, "y");
  FX_CHECK(y.sym_sizes() == x.sym_sizes(), fn, ": argument 'y' must have the shape of 'x' (", x.sym_sizes(),
           "), got ", y.sym_sizes());
  if (grad_out != nullptr) {
    check_same_device_dtype(fn, x, "x", *grad_out, "grad_out");
    FX_CHECK(grad_out->sym_sizes() == x.sym_sizes(), fn, ": argument 'grad_out' must have the shape of 'x' (",
             x.sym_sizes(), "), got ", grad_out->sym_sizes());
  }
  return parse_approximate(fn, approximate);
}

void launch_add_gelu(const at::Tensor& x_in, const at::Tensor& y_in, flashext::GeluApprox approx, at::Tensor& out) {
  if (is_meta(x_in) || x_in.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous(), y = y_in.contiguous();  // copies only for strided views
  flashext::AddGeluParams params;
  params.x = x.data_ptr();
  params.y = y.data_ptr();
  params.out = out.data_ptr();
  params.n = x.numel();
  params.dtype = to_kernel_dtype(x.scalar_type());
  params.approximate = approx;
  check_launch(kAddGelu, flashext::run_add_gelu_fwd(params, current_stream(x)));
}

at::Tensor add_gelu(const at::Tensor& x, const at::Tensor& y, std::string approximate) {
  const auto approx = check_add_gelu_inputs(kAddGelu, x, y, nullptr, approximate);
  at::Tensor out = at::empty_symint(x.sym_sizes(), x.options());
  launch_add_gelu(x, y, approx, out);
  return out;
}

void add_gelu_out(const at::Tensor& x, const at::Tensor& y, std::string approximate, at::Tensor out) {
  const auto approx = check_add_gelu_inputs(kAddGelu, x, y, nullptr, approximate);
  check_out_tensor(kAddGelu, out, x, {x, y});
  launch_add_gelu(x, y, approx, out);
}

at::Tensor add_gelu_backward(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& y,
                             std::string approximate) {
  const auto approx = check_add_gelu_inputs(kAddGelu, x, y, &grad_out, approximate);
  at::Tensor grad_in = at::empty_symint(x.sym_sizes(), x.options());
  if (is_meta(x) || x.numel() == 0) return grad_in;
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor g = grad_out.contiguous(), xc = x.contiguous(), yc = y.contiguous();
  flashext::AddGeluBwdParams params;
  params.grad_out = g.data_ptr();
  params.x = xc.data_ptr();
  params.y = yc.data_ptr();
  params.grad_in = grad_in.data_ptr();
  params.n = x.numel();
  params.dtype = to_kernel_dtype(x.scalar_type());
  params.approximate = approx;
  check_launch(kAddGelu, flashext::run_add_gelu_bwd(params, current_stream(x)));
  return grad_in;
}

// ---- bias + GeLU: x viewed as rows × cols (cols = last dim), bias of length cols -----------

// The checks of every bias + GeLU op; returns the parsed `approximate`.
flashext::GeluApprox check_bias_gelu_inputs(const char* fn, const at::Tensor& x, const at::Tensor& bias,
                                            const at::Tensor* grad_out, std::string_view approximate) {
  check_float_cuda_tensor(fn, x, "x");
  check_same_device_dtype(fn, x, "x", bias, "bias");
  FX_CHECK(x.dim() >= 1, fn, ": argument 'x' must have at least one dimension, got a scalar");
  FX_CHECK(bias.dim() == 1 && bias.sym_size(0) == x.sym_size(-1), fn,
           ": argument 'bias' must be 1-D of length x.shape[-1] = ", x.sym_size(-1), ", got shape ",
           bias.sym_sizes());
  if (grad_out != nullptr) {
    check_same_device_dtype(fn, x, "x", *grad_out, "grad_out");
    FX_CHECK(grad_out->sym_sizes() == x.sym_sizes(), fn, ": argument 'grad_out' must have the shape of 'x' (",
             x.sym_sizes(), "), got ", grad_out->sym_sizes());
  }
  return parse_approximate(fn, approximate);
}

void launch_bias_gelu(const at::Tensor& x, const at::Tensor& bias, flashext::GeluApprox approx, at::Tensor& out) {
  if (is_meta(x) || x.numel() == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  const RowView view = row_view(x);
  const at::Tensor b = bias.contiguous();
  flashext::BiasGeluParams params;
  params.x = view.tensor.data_ptr();
  params.bias = b.data_ptr();
  params.out = out.data_ptr();
  params.rows = view.rows;
  params.cols = view.cols;
  params.x_row_stride = view.row_stride;
  params.dtype = to_kernel_dtype(x.scalar_type());
  params.approximate = approx;
  check_launch(kBiasGelu, flashext::run_bias_gelu_fwd(params, current_stream(x)));
}

at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias, std::string approximate) {
  const auto approx = check_bias_gelu_inputs(kBiasGelu, x, bias, nullptr, approximate);
  at::Tensor out = at::empty_symint(x.sym_sizes(), x.options());
  launch_bias_gelu(x, bias, approx, out);
  return out;
}

void bias_gelu_out(const at::Tensor& x, const at::Tensor& bias, std::string approximate, at::Tensor out) {
  const auto approx = check_bias_gelu_inputs(kBiasGelu, x, bias, nullptr, approximate);
  check_out_tensor(kBiasGelu, out, x, {x, bias});
  launch_bias_gelu(x, bias, approx, out);
}

std::tuple<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& grad_out, const at::Tensor& x,
                                                      const at::Tensor& bias, std::string approximate) {
  const auto approx = check_bias_gelu_inputs(kBiasGelu, x, bias, &grad_out, approximate);
  at::Tensor grad_x = at::empty_symint(x.sym_sizes(), x.options());
  if (is_meta(x)) return {grad_x, at::empty_symint(bias.sym_sizes(), bias.options())};
  if (x.size(-1) == 0) return {grad_x, at::empty(bias.sizes(), bias.options())};
  if (x.numel() == 0) return {grad_x, at::zeros(bias.sizes(), bias.options())};
  const c10::cuda::CUDAGuard guard(x.device());
  const RowView view = row_view(x);
  const at::Tensor g = grad_out.contiguous(), b = bias.contiguous();
  at::Tensor grad_bias = at::empty(bias.sizes(), bias.options());
  flashext::BiasGeluBwdParams params;
  params.grad_out = g.data_ptr();
  params.x = view.tensor.data_ptr();
  params.bias = b.data_ptr();
  params.grad_x = grad_x.data_ptr();
  params.grad_bias = grad_bias.data_ptr();
  params.rows = view.rows;
  params.cols = view.cols;
  params.x_row_stride = view.row_stride;
  params.dtype = to_kernel_dtype(x.scalar_type());
  params.approximate = approx;
  // Partial column sums come from PyTorch's caching allocator (graph-capture safe); the one-pass
  // backward (few rows) needs none.
  const int64_t workspace_floats = int64_t(flashext::bias_gelu_bwd_workspace_bytes(params) / sizeof(float));
  at::Tensor workspace;
  if (workspace_floats > 0) {
    workspace = at::empty({workspace_floats}, x.options().dtype(at::kFloat));
    params.workspace = workspace.data_ptr<float>();
  }
  check_launch(kBiasGelu, flashext::run_bias_gelu_bwd(params, current_stream(x)));
  return {grad_x, grad_bias};
}

void register_gelu_impls(torch::Library& m) {
  m.impl("add_gelu", &add_gelu);
  m.impl("add_gelu_out", &add_gelu_out);
  m.impl("add_gelu_backward", &add_gelu_backward);
  m.impl("bias_gelu", &bias_gelu);
  m.impl("bias_gelu_out", &bias_gelu_out);
  m.impl("bias_gelu_backward", &bias_gelu_backward);
}

}  // namespace

// CUDA tensors run the kernels; CPU tensors reach the same checks, which refuse them by name; meta
// (fake) tensors get every check but the device ones, and empty outputs of the right shape.
TORCH_LIBRARY_IMPL(flashext, CUDA, m) { register_gelu_impls(m); }
TORCH_LIBRARY_IMPL(flashext, CPU, m) { register_gelu_impls(m); }
TORCH_LIBRARY_IMPL(flashext, Meta, m) { register_gelu_impls(m); }

}  // namespace flashext_torch
