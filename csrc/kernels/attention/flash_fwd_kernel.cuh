// flashext FlashAttention-2 forward (sm_80+: mma.sync, ldmatrix, cp.async). Included by the
// flash_fwd_hdim*.cu files, one per compiled head dim (fp16 and bf16 each).
//
// Computes, per (query block, head, batch), with c = softmax_scale · log2 e:
//   S = Q Kᵀ                        (soft-capped: S = softcap · tanh(Q Kᵀ · scale / softcap), c = log2 e)
//   S = −inf where a key is masked  (past the sequence, causal diagonal, window edges)
//   per key block: m' = max(m, rowmax S),  P = 2^(S · c − m' · c) rounded to T (one FFMA),
//                  l = l · 2^((m − m') · c) + rowsum P,  acc_o = acc_o · 2^((m − m') · c) + P V
//   O = acc_o / l (0 for a row that sees no key),  lse = (m · c + log2 l) · ln 2
// l sums the same 16-bit P that P V multiplies (an mma against ones), so O's weights add up to 1
// as far as fp32 goes, whatever the rounding of P: with huge logits, where the folded exponent
// leaves the max's own P at 2^r (r: the fp32 residual of m · c), a one-hot row still returns its
// v exactly (docs/notes/attention.md, "The row sum and the exponent").
//
// Grid: (ceil(Sq / kBlockM), H, B), the last query block first. At D = 256, when every query block
// has the same work (no mask, no window, dense batch) and there are more tiles than fit at once,
// a 1-D grid of resident blocks walks the tiles instead (persistent blocks; see the kernel).
// Block: kNWarps = 4 warps. Warp w owns kMTiles m16 row tiles (rows 16 · kMTiles · w + [0, 16 ·
// kMTiles)), so a row's statistics live in one warp: each thread holds rows g and g + 8 of a row
// tile (g = lane / 4), and a row's 4 owners are one lane quad.
//
//   D     kBlockM × kBlockN  row tiles/warp  K/V buffers  shared memory        registers/thread
//   64    128 × 128          2               2            16 + 2·2·16 = 80 KiB  255 (+ 8 B spilled)
//   128   128 × 64           2               2            32 + 2·2·16 = 96 KiB  255 (+ 8 B spilled)
//   256    64 × 64           1               1            32 + 2·32   = 96 KiB  246
// Two blocks (8 warps) per SM at every head dim: 128 threads × 255 registers fit twice in 64K,
// and two blocks' shared memory fit in the SM's 228 KiB.
//
// Shared memory (dynamic, 16-bit elements): Q (kBlockM × kHeadDim), then kKVBuffers K tiles,
// then kKVBuffers V tiles (kBlockN × kHeadDim each). Rows are stored in 16-byte chunks with an
// XOR swizzle (chunk c of row r at c ^ (r % 8)), so the 8 row addresses of every ldmatrix hit 8
// different bank groups. O leaves through the Q tile (or, persistent, the V tile) so that the
// global stores are whole 16-byte chunks of a row.
//
// Constraints: kHeadDim ∈ {64, 128, 256}; the actual head_dim ≤ kHeadDim and a multiple of 8 (the
// rest of each row is zero-filled and never stored); rows 16-byte aligned; H % Hkv == 0.
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../common/device.h"
#include "../common/online_softmax.h"
#include "../common/ptx.cuh"
#include "flashext/attention.h"
#include "tiles.cuh"

