// flashext bias + GeLU backward over few rows, in one launch (BiasBwdOnePass, plan.h):
//   grad_x[r, c] = grad_out[r, c] · gelu'(x[r, c] + bias[c])
//   grad_bias[c] = Σ_r grad_x[r, c]            (fp32 sums, one rounding to T; deterministic)
// With few rows the two-kernel backward (bias_gelu.cuh) spends a second launch and a round trip
// of partial sums on little work; here a block owns whole columns and needs neither.
//
// bias_gelu_bwd_one_pass_kernel<T, kVec, kTanh>
//   grid: one block per strip of kCols = 8 · kVec columns (128 bytes of a row).
//   block: kThreads = 8 × kRowThreads (64 row threads for 16-bit types, 32 for fp32), a 1-D index
//   t split as tx = t % 8 (the column pack) and ty = t / 8 (the rows ty + kRowThreads · k), so a
//   warp reads whole 128-byte lines of 4 rows. Each thread streams its (x, grad_out) packs through
//   a private 2-slot cp.async ring (ring.cuh) with an L2 evict-first policy: they are read once.
//   Reduction: each warp adds its 4 row threads' fp32 sums by shuffles (lanes 8 apart hold the
//   same columns) and writes one row of sums; after one barrier kSlices = kThreads / kCols threads
//   per column add every kSlices-th warp's row, and a shuffle across those kSlices neighbouring
//   lanes finishes the column.
//   Shared memory (dynamic, one_pass_smem_bytes): ring[kStages][x, grad_out][kThreads] packs, then
//   sums[kWarps][kCols + 1] floats — 32 KiB + 4160 B = 36.1 KiB for 16-bit types, 16 KiB + 1056 B
//   = 17.0 KiB for fp32. The sums have bytes of their own, so a warp writes them as soon as its rows
//   are done and one barrier, not two, stands between the last row and the reduction.
//   Constraints: rows ≤ BiasBwdOnePass::kMaxRows (row arithmetic in 32 bits); kVec = 16 / sizeof(T)
//   (16-byte aligned pointers, cols and x_row_stride multiples of kVec); the row stride and cols
//   non-negative.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../common/device.h"
#include "../common/macros.h"
#include "../common/ptx.cuh"
#include "../common/vec.cuh"
#include "epilogue.cuh"
#include "plan.h"
#include "ring.cuh"

