// flashext online softmax: y = softmax(x) over each row, the running max/sum of FlashAttention
// as an op of its own:  m = max x,  l = Σ 2^((x − m) · log2 e),  y = 2^((x − m) · log2 e) / l.
// The max stays in x's units and log2 e multiplies x − m, which is exact near the max, so huge
// logits keep their digits (common/online_softmax.h). NaN or +inf in a row makes l NaN, and a row of
// only −inf has l = 0: both rows come out all NaN, as torch.softmax's do.
//
// Vector path (rows 16-byte aligned, cols a multiple of the 16-byte pack): one block per row
// (blockIdx.x strides over rows), blockDim = the fewest warps that hold the row in kHeadPacks
// 16-byte packs per thread (at most 1024 threads). Thread t owns packs t, t + blockDim, …; its
// first kHeadPacks packs stay in registers, so rows up to 1024 · kHeadPacks packs (32768 fp32,
// 65536 fp16/bf16 columns) are read once and written once. Packs past that (the row's tail) are
// folded into the running state as they stream by and read again for the output (the re-read
// mostly hits L2). Each thread keeps (row_max in x's units, row_sum) over its own values; warps
// merge with shuffles, then warp 0 merges the warp states from shared memory.
// Scalar path (any other layout): 1024 threads per row, one element per access, two reads.
// Napkin math: fp32 4096 columns is 32 KiB per row read + written; 128 threads × 8 packs of 16 B
// put the whole row in flight at once.
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "../common/online_softmax.h"
#include "../common/ptx.cuh"
#include "../common/vec.cuh"
#include "flashext/online_softmax.h"

namespace flashext {
namespace {

constexpr int kMaxThreads = 1024;
constexpr int kHeadPacks = 8;  // 16-byte packs per thread kept in registers

FX_DEVICE SoftmaxState warp_merge(SoftmaxState s) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const SoftmaxState other{__shfl_xor_sync(0xffffffffu, s.row_max, offset),
                             __shfl_xor_sync(0xffffffffu, s.row_sum, offset)};
    s = merge_softmax_states(s, other, kLog2e);
  }
  return s;
}

// The row's (max, sum) in every thread: warp shuffles, then one pass through shared memory.
FX_DEVICE SoftmaxState block_merge(SoftmaxState s) {
  __shared__ float warp_max[kMaxThreads / 32], warp_sum[kMaxThreads / 32];
  __shared__ SoftmaxState row_state;
  s = warp_merge(s);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (warps == 1) return s;
  if (lane == 0) {
    warp_max[warp] = s.row_max;
    warp_sum[warp] = s.row_sum;
  }
  __syncthreads();  // every warp's state is in shared memory
  if (warp == 0) {
    SoftmaxState t = lane < warps ? SoftmaxState{warp_max[lane], warp_sum[lane]} : SoftmaxState{-INFINITY, 0.0f};
    t = warp_merge(t);
    if (lane == 0) row_state = t;
  }
  __syncthreads();  // row_state is final
  const SoftmaxState result = row_state;
  __syncthreads();  // shared memory may be reused for the next row
  return result;
}

// 2^((x − base) · log2 e) = e^(x − base).
FX_DEVICE float exp_from(float x, float base) { return ptx::exp2_approx((x - base) * kLog2e); }

// Fold n values into a running state: one rescale per group, not per value.
template <int N>
FX_DEVICE SoftmaxState push(SoftmaxState s, const float (&value)[N]) {
  float m = s.row_max;
#pragma unroll
  for (int i = 0; i < N; ++i) m = fmaxf(m, value[i]);
  float sum = s.row_sum * rescale_factor(s.row_max, m, kLog2e);
  const float base = safe_row_max(m);
#pragma unroll
  for (int i = 0; i < N; ++i) sum += exp_from(value[i], base);
  return {m, sum};
}

