// flashext GeLU epilogues, backward: grad = grad_out · gelu'(z) for add + GeLU (add_gelu.cuh), and
// for bias + GeLU with the bias gradient Σ_rows grad, in one launch over few rows
// (bias_gelu_bwd_one_pass.cuh) or as a rows pass and a column reduction (bias_gelu.cuh).
#include "add_gelu.cuh"
#include "bias_gelu.cuh"
#include "bias_gelu_bwd_one_pass.cuh"
#include "flashext/gelu.h"
#include "plan.h"

namespace flashext {

using namespace gelu_detail;

cudaError_t run_add_gelu_bwd(const AddGeluBwdParams& p, cudaStream_t stream) {
  if (p.n < 0) return cudaErrorInvalidValue;
  if (p.n == 0) return cudaSuccess;
  const FlatArgs args{p.grad_out, p.x, p.y, p.grad_in, p.n, p.approximate == GeluApprox::kTanh};
  return dispatch_dtype(p.dtype, [&](auto type_tag) {
    return launch_add_gelu<decltype(type_tag), /*kBackward=*/true>(args, stream);
  });
}

cudaError_t run_bias_gelu_bwd(const BiasGeluBwdParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.cols < 0 || p.x_row_stride < p.cols) return cudaErrorInvalidValue;
  if (p.cols == 0) return cudaSuccess;
  if (p.rows == 0) {  // Σ over no rows: the bias gradient is zero
    return cudaMemsetAsync(p.grad_bias, 0, size_t(p.cols) * dtype_size(p.dtype), stream);
  }
  const bool tanh_form = p.approximate == GeluApprox::kTanh;
  if (bias_gelu_bwd_one_pass(p)) {
    const RowColArgs args{p.grad_out, p.x, p.bias, p.grad_x, nullptr, p.rows, p.cols, p.x_row_stride,
                          p.rows, tanh_form, p.grad_bias};
    return dispatch_dtype(p.dtype, [&](auto type_tag) {
      return launch_bias_gelu_bwd_one_pass<decltype(type_tag)>(args, stream);
    });
  }
  if (p.workspace == nullptr) return cudaErrorInvalidValue;
  const RowColPlan plan = plan_bias_gelu_bwd(p);
  const RowColArgs args{p.grad_out, p.x, p.bias, p.grad_x, p.workspace, p.rows, p.cols,
                        p.x_row_stride, plan.rows_per_block, tanh_form};
  return dispatch_dtype(p.dtype, [&](auto type_tag) {
    using T = decltype(type_tag);
    FX_RETURN_IF_ERROR((launch_bias_gelu<T, /*kBackward=*/true>(args, plan, stream)));
    const dim3 block(kReduceCols, kReduceSlices);
    const dim3 grid(unsigned(ceil_div(p.cols, kReduceCols)));
    bias_grad_reduce_kernel<T><<<grid, block, 0, stream>>>(p.workspace, static_cast<T*>(p.grad_bias),
                                                           plan.grid_y, p.cols);
    return cudaGetLastError();
  });
}

}  // namespace flashext
