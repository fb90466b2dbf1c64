// flashext attention over KV caches (flashext/attention.h, FlashDecodeParams): decode, speculative
// and chunked-prefill query blocks against dense or paged caches, split-KV with an lse merge.
//
// Main kernel. Grid: (row blocks × splits, Hkv, B); block: 4 warps × 16 rows. A block's rows are
// (query position i, query head g of the KV head's group) pairs, r = i · group + g, so the group's
// heads share every K/V tile (a cached byte is read once per KV head and row block: once, for
// decode). Each block walks the key tiles of its split, [split · split_keys, ... + split_keys)
// ∩ [0, cache_seqlens[b] + seqlen_new), tiles copied from a base per tile (dense caches, pages of
// whole tiles) or row by row through the page table (smaller pages; the table read a tile
// ahead), in a cp.async pipeline of kStages buffers: the FA2 loop of
// flash_fwd_kernel.cuh with one m16 row tile per warp, where warps with no real rows only copy;
// or, when every row fits one m16 tile (decode), each warp takes a 16-key slab of every tile for
// those rows, and the 4 warps' softmax states merge at the end (each warp merging the row states
// and writing a quarter of O's columns).
// Row sums add the 16-bit P that P V multiplies. One split writes o and lse itself; more write
// fp32 partials that flash_decode_combine merges by their lse.
//
//   D     rows × keys   shared memory (Q + stages × (K, V))   registers: S + acc_o per thread
//   64    64 × 64       8 + 3·2·8  = 56 KiB                    32 + 32
//   128   64 × 64       16 + 3·2·16 = 112 KiB                  32 + 64
//   256   64 × 32       32 + 2·2·16 = 96 KiB                   16 + 128
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../common/device.h"
#include "../common/divmod.h"
#include "../common/online_softmax.h"
#include "../common/ptx.cuh"
#include "../common/vec.cuh"
#include "dispatch.h"
#include "flashext/attention.h"
#include "tiles.cuh"