// Max of a pack's elements, as fp32. 16-bit packs compare pairs natively (the max of 16-bit
// values is one of them, so this is exact), which keeps the compiler from holding all the
// register-resident packs as fp32 between the max and the sum.
template <typename T, int N>
FX_DEVICE float pack_max(const Pack<T, N>& v) {
  if constexpr (sizeof(T) == 2) {
    using T2 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
    const T2* pairs = reinterpret_cast<const T2*>(v.elem);
    T2 m = pairs[0];
#pragma unroll
    for (int i = 1; i < N / 2; ++i) m = __hmax2(m, pairs[i]);
    return fmaxf(to_float(m.x), to_float(m.y));
  } else {
    float m = to_float(v.elem[0]);
#pragma unroll
    for (int i = 1; i < N; ++i) m = fmaxf(m, to_float(v.elem[i]));
    return m;
  }
}

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) online_softmax_vec_kernel(const OnlineSoftmaxParams p) {
  constexpr int kVec = kVec16<T>;
  using P = Pack<T, kVec>;
  const int64_t packs = p.cols / kVec;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x = static_cast<const T*>(p.x) + row * p.x_row_stride;
    T* y = static_cast<T*>(p.y) + row * p.y_row_stride;
    P head[kHeadPacks];
#pragma unroll
    for (int i = 0; i < kHeadPacks; ++i) {
      const int64_t pack = threadIdx.x + int64_t(i) * blockDim.x;
      if (pack < packs) head[i] = load_pack<T, kVec>(x, pack);
    }
    // This thread's state: the register-held packs first (max, then one sum), then the tail.
    float thread_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < kHeadPacks; ++i) {
      if (threadIdx.x + int64_t(i) * blockDim.x < packs) {
        thread_max = fmaxf(thread_max, pack_max(head[i]));
      }
    }
    const float head_base = safe_row_max(thread_max);
    float thread_sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kHeadPacks; ++i) {
      if (threadIdx.x + int64_t(i) * blockDim.x < packs) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) thread_sum += exp_from(to_float(head[i].elem[e]), head_base);
      }
    }
    SoftmaxState state{thread_max, thread_sum};
    const int64_t tail_start = threadIdx.x + int64_t(kHeadPacks) * blockDim.x;
    for (int64_t pack = tail_start; pack < packs; pack += blockDim.x) {
      const P v = load_pack<T, kVec>(x, pack);
      float value[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) value[e] = to_float(v.elem[e]);
      state = push(state, value);
    }
    state = block_merge(state);
    const float inv = 1.0f / state.row_sum;  // l = 0 (all −inf): inf · 0 = NaN; l = NaN: NaN
    const float base = safe_row_max(state.row_max);
#pragma unroll
    for (int i = 0; i < kHeadPacks; ++i) {
      const int64_t pack = threadIdx.x + int64_t(i) * blockDim.x;
      if (pack < packs) {
        P out;
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          out.elem[e] = from_float<T>(exp_from(to_float(head[i].elem[e]), base) * inv);
        }
        store_pack<T, kVec>(y, pack, out);
      }
    }
    for (int64_t pack = tail_start; pack < packs; pack += blockDim.x) {
      const P v = load_pack<T, kVec>(x, pack);
      P out;
#pragma unroll
      for (int e = 0; e < kVec; ++e) out.elem[e] = from_float<T>(exp_from(to_float(v.elem[e]), base) * inv);
      store_pack<T, kVec>(y, pack, out);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) online_softmax_scalar_kernel(const OnlineSoftmaxParams p) {
  const T* x_all = static_cast<const T*>(p.x);
  T* y_all = static_cast<T*>(p.y);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x = x_all + row * p.x_row_stride;
    T* y = y_all + row * p.y_row_stride;
    SoftmaxState state{-INFINITY, 0.0f};
    for (int64_t col = threadIdx.x; col < p.cols; col += blockDim.x) {
      const float value[1] = {to_float(x[col])};
      state = push(state, value);
    }
    state = block_merge(state);
    const float inv = 1.0f / state.row_sum;
    const float base = safe_row_max(state.row_max);
    for (int64_t col = threadIdx.x; col < p.cols; col += blockDim.x) {
      y[col] = from_float<T>(exp_from(to_float(x[col]), base) * inv);
    }
  }
}

template <typename T>
cudaError_t launch_online_softmax(const OnlineSoftmaxParams& p, cudaStream_t stream) {
  constexpr int kVec = kVec16<T>;
  const dim3 grid(unsigned(p.rows < 2147483647 ? p.rows : 2147483647));
  const bool vec = p.cols % kVec == 0 && p.x_row_stride % kVec == 0 && p.y_row_stride % kVec == 0 &&
                   is_aligned16(p.x) && is_aligned16(p.y);
  if (!vec) {
    online_softmax_scalar_kernel<T><<<grid, kMaxThreads, 0, stream>>>(p);
  } else {
    const int64_t packs = p.cols / kVec;
    const int64_t warps = std::min<int64_t>(ceil_div(packs, 32 * kHeadPacks), kMaxThreads / 32);
    online_softmax_vec_kernel<T><<<grid, unsigned(32 * warps), 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t run_online_softmax(const OnlineSoftmaxParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.cols < 0) return cudaErrorInvalidValue;
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kFloat32: return launch_online_softmax<float>(p, stream);
    case DType::kFloat16: return launch_online_softmax<__half>(p, stream);
    case DType::kBFloat16: return launch_online_softmax<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace flashext
