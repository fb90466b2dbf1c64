// flashext bias + GeLU over rows × cols (x with a row stride; bias, out and grad_out contiguous):
//   forward:  out[r, c]     = gelu(x[r, c] + bias[c])
//   backward: grad_x[r, c]  = grad_out[r, c] · gelu'(x[r, c] + bias[c])
//             partial[g, c] = Σ_{rows r of row group g} grad_x[r, c]      (fp32, before rounding)
//             grad_bias[c]  = Σ_g partial[g, c]                            (bias_grad_reduce_kernel)
// The backward over few rows has a one-launch kernel of its own (bias_gelu_bwd_one_pass.cuh).
//
// bias_gelu_kernel<T, kVec, kBackward, kTanh, kRing, kRowUnroll>
//   grid (grid_x, grid_y) of RowColPlan (plan.h): block (bx, by) covers column packs
//   bx · 32 … bx · 32 + 31 of the rows [by · rows_per_block, (by + 1) · rows_per_block).
//   block 32 × 8: threadIdx.x the column pack (a warp reads 512 contiguous bytes of a row),
//   threadIdx.y the rows threadIdx.y + 8 · i, kRowUnroll of them in flight at a time. The bias
//   pack is loaded once per thread and kept in registers.
//   Shared memory (static): kRing, kRowUnroll slots of 16 B a thread, 16 KiB; backward, 8 × 32 · kVec
//   fp32 sums (8 KiB for 16-bit types, 4 KiB for fp32), added over threadIdx.y.
//   Constraints: kVec > 1 needs 16-byte aligned pointers and cols, x_row_stride multiples of kVec
//   (bias_gelu_vec_width); rows_per_block ≥ 1.
// bias_grad_reduce_kernel<T>: a block of 32 columns × 8 slices of the row groups, then a
//   shared-memory sum over the slices (1 KiB). Deterministic: no atomics.
#pragma once

#include <cuda_runtime.h>

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

// Rows in flight per thread (RowColPlan::row_unroll): the fp32 forward 2, or 4 over many waves
// (bias_gelu_fwd_rows_fp32, chosen at launch); the 16-bit forward kBiasFwdRows16 = 4; the
// backward 1 — its math, not the bytes in flight, sets the pace.
template <typename T, bool kBackward>
constexpr int kBiasRowUnroll = kBackward ? 1 : sizeof(T) == 4 ? 2 : kBiasFwdRows16;

// Resident blocks per SM asked of the register allocator: 4 (64 registers) for the 4-row forwards,
// whose rows need them (the fp32 one spills 56 bytes at 6 blocks, 12 at 5), and for the backward's
// two packs and gradient math; 6 (40 registers) for the fp32 forward's 2 rows.
template <typename T, bool kBackward, int kRowUnroll>
constexpr int kRowColMinBlocks = kRowUnroll >= 4 ? kBiasFwdBlocksPerSm : kBackward ? 4 : 6;

// kRing (16-bit forward in one-wave grids, bias_gelu_fwd_ring): the thread's rows stream through
// a ring of kRowUnroll slots (ring.cuh), all requested up front and each computed as it lands;
// through registers a warp would wait for its last row before computing its first.
template <typename T, int kVec, bool kBackward, bool kTanh, bool kRing = false,
          int kRowUnroll = kBiasRowUnroll<T, kBackward>>
