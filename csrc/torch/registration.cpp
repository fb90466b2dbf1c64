// flashext: every op's schema, written once. Implementations register per backend in the op
// family's glue file (gelu.cpp); fake (meta) kernels and autograd formulas live in Python
// (flashext/gelu.py), which torch imports when it needs them (set_python_module).
#include <torch/library.h>

TORCH_LIBRARY(flashext, m) {
  m.set_python_module("flashext.gelu");
  // out = gelu(x + y); approximate: "none" (erf) or "tanh"
  m.def("add_gelu(Tensor x, Tensor y, str approximate=\"none\") -> Tensor");
  m.def("add_gelu_out(Tensor x, Tensor y, str approximate, Tensor(a!) out) -> ()");
  // grad_x = grad_y = grad_out · gelu'(x + y)
  m.def("add_gelu_backward(Tensor grad_out, Tensor x, Tensor y, str approximate=\"none\") -> Tensor");
  // out = gelu(x + bias), bias broadcast over the last dimension
  m.def("bias_gelu(Tensor x, Tensor bias, str approximate=\"none\") -> Tensor");
  m.def("bias_gelu_out(Tensor x, Tensor bias, str approximate, Tensor(a!) out) -> ()");
  // (grad_x, grad_bias) with grad_bias = Σ over all leading dims of grad_x
  m.def("bias_gelu_backward(Tensor grad_out, Tensor x, Tensor bias, str approximate=\"none\") -> (Tensor, Tensor)");
}