namespace flashext {
namespace attention_detail {
namespace {

template <int kHeadDim_, int kStages_ = (kHeadDim_ <= 128 ? 3 : 2)>
struct DecodeConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kNWarps = 4;
  static constexpr int kThreads = 32 * kNWarps;
  // Blocks an SM that the registers must allow: at D = 64 the four that shared memory holds (left
  // to itself, ptxas gives the bf16 kernel registers for three); elsewhere no minimum (0: ptxas's
  // own count already fits the two blocks that shared memory holds, and an explicit minimum
  // changes D = 128's code, to more registers or to spills).
  static constexpr int kMinBlocks = kHeadDim <= 64 ? 4 : 0;
  static constexpr int kBlockM = 16 * kNWarps;  // rows: (query, group head) pairs
  static constexpr int kBlockN = kHeadDim <= 128 ? 64 : 32;
  // K/V buffers: up to two tiles in flight while one is read where two such blocks fit an SM
  // (sm_90's 228 KiB); two buffers at D = 256, and on GPUs with less shared memory (launch_decode)
  static constexpr int kStages = kStages_;
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr int kTileQ = kBlockM * kHeadDim;
  static constexpr int kTileKV = kBlockN * kHeadDim;
  static constexpr int kSmemBytes = (kTileQ + 2 * kStages * kTileKV) * 2;
  static_assert(kBlockN % (kThreads / kChunks) == 0 && kBlockM % (kThreads / kChunks) == 0, "whole copy passes");
};

constexpr int kMaxSplits = 64;

// A sequence's keys: its `cached` tokens plus the new ones, clamped to the capacity (in 64 bits:
// any int32 length is safe).
FX_DEVICE int decode_total_keys(const FlashDecodeParams& p, int cached) {
  return int(min(int64_t(max(cached, 0)) + p.seqlen_new, int64_t(p.capacity)));
}

// The kernel's divisions by run-time values, set up on the host once per launch: a division costs
// about 20 instructions, and a block's setup does several before its first copy can issue.
struct DecodeDivisors {
  FastDivmod group;       // query heads per KV head: a block row r is (query r / group, head r % group)
  FastDivmod row_blocks;  // row blocks per split: blockIdx.x is (split, row block)
  FastDivmod page;        // tokens per page (paged caches; 1 for dense ones)
  int split_keys = 0;     // keys per split, whole key tiles
};

// The cache row of token t of sequence b (dense: row t of sequence b; paged: through the table,
// page ids clamped so that no table reaches outside the cache).
FX_DEVICE int64_t cache_row(const FlashDecodeParams& p, int b, int t, int64_t page_stride, int64_t row_stride) {
  if (p.block_table == nullptr) return int64_t(b) * page_stride + int64_t(t) * row_stride;
  const int page = min(max(p.block_table[int64_t(b) * p.block_table_stride + t / p.page_size], 0), p.num_pages - 1);
  return int64_t(page) * page_stride + int64_t(t % p.page_size) * row_stride;
}

template <typename T, typename Config>
__global__ void __launch_bounds__(Config::kThreads, Config::kMinBlocks)
    flash_decode_kernel(const FlashDecodeParams p, const DecodeDivisors divs, float* o_part, float* lse_part) {
  constexpr int kHeadDim = Config::kHeadDim, kBlockM = Config::kBlockM, kBlockN = Config::kBlockN;
  constexpr int kDTiles = kHeadDim / 8;
  constexpr uint32_t kRowBytes = 2 * kHeadDim;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* smem_q = reinterpret_cast<T*>(smem_raw);
  constexpr int kStages = Config::kStages;
  T* smem_k = smem_q + Config::kTileQ;  // kStages buffers each
  T* smem_v = smem_k + kStages * Config::kTileKV;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group_id = lane / 4, quad = lane % 4;
  const int group = divs.group.divisor;
  int split, row_block;
  divs.row_blocks.divmod(int(blockIdx.x), split, row_block);
  const int kv_head = blockIdx.y, b = blockIdx.z;
  const int cached = p.cache_seqlens[b];  // (in flight while the first split's first copies issue)
  const int split_keys = divs.split_keys;
  const int row0 = row_block * kBlockM;
  const int i_first = divs.group.div(row0);
  const int i_last = divs.group.div(min(row0 + kBlockM - 1, group * p.seqlen_q - 1));
  // The split's keys within the capacity. With no left window the first split's first key is key 0,
  // whatever the sequence's length, so its prologue copies the first tiles before the length is in
  // (rows up to split_hi: memory of the cache) and copies them again where the sequence ends inside
  // them (below). Later splits wait for the length: one past its sequence's end would read its
  // first tiles for nothing, and short sequences in a long cache leave most splits so.
  const int split_lo = split * split_keys, split_hi = min(split_lo + split_keys, p.capacity);
  const bool early = p.window_left < 0 && split == 0;
  int n_hi = split_hi;  // the copies' bound: split_hi until the length is in

  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k_cache);
  const T* v = static_cast<const T*>(p.v_cache);
  const auto q_row = [&](int r, int) -> const T* {
    int i, g;
    divs.group.divmod(row0 + r, i, g);
    if (i >= p.seqlen_q) return nullptr;
    return q + int64_t(b) * p.q_batch_stride + int64_t(i) * p.q_row_stride +
           int64_t(kv_head * group + g) * p.q_head_stride;
  };
  // K/V copies: this thread copies 16-byte chunk `chunk` of rows copy_row0 + i · kCopyStep of each
  // tile (i < kCopyRows). Where a tile's rows are consecutive cache rows (dense caches, or pages of
  // whole tiles: tiles start at multiples of kBlockN), a base per tile and a pointer step per row;
  // with smaller pages, each row's (page, row in page), from the table read a tile ahead so that
  // its latency hides under a tile's math. Page ids are clamped into the cache.
  constexpr int kCopyRows = kBlockN / (Config::kThreads / Config::kChunks), kCopyStep = kBlockN / kCopyRows;
  const int copy_row0 = threadIdx.x / Config::kChunks, chunk = threadIdx.x % Config::kChunks;
  const bool chunk_valid = chunk * 8 < p.head_dim;
  const uint32_t copy_dst0 = 2 * swizzled<kHeadDim>(copy_row0, chunk);  // bytes into a tile
  const bool paged = p.block_table != nullptr;
  const bool whole_pages = !paged || p.page_size % kBlockN == 0;
  const T* k_thread = k + int64_t(kv_head) * p.k_head_stride + chunk * 8 + (paged ? 0 : int64_t(b) * p.k_page_stride);
  const T* v_thread = v + int64_t(kv_head) * p.v_head_stride + chunk * 8 + (paged ? 0 : int64_t(b) * p.v_page_stride);
  const int64_t k_step = int64_t(kCopyStep) * p.k_row_stride, v_step = int64_t(kCopyStep) * p.v_row_stride;
  const int32_t* table = paged ? p.block_table + int64_t(b) * p.block_table_stride : nullptr;
  int page[kCopyRows], page_row[kCopyRows];  // pages of whole tiles: [0], the tile's first row
  const auto fetch_pages = [&](int n) {
    if (!paged) return;
    if (whole_pages) {
      int slot;
      divs.page.divmod(n, slot, page_row[0]);
      page[0] = table[slot];  // (clamped where used: nothing waits on this load until then)
      return;
    }
#pragma unroll
    for (int i = 0; i < kCopyRows; ++i) {
      const int t = min(n + copy_row0 + i * kCopyStep, n_hi - 1);  // (rows past the range: not copied)
      int slot;
      divs.page.divmod(t, slot, page_row[i]);
      page[i] = table[slot];
    }
  };
  const auto page_offset = [&](int id, int64_t page_stride) {
    return int64_t(min(max(id, 0), p.num_pages - 1)) * page_stride;
  };
  // One tile of K or V (base: this thread's column of the head; rows past n_hi zero-filled, their
  // copies pointed at the cache's start). copy_rows: a tile of consecutive cache rows, src this
  // thread's first.
  const auto dst = [&](uint32_t dst0, int i) {
    return (dst0 ^ uint32_t(((i * kCopyStep) & 7) << 4)) + uint32_t(2 * i * kCopyStep * kHeadDim);
  };
  const auto valid = [&](int n, int i) { return chunk_valid && n + copy_row0 + i * kCopyStep < n_hi; };
  const auto copy_rows = [&](uint32_t dst0, int n, const T* src, int64_t step, const T* cache) {
    if (chunk_valid && n + kBlockN <= n_hi) {  // every row in range (all but a split's last tile)
#pragma unroll
      for (int i = 0; i < kCopyRows; ++i, src += step) ptx::cp_async_16(dst(dst0, i), src, 16);
    } else {
#pragma unroll
      for (int i = 0; i < kCopyRows; ++i, src += step)
        ptx::cp_async_16(dst(dst0, i), valid(n, i) ? src : cache, valid(n, i) ? 16 : 0);
    }
  };
  const auto copy_tile = [&](uint32_t dst0, int n, const T* base, int64_t page_stride, int64_t row_stride,
                             int64_t step, const T* cache) {
    if (whole_pages) {
      copy_rows(dst0, n,
                base + (paged ? page_offset(page[0], page_stride) + int64_t(page_row[0] + copy_row0) * row_stride
                              : int64_t(n + copy_row0) * row_stride),
                step, cache);
    } else {
#pragma unroll
      for (int i = 0; i < kCopyRows; ++i) {
        const T* src = base + page_offset(page[i], page_stride) + int64_t(page_row[i]) * row_stride;
        ptx::cp_async_16(dst(dst0, i), valid(n, i) ? src : cache, valid(n, i) ? 16 : 0);
      }
    }
  };
  const auto tile_dst = [&](const T* smem, int buffer) {  // this thread's first slot of a K or V buffer
    return ptx::smem_addr(smem + buffer * Config::kTileKV) + copy_dst0;
  };
  const auto load_kv = [&](int buffer, int n) {
    copy_tile(tile_dst(smem_k, buffer), n, k_thread, p.k_page_stride, p.k_row_stride, k_step, k);
    copy_tile(tile_dst(smem_v, buffer), n, v_thread, p.v_page_stride, p.v_row_stride, v_step, v);
  };