namespace flashext {
namespace attention_detail {

// The configuration per compiled head dim: the tile shapes, the pipeline and its shared memory.
template <int kHeadDim_>
struct FlashFwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  // Four warps: 8 warps at D = 256 (128 KiB, one block per SM) lose to two 4-warp blocks per SM.
  static constexpr int kNWarps = 4;
  // Two m16 row tiles per warp share every K/V fragment read from shared memory (half the shared-
  // memory bytes per FLOP); one at D = 256, where the O accumulator alone is 128 registers.
  static constexpr int kMTiles = kHeadDim <= 128 ? 2 : 1;
  static constexpr int kThreads = 32 * kNWarps;
  static constexpr int kBlockM = 16 * kMTiles * kNWarps;
  // Keys per block: S and acc_o together hold 192 fp32 registers per thread at D ≤ 128 (128 keys
  // at D = 64, 64 at D = 128) and 160 at D = 256, where 64 keys beat 32.
  static constexpr int kBlockN = kHeadDim == 64 ? 128 : 64;
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  static constexpr int kTileQ = kBlockM * kHeadDim;  // elements
  static constexpr int kTileKV = kBlockN * kHeadDim;
  // Double-buffered K/V at D ≤ 128: the next key block's tiles load under this block's math.
  // Single-buffered at D = 256 so that two 96 KiB blocks share an SM: V loads under Q Kᵀ, and the
  // next K under the softmax and P V (issued right after Q Kᵀ, as FlashAttention-2 orders it).
  static constexpr bool kDoubleBuffer = kHeadDim <= 128;
  static constexpr int kKVBuffers = kDoubleBuffer ? 2 : 1;
  // Rescale acc_o on every key block at D ≥ 128 (the softmax and P V then form one basic block for
  // the scheduler); at D = 64 the warp vote that skips it when no row max moved is faster.
  static constexpr bool kRescaleAlways = kHeadDim >= 128;
  // The row sum l: at D ≤ 128 one mma per 16 keys of the 16-bit P against ones (the sum of exactly
  // the values P V multiplies, so the exponent may be the folded 2^(s·c − m·c)); at D = 256, where
  // those mmas cost 3.5–4%, an fp32 FADD per score of P = 2^((s − m)·c), exact at the max.
  static constexpr bool kFp32RowSum = kHeadDim == 256;
  static constexpr int kSmemBytes = (kTileQ + 2 * kKVBuffers * kTileKV) * 2;
  // Persistent blocks for uniform work at D = 256: a tile's last key block requests the next
  // tile's Q and first K, and its O is staged in the V buffer while they load.
  static constexpr bool kPersistent = !kDoubleBuffer;
  static_assert(!kPersistent || (!kDoubleBuffer && kTileKV >= kTileQ),
                "persistent blocks stage O in the single V buffer");
  static_assert(kChunks >= 8, "the XOR swizzle needs at least 8 chunks per row");
  static_assert(kThreads % kChunks == 0, "a thread copies one fixed chunk column");
  static_assert(kBlockN % (kThreads / kChunks) == 0 && kBlockM % (kThreads / kChunks) == 0,
                "load_tile copies whole passes of kThreads / kChunks rows");
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than one block may have (sm_90)");
};

// num_tiles = 0: one query block per block of a (query blocks, heads, batch) grid. num_tiles > 0
// (Config::kPersistent, uniform work only): a 1-D grid of resident blocks walks the num_tiles
// query blocks in turn, query block fastest, then head, then batch (so that the blocks running at
// once share K/V in L2).
//
// kSparse (block-sparse, never persistent): the key blocks come from this query block's list in
// p.sparse_blocks (block_sparse_plan) instead of [n_lo, n_hi), and a partly visible one looks
// p.block_mask up per element; the dense kernels' code is unchanged.
template <typename T, typename Config, bool kSparse = false>
__global__ void __launch_bounds__(Config::kThreads) flash_fwd_kernel(const FlashFwdParams p, const int num_tiles) {
  constexpr int kHeadDim = Config::kHeadDim, kBlockM = Config::kBlockM, kBlockN = Config::kBlockN;
  constexpr int kMTiles = Config::kMTiles;
  constexpr int kNTiles = kBlockN / 8;  // n8 tiles of S per row tile
  constexpr int kDTiles = kHeadDim / 8;  // n8 tiles of O per row tile
  constexpr bool kFp32Sum = Config::kFp32RowSum;
  extern __shared__ __align__(128) unsigned char smem_raw[];  // 128: see swizzled_chunk_addr
  T* smem_q = reinterpret_cast<T*>(smem_raw);
  T* smem_k = smem_q + Config::kTileQ;  // kKVBuffers buffers each
  T* smem_v = smem_k + Config::kKVBuffers * Config::kTileKV;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;
  const int m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;  // persistent: uniform, dense
  // (query block, head, batch) of a persistent tile.
  const auto tile_coords = [&](int tile, int& m_block, int& head, int& batch) {
    m_block = tile % m_blocks;
    head = (tile / m_blocks) % p.heads;
    batch = tile / m_blocks / p.heads;
  };
  // Without Config::kPersistent the loop below runs once and compiles away.
  const bool persistent = Config::kPersistent && num_tiles > 0;
  bool prefetched = false;  // this tile's Q and first K were requested by the tile before it
  for (int tile = persistent ? int(blockIdx.x) : 0; tile < (persistent ? num_tiles : 1);
       tile += persistent ? int(gridDim.x) : 1) {
    int m_block, head, batch;
    if (persistent) {
      tile_coords(tile, m_block, head, batch);
    } else {
      // The last query blocks first: under a causal mask they have the most key blocks to visit.
      m_block = gridDim.x - 1 - blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
    }
    const int kv_head = head / (p.heads / p.heads_kv);
    // The next tile's Q and first K go out during this tile's last key block (uniform tiles: the
    // same seqlens, and key block 0 first).
    const bool prefetch_next = persistent && tile + int(gridDim.x) < num_tiles;

    // This sequence's rows: dense batch or packed varlen.
    int seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k;
    int64_t q_offset = batch * p.q_batch_stride, k_offset = batch * p.k_batch_stride;
    int64_t v_offset = batch * p.v_batch_stride, o_offset = batch * p.o_batch_stride;
    int64_t lse_offset = batch * p.lse_batch_stride;
    if (p.cu_seqlens_q != nullptr) {
      const SequenceRows seq = sequence_rows(p, batch);  // (clamped into the packed tensors)
      const int64_t q_start = seq.q_start, k_start = seq.k_start;
      seqlen_q = seq.seqlen_q;
      seqlen_k = seq.seqlen_k;
      q_offset = q_start * p.q_row_stride;
      o_offset = q_start * p.o_row_stride;
      k_offset = k_start * p.k_row_stride;
      v_offset = k_start * p.v_row_stride;
      lse_offset = q_start;
    }
    const int m_start = m_block * kBlockM;
    if (m_start >= seqlen_q) continue;  // whole block past this sequence (uniform per block)

    const T* q = static_cast<const T*>(p.q) + q_offset + head * p.q_head_stride + int64_t(m_start) * p.q_row_stride;
    const T* k = static_cast<const T*>(p.k) + k_offset + kv_head * p.k_head_stride;
    const T* v = static_cast<const T*>(p.v) + v_offset + kv_head * p.v_head_stride;

    // Key blocks that can be visible to rows [m_start, m_start + kBlockM). Query row i sits at key
    // column i + diag: bottom-right (diag = Sk − Sq) or top-left (diag = 0).
    const int diag = p.align_top_left ? 0 : seqlen_k - seqlen_q;
    const int m_last = m_start + kBlockM - 1;
    int n_lo = 0, n_hi = seqlen_k;
    if (p.window_left >= 0) n_lo = max(0, m_start + diag - p.window_left) / kBlockN * kBlockN;
    if (p.window_right >= 0) n_hi = min(seqlen_k, m_last + diag + p.window_right + 1);
    // Block-sparse: the listed key blocks (a subset of [n_lo, n_hi)); entry and entry_next are this
    // and the next one's (key block · 2 + partial), the list read one block ahead of its use.
    const int* sparse = nullptr;
    int entry = 0, entry_next = 0;
    if constexpr (kSparse) {
      sparse = p.sparse_blocks + ((int64_t(batch) * p.heads + head) * m_blocks + m_block) * p.sparse_stride;
    }
    const int num_n_blocks = kSparse ? sparse[0] : n_hi > n_lo ? (n_hi - n_lo + kBlockN - 1) / kBlockN : 0;
    if constexpr (kSparse) {
      entry = num_n_blocks > 0 ? sparse[1] : 0;
      entry_next = num_n_blocks > 1 ? sparse[2] : 0;
    }
    const int n_first = kSparse ? (entry >> 1) * kBlockN : n_lo;

    const bool softcap_on = p.softcap > 0.0f;
    // Scores enter exp2 as s · score_scale − m · score_scale (one FFMA); s is the raw Q Kᵀ (or the
    // capped logit) and m the row max in the same units.
    const float score_scale = softcap_on ? kLog2e : p.softmax_scale * kLog2e;
    const float cap_scale = softcap_on ? p.softmax_scale / p.softcap : 0.0f;

    // Row tile i of this warp covers block rows 16 · (kMTiles · warp + i) + [0, 16); this thread
    // holds rows g and g + 8 of it (g = lane / 4), columns 2 · quad + {0, 1} of every n8 tile.
    // row_max in raw score units. row_sum is an mma accumulator, the 16-bit P times ones (so its
    // columns 0/1 hold row g's sum over all keys and 2/3 row g + 8's, already summed over the quad).
    float row_max[kMTiles][2], row_sum[kMTiles][4];
    float acc_o[kMTiles][kDTiles][4];
#pragma unroll
    for (int i = 0; i < kMTiles; ++i) {
      row_max[i][0] = row_max[i][1] = -INFINITY;
      row_sum[i][0] = row_sum[i][1] = row_sum[i][2] = row_sum[i][3] = 0.0f;
#pragma unroll
      for (int t = 0; t < kDTiles; ++t) acc_o[i][t][0] = acc_o[i][t][1] = acc_o[i][t][2] = acc_o[i][t][3] = 0.0f;
    }
    const int warp_row0 = 16 * kMTiles * warp;

    // The K or V tile of the key block starting at n into a shared buffer.
    const auto load_k = [&](T* dst, int n) {
      load_tile<Config, kBlockN>(dst, k + int64_t(n) * p.k_row_stride, p.k_row_stride, seqlen_k - n, p.head_dim);
    };
    const auto load_v = [&](T* dst, int n) {
      load_tile<Config, kBlockN>(dst, v + int64_t(n) * p.v_row_stride, p.v_row_stride, seqlen_k - n, p.head_dim);
    };

    // Prologue: Q and the first K in one cp.async group; double-buffered, the first V in a second,
    // so that the first Q Kᵀ waits only for the first group (single-buffered, V loads under Q Kᵀ).
    if (num_n_blocks > 0 && !prefetched) {
      load_tile<Config, kBlockM>(smem_q, q, p.q_row_stride, seqlen_q - m_start, p.head_dim);
      load_k(smem_k, n_first);
    }
    ptx::cp_async_commit();
    if (Config::kDoubleBuffer && num_n_blocks > 0) load_v(smem_v, n_first);
    ptx::cp_async_commit();

    // ldmatrix addresses: this lane's row of each fragment, at chunk 0 or 1 (swizzled_chunk_addr
    // reaches the other chunks). Q: rows warp_row0 + 16 · i + lane % 16; K: key rows 16 · jp + ...;
    // V (transposed): key rows 16 · kk + ..., head-dim chunks 2 · tp + lane / 16.
    constexpr uint32_t kRowBytes = 2 * kHeadDim;
    const uint32_t q_base = ptx::smem_addr(smem_q) + 2 * swizzled<kHeadDim>(warp_row0 + lane % 16, lane / 16);
    const uint32_t k_base0 =
        ptx::smem_addr(smem_k) + 2 * swizzled<kHeadDim>(lane % 8 + (lane / 16) * 8, (lane / 8) % 2);
    const uint32_t v_base0 =
        ptx::smem_addr(smem_v) + 2 * swizzled<kHeadDim>(lane % 8 + ((lane / 8) % 2) * 8, lane / 16);

    for (int it = 0; it < num_n_blocks; ++it) {
      // (the dense form's expressions stay as they were: the D <= 128 code is sensitive to them)
      const int n_start = kSparse ? (entry >> 1) * kBlockN : n_lo + it * kBlockN;
      const int n_next = kSparse ? (entry_next >> 1) * kBlockN : 0;
      const int buffer = Config::kDoubleBuffer ? it % 2 : 0;
      const uint32_t k_base = k_base0 + buffer * (2 * Config::kTileKV);
      const uint32_t v_base = v_base0 + buffer * (2 * Config::kTileKV);
      if (Config::kDoubleBuffer && it == 0) {
        ptx::cp_async_wait<1>();  // Q and the first K; the first V may still be in flight
      } else {
        ptx::cp_async_wait<0>();
      }
      __syncthreads();  // this block's K (and V) is in shared memory; what the last block read is free
      if constexpr (Config::kDoubleBuffer) {
        if (it + 1 < num_n_blocks) {  // prefetch the next K and V tiles while this one is computed
          const int other = (it + 1) % 2;
          load_k(smem_k + other * Config::kTileKV, kSparse ? n_next : n_start + kBlockN);
          load_v(smem_v + other * Config::kTileKV, kSparse ? n_next : n_start + kBlockN);
        }
      } else {  // this block's V loads while Q Kᵀ runs
        load_v(smem_v, n_start);
      }
      ptx::cp_async_commit();
      int entry_after = 0;  // the list entry after next, read now, used an iteration later
      if constexpr (kSparse) entry_after = it + 2 < num_n_blocks ? sparse[it + 3] : 0;

      // S = Q Kᵀ for this warp's kMTiles × 16 rows × kBlockN columns.
      float s[kMTiles][kNTiles][4];
#pragma unroll
      for (int i = 0; i < kMTiles; ++i)
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) s[i][j][0] = s[i][j][1] = s[i][j][2] = s[i][j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        uint32_t q_frag[kMTiles][4];
#pragma unroll
        for (int i = 0; i < kMTiles; ++i) {
          ptx::ldmatrix_x4(q_frag[i], swizzled_chunk_addr(q_base, 2 * kk) + 16 * i * kRowBytes);
        }
#pragma unroll
        for (int jp = 0; jp < kNTiles / 2; ++jp) {
          uint32_t k_frag[4];
          ptx::ldmatrix_x4(k_frag, swizzled_chunk_addr(k_base, 2 * kk) + 16 * jp * kRowBytes);
#pragma unroll
          for (int i = 0; i < kMTiles; ++i) {
            ptx::mma_16816<T>(s[i][2 * jp], q_frag[i], k_frag[0], k_frag[1]);
            ptx::mma_16816<T>(s[i][2 * jp + 1], q_frag[i], k_frag[2], k_frag[3]);
          }
        }
      }

      // Single-buffered, after Q Kᵀ: wait for this block's V; every warp is then done with K (and
      // Q), so the next K, or in the last key block the next persistent tile's Q and first K, loads
      // under the softmax and P V. (A lambda, built at every head dim: written inline, it changes
      // the D ≤ 128 machine code, and D = 128 spills.)
      const auto wait_v_load_next_k = [&] {
        ptx::cp_async_wait<0>();
        __syncthreads();  // V is in shared memory; every warp is done with K (and Q)
        if (it + 1 < num_n_blocks) {
          if constexpr (kSparse) {
            load_k(smem_k, n_next);
          } else {
            load_k(smem_k, n_start + kBlockN);
          }
        } else if (prefetch_next) {
          int next_m, next_head, next_batch;
          tile_coords(tile + int(gridDim.x), next_m, next_head, next_batch);
          const int next_start = next_m * kBlockM;
          load_tile<Config, kBlockM>(smem_q,
                                     static_cast<const T*>(p.q) + next_batch * p.q_batch_stride +
                                         next_head * p.q_head_stride + int64_t(next_start) * p.q_row_stride,
                                     p.q_row_stride, p.seqlen_q - next_start, p.head_dim);
          load_tile<Config, kBlockN>(smem_k,
                                     static_cast<const T*>(p.k) + next_batch * p.k_batch_stride +
                                         (next_head / (p.heads / p.heads_kv)) * p.k_head_stride,
                                     p.k_row_stride, p.seqlen_k, p.head_dim);
        }
        ptx::cp_async_commit();
      };
      if constexpr (!Config::kDoubleBuffer) wait_v_load_next_k();

      // Soft-cap (rare: a uniform branch), then the mask, only on blocks that cross a boundary.
      if (softcap_on) {
#pragma unroll
        for (int i = 0; i < kMTiles; ++i)
#pragma unroll
          for (int j = 0; j < kNTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[i][j][e] = p.softcap * tanhf(s[i][j][e] * cap_scale);
      }
      const bool full_block = n_start + kBlockN <= seqlen_k &&
                              (p.window_right < 0 || n_start + kBlockN - 1 <= m_start + diag + p.window_right) &&
                              (p.window_left < 0 || n_start >= m_last + diag - p.window_left);
      if (!full_block) {
        // Per row, the visible columns are [left, right) (bottom-right or top-left aligned through
        // diag; the glue turns windows of Sq + Sk or more into -1, so none of this overflows).
        // Taken relative to this thread's first column, each element is one compare against a
        // constant per bound after unrolling.
        // Without a left window edge (causal, or the sequence end) the left test is compiled out.
        const int col0 = n_start + 2 * quad;
        const auto mask = [&](auto with_left) {
          constexpr bool kWithLeft = decltype(with_left)::value;
#pragma unroll
          for (int i = 0; i < kMTiles; ++i) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const int row = m_start + warp_row0 + 16 * i + group + 8 * r;
              const int right =
                  (p.window_right < 0 ? seqlen_k : min(seqlen_k, row + diag + p.window_right + 1)) - col0;
              const int left = row + diag - p.window_left - col0;
#pragma unroll
              for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                  if (8 * j + e >= right || (kWithLeft && 8 * j + e < left)) s[i][j][2 * r + e] = -INFINITY;
                }
              }
            }
          }
        };
        if (p.window_left < 0) {
          mask(std::false_type{});
        } else {
          mask(std::true_type{});
        }
      }
      if constexpr (kSparse) {
        if (entry & 1) {  // partly visible through block_mask: each element's (row, column) block
          // A bit per column of this thread (2 · kNTiles ≤ 32) for each of its rows, built column
          // by column (one division per column), then applied. Rows and columns past the sequence
          // are masked already: clamped, so that no lookup leaves the mask.
          const uint8_t* mask_bh = p.block_mask + batch * p.mask_batch_stride + head * p.mask_head_stride;
          static_assert(2 * kNTiles <= 32, "a 32-bit mask per row");
          const uint8_t* mask_row[kMTiles][2];
          uint32_t visible[kMTiles][2];
#pragma unroll
          for (int i = 0; i < kMTiles; ++i)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const int row = min(m_start + warp_row0 + 16 * i + group + 8 * r, seqlen_q - 1);
              mask_row[i][r] = mask_bh + int64_t(row / p.block_rows) * p.mask_row_stride;
              visible[i][r] = 0u;
            }
#pragma unroll
          for (int c = 0; c < 2 * kNTiles; ++c) {
            const int col_block = min(n_start + 8 * (c / 2) + 2 * quad + c % 2, seqlen_k - 1) / p.block_cols;
#pragma unroll
            for (int i = 0; i < kMTiles; ++i)
#pragma unroll
              for (int r = 0; r < 2; ++r) visible[i][r] |= uint32_t(mask_row[i][r][col_block] != 0) << c;
          }
#pragma unroll
          for (int i = 0; i < kMTiles; ++i)
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
              for (int c = 0; c < 2 * kNTiles; ++c) {
                if (!((visible[i][r] >> c) & 1u)) s[i][c / 2][2 * r + c % 2] = -INFINITY;
              }
        }
      }

      // Online softmax per row: new max (the row's 4 owners are one lane quad), P = 2^(s·c − m·c),
      // rescale what was accumulated under the old max. P is packed to 16 bits at once (half the
      // registers of the fp32 S): p16[i][j][r] holds row g + 8 · r, columns 2 · quad + {0, 1}.
      // (kFp32RowSum: P = 2^((s − m)·c) stays in s, summed in fp32, packed only for P V.)
      uint32_t p16[kMTiles][kNTiles][2];
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
        float row_alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          // One dependent chain per row for the max and the sum: partial chains plus a tree were
          // no faster.
          float tile_max = -INFINITY;
