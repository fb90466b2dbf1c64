// flashext TMA descriptors (tma.h).
#include "tma.h"

namespace flashext {
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* entry = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    // 12000: the ABI of cuTensorMapEncodeTiled since CUDA 12.0
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return EncodeTiled(nullptr);
    }
    return reinterpret_cast<EncodeTiled>(entry);
  }();
  return fn;
}

}  // namespace

cudaError_t make_tma_2d_swizzle128(CUtensorMap* map, const void* base, int element_bytes, uint64_t rows,
                                   uint64_t cols, uint64_t row_stride_bytes, uint32_t box_rows, uint32_t box_cols) {
  const EncodeTiled encode = encode_tiled();
  if (encode == nullptr || element_bytes != 2 || box_cols * uint32_t(element_bytes) != 128) return cudaErrorInvalidValue;
  const cuuint64_t dims[2] = {cols, rows};        // innermost first
  const cuuint64_t strides[1] = {row_stride_bytes};  // of every dim but the innermost
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t make_tma_4d_swizzle128(CUtensorMap* map, const void* base, const uint64_t (&dims)[4],
                                   const uint64_t (&strides_bytes)[3], const uint32_t (&box)[4]) {
  const EncodeTiled encode = encode_tiled();
  if (encode == nullptr || box[0] * 2 != 128) return cudaErrorInvalidValue;
  const cuuint64_t global_dims[4] = {dims[0], dims[1], dims[2], dims[3]};
  const cuuint64_t global_strides[3] = {strides_bytes[0], strides_bytes[1], strides_bytes[2]};
  const cuuint32_t box_dims[4] = {box[0], box[1], box[2], box[3]};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  // (16-bit either way: the copy does not look at the values, and zero fills are zero in both)
  const CUresult result =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), global_dims, global_strides, box_dims,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

TmaAttentionLayout tma_attention_layout(int64_t head_dim, int64_t heads, int64_t rows, int64_t batch,
                                        int64_t row_stride, int64_t head_stride, int64_t batch_stride) {
  head_stride = heads > 1 ? head_stride : head_dim;
  row_stride = rows > 1 ? row_stride : heads * head_stride;
  batch_stride = batch > 1 ? batch_stride : rows * row_stride;
  return {{uint64_t(head_dim), uint64_t(heads), uint64_t(rows), uint64_t(batch)},
          {uint64_t(head_stride) * 2, uint64_t(row_stride) * 2, uint64_t(batch_stride) * 2}};
}

cudaError_t make_tma_attention_map(CUtensorMap* map, const void* base, int64_t head_dim, int64_t heads, int64_t rows,
                                   int64_t batch, int64_t row_stride, int64_t head_stride, int64_t batch_stride,
                                   uint32_t box_rows) {
  const TmaAttentionLayout layout =
      tma_attention_layout(head_dim, heads, rows, batch, row_stride, head_stride, batch_stride);
  const uint32_t box[4] = {64, 1, box_rows, 1};
  return make_tma_4d_swizzle128(map, base, layout.dims, layout.strides_bytes, box);
}

}  // namespace flashext