  const bool softcap_on = p.softcap > 0.0f;
  const float score_scale = softcap_on ? kLog2e : p.softmax_scale * kLog2e;
  const float cap_scale = softcap_on ? p.softmax_scale / p.softcap : 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
  float acc_o[kDTiles][4];
#pragma unroll
  for (int t = 0; t < kDTiles; ++t) acc_o[t][0] = acc_o[t][1] = acc_o[t][2] = acc_o[t][3] = 0.0f;

  // Prologue: Q and the first kStages - 1 tiles, one commit group per tile (Q rides the first).
  const auto prologue = [&](int n_first, int blocks) {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < blocks) {
        fetch_pages(n_first + s * kBlockN);
        load_kv(s, n_first + s * kBlockN);
      }
      ptx::cp_async_commit();
    }
  };
  if (early && split_lo < split_hi) {
    load_rows<Config, kBlockM>(smem_q, q_row, p.head_dim, q);
    prologue(split_lo, (split_hi - split_lo + kBlockN - 1) / kBlockN);
  }
  const int total = decode_total_keys(p, cached);
  const int diag = total - p.seqlen_q;  // bottom-right: the last query sits at the last key
  // Keys this block's rows can see: the split's range, narrowed by causal / window bounds of the
  // first and last query positions among its rows.
  int n_lo = split_lo;
  n_hi = min(split_hi, total);
  if (p.window_left >= 0) n_lo = max(n_lo, (i_first + diag - p.window_left) / kBlockN * kBlockN);
  if (p.window_right >= 0) n_hi = min(n_hi, i_last + diag + p.window_right + 1);
  const int num_n_blocks = n_hi > n_lo ? (n_hi - n_lo + kBlockN - 1) / kBlockN : 0;
  // Keys every real row of the block sees: tiles inside [mask_free_lo, mask_free_hi) skip the mask
  // (rows past the block's (query, head) pairs are never written, whatever they see).
  const int mask_free_hi = p.window_right < 0 ? n_hi : min(n_hi, i_first + diag + p.window_right + 1);
  const int mask_free_lo = p.window_left < 0 ? 0 : i_last + diag - p.window_left;
  // Where the keys end inside the tiles copied early, their rows past the end hold other tokens (or
  // never-written memory), which the mask would hide in S but not in P V: each thread copies its
  // own chunks again, those rows zero-filled, once its first copies have landed.
  const bool again = early && n_hi < min(split_hi, split_lo + (kStages - 1) * kBlockN);
  if (!early || again) {
    if (again) {
      ptx::cp_async_wait<0>();
    } else if (num_n_blocks > 0) {
      load_rows<Config, kBlockM>(smem_q, q_row, p.head_dim, q);
    }
    prologue(n_lo, num_n_blocks);
  }
  if (kStages - 1 < num_n_blocks) fetch_pages(n_lo + (kStages - 1) * kBlockN);

  // Two ways to share a tile among the 4 warps. Rows: warp w owns rows 16 w + [0, 16) and every
  // key of the tile. Keys, when all the block's rows fit one m16 tile (decode: group · Sq ≤ 16):
  // every warp computes those 16 rows over its own 16-key slab of each tile, with a softmax state
  // of its own, and the warps' states are merged at the end (as split-KV partials are), so all 4
  // warps' tensor cores share a tile's math instead of one warp doing all of it.
  constexpr int kKeySlabs = kBlockN / 16;
  static_assert(kKeySlabs <= Config::kNWarps, "key sharing gives each warp at most one slab");
  const bool share_keys = group * p.seqlen_q <= 16;
  const int row_warp = share_keys ? 0 : warp;  // the m16 row tile this warp computes
  const int slab0 = share_keys ? warp : 0;     // its first 16-key slab of each tile
  const uint32_t q_base = ptx::smem_addr(smem_q) + 2 * swizzled<kHeadDim>(16 * row_warp + lane % 16, lane / 16);
  const uint32_t k_base0 = ptx::smem_addr(smem_k) + 2 * swizzled<kHeadDim>(lane % 8 + (lane / 16) * 8, (lane / 8) % 2) +
                           16 * slab0 * kRowBytes;
  const uint32_t v_base0 = ptx::smem_addr(smem_v) + 2 * swizzled<kHeadDim>(lane % 8 + ((lane / 8) % 2) * 8, lane / 16) +
                           16 * slab0 * kRowBytes;
  // A warp with no rows (row sharing: its 16 rows all past the block's (query, head) pairs) or no
  // keys (key sharing at D = 256: two slabs for four warps) only helps load the tiles.
  const bool warp_busy = share_keys ? slab0 < kKeySlabs : row0 + 16 * warp < group * p.seqlen_q;
  // This thread's two rows (group_id, group_id + 8 of the warp's 16) as query positions.
  int row_query[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) row_query[r] = divs.group.div(row0 + 16 * row_warp + group_id + 8 * r);

  // One tile's math for this warp's rows over kSlabs 16-key slabs from slab0: S = Q Kᵀ, mask,
  // online softmax, O += P V (softcap only where `general`).
  const auto tile_math = [&](auto slabs, int buffer, int n_start, bool masked, auto general) {
    constexpr int kSlabs = decltype(slabs)::value, kTiles = 2 * kSlabs;
    const uint32_t k_base = k_base0 + buffer * (2 * Config::kTileKV);
    const uint32_t v_base = v_base0 + buffer * (2 * Config::kTileKV);
    const int key0 = n_start + 16 * slab0;

    float s[kTiles][4];
#pragma unroll
    for (int j = 0; j < kTiles; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t q_frag[4];
      ptx::ldmatrix_x4(q_frag, swizzled_chunk_addr(q_base, 2 * kk));
#pragma unroll
      for (int jp = 0; jp < kSlabs; ++jp) {
        uint32_t k_frag[4];
        ptx::ldmatrix_x4(k_frag, swizzled_chunk_addr(k_base, 2 * kk) + 16 * jp * kRowBytes);
        ptx::mma_16816<T>(s[2 * jp], q_frag, k_frag[0], k_frag[1]);
        ptx::mma_16816<T>(s[2 * jp + 1], q_frag, k_frag[2], k_frag[3]);
      }
    }
    if (decltype(general)::value && softcap_on) {
#pragma unroll
      for (int j = 0; j < kTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = p.softcap * tanhf(s[j][e] * cap_scale);
    }
    // Mask (tiles that need it): keys past the range, and per row the causal / window bounds of
    // its query position.
    if (masked) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = row_query[r];
        const int right = min(n_hi, p.window_right < 0 ? n_hi : i + diag + p.window_right + 1);
        const int left = p.window_left < 0 ? 0 : i + diag - p.window_left;
#pragma unroll
        for (int j = 0; j < kTiles; ++j) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = key0 + 8 * j + 2 * quad + e;
            if (key >= right || key < left) s[j][2 * r + e] = -INFINITY;
          }
        }
      }
    }
    // Online softmax per row (its 4 owners are one lane quad); P rounded to T, summed as rounded.
    uint32_t p16[kTiles][2];
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kTiles; ++j) tile_max = fmaxf(tile_max, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float new_max = fmaxf(row_max[r], tile_max);
      alpha[r] = rescale_factor(row_max[r], new_max, score_scale);
      const float base = safe_row_max(new_max) * score_scale;
      float tile_sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        p16[j][r] = ptx::pack2<T>(ptx::exp2_approx(fmaf(s[j][2 * r], score_scale, -base)),
                                  ptx::exp2_approx(fmaf(s[j][2 * r + 1], score_scale, -base)));
        const Pack<T, 2> pair = *reinterpret_cast<const Pack<T, 2>*>(&p16[j][r]);
        tile_sum += to_float(pair.elem[0]) + to_float(pair.elem[1]);
      }
      row_sum[r] = row_sum[r] * alpha[r] + tile_sum;
      row_max[r] = new_max;
    }
    // Past the first tiles most raise no row's max: every alpha is 1 and O keeps its scale.
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int t = 0; t < kDTiles; ++t) {
        acc_o[t][0] *= alpha[0];
        acc_o[t][1] *= alpha[0];
        acc_o[t][2] *= alpha[1];
        acc_o[t][3] *= alpha[1];
      }
    }
    // O += P V
