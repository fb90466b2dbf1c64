// flashext merge_attention_states: o = w_a · o_a + w_b · o_b and lse from two partial results
// (flashext/merge_states.h; the weights from common/online_softmax.h's merge_lse). One thread per
// 8 elements of a row of one head (16-byte loads at 16-bit, two at fp32), the head dim fastest so
// that a warp reads whole rows; each thread recomputes the row's weights from the two lse values
// (two loads that hit L1 across the row's threads).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../common/macros.h"
#include "../common/online_softmax.h"
#include "../common/vec.cuh"
#include "flashext/merge_states.h"

namespace flashext {
namespace {

template <typename T>
__global__ void __launch_bounds__(256) merge_states_kernel(const MergeStatesParams p) {
  constexpr int kN = 8;  // elements per thread: one 16-byte access at 16-bit, two at fp32
  const int chunks = p.head_dim / kN;
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= p.batch * p.seqlen * p.heads * chunks) return;
  const int c = int(id % chunks);
  const int64_t pair = id / chunks;
  const int h = int(pair % p.heads);
  const int64_t s = (pair / p.heads) % p.seqlen, b = pair / p.heads / p.seqlen;
  const auto at = [&](const int64_t (&st)[3], int64_t i0, int64_t i1, int64_t i2) {
    return i0 * st[0] + i1 * st[1] + i2 * st[2];
  };
  const LseMerge m = merge_lse(p.lse_a[at(p.lse_a_strides, b, h, s)], p.lse_b[at(p.lse_b_strides, b, h, s)]);
  if (c == 0) p.lse[at(p.lse_strides, b, h, s)] = m.lse;
  float a[kN], o_b[kN];
  unpack(load_pack<T, kN>(static_cast<const T*>(p.o_a) + at(p.o_a_strides, b, s, h), c), a);
  unpack(load_pack<T, kN>(static_cast<const T*>(p.o_b) + at(p.o_b_strides, b, s, h), c), o_b);
  Pack<T, kN> out;
#pragma unroll
  for (int e = 0; e < kN; ++e) {
    // A weight of 0 skips its side: an empty side's o may be anything (uninitialised, NaN).
    const float va = m.weight_a == 0.0f ? 0.0f : m.weight_a * a[e];
    const float vb = m.weight_b == 0.0f ? 0.0f : m.weight_b * o_b[e];
    out.elem[e] = from_float<T>(va + vb);
  }
  store_pack<T, kN>(static_cast<T*>(p.o) + at(p.o_strides, b, s, h), c, out);
}

template <typename T>
cudaError_t launch(const MergeStatesParams& p, cudaStream_t stream) {
  const int64_t threads = p.batch * p.seqlen * p.heads * (p.head_dim / 8);
  merge_states_kernel<T><<<unsigned((threads + 255) / 256), 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t run_merge_attention_states(const MergeStatesParams& p, cudaStream_t stream) {
  if (p.batch < 0 || p.seqlen < 0 || p.heads <= 0 || p.head_dim <= 0 || p.head_dim % 8 != 0) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0 || p.seqlen == 0) return cudaSuccess;
  switch (p.dtype) {
    case DType::kFloat32: return launch<float>(p, stream);
    case DType::kFloat16: return launch<__half>(p, stream);
    case DType::kBFloat16: return launch<__nv_bfloat16>(p, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace flashext
