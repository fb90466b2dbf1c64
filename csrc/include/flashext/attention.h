// flashext FlashAttention: torch-free launch API.
//
//   O = softmax(mask(cap(Q Kᵀ · softmax_scale))) V,   lse = log Σ_j exp(score_ij)  (natural log)
//
// Layout as flash-attn: q (B, Sq, H, D), k and v (B, Sk, Hkv, D), o like q, H % Hkv == 0 (query
// head h reads KV head h / (H / Hkv)); any element strides, the last dim contiguous. Varlen:
// cu_seqlens_q/k (B + 1, int32) give each sequence's rows of packed (total, H, D) tensors.
// Causal and windows are bottom-right aligned: key j is visible to query i when
// i + Sk − Sq − window_left ≤ j ≤ i + Sk − Sq + window_right (−1: unbounded; causal: right = 0);
// with align_top_left the diagonal offset Sk − Sq is 0 instead (torch SDPA's convention).
// A query that sees no key gets O = 0 and lse = −inf.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "flashext/common.h"

namespace flashext {

struct FlashFwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // dense: (B, H, Sq); varlen: (H, total_q); may be null
  // Strides in elements. Varlen ignores the batch strides (rows are found through cu_seqlens).
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;
  const int32_t* cu_seqlens_q = nullptr;  // both null: dense batch
  const int32_t* cu_seqlens_k = nullptr;
  // Varlen: rows in the packed q and k. The kernel clamps every cu_seqlens value into
  // [previous value, total] (and each length to the maximum below), so bad offsets can never
  // read or write out of bounds; validating them is the caller's choice (no host sync here).
  int64_t total_q = 0, total_k = 0;
  int batch = 0, heads = 0, heads_kv = 0, head_dim = 0;
  int seqlen_q = 0, seqlen_k = 0;  // dense: every sequence's; varlen: the maxima
  float softmax_scale = 0.0f;
  float softcap = 0.0f;  // 0: off
  int window_left = -1, window_right = -1;  // causal is window_right = 0
  // Diagonal alignment: bottom-right (flash-attn, KV caches: query i sits at key i + Sk − Sq)
  // or top-left (torch SDPA's is_causal: query i sits at key i).
  bool align_top_left = false;
  DType dtype = DType::kBFloat16;  // kFloat16 or kBFloat16
  // Block-sparse (run_flash_block_sparse_fwd only; dense batch): query i sees key j only where
  // block_mask[b][h][i / block_rows][j / block_cols] is nonzero, on top of causal and windows.
  // One byte per block, the last dim contiguous; a batch or head stride of 0 broadcasts (null
  // allowed when seqlen_k = 0).
  const uint8_t* block_mask = nullptr;
  int64_t mask_batch_stride = 0, mask_head_stride = 0, mask_row_stride = 0;
  int block_rows = 1, block_cols = 1;
  // Set by run_flash_block_sparse_fwd (in its workspace): per (batch, head, query block of the
  // kernel), a count, then the visible key blocks as key_block · 2 + partial (partial: some of
  // its elements are masked by block_mask, looked up per element), ascending.
  const int* sparse_blocks = nullptr;
  int sparse_stride = 0;  // ints per (batch, head, query block)
};

// The compiled head dim that serves `head_dim` (64, 128 or 256), or 0 when none does
// (head_dim must be a multiple of 8, at most 256).
inline int flash_fwd_kernel_head_dim(int head_dim) {
  if (head_dim <= 0 || head_dim % 8 != 0 || head_dim > 256) return 0;
  return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : 256;
}

cudaError_t run_flash_fwd(const FlashFwdParams& params, cudaStream_t stream);

// Block-sparse attention forward (block_mask, block_rows and block_cols set; no cu_seqlens): a
// small kernel lists, per query block, the key blocks any of whose (row, column) blocks is set
// (in `workspace`, flash_block_sparse_workspace_bytes of it), then the forward visits only those:
// key blocks wholly masked cost nothing, wholly visible ones nothing extra.
size_t flash_block_sparse_workspace_bytes(const FlashFwdParams& params);
cudaError_t run_flash_block_sparse_fwd(const FlashFwdParams& params, void* workspace, cudaStream_t stream);

// The backward: dq, dk, dv from dout, the forward's inputs, its out and its lse (natural log,
// −inf for a query that sees no key: its gradients are 0). The same layouts, strides and options
// as the forward (the FlashFwdParams part); dq like q, dk and dv like k and v. dK and dV of a KV
// head sum over the H / Hkv query heads that read it.
//
// Work: (1) D = rowsum(dout ∘ out) per query row, (2) per key block, dK and dV held in registers
// while the visible query blocks of every query head of the group stream past, and dQ added
// into an fp32 buffer (atomics: the order of additions, and so dq's last bits, can vary from run
// to run, unless deterministic), (3) dq = that buffer · softmax_scale in q's dtype. Varlen rows
// that no sequence covers are not written: the caller zeroes dq, dk and dv there. The workspace
// holds the buffer, D and the counters: flash_bwd_workspace_bytes(params) bytes, 256-byte aligned,
// any contents (zeroed in-stream).
struct FlashBwdParams : FlashFwdParams {
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  // Strides in elements, as the forward's (varlen ignores the batch strides).
  int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;
  // lse must be given (FlashFwdParams::lse and its strides), as the forward wrote it. dlse, the
  // gradient of lse when the caller used it (null: none), has lse's layout and strides.
  const float* dlse = nullptr;
  // Adds each block's dQ in a fixed order (key block by key block, waiting on a counter per
  // query block) instead of by atomics: dq is then bitwise the same from run to run.
  bool deterministic = false;
  // Shared memory per block the kernels may use (0: the device's opt-in maximum). Hopper's 227 KiB
  // takes the fastest tiles; less (A100, Ada) gets smaller ones; tests pass less to run those.
  int max_smem_per_block = 0;
};