#pragma unroll
    for (int kk = 0; kk < kSlabs; ++kk) {
      const uint32_t p_frag[4] = {p16[2 * kk][0], p16[2 * kk][1], p16[2 * kk + 1][0], p16[2 * kk + 1][1]};
#pragma unroll
      for (int tp = 0; tp < kDTiles / 2; ++tp) {
        uint32_t v_frag[4];
        ptx::ldmatrix_x4_trans(v_frag, swizzled_chunk_addr(v_base, 2 * tp) + 16 * kk * kRowBytes);
        ptx::mma_16816<T>(acc_o[2 * tp], p_frag, v_frag[0], v_frag[1]);
        ptx::mma_16816<T>(acc_o[2 * tp + 1], p_frag, v_frag[2], v_frag[3]);
      }
    }
  };

  // The tile loop, in two copies: the common case (key sharing, no softcap: decode) with only its
  // own code, and every other case. One loop over every case spans 38 KB of code at D = 128 (the
  // row path and softcap inside it), through which the decode path's instructions jump; the
  // common case's own copy is 18 KB. Its dense copies step a pointer a tile at a time, where the
  // paged ones compute each tile's rows from n and the table.
  const auto tile_loop = [&](auto general) {
    constexpr bool kGeneral = decltype(general)::value;
    const int64_t k_tile = int64_t(kBlockN) * p.k_row_stride, v_tile = int64_t(kBlockN) * p.v_row_stride;
    const int64_t row_ahead = int64_t(n_lo) + (kStages - 1) * kBlockN + copy_row0;  // (common case)
    const T* k_src = k_thread + row_ahead * p.k_row_stride;
    const T* v_src = v_thread + row_ahead * p.v_row_stride;
    for (int it = 0; it < num_n_blocks; ++it) {
      const int n_start = n_lo + it * kBlockN, buffer = it % kStages, ahead = it + kStages - 1;
      ptx::cp_async_wait<kStages - 2>();
      __syncthreads();  // tile `it` is in; every warp is done with tile it - 1's buffer, refilled next
      if (ahead < num_n_blocks) {
        if (kGeneral || paged) {
          load_kv(ahead % kStages, n_lo + ahead * kBlockN);
        } else {
          const int b_ahead = ahead % kStages, n = n_lo + ahead * kBlockN;
          copy_rows(tile_dst(smem_k, b_ahead), n, k_src, k_step, k);
          copy_rows(tile_dst(smem_v, b_ahead), n, v_src, v_step, v);
          k_src += k_tile;
          v_src += v_tile;
        }
      }
      ptx::cp_async_commit();
      if (ahead + 1 < num_n_blocks) fetch_pages(n_lo + (ahead + 1) * kBlockN);
      if (!warp_busy) continue;  // (a warp-uniform branch; the loop's barrier stays at its top)
      const bool masked = n_start < mask_free_lo || n_start + kBlockN > mask_free_hi;
      if (!kGeneral || share_keys) {
        tile_math(std::integral_constant<int, 1>{}, buffer, n_start, masked, general);
      } else {
        tile_math(std::integral_constant<int, kKeySlabs>{}, buffer, n_start, masked, general);
      }
    }
  };
  if (share_keys && !softcap_on) {
    tile_loop(std::false_type{});
  } else {
    tile_loop(std::true_type{});
  }
  ptx::cp_async_wait<0>();  // nothing in flight at exit

  // Key sharing: the warps' states merge through the tiles' shared memory (lane t of every warp
  // holds the same rows and columns). Every warp with a slab stores (m, l, O) per lane,
  // element-major so that a warp's 32 lanes hit 32 banks; then every warp merges the row states
  // and its own quarter of O's column tiles (tiles warp + kNWarps j), and writes those columns.
  constexpr int kValues = 4 + 4 * kDTiles, kMergedTiles = kDTiles / Config::kNWarps;
  static_assert(kKeySlabs * kValues * 32 * 4 <= Config::kSmemBytes, "the merge fits the tiles' memory");
  static_assert(kDTiles % Config::kNWarps == 0, "whole column tiles a warp");
  float merged[kMergedTiles][4];
  if (share_keys) {
    float* merge = reinterpret_cast<float*>(smem_raw);
    __syncthreads();  // every warp is done reading the tiles
    if (warp < kKeySlabs) {  // (warps past the slabs hold nothing)
      float* mine = merge + warp * kValues * 32 + lane;
      mine[0] = row_max[0], mine[32] = row_max[1], mine[64] = row_sum[0], mine[96] = row_sum[1];
#pragma unroll
      for (int t = 0; t < kDTiles; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[32 * (4 + 4 * t + e)] = acc_o[t][e];
    }
    __syncthreads();
    const float* state = merge + lane;
    float scale[kKeySlabs][2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m = -INFINITY, l = 0.0f;
#pragma unroll
      for (int w = 0; w < kKeySlabs; ++w) m = fmaxf(m, state[w * kValues * 32 + 32 * r]);
#pragma unroll
      for (int w = 0; w < kKeySlabs; ++w) {
        scale[w][r] = rescale_factor(state[w * kValues * 32 + 32 * r], m, score_scale);
        l += state[w * kValues * 32 + 32 * (2 + r)] * scale[w][r];
      }
      row_max[r] = m, row_sum[r] = l;
    }
#pragma unroll
    for (int j = 0; j < kMergedTiles; ++j) {
      const float* tile = state + 32 * (4 + 4 * (warp + Config::kNWarps * j));
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < kKeySlabs; ++w) o += tile[w * kValues * 32 + 32 * e] * scale[w][e / 2];
        merged[j][e] = o;
      }
    }
  }

  // The combine kernel (launched as this grid's programmatic dependent) may start its launch now;
  // it waits for this whole grid's writes before it reads a partial.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  // Epilogue: this thread's rows over column tiles t_first + t_step j; one split writes o and lse
  // (with key sharing, the first warp's lanes write the lse of the rows all warps share), more
  // write fp32 partials.
  const auto epilogue = [&](const auto& o_tiles, int t_first, int t_step) {
    constexpr int kTiles = sizeof(o_tiles) / sizeof(o_tiles[0]);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float total_sum = row_sum[r];
      total_sum += __shfl_xor_sync(0xffffffffu, total_sum, 1);
      total_sum += __shfl_xor_sync(0xffffffffu, total_sum, 2);
      int i, g;
      divs.group.divmod(row0 + 16 * row_warp + group_id + 8 * r, i, g);
      if (i >= p.seqlen_q) continue;
      const int head = kv_head * group + g;
      const float inv = total_sum > 0.0f ? 1.0f / total_sum : 0.0f;
      const float lse = row_lse({row_max[r] * score_scale, total_sum});
      // (t_step 1: the row path, where each warp owns its rows; else key sharing, rows shared)
      const bool lse_writer = quad == 0 && (t_step == 1 || warp == 0);
      if (p.num_splits == 1) {
        T* o = static_cast<T*>(p.o) + int64_t(b) * p.o_batch_stride + int64_t(i) * p.o_row_stride +
               int64_t(head) * p.o_head_stride;
#pragma unroll
        for (int j = 0; j < kTiles; ++j) {
          const int col = 8 * (t_first + t_step * j) + 2 * quad;
          if (col < p.head_dim) {
            *reinterpret_cast<uint32_t*>(o + col) =
                ptx::pack2<T>(o_tiles[j][2 * r] * inv, o_tiles[j][2 * r + 1] * inv);
          }
        }
        if (p.lse != nullptr && lse_writer) {
          p.lse[int64_t(b) * p.lse_batch_stride + int64_t(head) * p.lse_head_stride + i] = lse;
        }
      } else {
        // partials: o (splits, B, Sq, H, D), lse (splits, B, H, Sq)
        const int64_t part = int64_t(split) * p.batch + b;
        float* o = o_part + ((part * p.seqlen_q + i) * p.heads + head) * p.head_dim;
#pragma unroll
        for (int j = 0; j < kTiles; ++j) {
          const int col = 8 * (t_first + t_step * j) + 2 * quad;
          if (col < p.head_dim) {
            *reinterpret_cast<float2*>(o + col) = make_float2(o_tiles[j][2 * r] * inv, o_tiles[j][2 * r + 1] * inv);
          }
        }
        if (lse_writer) lse_part[(part * p.heads + head) * p.seqlen_q + i] = lse;
      }
    }
  };
  if (share_keys) {
    epilogue(merged, warp, Config::kNWarps);
  } else {
    epilogue(acc_o, 0, 1);
  }
}

