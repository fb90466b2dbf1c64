// flashext online softmax: y = softmax(x) over each row, the running max/sum of FlashAttention
// as an op of its own. Status: written with the attention kernel v0, awaiting its first GPU run.
//
// Grid: one block of kThreads threads per row (blockIdx.x strides over rows). Thread t owns
// columns t, t + kThreads, … (coalesced across the warp). When cols ≤ kThreads · kPerThread
// (32768) the row stays in registers: one HBM read and one write per element. Longer rows are
// read twice (state, then output). Per thread: running (row_max, row_sum) in log2 units; warps
// merge states with shuffles, then warp 0 merges the kThreads / 32 warp states from shared memory
// (2 × 32 floats). Napkin math: 4 B (bf16: read + write) per element at 4.2 TB/s is ~1 ns per
// 1000 elements; a 32768-column row's 32 loads per thread are all in flight before the first use.
#include <cuda_runtime.h>

#include "../common/online_softmax.h"
#include "../common/vec.cuh"
#include "flashext/attention.h"

namespace flashext {
namespace {

constexpr int kThreads = 1024;
constexpr int kPerThread = 32;

FX_DEVICE SoftmaxState warp_merge(SoftmaxState s) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const SoftmaxState other{__shfl_xor_sync(0xffffffffu, s.row_max, offset),
                             __shfl_xor_sync(0xffffffffu, s.row_sum, offset)};
    s = merge_softmax_states(s, other);
  }
  return s;
}

// The row's (max, sum) in every thread: warp shuffles, then one pass through shared memory.
FX_DEVICE SoftmaxState block_merge(SoftmaxState s) {
  __shared__ float warp_max[kThreads / 32], warp_sum[kThreads / 32];
  __shared__ SoftmaxState row_state;
  s = warp_merge(s);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_max[warp] = s.row_max;
    warp_sum[warp] = s.row_sum;
  }
  __syncthreads();  // every warp's state is in shared memory
  if (warp == 0) {
    SoftmaxState t = lane < kThreads / 32 ? SoftmaxState{warp_max[lane], warp_sum[lane]} : SoftmaxState{-INFINITY, 0.0f};
    t = warp_merge(t);
    if (lane == 0) row_state = t;
  }
  __syncthreads();  // row_state is final
  const SoftmaxState result = row_state;
  __syncthreads();  // shared memory may be reused for the next row
  return result;
}

// Add one score (log2 units) to a running state.
FX_DEVICE SoftmaxState push(SoftmaxState s, float score) {
  const float m = fmaxf(s.row_max, score);
  return {m, s.row_sum * rescale_factor(s.row_max, m) + exp2f(score - safe_row_max(m))};
}

template <typename T>
__global__ void __launch_bounds__(kThreads) online_softmax_kernel(const OnlineSoftmaxParams p) {
  const T* x_all = static_cast<const T*>(p.x);
  T* y_all = static_cast<T*>(p.y);
  const bool in_registers = p.cols <= int64_t(kThreads) * kPerThread;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x = x_all + row * p.x_row_stride;
    T* y = y_all + row * p.y_row_stride;
    SoftmaxState state{-INFINITY, 0.0f};
    if (in_registers) {
      float v[kPerThread];  // scores in log2 units
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        const int64_t col = int64_t(i) * kThreads + threadIdx.x;
        v[i] = col < p.cols ? to_float(x[col]) * kLog2e : -INFINITY;
      }
      float thread_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) thread_max = fmaxf(thread_max, v[i]);
      float thread_sum = 0.0f;
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) thread_sum += exp2f(v[i] - safe_row_max(thread_max));
      state = block_merge({thread_max, thread_sum});
      const float inv = 1.0f / state.row_sum;  // 0 sum (all −inf) → inf · 0 = NaN, as torch
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        const int64_t col = int64_t(i) * kThreads + threadIdx.x;
        if (col < p.cols) y[col] = from_float<T>(exp2f(v[i] - safe_row_max(state.row_max)) * inv);
      }
    } else {
      for (int64_t col = threadIdx.x; col < p.cols; col += kThreads) state = push(state, to_float(x[col]) * kLog2e);
      state = block_merge(state);
      const float inv = 1.0f / state.row_sum;
      for (int64_t col = threadIdx.x; col < p.cols; col += kThreads) {
        y[col] = from_float<T>(exp2f(to_float(x[col]) * kLog2e - safe_row_max(state.row_max)) * inv);
      }
    }
  }
}

}  // namespace

cudaError_t run_online_softmax(const OnlineSoftmaxParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.cols < 0) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  const dim3 grid(unsigned(p.rows < 2147483647 ? p.rows : 2147483647));
  switch (p.dtype) {
    case DType::kFloat32: online_softmax_kernel<float><<<grid, kThreads, 0, stream>>>(p); break;
    case DType::kFloat16: online_softmax_kernel<__half><<<grid, kThreads, 0, stream>>>(p); break;
    case DType::kBFloat16: online_softmax_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(p); break;
  }
  return cudaGetLastError();
}

}  // namespace flashext