#pragma unroll
          for (int j = 0; j < kNTiles; ++j) tile_max = fmaxf(tile_max, fmaxf(s[i][j][2 * r], s[i][j][2 * r + 1]));
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
          const float new_max = fmaxf(row_max[i][r], tile_max);
          const float alpha = rescale_factor(row_max[i][r], new_max, score_scale);  // 2^((m_old − m_new)·c), 0 if empty
          if constexpr (kFp32Sum) {  // P stays fp32 in s (packed for P V), l gets this thread's partial sum
            const float raw_base = safe_row_max(new_max);
            float tile_sum = 0.0f;
#pragma unroll
            for (int j = 0; j < kNTiles; ++j) {
#pragma unroll
              for (int e = 2 * r; e < 2 * r + 2; ++e) {
                s[i][j][e] = ptx::exp2_approx((s[i][j][e] - raw_base) * score_scale);  // −inf → 0
                tile_sum += s[i][j][e];
              }
            }
            row_sum[i][2 * r] = row_sum[i][2 * r] * alpha + tile_sum;
          } else {
            const float base = safe_row_max(new_max) * score_scale;
#pragma unroll
            for (int j = 0; j < kNTiles; ++j) {
              p16[i][j][r] = ptx::pack2<T>(ptx::exp2_approx(fmaf(s[i][j][2 * r], score_scale, -base)),  // −inf → 0
                                           ptx::exp2_approx(fmaf(s[i][j][2 * r + 1], score_scale, -base)));
            }
          }
          row_max[i][r] = new_max;
          row_alpha[r] = alpha;
        }
        // acc_o · 2^(m − m'). Once the row maxima settle most key blocks leave them unchanged, so
        // unless kRescaleAlways the warp skips it when none of its rows moved (a uniform branch).
        if (Config::kRescaleAlways || __any_sync(0xffffffffu, row_alpha[0] != 1.0f || row_alpha[1] != 1.0f)) {
          if constexpr (!kFp32Sum) {  // (the fp32 sum was rescaled above)
            row_sum[i][0] *= row_alpha[0];
            row_sum[i][1] *= row_alpha[0];
            row_sum[i][2] *= row_alpha[1];
            row_sum[i][3] *= row_alpha[1];
          }
#pragma unroll
          for (int t = 0; t < kDTiles; ++t) {
            acc_o[i][t][0] *= row_alpha[0];
            acc_o[i][t][1] *= row_alpha[0];
            acc_o[i][t][2] *= row_alpha[1];
            acc_o[i][t][3] *= row_alpha[1];
          }
        }
        // l += rowsum P on the tensor cores: one mma per 16 keys instead of an FADD per score, and
        // the sum of exactly the values P V multiplies.
        if constexpr (!kFp32Sum) {
#pragma unroll
          for (int kk = 0; kk < kBlockN / 16; ++kk) {
            const uint32_t p_frag[4] = {p16[i][2 * kk][0], p16[i][2 * kk][1],  //
                                        p16[i][2 * kk + 1][0], p16[i][2 * kk + 1][1]};
            ptx::mma_16816<T>(row_sum[i], p_frag, ptx::ones2<T>(), ptx::ones2<T>());
          }
        }
      }

      // Double-buffered: the first block's V has a cp.async group of its own, waited for only now;
      // every later block's V arrived with its K.
      if constexpr (Config::kDoubleBuffer) {
        if (it == 0) {
          ptx::cp_async_wait<1>();  // only the prefetch of the second key block may be pending
          __syncthreads();
        }
      }

      // O += P V: P's accumulator layout is already the A-fragment layout (two n8 tiles = one k16).
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t p_frag[kMTiles][4];
#pragma unroll
        for (int i = 0; i < kMTiles; ++i) {
          if constexpr (kFp32Sum) {
            p_frag[i][0] = ptx::pack2<T>(s[i][2 * kk][0], s[i][2 * kk][1]);
            p_frag[i][1] = ptx::pack2<T>(s[i][2 * kk][2], s[i][2 * kk][3]);
            p_frag[i][2] = ptx::pack2<T>(s[i][2 * kk + 1][0], s[i][2 * kk + 1][1]);
            p_frag[i][3] = ptx::pack2<T>(s[i][2 * kk + 1][2], s[i][2 * kk + 1][3]);
          } else {
            p_frag[i][0] = p16[i][2 * kk][0];
            p_frag[i][1] = p16[i][2 * kk][1];
            p_frag[i][2] = p16[i][2 * kk + 1][0];
            p_frag[i][3] = p16[i][2 * kk + 1][1];
          }
        }
