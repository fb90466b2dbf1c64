// flashext GeLU epilogues, backward: grad = grad_out · gelu'(z), and for bias + GeLU the bias
// gradient Σ_rows grad. Kernel bodies and their header comment: gelu_kernels.cuh.
#include "gelu_kernels.cuh"

namespace flashext {

using namespace gelu_detail;

// Few rows in one launch (bias_gelu_bwd_one_pass); -DFLASHEXT_GELU_BIAS_BWD_ONE_PASS=0 keeps the
// two-kernel path everywhere (A/B).
#ifndef FLASHEXT_GELU_BIAS_BWD_ONE_PASS
#define FLASHEXT_GELU_BIAS_BWD_ONE_PASS 1
#endif
bool bias_gelu_bwd_one_pass_enabled() { return FLASHEXT_GELU_BIAS_BWD_ONE_PASS != 0; }

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
  if (bias_gelu_bwd_one_pass(p)) {  // vectorized: 16-byte packs of T
    const RowColArgs args{p.grad_out, p.x, p.bias, p.grad_x, nullptr, p.rows, p.cols, p.x_row_stride,
                          p.rows, p.approximate == GeluApprox::kTanh, p.grad_bias};
    return dispatch_dtype(p.dtype, [&](auto type_tag) {
      using T = decltype(type_tag);
      constexpr int kThreads = kOnePassThreads<T>;
      const dim3 grid(unsigned(ceil_div(p.cols, int64_t(kVec16<T>) * BiasBwdOnePass::kColThreads)));
      constexpr size_t kSmem = one_pass_smem_bytes<T, kVec16<T>>();
      const auto kernel = args.tanh_form ? bias_gelu_bwd_one_pass_kernel<T, kVec16<T>, true>
                                         : bias_gelu_bwd_one_pass_kernel<T, kVec16<T>, false>;
      FX_RETURN_IF_ERROR(allow_dynamic_smem(kernel, kSmem));
      kernel<<<grid, kThreads, kSmem, stream>>>(args);
      return cudaGetLastError();
    });
  }
  if (p.workspace == nullptr) return cudaErrorInvalidValue;
  const RowColPlan plan = plan_bias_gelu_bwd(p);
  const RowColArgs args{p.grad_out, p.x, p.bias, p.grad_x, p.workspace, p.rows, p.cols,
                        p.x_row_stride, plan.rows_per_block, p.approximate == GeluApprox::kTanh};
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