// o and lse from the splits' partials: lse = log Σ_s e^lse_s, o = Σ_s e^(lse_s − lse) o_s (a split
// that saw no key has lse −inf, weight 0), with online_softmax.h's rescale: a split is a row state
// (max lse_s, sum 1) in natural-log units (scale log2 e). A block per (batch, query, head) row;
// thread t owns columns 4 (t mod D/4) + [0, 4) of the splits ≡ t div (D/4) modulo the block's
// groups. Each thread loads its splits' lse and partials in one round (every load in flight at
// once) and merges them online against its own running max; the groups' (max, sum, o) meet in
// shared memory. (Weights first, then the partials, cost two dependent rounds of loads after the
// split grid; one thread walking every split in turn, a latency per split: 18 µs for 1 × 32K.)
constexpr int kCombineThreads = 128;

template <typename T>
__global__ void __launch_bounds__(kCombineThreads) flash_decode_combine(const FlashDecodeParams p, const float* o_part,
                                                                        const float* lse_part) {
  constexpr int kMaxGroups = kCombineThreads / 2;  // head dims ≥ 8: at least 2 column chunks of 4
  __shared__ float group_max[kMaxGroups], group_sum[kMaxGroups];
  __shared__ int group_nan[kMaxGroups];
  __shared__ float4 partial[kCombineThreads];
  const int head = int(blockIdx.x % unsigned(p.heads));
  const int i = int(blockIdx.x / unsigned(p.heads) % unsigned(p.seqlen_q));
  const int b = int(blockIdx.x / unsigned(p.heads) / unsigned(p.seqlen_q));
  const int64_t split_stride = int64_t(p.batch) * p.heads * p.seqlen_q;  // partial rows per split
  const int64_t row = (int64_t(b) * p.heads + head) * p.seqlen_q + i;      // lse_part's row index
  const int chunks = p.head_dim / 4, groups = kCombineThreads / chunks;
  const int c = int(threadIdx.x) % chunks, g = int(threadIdx.x) / chunks;

  float m = -INFINITY, l = 0.0f;
  bool nan = false;
  float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  // (the setup above runs under the split grid's tail; from here on its writes are read)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");  // the split grid's partials are all written
#endif
  if (g < groups) {
    // every split wrote its rows (zeros where it saw no key), so every load is issued
    const float4* o_s = reinterpret_cast<const float4*>(o_part + ((int64_t(b) * p.seqlen_q + i) * p.heads + head) *
                                                                     p.head_dim) + c;
    const int64_t o_split_stride = split_stride * chunks;  // in float4
    constexpr int kBatch = 8;  // loads in flight per round of the loop
    for (int s0 = g; s0 < p.num_splits; s0 += kBatch * groups) {
      float lse[kBatch];
      float4 x[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int s = s0 + k * groups;
        lse[k] = s < p.num_splits ? lse_part[row + s * split_stride] : -INFINITY;
        x[k] = s < p.num_splits ? o_s[s * o_split_stride] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        nan |= isnan(lse[k]);  // (the flag carries a NaN split: rescale_factor's fminf would drop it)
        if (lse[k] == -INFINITY) continue;  // no key, weight 0 (whatever its partial holds)
        const float m_new = fmaxf(m, lse[k]);
        const float keep = rescale_factor(m, m_new, kLog2e), w = rescale_factor(lse[k], m_new, kLog2e);
        l = l * keep + w;  // (merge_softmax_states of (m, l) and (lse_s, 1); m = −inf: keep 0)
        sum.x = sum.x * keep + w * x[k].x, sum.y = sum.y * keep + w * x[k].y;
        sum.z = sum.z * keep + w * x[k].z, sum.w = sum.w * keep + w * x[k].w;
        m = m_new;
      }
    }
  }
  partial[threadIdx.x] = sum;
  if (c == 0 && g < groups) group_max[g] = m, group_sum[g] = l, group_nan[g] = nan;
  __syncthreads();
  if (g > 0) return;
  float row_max = -INFINITY;
  for (int h = 0; h < groups; ++h) row_max = fmaxf(row_max, group_max[h]), nan |= group_nan[h] != 0;
  float total = 0.0f;
  sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if (row_max != -INFINITY) {
    for (int h = 0; h < groups; ++h) {
      const float scale = rescale_factor(group_max[h], row_max, kLog2e);  // (a group that saw no split: 0)
      const float4 x = partial[h * chunks + c];
      total += group_sum[h] * scale;
      sum.x += scale * x.x, sum.y += scale * x.y, sum.z += scale * x.z, sum.w += scale * x.w;
    }
  }
  // A NaN split makes the row NaN, as one split would; no split with a key gives 0 and −inf.
  const float inv = nan ? NAN : (total > 0.0f ? 1.0f / total : 0.0f);
  const Pack<T, 4> packed{{from_float<T>(sum.x * inv), from_float<T>(sum.y * inv), from_float<T>(sum.z * inv),
                           from_float<T>(sum.w * inv)}};
  T* o = static_cast<T*>(p.o) + int64_t(b) * p.o_batch_stride + int64_t(i) * p.o_row_stride +
         int64_t(head) * p.o_head_stride;
  store_pack<T, 4>(o, c, packed);
  // (the lse in natural log directly: row_lse's round trip through log2 units costs row_max an ulp)
  if (p.lse != nullptr && threadIdx.x == 0) {
    p.lse[int64_t(b) * p.lse_batch_stride + int64_t(head) * p.lse_head_stride + i] =
        nan ? NAN : (total > 0.0f ? row_max + logf(total) : -INFINITY);
  }
}