#pragma unroll
        for (int tp = 0; tp < kDTiles / 2; ++tp) {
          uint32_t v_frag[4];
          ptx::ldmatrix_x4_trans(v_frag, swizzled_chunk_addr(v_base, 2 * tp) + 16 * kk * kRowBytes);
#pragma unroll
          for (int i = 0; i < kMTiles; ++i) {
            ptx::mma_16816<T>(acc_o[i][2 * tp], p_frag[i], v_frag[0], v_frag[1]);
            ptx::mma_16816<T>(acc_o[i][2 * tp + 1], p_frag[i], v_frag[2], v_frag[3]);
          }
        }
      }
      if constexpr (kSparse) {
        entry = entry_next;
        entry_next = entry_after;
      }
    }

    // Epilogue: O = acc_o / l (0 for a row that saw no key), lse = (m + log2 l) · ln 2. O goes
    // through shared memory (the Q tile's space, each warp reusing only its own rows; the V tile's
    // once every warp is done with it, while the next tile's Q loads) so that the global stores are
    // whole 16-byte chunks of a row.
    T* const smem_o = prefetch_next ? smem_v : smem_q;
    if (prefetch_next) {
      __syncthreads();  // every warp is done with V; the next tile's Q and K stay in flight
    } else {
      ptx::cp_async_wait<0>();
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kMTiles; ++i) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float total = row_sum[i][2 * r];
        if constexpr (kFp32Sum) {  // the row's four owners' partial sums
          total += __shfl_xor_sync(0xffffffffu, total, 1);
          total += __shfl_xor_sync(0xffffffffu, total, 2);
        }
        const float inv = total > 0.0f ? 1.0f / total : 0.0f;
        const int tile_row = warp_row0 + 16 * i + group + 8 * r;
