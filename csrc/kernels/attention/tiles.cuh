// flashext attention kernels: swizzled shared-memory tiles of 16-bit rows and the cp.async copies
// that fill them, and a sequence's rows in a dense or packed batch (the forward, the Hopper
// forward and the backward share these).
//
// A tile is rows of kWidth 16-bit elements (128, 256 or 512 bytes), stored in 16-byte chunks with
// chunk c of row r at c ^ (r % 8): the 8 row addresses of every ldmatrix then hit 8 different bank
// groups. Tiles start 128-byte aligned.
#pragma once

#include <cstdint>

#include "../common/macros.h"
#include "../common/ptx.cuh"

namespace flashext {
namespace attention_detail {

// Element offset of (row, 16-byte chunk) in a swizzled tile of kWidth-element rows.
template <int kWidth>
FX_DEVICE int swizzled(int row, int chunk) {
  return row * kWidth + ((chunk ^ (row & 7)) << 3);
}

// Byte address in shared memory of the even chunk `chunk_even` (+ c) of a swizzled row, from the
// address `base_c` of chunk c (0 or 1) of that row. Tiles start 128-byte aligned and rows are whole
// multiples of 128 bytes, so bits 4-6 of base_c hold (c ^ (row & 7)): XOR-ing the low three bits of
// chunk_even into them and adding the rest gives chunk (chunk_even + c) ^ (row & 7). With
// chunk_even a constant after unrolling that is at most one LOP3 (often none) per fragment instead
// of the three instructions that form the swizzle from the row and the chunk.
FX_DEVICE uint32_t swizzled_chunk_addr(uint32_t base_c, int chunk_even) {
  return (base_c ^ uint32_t((chunk_even & 7) << 4)) + uint32_t((chunk_even & ~7) << 4);
}

// Copy rows [0, kRows) of a (rows_left-row, head_dim-wide) global tile into a swizzled shared tile
// with cp.async; rows past rows_left and columns past head_dim are zero-filled. Thread t always
// copies chunk t % kChunks of rows t / kChunks + i · kRowStep. Whole tiles (the common case: every
// block but the last of a sequence, full head_dim) take a branch with no per-row predicates.
template <typename Config, int kRows, typename T>
FX_DEVICE void load_tile(T* smem, const T* gmem, int64_t row_stride, int rows_left, int head_dim) {
  constexpr int kChunks = Config::kChunks, kRowStep = Config::kThreads / kChunks;
  static_assert((kRowStep & (kRowStep - 1)) == 0, "row steps are powers of two");
  const int chunk = threadIdx.x % kChunks, row0 = threadIdx.x / kChunks;
  const T* src = gmem + int64_t(row0) * row_stride + chunk * 8;
  const int64_t src_step = kRowStep * row_stride;
  // Row row0 + i · kRowStep has swizzle row0 ^ ((i · kRowStep) & 7) (row0 < kRowStep, a power of
  // two, so the bits do not overlap): the same XOR trick as swizzled_chunk_addr.
  const uint32_t dst0 = ptx::smem_addr(smem) + 2 * swizzled<Config::kHeadDim>(row0, chunk);
  const auto dst = [&](int i) {
    return (dst0 ^ uint32_t(((i * kRowStep) & 7) << 4)) + uint32_t(2 * i * kRowStep * Config::kHeadDim);
  };
  if (rows_left >= kRows && head_dim == Config::kHeadDim) {
#pragma unroll
    for (int i = 0; i < kRows / kRowStep; ++i) {
      ptx::cp_async_16(dst(i), src, 16);
      src += src_step;
    }
  } else {
    const bool chunk_valid = chunk * 8 < head_dim;
#pragma unroll
    for (int i = 0; i < kRows / kRowStep; ++i) {
      const bool valid = chunk_valid && row0 + i * kRowStep < rows_left;
      ptx::cp_async_16(dst(i), valid ? src : gmem, valid ? 16 : 0);
      src += src_step;
    }
  }
}

// Copy rows [0, kRows) of a tile whose rows live anywhere (a paged KV cache, rows gathered across
// heads) into a swizzled shared tile: row_ptr(row, i) gives row `row`'s first element in global
// memory, or nullptr for a row to zero-fill, where i is the thread's pass (its i-th row, a
// compile-time index after unrolling: row = threadIdx.x / kChunks + i · kThreads / kChunks);
// columns past head_dim are zero-filled (cp.async then reads nothing, from `fallback`, any valid
// address). The same thread-to-chunk map as load_tile.
template <typename Config, int kRows, typename T, typename RowPtr>
FX_DEVICE void load_rows(T* smem, RowPtr row_ptr, int head_dim, const T* fallback) {
  constexpr int kChunks = Config::kChunks, kRowStep = Config::kThreads / kChunks;
  static_assert((kRowStep & (kRowStep - 1)) == 0, "row steps are powers of two");
  const int chunk = threadIdx.x % kChunks, row0 = threadIdx.x / kChunks;
  const bool chunk_valid = chunk * 8 < head_dim;
  const uint32_t dst0 = ptx::smem_addr(smem) + 2 * swizzled<Config::kHeadDim>(row0, chunk);
#pragma unroll
  for (int i = 0; i < kRows / kRowStep; ++i) {
    const T* src = row_ptr(row0 + i * kRowStep, i);
    const bool valid = chunk_valid && src != nullptr;
    const uint32_t dst =
        (dst0 ^ uint32_t(((i * kRowStep) & 7) << 4)) + uint32_t(2 * i * kRowStep * Config::kHeadDim);
    ptx::cp_async_16(dst, valid ? src + chunk * 8 : fallback, valid ? 16 : 0);
  }
}

// This sequence's rows (dense batch or packed varlen): varlen offsets clamped into [previous
// offset, total] and lengths to the maxima, so that no offsets, however wrong, reach outside the
// packed tensors. Params: FlashFwdParams or FlashBwdParams.
struct SequenceRows {
  int seqlen_q, seqlen_k;
  int64_t q_start, k_start;  // varlen: first packed row; dense: 0
};

template <typename Params>
FX_DEVICE SequenceRows sequence_rows(const Params& p, int batch) {
  SequenceRows s{p.seqlen_q, p.seqlen_k, 0, 0};
  if (p.cu_seqlens_q != nullptr) {
    const int64_t q_start = min(max(int64_t(p.cu_seqlens_q[batch]), int64_t(0)), p.total_q);
    const int64_t k_start = min(max(int64_t(p.cu_seqlens_k[batch]), int64_t(0)), p.total_k);
    const int64_t q_end = min(max(int64_t(p.cu_seqlens_q[batch + 1]), q_start), p.total_q);
    const int64_t k_end = min(max(int64_t(p.cu_seqlens_k[batch + 1]), k_start), p.total_k);
    s.seqlen_q = int(min(q_end - q_start, int64_t(p.seqlen_q)));
    s.seqlen_k = int(min(k_end - k_start, int64_t(p.seqlen_k)));
    s.q_start = q_start;
    s.k_start = k_start;
  }
  return s;
}

}  // namespace attention_detail
}  // namespace flashext