__global__ void __launch_bounds__(RowColPlan::kColThreads* RowColPlan::kRowThreads,
                                  kRowColMinBlocks<T, kBackward, kRowUnroll>) bias_gelu_kernel(const RowColArgs args) {
  static_assert(!kRing || (!kBackward && kVec > 1), "the ring is the vectorized forward's");
  constexpr int kColThreads = RowColPlan::kColThreads;
  constexpr int kRowThreads = RowColPlan::kRowThreads;
  using P = Pack<T, kVec>;
  const T* x = static_cast<const T*>(args.x);
  const T* grad_out = static_cast<const T*>(args.grad_out);
  T* dst = static_cast<T*>(args.dst);

  const int64_t col_pack = int64_t(blockIdx.x) * kColThreads + threadIdx.x;
  const bool col_valid = col_pack * kVec < args.cols;  // cols % kVec == 0 when kVec > 1
  const int64_t row_begin = int64_t(blockIdx.y) * args.rows_per_block;
  const int64_t row_end =
      row_begin + args.rows_per_block < args.rows ? row_begin + args.rows_per_block : args.rows;
  const int64_t x_row_packs = args.x_row_stride / kVec;
  const int64_t dst_row_packs = args.cols / kVec;

  float bias[kVec];
  float bias_grad[kVec];  // Σ over this thread's rows of grad_x (backward)
  if (col_valid) {
    const P bias_pack = load_pack<T, kVec>(static_cast<const T*>(args.bias), col_pack);
    unpack(bias_pack, bias);
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) bias_grad[i] = 0.0f;

  if constexpr (kRing) {
    constexpr int kThreads = kColThreads * kRowThreads;
    __shared__ alignas(16) P ring[kRowUnroll][kThreads];
    const int tid = threadIdx.y * kColThreads + threadIdx.x;
    const int64_t block_rows = row_end - row_begin;
    const int64_t my_rows = block_rows > threadIdx.y ? (block_rows - threadIdx.y + kRowThreads - 1) / kRowThreads : 0;
    if (col_valid) {
      const auto issue = [&](int64_t k) {  // this thread's row k into slot k % kRowUnroll
        const int64_t row = row_begin + threadIdx.y + k * kRowThreads;
        ptx::cp_async_16(ptx::smem_addr(&ring[k % kRowUnroll][tid]), x + (row * x_row_packs + col_pack) * kVec, 16);
      };
      const auto compute = [&](int64_t, int slot) {
        float xs[kVec];
        unpack(ring[slot][tid], xs);
        P out;
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          out.elem[i] = from_float<T>(gelu_epilogue<T, /*kBackward=*/false, kTanh>(xs[i] + bias[i], 0.0f));
        }
        return out;
      };
      const auto store = [&](int64_t k, const P& out) {
        store_pack<T, kVec>(dst, (row_begin + threadIdx.y + k * kRowThreads) * dst_row_packs + col_pack, out);
      };
      ring_prologue<kRowUnroll>(my_rows, issue);
      ring_rows<kRowUnroll>(my_rows, issue, compute, store);
    }
  } else if (col_valid) {
    for (int64_t row0 = row_begin + threadIdx.y; row0 < row_end; row0 += kRowThreads * kRowUnroll) {
      P x_pack[kRowUnroll], g_pack[kRowUnroll];
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int64_t row = row0 + u * kRowThreads;
        if (row < row_end) {
          x_pack[u] = load_pack<T, kVec>(x, row * x_row_packs + col_pack);
          if constexpr (kBackward) g_pack[u] = load_pack<T, kVec>(grad_out, row * dst_row_packs + col_pack);
        }
      }
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int64_t row = row0 + u * kRowThreads;
        if (row < row_end) {
          float xs[kVec], gs[kVec];
          unpack(x_pack[u], xs);
          if constexpr (kBackward) unpack(g_pack[u], gs);
          P out;
#pragma unroll
          for (int i = 0; i < kVec; ++i) {
            const float z = xs[i] + bias[i];  // z = x + bias
            const float value = gelu_epilogue<T, kBackward, kTanh>(z, kBackward ? gs[i] : 0.0f);
            out.elem[i] = from_float<T>(value);
            if constexpr (kBackward) bias_grad[i] += value;  // fp32, before rounding to T
          }
          store_pack<T, kVec>(dst, row * dst_row_packs + col_pack, out);
        }
      }
    }
  }

  if constexpr (kBackward) {
    // partial[blockIdx.y, c] = Σ_{threadIdx.y} bias_grad — reduce the row threads in shared memory.
    __shared__ float smem[kRowThreads][kColThreads * kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) smem[threadIdx.y][threadIdx.x * kVec + i] = bias_grad[i];
    __syncthreads();  // every row thread's sums are in shared memory
    for (int e = threadIdx.y * kColThreads + threadIdx.x; e < kColThreads * kVec;
         e += kColThreads * kRowThreads) {
      float sum = 0.0f;
#pragma unroll
      for (int r = 0; r < kRowThreads; ++r) sum += smem[r][e];
      const int64_t col = int64_t(blockIdx.x) * kColThreads * kVec + e;
      if (col < args.cols) args.partial[int64_t(blockIdx.y) * args.cols + col] = sum;
    }
  }
}