#pragma unroll
        for (int t = 0; t < kDTiles; ++t) {
          *reinterpret_cast<uint32_t*>(smem_o + swizzled<kHeadDim>(tile_row, t) + 2 * quad) =
              ptx::pack2<T>(acc_o[i][t][2 * r] * inv, acc_o[i][t][2 * r + 1] * inv);
        }
        const int row = m_start + tile_row;
        if (p.lse != nullptr && quad == 0 && row < seqlen_q) {
          p.lse[lse_offset + int64_t(head) * p.lse_head_stride + row] = row_lse({row_max[i][r] * score_scale, total});
        }
      }
    }
    __syncwarp();
    T* o = static_cast<T*>(p.o) + o_offset + head * p.o_head_stride;
    constexpr int kWarpRows = 16 * kMTiles, kChunks = Config::kChunks;
#pragma unroll
    for (int id = lane; id < kWarpRows * kChunks; id += 32) {
      const int tile_row = warp_row0 + id / kChunks, chunk = id % kChunks;
      const int row = m_start + tile_row;
      if (row < seqlen_q && chunk * 8 < p.head_dim) {
        const uint4 value = *reinterpret_cast<const uint4*>(smem_o + swizzled<kHeadDim>(tile_row, chunk));
        *reinterpret_cast<uint4*>(o + int64_t(row) * p.o_row_stride + chunk * 8) = value;
      }
    }
    prefetched = prefetch_next;
  }  // tiles
}

