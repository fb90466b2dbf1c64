// flashext GeLU epilogues: how a bias + GeLU call is cut into blocks (host logic, private to
// csrc/kernels/gelu; unit-tested on the CPU by tests/cpp/test_gelu.cpp).
//
// Bias + GeLU runs one of three row kernels, chosen here from the layout and the device:
// - bias_gelu_kernel (bias_gelu.cuh), forward and the two-kernel backward: a block of
//   RowColPlan::kColThreads × kRowThreads threads covers one column segment × one row group.
//   The 16-bit forward streams its rows through a cp.async ring when its grid fits in one wave
//   (bias_gelu_fwd_ring); the fp32 forward keeps 2 or 4 rows in flight (bias_gelu_fwd_rows_fp32).
// - bias_gelu_bwd_one_pass_kernel (bias_gelu_bwd_one_pass.cuh): the backward over few rows in one
//   launch, when bias_gelu_bwd_one_pass says so; otherwise the backward writes fp32 partial column
//   sums per row group (plan_bias_gelu_bwd) that bias_grad_reduce_kernel adds.
#pragma once

#include <cstdint>

#include "flashext/gelu.h"

namespace flashext {

// A rows × cols launch of bias_gelu_kernel: threadIdx.x walks vec-wide column packs of one
// column segment (blockIdx.x), threadIdx.y the rows of one row group (blockIdx.y), row_unroll rows
// in flight per thread.
struct RowColPlan {
  static constexpr int kColThreads = 32;  // a warp covers 32 packs: 512 contiguous bytes of a row
  static constexpr int kRowThreads = 8;
  int vec = 1;  // elements per thread access (16 bytes when the layout allows, else 1)
  int64_t grid_x = 0;  // column segments: ceil(cols / (vec · kColThreads))
  int64_t grid_y = 0;  // row groups, at most min(max_row_groups, 65535)
  int64_t rows_per_block = 0;  // ceil(rows / grid_y)
  int row_unroll = 1;  // rows in flight per thread the kernel is instantiated for
};

// Row groups of at least kRowThreads · row_unroll rows (one full batch per row thread), as many
// as the rows allow up to max_row_groups.
RowColPlan plan_bias_gelu(int64_t rows, int64_t cols, int vec, int64_t max_row_groups, int row_unroll);

// Rows in flight per thread of the 16-bit forward: 4 (4 blocks per SM). Its erff-free math is
// cheap enough that bytes in flight set the pace: 1 row reached 0.78 of the copy ceiling, 2 rows
// 0.87, 4 rows 0.93.
constexpr int kBiasFwdRows16 = 4;
// Resident blocks per SM of the 4-row forward kernels (their register cap).
constexpr int kBiasFwdBlocksPerSm = 4;

// Whether the 16-bit forward streams its rows through the cp.async ring (a vectorized plan whose
// grid fits in one wave of kBiasFwdBlocksPerSm blocks per SM). In one wave every row is requested
// up front, and rows loaded into registers share one scoreboard: a warp would wait for its last
// row before computing its first. Over many waves the register kernel is faster.
bool bias_gelu_fwd_ring(const RowColPlan& plan, int sm_count);

// Rows in flight per thread of the fp32 forward: kBiasRowUnrollManyWaves (4, 4 blocks per SM)
// when the layout is vectorized and that plan's grid is at least kBiasFwdManyWaves waves, else 2
// (6 blocks per SM): 4 rows win 1-2% from about 8 waves up and lose 3% at two waves.
constexpr int kBiasRowUnrollManyWaves = 4;
constexpr int kBiasFwdManyWaves = 4;
int bias_gelu_fwd_rows_fp32(int64_t rows, int64_t cols, int vec, int sm_count);

// 16 / sizeof(element) when the pointers (all 16-byte aligned), cols and the row stride allow
// 16-byte accesses, else 1.
int bias_gelu_vec_width(const void* const* ptrs, int num_ptrs, int64_t cols, int64_t x_row_stride,
                        DType dtype);
// bias_gelu_vec_width of a backward call: grad_out, x, bias and grad_x.
int bias_gelu_bwd_vec_width(const BiasGeluBwdParams& params);

// The one-pass backward (bias_gelu_bwd_one_pass_kernel): a block of kColThreads × row threads
// owns a strip of kColThreads · vec columns, walks every row and writes the strip's bias gradient.
struct BiasBwdOnePass {
  static constexpr int kColThreads = 8;  // a warp reads whole 128-byte lines of 4 rows
  // Row threads: 16-bit types 512-thread blocks, 2 per SM (16384 columns: 256 strips, one wave);
  // fp32 256-thread blocks, 4 per SM (its 512 strips in one wave too; 64 took two, 3-7% slower).
  static constexpr int kRowThreads16 = 64;
  static constexpr int kRowThreadsFp32 = 32;
  // Ring slots per thread: rows k + 1 … k + kStages − 1 in flight while row k is computed. Two
  // keep a thread's requests in row order; 3 or 4 were slower.
  static constexpr int kStages = 2;
  // Rows counted in 32 bits; past a thousand rows the two-kernel backward has waves to spare.
  static constexpr int64_t kMaxRows = 1024;
};

// Whether a backward call runs in one pass: rows ≤ kMaxRows, a vectorized layout, and at least
// one strip per SM.
bool bias_gelu_bwd_one_pass(int64_t rows, int64_t cols, int vec, int sm_count);
// The same for a backward call on the current device.
bool bias_gelu_bwd_one_pass(const BiasGeluBwdParams& params);

// The two-kernel backward's plan on the current device: about 16 blocks per SM, at least 16 rows
// per row group. Its workspace (bias_gelu_bwd_workspace_bytes) is grid_y × cols fp32 sums.
RowColPlan plan_bias_gelu_bwd(const BiasGeluBwdParams& params);

}  // namespace flashext