// grad_bias[c] = Σ_{g < num_groups} partial[g, c]
constexpr int kReduceCols = 32;
constexpr int kReduceSlices = 8;

template <typename T>
__global__ void __launch_bounds__(kReduceCols* kReduceSlices)
    bias_grad_reduce_kernel(const float* partial, T* grad_bias, int64_t num_groups, int64_t cols) {
  __shared__ float smem[kReduceSlices][kReduceCols];
  const int64_t col = int64_t(blockIdx.x) * kReduceCols + threadIdx.x;
  float sum = 0.0f;
  if (col < cols) {
    for (int64_t g = threadIdx.y; g < num_groups; g += kReduceSlices) sum += partial[g * cols + col];
  }
  smem[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();  // all slices written
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.0f;
#pragma unroll
    for (int s = 0; s < kReduceSlices; ++s) total += smem[s][threadIdx.x];
    grad_bias[col] = from_float<T>(total);
  }
}

// Launches the kernel the plan was cut for: the ring for a one-wave 16-bit forward, 4 rows for the
// fp32 forward whose plan says so, else kBiasRowUnroll<T, kBackward> rows.
template <typename T, bool kBackward>
cudaError_t launch_bias_gelu(const RowColArgs& args, const RowColPlan& plan, cudaStream_t stream) {
  constexpr int kVec = kVec16<T>;
  const dim3 grid(unsigned(plan.grid_x), unsigned(plan.grid_y));
  const dim3 block(RowColPlan::kColThreads, RowColPlan::kRowThreads);
  if constexpr (!kBackward && sizeof(T) == 2) {
    if (plan.vec == kVec && bias_gelu_fwd_ring(plan, current_device_sm_count())) {
      if (args.tanh_form) bias_gelu_kernel<T, kVec, false, true, true><<<grid, block, 0, stream>>>(args);
      else bias_gelu_kernel<T, kVec, false, false, true><<<grid, block, 0, stream>>>(args);
      return cudaGetLastError();
    }
  }
  if constexpr (!kBackward && sizeof(T) == 4) {
    if (plan.vec == kVec && plan.row_unroll == kBiasRowUnrollManyWaves) {
      constexpr int kRows = kBiasRowUnrollManyWaves;
      if (args.tanh_form) bias_gelu_kernel<T, kVec, false, true, false, kRows><<<grid, block, 0, stream>>>(args);
      else bias_gelu_kernel<T, kVec, false, false, false, kRows><<<grid, block, 0, stream>>>(args);
      return cudaGetLastError();
    }
  }
  if (plan.vec == kVec) {
    if (args.tanh_form) bias_gelu_kernel<T, kVec, kBackward, true><<<grid, block, 0, stream>>>(args);
    else bias_gelu_kernel<T, kVec, kBackward, false><<<grid, block, 0, stream>>>(args);
  } else {
    if (args.tanh_form) bias_gelu_kernel<T, 1, kBackward, true><<<grid, block, 0, stream>>>(args);
    else bias_gelu_kernel<T, 1, kBackward, false><<<grid, block, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

}  // namespace gelu_detail
}  // namespace flashext