template <typename T, int kHeadDim>
cudaError_t launch_flash_fwd(const FlashFwdParams& p, cudaStream_t stream) {
  using Config = FlashFwdConfig<kHeadDim>;
  auto kernel = flash_fwd_kernel<T, Config>;
  FX_RETURN_IF_ERROR(allow_dynamic_smem(kernel, Config::kSmemBytes));
  const int m_blocks = (p.seqlen_q + Config::kBlockM - 1) / Config::kBlockM;
  if (Config::kPersistent && p.window_left < 0 && p.window_right < 0 && p.cu_seqlens_q == nullptr && p.seqlen_k > 0) {
    // Every query block has the same work: persistent blocks, if there are more tiles than fit.
    // How many fit is this kernel's occupancy on the device, queried once per device.
    static PerDeviceValue blocks_per_sm;
    const int per_sm = blocks_per_sm.get([&](int) {
      int blocks = 0;
      const cudaError_t err =
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, Config::kThreads, Config::kSmemBytes);
      return err == cudaSuccess ? blocks : 0;
    });
    const int64_t resident = int64_t(per_sm) * current_device_sm_count();
    const int64_t tiles = int64_t(m_blocks) * p.heads * p.batch;
    if (resident > 0 && tiles > resident && tiles <= INT32_MAX - resident) {
      kernel<<<unsigned(resident), Config::kThreads, Config::kSmemBytes, stream>>>(p, int(tiles));
      return cudaGetLastError();
    }
  }
  const dim3 grid(m_blocks, p.heads, p.batch);
  kernel<<<grid, Config::kThreads, Config::kSmemBytes, stream>>>(p, 0);
  return cudaGetLastError();
}