namespace flashext {
namespace gelu_detail {

template <typename T>
constexpr int kOnePassRowThreads = sizeof(T) == 4 ? BiasBwdOnePass::kRowThreadsFp32 : BiasBwdOnePass::kRowThreads16;
template <typename T>
constexpr int kOnePassThreads = BiasBwdOnePass::kColThreads * kOnePassRowThreads<T>;
// Row threads a warp holds, whose sums the kernel adds by shuffles.
constexpr int kOnePassWarpRows = 32 / BiasBwdOnePass::kColThreads;

// Dynamic shared memory of the one-pass kernel: the ring, then the reduction's sums, a row per
// warp padded by one float (the kSlices lanes that read one column from different warps' rows hit
// different banks).
template <typename T, int kVec>
constexpr size_t one_pass_smem_bytes() {
  constexpr size_t kRingBytes = sizeof(Pack<T, kVec>) * 2 * BiasBwdOnePass::kStages * kOnePassThreads<T>;
  constexpr size_t kSumBytes =
      sizeof(float) * (kOnePassRowThreads<T> / kOnePassWarpRows) * (BiasBwdOnePass::kColThreads * kVec + 1);
  return kRingBytes + kSumBytes;
}

template <typename T, int kVec, bool kTanh>
__global__ void __launch_bounds__(kOnePassThreads<T>, 1024 / kOnePassThreads<T>)
    bias_gelu_bwd_one_pass_kernel(const RowColArgs args) {
  constexpr int kColThreads = BiasBwdOnePass::kColThreads, kRowThreads = kOnePassRowThreads<T>;
  constexpr int kThreads = kColThreads * kRowThreads, kStages = BiasBwdOnePass::kStages;
  constexpr int kCols = kColThreads * kVec, kSlices = kThreads / kCols;
  constexpr int kWarpRows = kOnePassWarpRows, kWarps = kThreads / 32;
  static_assert(32 % kColThreads == 0 && kRowThreads % kWarpRows == 0, "a warp holds whole row threads");
  static_assert(kVec > 1 && kSlices <= 32 && kWarps % kSlices == 0, "one lane group per column");
  using P = Pack<T, kVec>;
  const T* x = static_cast<const T*>(args.x);
  const T* grad_out = static_cast<const T*>(args.grad_out);
  T* dst = static_cast<T*>(args.dst);
  const int tx = threadIdx.x % kColThreads, ty = threadIdx.x / kColThreads;
  const int64_t col_pack = int64_t(blockIdx.x) * kColThreads + tx;
  const bool col_valid = col_pack * kVec < args.cols;  // cols % kVec == 0

  extern __shared__ __align__(16) unsigned char smem[];
  auto ring = reinterpret_cast<P(*)[2][kThreads]>(smem);  // ring[slot][0 = x, 1 = grad_out][thread]

  float bias[kVec], bias_grad[kVec];
#pragma unroll
  for (int e = 0; e < kVec; ++e) bias_grad[e] = 0.0f;
  if (col_valid) {
    // Rows in 32 bits, pack pointers at this thread's column, the strides (non-negative multiples
    // of kVec) divided by a shift: fewer instructions a row, and the first request goes out earlier
    // than with 64-bit row indexing and signed divisions.
    const P* x_col = reinterpret_cast<const P*>(x) + col_pack;
    const P* grad_col = reinterpret_cast<const P*>(grad_out) + col_pack;
    P* dst_col = reinterpret_cast<P*>(dst) + col_pack;
    const int64_t x_stride = int64_t(uint64_t(args.x_row_stride) / kVec), stride = int64_t(uint64_t(args.cols) / kVec);
    const uint64_t policy = ptx::l2_evict_first_policy();  // x and grad_out are read once
    const auto issue = [&](int k) {  // row k of this thread into its slot
      const int row = ty + k * kRowThreads;
      const int slot = k % kStages;
      ptx::cp_async_16_policy(ptx::smem_addr(&ring[slot][0][threadIdx.x]), x_col + row * x_stride, policy);
      ptx::cp_async_16_policy(ptx::smem_addr(&ring[slot][1][threadIdx.x]), grad_col + row * stride, policy);
    };
    const unsigned rows = unsigned(args.rows);
    const int my_rows = rows > unsigned(ty) ? int((rows - unsigned(ty) + kRowThreads - 1) / kRowThreads) : 0;
    ring_prologue<kStages>(my_rows, issue);
    const P bias_pack = load_pack<T, kVec>(static_cast<const T*>(args.bias), col_pack);
    unpack(bias_pack, bias);
    const auto compute = [&](int, int slot) {
      float xs[kVec], gs[kVec];
      unpack(ring[slot][0][threadIdx.x], xs);
      unpack(ring[slot][1][threadIdx.x], gs);
      P out;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float value = gelu_epilogue<T, /*kBackward=*/true, kTanh>(xs[e] + bias[e], gs[e]);
        out.elem[e] = from_float<T>(value);
        bias_grad[e] += value;  // fp32, before rounding to T
      }
      return out;
    };
    // Through a P*: one 16-byte STG (a T* cast to a pack at the store was split into four).
    const auto store = [&](int k, const P& out) { dst_col[(ty + k * kRowThreads) * stride] = out; };
    ring_rows<kStages>(my_rows, issue, compute, store);
    ptx::cp_async_wait<0>();  // the groups left are empty: nothing in flight past here
  }

  // bias_grad summed over the warp's kWarpRows row threads (lanes kColThreads apart), then one row
  // of sums per warp in shared memory, after the ring.
  auto sums = reinterpret_cast<float(*)[kCols + 1]>(smem + sizeof(P) * 2 * kStages * kThreads);
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
#pragma unroll
    for (int offset = kColThreads; offset < 32; offset *= 2)
      bias_grad[e] += __shfl_xor_sync(0xffffffffu, bias_grad[e], offset);
  }
  if (ty % kWarpRows == 0) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) sums[ty / kWarpRows][tx * kVec + e] = bias_grad[e];
  }
  __syncthreads();  // every warp's sums are in shared memory
  // grad_bias[col] = Σ_w sums[w][col]: kSlices neighbouring lanes per column, every kSlices-th warp each.
  const int col = threadIdx.x / kSlices, slice = threadIdx.x % kSlices;
  float sum = 0.0f;
#pragma unroll
  for (int w = slice; w < kWarps; w += kSlices) sum += sums[w][col];
#pragma unroll
  for (int offset = kSlices / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const int64_t out_col = int64_t(blockIdx.x) * kCols + col;
  if (slice == 0 && out_col < args.cols) static_cast<T*>(args.grad_bias)[out_col] = from_float<T>(sum);
}

// One block per column strip; args.grad_bias is written, args.partial unused.
template <typename T>
cudaError_t launch_bias_gelu_bwd_one_pass(const RowColArgs& args, cudaStream_t stream) {
  constexpr int kVec = kVec16<T>;
  constexpr size_t kSmem = one_pass_smem_bytes<T, kVec>();
  const dim3 grid(unsigned(ceil_div(args.cols, int64_t(kVec) * BiasBwdOnePass::kColThreads)));
  const auto kernel = args.tanh_form ? bias_gelu_bwd_one_pass_kernel<T, kVec, true>
                                     : bias_gelu_bwd_one_pass_kernel<T, kVec, false>;
  FX_RETURN_IF_ERROR(allow_dynamic_smem(kernel, kSmem));
  kernel<<<grid, kOnePassThreads<T>, kSmem, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace gelu_detail
}  // namespace flashext