template <typename T>
__global__ void __launch_bounds__(256) kvcache_append_kernel(const FlashDecodeParams p, const KvAppendParams a) {
  const int chunks = p.head_dim / 8;
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= int64_t(p.batch) * p.seqlen_new * p.heads_kv * chunks) return;
  const int c = int(id % chunks), h = int((id / chunks) % p.heads_kv);
  const int t = int((id / chunks / p.heads_kv) % p.seqlen_new), b = int(id / chunks / p.heads_kv / p.seqlen_new);
  const int cached = max(p.cache_seqlens[b], 0);
  if (cached >= p.capacity - t) return;  // past the cache: dropped, never written outside it
  const int pos = cached + t;
  const int64_t src_k = int64_t(b) * a.k_batch_stride + int64_t(t) * a.k_row_stride + int64_t(h) * a.k_head_stride;
  const int64_t src_v = int64_t(b) * a.v_batch_stride + int64_t(t) * a.v_row_stride + int64_t(h) * a.v_head_stride;
  T* k = static_cast<T*>(p.k_cache) + cache_row(p, b, pos, p.k_page_stride, p.k_row_stride) + h * p.k_head_stride;
  T* v = static_cast<T*>(p.v_cache) + cache_row(p, b, pos, p.v_page_stride, p.v_row_stride) + h * p.v_head_stride;
  store_pack<T, 8>(k, c, load_pack<T, 8>(static_cast<const T*>(a.k) + src_k, c));
  store_pack<T, 8>(v, c, load_pack<T, 8>(static_cast<const T*>(a.v) + src_v, c));
}

