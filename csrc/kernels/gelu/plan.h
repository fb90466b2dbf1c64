// flashext GeLU epilogues: how a bias + GeLU call is cut into blocks (host logic, private to
// csrc/kernels/gelu; unit-tested on the CPU by tests/cpp/test_gelu.cpp).
#pragma once

#include <cstdint>

#include "flashext/gelu.h"

namespace flashext {

// How a rows × cols launch is cut.
// A block is kColThreads × kRowThreads threads: threadIdx.x walks vec-wide column packs of one
// column segment (blockIdx.x), threadIdx.y the rows of one row group (blockIdx.y), row_unroll
// rows in flight at a time (2 or 4 for the fp32 forward, whose one 16-byte load per thread left
// too few bytes in flight to reach the copy rate: bias_gelu_fwd_rows_fp32; 4 for the 16-bit
// forward, through a cp.async ring in one-wave grids (bias_gelu_fwd_ring); 1 for the backward). The backward kernel reduces its
// block's rows in shared memory and writes one fp32 partial row per row group, which a second
// kernel sums.
struct RowColPlan {
  static constexpr int kColThreads = 32;
  static constexpr int kRowThreads = 8;
  int vec = 1;  // elements per thread access (16 bytes when the layout allows, else 1)
  int64_t grid_x = 0;  // column segments: ceil(cols / (vec · kColThreads))
  int64_t grid_y = 0;  // row groups, at most min(max_row_groups, 65535)
  int64_t rows_per_block = 0;  // ceil(rows / grid_y)
  int row_unroll = 1;  // rows in flight per thread the plan was cut for
};

RowColPlan plan_bias_gelu(int64_t rows, int64_t cols, int vec, int64_t max_row_groups, int row_unroll);

// Whether the 16-bit forward streams its rows through the cp.async ring (bias_gelu_kernel's kRing):
// a vectorized plan whose grid fits in one wave of kBiasFwdBlocksPerSm blocks per SM. There every
// row is requested up front and a warp computes each row as it lands (measured at 256 × 16384:
// 0.89 → 0.97-1.00 of a same-bytes copy); with the rows in registers a warp waited for its last
// row. Over many waves (8192 × 16384) the register kernel is faster (0.94 of the ceiling against
// the ring's 0.87-0.91), so it keeps that case.
constexpr int kBiasFwdBlocksPerSm = 4;
bool bias_gelu_fwd_ring(const RowColPlan& plan, int sm_count);

// Rows in flight per thread of the fp32 forward: kBiasRowUnrollManyWaves (4, at 4 blocks per SM)
// when the layout is vectorized and that plan's grid is at least kBiasFwdManyWaves waves, else 2
// (6 blocks per SM). Measured on the H200 (A/Bs at 7145978 and d01dd1d, × 16384 columns, µs with
// 2 / 4 rows): 256 rows (1.9 waves at 4 rows) 14.0 / 14.4; 1024 rows (7.8 waves) 38.7 / 38.4;
// 2048 rows 71.6 / 70.6; 4096 rows 137.4 / 134.9; 8192 rows 268 / 262. 512 rows (3.9 waves) was
// not measured; the line is put at 4 waves.
constexpr int kBiasRowUnrollManyWaves = 4;
constexpr int kBiasFwdManyWaves = 4;
int bias_gelu_fwd_rows_fp32(int64_t rows, int64_t cols, int vec, int sm_count);

// 16 bytes when the pointers (all 16-byte aligned), cols and the row stride allow it, else 1.
int bias_gelu_vec_width(const void* const* ptrs, int num_ptrs, int64_t cols, int64_t x_row_stride,
                        DType dtype);

// Bias + GeLU backward over few rows, in one launch (bias_gelu_bwd_one_pass): a block of
// kColThreads × kRowThreads threads owns a strip of kColThreads · vec columns and walks every row
// (two rows in flight per thread, through a cp.async ring in shared memory), then reduces its
// strip's bias gradient in shared memory; no partial sums, no second kernel. Taken when the rows
// are few (≤ kMaxRows: the kernel counts rows in 32 bits), the layout is vectorized, and the strips
// alone give at least one block per SM.
// 8 column threads: a warp reads whole 128-byte lines (4 measured 6-7% slower, 64-byte segments).
// Row threads: 64 for 16-bit types (512-thread blocks, 2 per SM: 256 strips of 64 columns at
// 16384 columns, one wave), 32 for fp32 (256-thread blocks, 4 per SM: its 512 strips of 32 columns
// in one wave too; with 64 they took two, 3-7% slower).
struct BiasBwdOnePass {
  static constexpr int kColThreads = 8;
  static constexpr int kRowThreads = 64;
  static constexpr int kRowThreadsFp32 = 32;
  static constexpr int64_t kMaxRows = 1024;
};
bool bias_gelu_bwd_one_pass(int64_t rows, int64_t cols, int vec, int sm_count);
// The same for a backward call on the current device (vec from its four tensors' layout).
bool bias_gelu_bwd_one_pass(const BiasGeluBwdParams& params);
// bias_gelu_vec_width of a backward call: grad_out, x, bias and grad_x.
int bias_gelu_bwd_vec_width(const BiasGeluBwdParams& params);
// False only in builds with -DFLASHEXT_GELU_BIAS_BWD_ONE_PASS=0 (the A/B switch; nvcc flags).
bool bias_gelu_bwd_one_pass_enabled();

// The plan run_bias_gelu_bwd uses on the current device when not in one pass; its workspace
// (bias_gelu_bwd_workspace_bytes, flashext/gelu.h) is grid_y × cols fp32 partial column sums.
RowColPlan plan_bias_gelu_bwd(const BiasGeluBwdParams& params);

}  // namespace flashext