// Block-sparse plan: per (batch, head, query block of kBlockM rows), the key blocks of kBlockN in
// the kernel's [n_lo, n_hi) (causal and windows as flash_fwd_kernel bounds them) that a set
// (row, column) block of block_mask touches: the count, then key_block · 2 + partial, partial
// when some block under it is not set, ascending. One warp per query block, a lane per key block
// (32 at a time, compacted by ballot).
template <int kBlockM, int kBlockN>
__global__ void __launch_bounds__(32) block_sparse_plan(const FlashFwdParams p) {
  const int m_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z, lane = threadIdx.x;
  int* list = const_cast<int*>(p.sparse_blocks) +
              ((int64_t(batch) * p.heads + head) * gridDim.x + m_block) * p.sparse_stride;
  const int m_start = m_block * kBlockM, m_last = m_start + kBlockM - 1;
  const int diag = p.align_top_left ? 0 : p.seqlen_k - p.seqlen_q;
  int n_lo = 0, n_hi = p.seqlen_k;
  if (p.window_left >= 0) n_lo = max(0, m_start + diag - p.window_left) / kBlockN * kBlockN;
  if (p.window_right >= 0) n_hi = min(p.seqlen_k, m_last + diag + p.window_right + 1);
  const uint8_t* mask = p.block_mask + batch * p.mask_batch_stride + head * p.mask_head_stride;
  const int r0 = m_start / p.block_rows, r1 = min(m_last, p.seqlen_q - 1) / p.block_rows;
  const int first = n_lo / kBlockN, last = n_hi > n_lo ? (n_hi - 1) / kBlockN : first - 1;
  int count = 0;
  for (int base = first; base <= last; base += 32) {
    const int block = base + lane;
    bool any = false, all = true;
    if (block <= last) {
      const int n = block * kBlockN;
      const int c0 = n / p.block_cols, c1 = (min(n + kBlockN, p.seqlen_k) - 1) / p.block_cols;
      for (int r = r0; r <= r1; ++r) {
        const uint8_t* row = mask + int64_t(r) * p.mask_row_stride;
        for (int c = c0; c <= c1; ++c) {
          const bool set = row[c] != 0;
          any = any || set;
          all = all && set;
        }
      }
    }
    const unsigned listed = __ballot_sync(0xffffffffu, any);
    if (any) list[1 + count + __popc(listed & ((1u << lane) - 1u))] = block * 2 + (all ? 0 : 1);
    count += __popc(listed);
  }
  if (lane == 0) list[0] = count;
}

