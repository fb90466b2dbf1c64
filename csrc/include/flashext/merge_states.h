// flashext: merging two partial attention results by their log-sum-exp (split-KV, cascade /
// shared-prefix attention, context parallelism). Torch-free launch API.
//
// For attention over the union of two disjoint key sets A and B, with o_a, lse_a the normalised
// output and natural-log lse over A (likewise B):
//   lse = log(e^lse_a + e^lse_b),   o = e^(lse_a − lse) · o_a + e^(lse_b − lse) · o_b
// computed as m = max(lse_a, lse_b), w = e^(lse − m), in fp32. A pair of −inf (neither set has a
// visible key) gives o = 0 and lse = −inf, never NaN; NaN in either lse makes the row NaN.
//
// Index (b, s, h) of o tensors (B, S, H, D) and of lse tensors (B, H, S), any element strides
// (the last dim of o contiguous, rows 16-byte aligned); a packed (total, H, D) batch is B = 1.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "flashext/common.h"

namespace flashext {

struct MergeStatesParams {
  const void* o_a = nullptr;
  const void* o_b = nullptr;
  void* o = nullptr;
  const float* lse_a = nullptr;
  const float* lse_b = nullptr;
  float* lse = nullptr;
  int64_t batch = 0, seqlen = 0;
  int heads = 0, head_dim = 0;  // head_dim a multiple of 8
  // Strides in elements: o tensors (batch, seq, head), lse tensors (batch, head, seq).
  int64_t o_a_strides[3] = {}, o_b_strides[3] = {}, o_strides[3] = {};
  int64_t lse_a_strides[3] = {}, lse_b_strides[3] = {}, lse_strides[3] = {};
  DType dtype = DType::kBFloat16;  // of the o tensors: kFloat32, kFloat16 or kBFloat16
};

cudaError_t run_merge_attention_states(const MergeStatesParams& params, cudaStream_t stream);

}  // namespace flashext
