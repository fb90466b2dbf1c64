// flashext GeLU epilogues, forward: out = gelu(x + y) (add_gelu.cuh) and out = gelu(x + bias)
// (bias_gelu.cuh); the launch plan comes from plan.h.
#include "add_gelu.cuh"
#include "bias_gelu.cuh"
#include "flashext/gelu.h"
#include "plan.h"

namespace flashext {

using namespace gelu_detail;

cudaError_t run_add_gelu_fwd(const AddGeluParams& p, cudaStream_t stream) {
  if (p.n < 0) return cudaErrorInvalidValue;
  if (p.n == 0) return cudaSuccess;
  const FlatArgs args{nullptr, p.x, p.y, p.out, p.n, p.approximate == GeluApprox::kTanh};
  return dispatch_dtype(p.dtype, [&](auto type_tag) {
    return launch_add_gelu<decltype(type_tag), /*kBackward=*/false>(args, stream);
  });
}

cudaError_t run_bias_gelu_fwd(const BiasGeluParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.cols < 0 || p.x_row_stride < p.cols) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  const void* ptrs[] = {p.x, p.bias, p.out};
  const int vec = bias_gelu_vec_width(ptrs, 3, p.cols, p.x_row_stride, p.dtype);
  return dispatch_dtype(p.dtype, [&](auto type_tag) {
    using T = decltype(type_tag);
    const int row_unroll = sizeof(T) == 4 ? bias_gelu_fwd_rows_fp32(p.rows, p.cols, vec, current_device_sm_count())
                                          : kBiasRowUnroll<T, /*kBackward=*/false>;
    const RowColPlan plan = plan_bias_gelu(p.rows, p.cols, vec, /*max_row_groups=*/INT64_MAX, row_unroll);
    const RowColArgs args{nullptr, p.x, p.bias, p.out, nullptr, p.rows, p.cols, p.x_row_stride,
                          plan.rows_per_block, p.approximate == GeluApprox::kTanh};
    return launch_bias_gelu<T, /*kBackward=*/false>(args, plan, stream);
  });
}

}  // namespace flashext