// Ints per query block's list (a count, then at most every key block) at this head dim's tiles,
// and of all the lists.
template <int kHeadDim>
int sparse_plan_stride(const FlashFwdParams& p) {
  return 1 + (p.seqlen_k + FlashFwdConfig<kHeadDim>::kBlockN - 1) / FlashFwdConfig<kHeadDim>::kBlockN;
}

template <int kHeadDim>
int64_t sparse_plan_ints(const FlashFwdParams& p) {
  using Config = FlashFwdConfig<kHeadDim>;
  return int64_t(p.batch) * p.heads * ((p.seqlen_q + Config::kBlockM - 1) / Config::kBlockM) *
         sparse_plan_stride<kHeadDim>(p);
}

template <typename T, int kHeadDim>
cudaError_t launch_flash_fwd_sparse(const FlashFwdParams& params, void* workspace, cudaStream_t stream) {
  using Config = FlashFwdConfig<kHeadDim>;
  FlashFwdParams p = params;
  p.sparse_stride = sparse_plan_stride<kHeadDim>(p);
  p.sparse_blocks = static_cast<const int*>(workspace);
  const dim3 grid((p.seqlen_q + Config::kBlockM - 1) / Config::kBlockM, p.heads, p.batch);
  block_sparse_plan<Config::kBlockM, Config::kBlockN><<<grid, 32, 0, stream>>>(p);
  FX_RETURN_IF_ERROR(cudaGetLastError());
  auto kernel = flash_fwd_kernel<T, Config, true>;
  FX_RETURN_IF_ERROR(allow_dynamic_smem(kernel, Config::kSmemBytes));
  kernel<<<grid, Config::kThreads, Config::kSmemBytes, stream>>>(p, 0);  // never persistent
  return cudaGetLastError();
}

}  // namespace attention_detail
}  // namespace flashext