template <typename T, typename Config>
cudaError_t launch_decode_config(const FlashDecodeParams& p, void* workspace, cudaStream_t stream) {
  auto kernel = flash_decode_kernel<T, Config>;
  FX_RETURN_IF_ERROR(allow_dynamic_smem(kernel, Config::kSmemBytes));
  const int group = p.heads / p.heads_kv;
  const int row_blocks = (group * p.seqlen_q + Config::kBlockM - 1) / Config::kBlockM;
  constexpr int kBlockN = Config::kBlockN;
  DecodeDivisors divs{FastDivmod(group), FastDivmod(row_blocks),
                      FastDivmod(p.block_table != nullptr ? p.page_size : 1)};
  divs.split_keys = ((p.capacity + p.num_splits - 1) / p.num_splits + kBlockN - 1) / kBlockN * kBlockN;
  float* o_part = static_cast<float*>(workspace);
  float* lse_part = o_part == nullptr ? nullptr
                                      : o_part + int64_t(p.num_splits) * p.batch * p.seqlen_q * p.heads * p.head_dim;
  const dim3 grid(unsigned(row_blocks * p.num_splits), unsigned(p.heads_kv), unsigned(p.batch));
  kernel<<<grid, Config::kThreads, Config::kSmemBytes, stream>>>(p, divs, o_part, lse_part);
  FX_RETURN_IF_ERROR(cudaGetLastError());
  if (p.num_splits > 1) {
    const int64_t rows = int64_t(p.batch) * p.seqlen_q * p.heads;  // ≤ 2^31 − 1: run_flash_decode checks
    // On sm_90+, a programmatic dependent launch: the combine's launch overlaps the split grid's
    // tail (its griddepcontrol.wait holds its reads until the split grid has finished).
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned(rows));
    config.blockDim = dim3(kCombineThreads);
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = current_device_major() >= 9 ? 1 : 0;
    return cudaLaunchKernelEx(&config, flash_decode_combine<T>, p, static_cast<const float*>(o_part),
                              static_cast<const float*>(lse_part));
  }
  return cudaGetLastError();
}

// Three stages where two such blocks fit an SM's shared memory (1 KiB of it reserved per block),
// as the split heuristic's two slots per SM assume; else two (A100, sm_86/89: 40-80 KiB).
template <typename T, int kHeadDim>
cudaError_t launch_decode(const FlashDecodeParams& p, void* workspace, cudaStream_t stream) {
  using Deep = DecodeConfig<kHeadDim>;
  if constexpr (Deep::kStages > 2) {
    const int smem_per_sm = p.max_smem_per_sm > 0 ? p.max_smem_per_sm : current_device_smem_per_sm();
    if (smem_per_sm < 2 * (Deep::kSmemBytes + 1024)) {
      return launch_decode_config<T, DecodeConfig<kHeadDim, 2>>(p, workspace, stream);
    }
  }
  return launch_decode_config<T, Deep>(p, workspace, stream);
}

