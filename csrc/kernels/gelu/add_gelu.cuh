// flashext add + GeLU, forward and backward, over n dense elements:
//   forward:  out[i]     = gelu(x[i] + y[i])
//   backward: grad_in[i] = grad_out[i] · gelu'(x[i] + y[i])      (= d/dx = d/dy)
//
// add_gelu_kernel<T, kVec, kBackward, kTanh>
//   grid: 1-D, kFlatThreads threads a block; thread t of block b owns pack p = b · kFlatThreads + t
//   (kVec elements, one 16-byte access per tensor), so a warp's access is 512 contiguous bytes.
//   Block 0 also does the n % kVec elements after the last full pack, one per thread.
//   No shared memory. kVec = 16 / sizeof(T) when every pointer is 16-byte aligned, else 1.
//   out may alias x or y: each element is read before it is written, by the same thread.
// Occupancy, not unrolling, keeps the bytes in flight: one pack per thread with the register cap
// of 8 resident blocks per SM (6 backward) beat 2 or 4 packs per thread at 3-6 blocks by 2-6%.
// Napkin math (H200): bf16 forward moves 6 B an element; at the 4.27 TB/s copy rate that is
// 7.1·10¹¹ elements/s, and 132 SMs issue ~3.3·10¹³ thread-instructions/s: ~47 instructions per
// element to spend, of which the 16-bit kernel uses 27 (216 SASS instructions per 8-element pack)
// and fp32's erff ~52 of its 93. Both run at the copy rate.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "../common/macros.h"
#include "../common/vec.cuh"
#include "epilogue.cuh"

namespace flashext {
namespace gelu_detail {

constexpr int kFlatThreads = 256;
// Resident blocks per SM asked of the register allocator: ≤ 32 registers a thread forward,
// ≤ 40 backward.
template <bool kBackward>
constexpr int kFlatMinBlocks = kBackward ? 6 : 8;

template <typename T, int kVec, bool kBackward, bool kTanh>
__global__ void __launch_bounds__(kFlatThreads, kFlatMinBlocks<kBackward>) add_gelu_kernel(const FlatArgs args) {
  using P = Pack<T, kVec>;
  const T* x = static_cast<const T*>(args.x);
  const T* y = static_cast<const T*>(args.y);
  const T* grad_out = static_cast<const T*>(args.grad_out);
  T* dst = static_cast<T*>(args.dst);
  const int64_t num_packs = args.n / kVec;
  const int64_t pack = int64_t(blockIdx.x) * kFlatThreads + threadIdx.x;

  if (pack < num_packs) {
    // All loads first, then the math: the 16-byte requests of x, y (and grad_out) overlap.
    const P x_pack = load_pack<T, kVec>(x, pack);
    const P y_pack = load_pack<T, kVec>(y, pack);
    P g_pack;
    if constexpr (kBackward) g_pack = load_pack<T, kVec>(grad_out, pack);
    float xs[kVec], ys[kVec], gs[kVec];
    unpack(x_pack, xs);
    unpack(y_pack, ys);
    if constexpr (kBackward) unpack(g_pack, gs);
    P out;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float z = xs[i] + ys[i];  // z = x + y
      out.elem[i] = from_float<T>(gelu_epilogue<T, kBackward, kTanh>(z, kBackward ? gs[i] : 0.0f));
    }
    store_pack<T, kVec>(dst, pack, out);
  }

  // The n % kVec elements after the last full pack.
  if (kVec > 1 && blockIdx.x == 0) {
    const int64_t index = num_packs * kVec + threadIdx.x;
    if (index < args.n) {
      const float z = to_float(x[index]) + to_float(y[index]);
      const float g = kBackward ? to_float(grad_out[index]) : 0.0f;
      dst[index] = from_float<T>(gelu_epilogue<T, kBackward, kTanh>(z, g));
    }
  }
}

template <typename T, bool kBackward>
cudaError_t launch_add_gelu(const FlatArgs& args, cudaStream_t stream) {
  constexpr int kVec = kVec16<T>;
  const bool vectorized = is_aligned16(args.x) && is_aligned16(args.y) && is_aligned16(args.dst) &&
                          (!kBackward || is_aligned16(args.grad_out));
  const int vec = vectorized ? kVec : 1;
  const dim3 grid(unsigned(std::max<int64_t>(1, ceil_div(args.n / vec, kFlatThreads))));
  if (vectorized) {
    if (args.tanh_form) add_gelu_kernel<T, kVec, kBackward, true><<<grid, kFlatThreads, 0, stream>>>(args);
    else add_gelu_kernel<T, kVec, kBackward, false><<<grid, kFlatThreads, 0, stream>>>(args);
  } else {
    if (args.tanh_form) add_gelu_kernel<T, 1, kBackward, true><<<grid, kFlatThreads, 0, stream>>>(args);
    else add_gelu_kernel<T, 1, kBackward, false><<<grid, kFlatThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

}  // namespace gelu_detail
}  // namespace flashext
