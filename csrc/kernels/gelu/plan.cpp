// flashext GeLU epilogues: host-side launch planning (plan.h; no device code, unit-tested on the CPU).
#include "plan.h"

#include <algorithm>
#include <cstdint>

#include "../common/device.h"
#include "../common/macros.h"

namespace flashext {

namespace {
constexpr int64_t kMaxGridY = 65535;  // CUDA's limit on gridDim.y
}  // namespace

RowColPlan plan_bias_gelu(int64_t rows, int64_t cols, int vec, int64_t max_row_groups, int row_unroll) {
  RowColPlan plan;
  plan.vec = vec;
  plan.row_unroll = std::max(row_unroll, 1);
  plan.grid_x = std::max<int64_t>(1, ceil_div(cols, int64_t(vec) * RowColPlan::kColThreads));
  // At least one full unrolled batch of rows per row thread, so the loads overlap.
  const int64_t min_rows_per_block = int64_t(RowColPlan::kRowThreads) * plan.row_unroll;
  const int64_t cap = std::max<int64_t>(1, std::min(max_row_groups, kMaxGridY));
  const int64_t groups = std::clamp<int64_t>(ceil_div(rows, min_rows_per_block), 1, cap);
  plan.rows_per_block = std::max<int64_t>(1, ceil_div(rows, groups));
  plan.grid_y = std::max<int64_t>(1, ceil_div(rows, plan.rows_per_block));
  return plan;
}

bool bias_gelu_fwd_ring(const RowColPlan& plan, int sm_count) {
  return plan.vec > 1 && plan.grid_x * plan.grid_y <= int64_t(kBiasFwdBlocksPerSm) * std::max(sm_count, 1);
}

int bias_gelu_fwd_rows_fp32(int64_t rows, int64_t cols, int vec, int sm_count) {
  if (vec <= 1) return 2;
  const RowColPlan plan = plan_bias_gelu(rows, cols, vec, /*max_row_groups=*/INT64_MAX, kBiasRowUnrollManyWaves);
  const int64_t wave = int64_t(kBiasFwdBlocksPerSm) * std::max(sm_count, 1);
  return plan.grid_x * plan.grid_y >= int64_t(kBiasFwdManyWaves) * wave ? kBiasRowUnrollManyWaves : 2;
}

int bias_gelu_vec_width(const void* const* ptrs, int num_ptrs, int64_t cols, int64_t x_row_stride,
                        DType dtype) {
  const int vec = 16 / dtype_size(dtype);
  if (cols % vec != 0 || x_row_stride % vec != 0) return 1;
  for (int i = 0; i < num_ptrs; ++i) {
    if (ptrs[i] != nullptr && !is_aligned16(ptrs[i])) return 1;
  }
  return vec;
}

int bias_gelu_bwd_vec_width(const BiasGeluBwdParams& p) {
  const void* ptrs[] = {p.grad_out, p.x, p.bias, p.grad_x};
  return bias_gelu_vec_width(ptrs, 4, p.cols, p.x_row_stride, p.dtype);
}

RowColPlan plan_bias_gelu_bwd(const BiasGeluBwdParams& p) {
  const int vec = bias_gelu_bwd_vec_width(p);
  // Row groups: enough blocks for about four waves at four resident blocks per SM, but at
  // least 16 rows per group, so the fp32 partial sums (grid_y × cols × 4 B) stay a few percent
  // of the bytes the kernel streams (≥ 16 rows × 3 tensors × 2 B per column).
  const int64_t target_blocks = 16 * int64_t(std::max(current_device_sm_count(), 1));
  const int64_t grid_x = ceil_div(p.cols, int64_t(vec) * RowColPlan::kColThreads);
  const int64_t max_groups = std::min(ceil_div(target_blocks, grid_x), std::max<int64_t>(1, p.rows / 16));
  return plan_bias_gelu(p.rows, p.cols, vec, std::max<int64_t>(1, max_groups), /*row_unroll=*/1);
}

bool bias_gelu_bwd_one_pass(int64_t rows, int64_t cols, int vec, int sm_count) {
  if (vec <= 1 || rows > BiasBwdOnePass::kMaxRows) return false;
  return ceil_div(cols, int64_t(vec) * BiasBwdOnePass::kColThreads) >= int64_t(sm_count);
}

bool bias_gelu_bwd_one_pass(const BiasGeluBwdParams& p) {
  return bias_gelu_bwd_one_pass(p.rows, p.cols, bias_gelu_bwd_vec_width(p), current_device_sm_count());
}

size_t bias_gelu_bwd_workspace_bytes(const BiasGeluBwdParams& p) {
  if (p.rows <= 0 || p.cols <= 0 || bias_gelu_bwd_one_pass(p)) return 0;
  const RowColPlan plan = plan_bias_gelu_bwd(p);
  return size_t(plan.grid_y) * size_t(p.cols) * sizeof(float);
}

}  // namespace flashext