bool decode_params_ok(const FlashDecodeParams& p) {
  return p.batch >= 0 && p.heads > 0 && p.heads_kv > 0 && p.heads % p.heads_kv == 0 && p.seqlen_q >= 0 &&
         p.seqlen_new >= 0 && p.capacity >= 0 && flash_fwd_kernel_head_dim(p.head_dim) != 0 &&
         p.cache_seqlens != nullptr && p.num_splits >= 1 && p.num_splits <= kMaxSplits &&
         (p.block_table == nullptr || (p.page_size > 0 && p.num_pages > 0));
}

}  // namespace
}  // namespace attention_detail

int flash_decode_num_splits(int batch, int heads, int heads_kv, int seqlen_q, int capacity, int head_dim,
                            int sm_count, bool paged) {
  using namespace attention_detail;
  if (batch <= 0 || heads <= 0 || heads_kv <= 0 || heads % heads_kv != 0 || seqlen_q <= 0 || capacity <= 0 ||
      sm_count <= 0) {
    return 1;
  }
  constexpr int kBlockM = DecodeConfig<128>::kBlockM;  // (every head dim's block has as many rows)
  const int64_t row_blocks = (int64_t(heads / heads_kv) * seqlen_q + kBlockM - 1) / kBlockM;
  const int64_t blocks = int64_t(batch) * heads_kv * row_blocks;
  const int64_t slots = 2 * int64_t(sm_count);  // about two blocks per SM (56-112 KiB of shared memory each)
  const int max_splits = int(std::clamp<int64_t>(capacity / 256, 1, kMaxSplits));  // splits of ≥ 256 keys
  const int64_t block_n = head_dim <= 128 ? DecodeConfig<128>::kBlockN : DecodeConfig<256>::kBlockN;
  // (two blocks per SM is D = 128's and 256's occupancy; D = 64's blocks would fit four)
  // The time of s splits: waves of blocks × what a block moves, in key tiles: the tiles of its
  // split, cut as the kernel cuts them (1 × 32K on 132 SMs: 29 splits take 18 tiles of 64 keys
  // each, 32 splits 16), and with s > 1 its fp32 partials written and read back by the combine
  // (rows × D × 4 bytes twice, against 4 · kBlockN · D bytes a tile: 2 · rows / kBlockN tiles).
  // Decode blocks (one m16 row tile, D ≤ 128: the three-stage kernels) over dense caches in a grid
  // of at most one per SM count at two blocks' rate: such a grid streams about as fast as one of two
  // blocks per SM with half the keys each. Over paged caches it does not, so they keep one block's
  // rate (docs/notes/decode.md, "Split count", has both measurements). The fewest splits
  // within 5 % of the cheapest: over many waves the model's last-wave rounding is finer than what
  // it predicts.
  const int64_t rows = std::min<int64_t>(kBlockM, int64_t(heads / heads_kv) * seqlen_q);
  const double partial_tiles = 2.0 * double(rows) / double(block_n);
  const bool lone_rate = !paged && rows <= 16 && head_dim <= 128;
  const auto cost = [&](int s) {
    const int64_t waves = (blocks * s + slots - 1) / slots, split_keys = (int64_t(capacity) + s - 1) / s;
    const double rate = lone_rate && blocks * s <= sm_count ? 2.0 : 1.0;
    return double(waves) * (double((split_keys + block_n - 1) / block_n) / rate + (s > 1 ? partial_tiles : 0.0));
  };
  double cheapest = cost(1);
  for (int s = 2; s <= max_splits; ++s) cheapest = std::min(cheapest, cost(s));
  for (int s = 1; s <= max_splits; ++s) {
    if (cost(s) <= 1.05 * cheapest) return s;
  }
  return 1;
}

size_t flash_decode_workspace_bytes(const FlashDecodeParams& p) {
  if (p.num_splits <= 1) return 0;
  const int64_t rows = int64_t(p.num_splits) * p.batch * p.seqlen_q * p.heads;
  return size_t(rows * p.head_dim + rows) * sizeof(float);
}

cudaError_t run_flash_decode(const FlashDecodeParams& p, void* workspace, cudaStream_t stream) {
  using namespace attention_detail;
  if (!decode_params_ok(p) || (p.num_splits > 1 && workspace == nullptr)) return cudaErrorInvalidValue;
  if (p.num_splits > 1 && int64_t(p.batch) * p.seqlen_q * p.heads > int64_t(INT32_MAX)) {
    return cudaErrorInvalidConfiguration;  // the combine's grid: a block per (batch, query, head) row
  }
  if (p.batch == 0 || p.seqlen_q == 0) return cudaSuccess;
  return with_16bit_type(p.dtype, cudaErrorInvalidValue, [&](auto type) {
    return with_kernel_head_dim(p.head_dim, cudaErrorInvalidValue, [&](auto dim) {
      return launch_decode<typename decltype(type)::type, decltype(dim)::value>(p, workspace, stream);
    });
  });
}

cudaError_t run_kvcache_append(const FlashDecodeParams& p, const KvAppendParams& a, cudaStream_t stream) {
  using namespace attention_detail;
  if (!decode_params_ok(p) || a.k == nullptr || a.v == nullptr) return cudaErrorInvalidValue;
  const int64_t threads = int64_t(p.batch) * p.seqlen_new * p.heads_kv * (p.head_dim / 8);
  if (threads == 0) return cudaSuccess;
  return with_16bit_type(p.dtype, cudaErrorInvalidValue, [&](auto type) {
    kvcache_append_kernel<typename decltype(type)::type><<<unsigned((threads + 255) / 256), 256, 0, stream>>>(p, a);
    return cudaGetLastError();
  });
}

}  // namespace flashext