size_t flash_bwd_workspace_bytes(const FlashBwdParams& params);

// The shared memory per block the backward needs at this head dim with max_smem_per_block bytes
// available (0: the current device's opt-in maximum): the tiles it would run, or 0 when none fits
// (at D = 256 the smallest needs 145 KiB: not sm_86/sm_89's 99).
int flash_bwd_smem_bytes(int head_dim, int max_smem_per_block = 0);

cudaError_t run_flash_bwd(const FlashBwdParams& params, void* workspace, cudaStream_t stream);

// Attention over KV caches (decode, speculative or chunked prefill): q (B, Sq, H, D) against each
// sequence's cache_seqlens[b] + seqlen_new cached tokens, the queries aligned bottom-right.
// Caches: dense (B, capacity, Hkv, D), or paged (num_pages, page_size, Hkv, D) with block_table
// (B, pages_per_seq) int32 (token t at page block_table[b, t / page_size], slot t % page_size).
// The seqlen_new new tokens are written into the caches first (run_kvcache_append) and attended.
// The query heads of a KV head are one block's rows, so a cached byte is read once per KV head;
// num_splits blocks share each sequence's keys (split-KV), their partial results merged by lse.
struct FlashDecodeParams {
  const void* q = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // (B, H, Sq), contiguous along Sq; may be null
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;
  int64_t lse_batch_stride = 0, lse_head_stride = 0;
  void* k_cache = nullptr;  // written only by run_kvcache_append
  void* v_cache = nullptr;
  // Strides in elements: per sequence (dense) or per page (paged), per token, per head.
  int64_t k_page_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_page_stride = 0, v_row_stride = 0, v_head_stride = 0;
  const int32_t* cache_seqlens = nullptr;  // (B,), on the device: tokens before this call's new ones
  const int32_t* block_table = nullptr;    // null: dense caches
  int64_t block_table_stride = 0;
  int num_pages = 0;  // paged: page ids are clamped into [0, num_pages), so no table reaches outside
  int page_size = 0;  // paged: tokens per page (dense: unused)
  // Tokens a sequence's cache holds. A length past it (cache_seqlens[b] + seqlen_new > capacity) is
  // clamped: the tokens past the end are dropped and the queries align to the last kept key.
  int capacity = 0;
  int seqlen_new = 0;
  int batch = 0, heads = 0, heads_kv = 0, head_dim = 0, seqlen_q = 0;
  float softmax_scale = 0.0f;
  float softcap = 0.0f;
  int window_left = -1, window_right = -1;  // causal is window_right = 0
  int num_splits = 1;
  DType dtype = DType::kBFloat16;
  // Shared memory per SM the launch plans for (0: the device's): three K/V stages where two such
  // blocks fit (sm_90), else two; tests pass less to run the two-stage pipeline on any GPU.
  int max_smem_per_sm = 0;
};

// Splits of each sequence's keys for this shape on a GPU of sm_count SMs: enough blocks for about
// two per SM (or, for dense caches, one per SM, which streams about as fast), each split at least
// 256 keys, at most 64. Shapes only: no device values, no sync.
int flash_decode_num_splits(int batch, int heads, int heads_kv, int seqlen_q, int capacity, int head_dim,
                            int sm_count, bool paged = false);

size_t flash_decode_workspace_bytes(const FlashDecodeParams& params);

cudaError_t run_flash_decode(const FlashDecodeParams& params, void* workspace, cudaStream_t stream);

// Writes new tokens k, v (B, seqlen_new, Hkv, D; element strides) into the caches of `cache` at
// tokens cache_seqlens[b] + [0, seqlen_new); positions past the capacity are dropped (never written
// outside the caches).
struct KvAppendParams {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
};

cudaError_t run_kvcache_append(const FlashDecodeParams& cache, const KvAppendParams& append, cudaStream_t stream);

// What is wrong with a host copy of varlen offsets cu[0 .. n) for a packed tensor of `total` rows
// and sequences of at most max_seqlen rows (the kernel clamps bad offsets, so this is about
// correct results, not memory safety). kOk also tells whether the sequences cover every row.
enum class CuSeqlensError : int32_t { kOk, kNotStartingAtZero, kDecreasing, kPastTotal, kLongerThanMax };
CuSeqlensError check_cu_seqlens(const int32_t* cu, int64_t n, int64_t total, int64_t max_seqlen);

}  // namespace flashext
