// flashext TMA descriptors (host side): 2-D tiled tensor maps of row-major 16-bit matrices with the
// 128-byte swizzle, for the Hopper kernels' cp.async.bulk.tensor loads and stores (sm90.cuh).
// Built through the driver's cuTensorMapEncodeTiled, reached with
// cudaGetDriverEntryPointByVersion, so nothing links against libcuda.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace flashext {

// map: rows × cols elements of element_bytes (2) each, row_stride_bytes apart (a multiple of 16),
// starting at base (16-byte aligned); boxes of box_rows × box_cols (box_cols · element_bytes =
// 128: one swizzle row); elements past the matrix read as zero. cudaErrorInvalidValue when the
// driver refuses the layout or has no such entry point.
cudaError_t make_tma_2d_swizzle128(CUtensorMap* map, const void* base, int element_bytes, uint64_t rows,
                                   uint64_t cols, uint64_t row_stride_bytes, uint32_t box_rows, uint32_t box_cols);

// A 4-D tensor of 16-bit elements (dims innermost first: e.g. head_dim, heads, seqlen, batch; the
// innermost contiguous), strides_bytes of dims 1-3 (multiples of 16), boxes of box[0..3] elements
// (box[0] · 2 = 128), the 128-byte swizzle; elements past the tensor read as zero.
cudaError_t make_tma_4d_swizzle128(CUtensorMap* map, const void* base, const uint64_t (&dims)[4],
                                   const uint64_t (&strides_bytes)[3], const uint32_t (&box)[4]);

// An attention tensor's 4-D layout for the TMA: dims (head_dim, heads, rows, batch), innermost
// first, and the byte strides of dims 1-3, from the tensor's element strides (16-bit elements).
// The stride of a dim of size 1 addresses nothing, but the TMA wants every stride a multiple of
// 16 bytes: such dims get the dense one, that of the dims inside them.
struct TmaAttentionLayout {
  uint64_t dims[4];
  uint64_t strides_bytes[3];
};
TmaAttentionLayout tma_attention_layout(int64_t head_dim, int64_t heads, int64_t rows, int64_t batch,
                                        int64_t row_stride, int64_t head_stride, int64_t batch_stride);

// An attention tensor (q, k, v, dout, dk, dv: batch × rows × heads × head_dim, 16-bit, element
// strides) as the 4-D map of tma_attention_layout with boxes of 64 columns × box_rows rows of one
// head: a tile's 64-column slabs, 128-byte swizzled.
cudaError_t make_tma_attention_map(CUtensorMap* map, const void* base, int64_t head_dim, int64_t heads, int64_t rows,
                                   int64_t batch, int64_t row_stride, int64_t head_stride, int64_t batch_stride,
                                   uint32_t box_rows);

}  // namespace flashext
