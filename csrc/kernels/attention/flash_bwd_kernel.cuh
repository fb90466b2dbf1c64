// flashext FlashAttention-2 backward (sm_80+: mma.sync, ldmatrix, cp.async). Included by the
// flash_bwd_hdim*.cu files, one per compiled head dim (fp16 and bf16 each).
//
// With P = softmax of the forward (recomputed from Q, K and the saved lse), per query row i:
//   dV = Pᵀ dO,   dP = dO Vᵀ,   dS = P ∘ (dP − D),  D_i = Σ_d dO_id O_id,
//   dK = dSᵀ Q · scale,   dQ = dS K · scale        (scale: softmax_scale; soft-capped scores add
//                                                  the factor 1 − tanh² per score)
// Three kernels: flash_bwd_preprocess writes D and lse · log2 e (+inf for a row that saw no key,
// so its P is 0) into the workspace; flash_bwd_kernel keeps dK and dV of one key block in registers
// while the visible query blocks of every query head of the KV head's group stream past, and adds
// each block's dQ into an fp32 buffer (atomics, into tiles laid out as the warps hold them:
// bwd_accum_bytes); flash_bwd_convert_dq scales that buffer into dq.
//
// Main kernel. Grid: (key blocks, KV heads, batch); block: 8 warps. Everything is computed
// transposed, keys as rows: Sᵀ = K Qᵀ and dPᵀ = V dOᵀ, then dV += Pᵀ dO and dK += dSᵀ Q with Pᵀ
// and dSᵀ (16-bit, rows = keys) read back from shared memory as A operands, and dQ = dS K with
// dSᵀ read transposed by ldmatrix.trans. Each GEMM phase has its own warp grid (FlashBwdConfig),
// so a warp's tile is at least 16 × 32 and every fragment it loads feeds two or more MMAs.
//
//   D     keys × queries  Sᵀ warp tile  dK/dV warp tile  dQ warp tile  shared memory
//   64    128 × 128       32 × 64       32 × 32          32 × 32       K, V 2·16 + Q, dO 2·2·16 + Pᵀ, dSᵀ 2·32 = 162 KiB
//   128   128 × 64        32 × 32       32 × 64          32 × 32       K, V 2·32 + Q, dO 2·2·16 + Pᵀ, dSᵀ 2·16 = 161 KiB
//   256    64 × 128       32 × 32       32 × 64          32 × 128      K, V 2·32 + Q, dO 2·64 + Pᵀ, dSᵀ 2·16 = 226 KiB
// Q, dO and the rows' (lse, D) are double-buffered, the next query block loading under this one,
// except Q and dO at D = 256 (they load under the dQ GEMM), whose dQ runs in two passes of 64
// columns (64 accumulator registers each).
// GPUs with less shared memory per block get the compact tiles (FlashBwdConfig): D = 64 128 × 64
// (97 KiB), D = 128 64 × 64 (81 KiB), D = 256 64 × 64 (145 KiB); Q, dO single-buffered at D ≥ 128.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../common/device.h"
#include "../common/online_softmax.h"
#include "../common/ptx.cuh"
#include "../common/vec.cuh"
#include "flashext/attention.h"
#include "tiles.cuh"

namespace flashext {
namespace attention_detail {

// kCompact: the tiles for GPUs with less shared memory per block than Hopper's 227 KiB (A100 163,
// sm_86/89 99): 64 queries per step at D = 64, 64 keys at D = 128, and Q, dO single-buffered at
// D ≥ 128 (the next query block then loads under the dQ GEMM only).
//
// Each of the three GEMM phases has its own warp grid, FlashAttention-2's, so that every warp owns a
// tile at least 16 × 32 and each fragment it loads feeds two or more MMAs: Sᵀ, dPᵀ (keys × queries)
// 4 × 2 warps (2 × 4 for D = 256's 64 × 128); dK, dV (keys × head dim) kBlockN / 32 × the rest, 32 keys per warp; dQ (queries ×
// head dim) kBlockM / 32 × the rest, 32 queries per warp. A warp then reads about a fifth fewer
// shared-memory bytes per step than with one 16-key slab per warp, at the cost of Pᵀ going through
// shared memory beside dSᵀ.
template <int kHeadDim_, bool kCompact_ = false>
struct FlashBwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kCompact = kCompact_;
  static constexpr int kNWarps = 8;
  static constexpr int kThreads = 32 * kNWarps;
  static constexpr int kBlockN = kHeadDim <= 64 || (kHeadDim <= 128 && !kCompact) ? 128 : 64;  // keys per block
  static constexpr int kBlockM = (kHeadDim == 64 || kHeadDim == 256) && !kCompact ? 128 : 64;  // queries per step
  static constexpr int kSKeyWarps = kBlockN == 64 && kBlockM == 128 ? 2 : 4;  // Sᵀ, dPᵀ: warps along keys
  static constexpr int kSKeyTiles = kBlockN / 16 / kSKeyWarps;      //   m16 key tiles per warp
  static constexpr int kQCols = kBlockM / (kNWarps / kSKeyWarps);   //   queries per warp
  static constexpr int kKVKeyTiles = 2;                             // dK, dV: 32 keys per warp
  static constexpr int kKVKeyWarps = kBlockN / 16 / kKVKeyTiles;    //   warps along keys
  static constexpr int kDCols = kHeadDim / (kNWarps / kKVKeyWarps); //   head-dim columns per warp
  static constexpr int kDqRowWarps = kBlockM / 32;                 // dQ: warps along queries
  static constexpr int kDqRowTiles = kBlockM / 16 / kDqRowWarps;    //   m16 query tiles per warp
  static constexpr int kDqCols = kHeadDim / (kNWarps / kDqRowWarps);  //   head-dim columns per warp
  static constexpr int kDqPasses = kDqRowTiles * kDqCols > 128 ? 2 : 1;  //   in passes of at most 64 registers
  static_assert(kDqRowTiles * kDqCols / kDqPasses <= 128 && kDqCols / kDqPasses % 16 == 0, "dQ passes");
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr int kTileKV = kBlockN * kHeadDim;
  static constexpr int kTileQ = kBlockM * kHeadDim;
  static constexpr int kTileS = kBlockN * kBlockM;  // Pᵀ or dSᵀ, rows = keys
  static constexpr int kTileDq = kBlockM * kHeadDim;  // one dQ accumulator tile (fp32)
  static constexpr int kDqWarpFloats = 16 * kDqRowTiles * kDqCols;  //   a dQ warp's part of it
  // Q and dO tiles each: single-buffered where two would not fit (D = 256's 128-query tiles, the
  // compact tiles above D = 64).
  static constexpr int kQBuffers = kHeadDim == 256 || (kCompact && kHeadDim > 64) ? 1 : 2;
  static constexpr int kSmemBytes = (2 * kTileKV + 2 * kQBuffers * kTileQ + 2 * kTileS) * 2 + 2 * 2 * kBlockM * 4;
  static_assert(kSKeyTiles >= 1 && kNWarps % kKVKeyWarps == 0 && kBlockM % (16 * kDqRowWarps) == 0, "warp grids");
  static_assert(kBlockM % 64 == 0, "Pᵀ, dSᵀ rows are whole 128-byte multiples, the swizzle's unit");
  static_assert(kQCols % 16 == 0 && kDCols % 16 == 0 && kDqCols % 16 == 0, "whole k16 steps and n8 pairs");
  static_assert(kThreads >= 2 * kBlockM, "one thread per row statistic");
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than one block may have (sm_90)");
};

// Workspace layout: D and lse · log2 e (fp32) per (head, row): dense [b][h][row] with rows padded
// to a multiple of 4, varlen [h][row of the packed q]; the dQ accumulator tiles (below); then the
// deterministic mode's counters, int32 [b][h][query block].
struct BwdWorkspace {
  float* dsum;
  float* lse2;
  float* dq_accum;
  int* dq_counters;  // deterministic: per (batch, head, query block), the key blocks added so far
  int64_t stats_head_stride;   // between heads
  int64_t stats_batch_stride;  // dense: between batch entries (varlen: 0)
  int64_t dq_accum_floats;     // the accumulator's size, which the preprocess zeroes
};

inline int64_t bwd_rows(const FlashBwdParams& p) {
  return p.cu_seqlens_q != nullptr ? p.total_q : int64_t(p.batch) * p.seqlen_q;
}

// Bytes of each of the two statistics arrays (256-byte multiples), and their strides.
struct BwdStatsLayout {
  int64_t bytes, head_stride, batch_stride;
};

inline BwdStatsLayout bwd_stats_layout(const FlashBwdParams& p) {
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t rows = bwd_rows(p);
  const int64_t row_pad = varlen ? rows : (int64_t(p.seqlen_q) + 3) / 4 * 4;
  const int64_t count = varlen ? int64_t(p.heads) * rows : int64_t(p.batch) * p.heads * row_pad;
  return {(count * 4 + 255) / 256 * 256, row_pad, varlen ? 0 : int64_t(p.heads) * row_pad};
}

// The dQ accumulator (fp32) is tiles, not rows: one kBlockM × kHeadDim tile per (query block of a
// sequence, head), ordered [tile row][head], and inside a tile each dQ warp's 16 · kDqRowTiles ×
// kDqCols part in the order its threads hold the mma fragments: four floats per thread per (m16
// tile, row half, n8 pair), lane-major. One red.global.add.v4.f32 of a warp then covers 512
// contiguous bytes (four whole lines) where row-major adds touched 8 rows of 32 bytes each; those
// 8 requests per instruction filled the load-store queue (Nsight's lg_throttle, 18 % of the D = 256
// kernel's stall samples). A dense batch entry's tiles start at b · ⌈Sq / kBlockM⌉, a varlen
// sequence's at ⌊(q_start + b · kBlockM) / kBlockM⌋, which keeps the tiles of non-decreasing
// cu_seqlens' sequences apart, and any offsets' inside total_q / kBlockM + B + 1 tile rows (as
// FlashAttention-2's total_q + 128 · B rows: many short sequences pad each to a tile). Rows past a
// sequence and columns past head_dim are added (zeros) and never read.
inline int64_t bwd_dq_tile_rows(const FlashBwdParams& p, int block_m) {
  return p.cu_seqlens_q != nullptr ? p.total_q / block_m + p.batch + 1
                                   : int64_t(p.batch) * ((p.seqlen_q + block_m - 1) / block_m);
}

template <int kBlockM>
FX_DEVICE int64_t bwd_dq_first_tile_row(const FlashBwdParams& p, int batch, int64_t q_start) {
  return p.cu_seqlens_q != nullptr ? (q_start + int64_t(batch) * kBlockM) / kBlockM
                                   : int64_t(batch) * ((p.seqlen_q + kBlockM - 1) / kBlockM);
}

// Where this thread's fragments of a dQ tile are: its first 16-byte slot in tile row `tile_row`
// (bwd_dq_first_tile_row + query block) of `head`, and the float offset from there of fragment (m16
// tile i, row half r, n8 pair `pair`). The main kernel adds there; the convert kernel reads back.
template <typename Config>
FX_DEVICE float* bwd_dq_tile(const FlashBwdParams& p, const BwdWorkspace& w, int64_t tile_row, int head) {
  return w.dq_accum + (tile_row * p.heads + head) * Config::kTileDq + threadIdx.x / 32 * Config::kDqWarpFloats +
         4 * (threadIdx.x % 32);
}

template <typename Config>
FX_DEVICE constexpr int bwd_dq_slot(int i, int r, int pair) {
  return ((2 * i + r) * (Config::kDqCols / 16) + pair) * 128;
}

// Sized for either configuration's tiles (the one that runs is chosen at launch).
template <int kHeadDim>
int64_t bwd_accum_bytes(const FlashBwdParams& p) {
  int64_t rows = 0;  // tile rows × kBlockM
  for (const int block_m : {FlashBwdConfig<kHeadDim>::kBlockM, FlashBwdConfig<kHeadDim, true>::kBlockM}) {
    rows = std::max(rows, bwd_dq_tile_rows(p, block_m) * block_m);
  }
  return (rows * p.heads * kHeadDim * 4 + 255) / 256 * 256;
}

// Deterministic mode: one counter per (batch, head, 64-row query block). Every configuration steps
// a multiple of 64 rows, so these serve whichever one runs (it indexes its own blocks among them).
constexpr int kBwdCounterRows = 64;

// The deterministic dQ's order: key block n_block's turn among the key blocks (of kBlockN keys) that
// add into the query block at m_start (of kBlockM rows), i.e. those whose query ranges hold it,
// [first, last]. With a right edge (causal among them) counted from the last down, the order in
// which the blocks reach the query block; else from the first up. Both backwards start their
// blocks in that order (the grid reversed with a right edge), so a block waits only for blocks
// started before it (bwd_key_block).
template <int kBlockM, int kBlockN>
FX_DEVICE int bwd_dq_turn(const FlashBwdParams& p, int seqlen_k, int diag, int m_start, int n_block) {
  if (p.window_right >= 0) {
    const int last =
        min((seqlen_k + kBlockN - 1) / kBlockN - 1, (m_start + kBlockM - 1 + diag + p.window_right) / kBlockN);
    return last - n_block;
  }
  int first = 0;
  if (p.window_left >= 0) {
    const int x = m_start + diag - p.window_left - (kBlockN - 1);
    first = x <= 0 ? 0 : (x + kBlockN - 1) / kBlockN;
  }
  return n_block - first;
}

// The key block a CTA of either backward owns: blockIdx.x, or, for the ordered (deterministic) dQ
// with a right edge, counted from the last, so that blocks start in bwd_dq_turn's order.
FX_DEVICE int bwd_key_block(const FlashBwdParams& p, bool ordered) {
  return ordered && p.window_right >= 0 ? int(gridDim.x - 1 - blockIdx.x) : int(blockIdx.x);
}

// Deterministic mode: the counter of the query block at m_start, counted in blocks of kRows rows
// (kBwdCounterRows or a multiple, the kernel's own query block). int math: the counters, one per
// 64 rows of every query head, number far below 2^31 for any tensor the GPU holds.
template <int kRows>
FX_DEVICE int* bwd_dq_counter(const FlashBwdParams& p, const BwdWorkspace& w, int batch, int head, int m_start) {
  static_assert(kRows % kBwdCounterRows == 0, "the workspace holds a counter per 64 query rows");
  return w.dq_counters + (batch * p.heads + head) * ((p.seqlen_q + kRows - 1) / kRows) + m_start / kRows;
}

inline int64_t bwd_counter_count(const FlashBwdParams& p) {
  return p.deterministic ? int64_t(p.batch) * p.heads * ((p.seqlen_q + kBwdCounterRows - 1) / kBwdCounterRows) : 0;
}

template <int kHeadDim>
BwdWorkspace bwd_workspace(const FlashBwdParams& p, void* base) {
  const BwdStatsLayout layout = bwd_stats_layout(p);
  const int64_t accum_bytes = bwd_accum_bytes<kHeadDim>(p);
  char* b = static_cast<char*>(base);
  return {reinterpret_cast<float*>(b),
          reinterpret_cast<float*>(b + layout.bytes),
          reinterpret_cast<float*>(b + 2 * layout.bytes),
          reinterpret_cast<int*>(b + 2 * layout.bytes + accum_bytes),
          layout.head_stride,
          layout.batch_stride,
          accum_bytes / 4};
}

template <int kHeadDim>
size_t bwd_workspace_bytes(const FlashBwdParams& p) {
  return size_t(2 * bwd_stats_layout(p).bytes + bwd_accum_bytes<kHeadDim>(p) + bwd_counter_count(p) * 4);
}

// D = rowsum(dO ∘ O) (− dlse when given) and lse · log2 e (+inf where lse = −inf) for every
// (row, head): a block per 64 rows of one head, a warp per 16 of them; also zeroes dq_accum (16
// bytes per thread and stride). D is summed by the tensor cores in the portable main kernel's k
// order (m16n8k16 steps of 16 columns from a zero accumulator), as the diagonal of O dOᵀ: where a
// row saw one key, O is that key's V row and D is dP bit for bit, so dS = P ∘ (dP − D) is exactly
// 0 as it should be (a sum in another order leaves an ulp of D, which a long query range adds up
// in dK; the Hopper backward's wgmma dP matched it on the H100 and H200, which PTX does not
// promise). O and dO reach the fragments through swizzled shared slabs of 64 columns
// (load_tile), two slabs in flight: all of a row at D ≤ 128, two rounds at 256.
struct BwdPreprocessTile {  // load_tile's view of a 64 × 64 slab copied by the whole block
  static constexpr int kHeadDim = 64, kChunks = 8, kThreads = 128, kRows = 64, kSlabsInFlight = 2;
  static constexpr int kSlabElems = kRows * kHeadDim;
  static FX_HOST_DEVICE int slab_count(int head_dim) { return (head_dim + kHeadDim - 1) / kHeadDim; }
  // dynamic shared memory: O's and dO's slabs of one round
  static FX_HOST_DEVICE int smem_bytes(int head_dim, int elem_bytes) {
    const int slabs = slab_count(head_dim);
    return 2 * (slabs < kSlabsInFlight ? slabs : kSlabsInFlight) * kSlabElems * elem_bytes;
  }
  // The rows a block's index counts in: a batch entry's (dense), or all of them (varlen, one entry)
  static FX_HOST_DEVICE int64_t rows(const FlashBwdParams& p) {
    return p.cu_seqlens_q != nullptr ? p.total_q : p.seqlen_q;
  }
  static FX_HOST_DEVICE int64_t row_blocks(const FlashBwdParams& p) { return (rows(p) + kRows - 1) / kRows; }
  // the grid: a block per kRows rows of a head
  static FX_HOST_DEVICE int64_t blocks(const FlashBwdParams& p) {
    return row_blocks(p) * p.heads * (p.cu_seqlens_q != nullptr ? 1 : p.batch);
  }
};

template <typename T>
__global__ void __launch_bounds__(BwdPreprocessTile::kThreads) flash_bwd_preprocess(const FlashBwdParams p,
                                                                                    const BwdWorkspace w) {
  using Tile = BwdPreprocessTile;
  extern __shared__ __align__(128) unsigned char preprocess_smem[];
  T* const slabs = reinterpret_cast<T*>(preprocess_smem);  // [slab of the round][O, dO][64 × 64]
  const int64_t threads = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < w.dq_accum_floats / 4; i += threads) {
    reinterpret_cast<float4*>(w.dq_accum)[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  const int64_t rows = Tile::rows(p), row_blocks = Tile::row_blocks(p);
  const int head = int(blockIdx.x % p.heads);
  const int64_t batch = blockIdx.x / p.heads / row_blocks, row0 = blockIdx.x / p.heads % row_blocks * Tile::kRows;
  const int rows_left = int(min(rows - row0, int64_t(Tile::kRows)));
  const T* o = static_cast<const T*>(p.o) + batch * p.o_batch_stride + row0 * p.o_row_stride + head * p.o_head_stride;
  const T* d_o =
      static_cast<const T*>(p.dout) + batch * p.do_batch_stride + row0 * p.do_row_stride + head * p.do_head_stride;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slab_count = Tile::slab_count(p.head_dim);
  float c[2][4] = {};  // this warp's O dOᵀ: its rows 0-15 against its dO rows 0-7, then 8-15
  for (int first = 0; first < slab_count; first += Tile::kSlabsInFlight) {
    const int round = min(slab_count - first, Tile::kSlabsInFlight);
    if (first > 0) __syncthreads();  // (every warp's reads of the previous round are done)
    for (int s = 0; s < round; ++s) {
      const int col0 = (first + s) * Tile::kHeadDim, width = min(p.head_dim - col0, Tile::kHeadDim);
      load_tile<Tile, Tile::kRows>(slabs + (2 * s) * Tile::kSlabElems, o + col0, p.o_row_stride, rows_left, width);
      load_tile<Tile, Tile::kRows>(slabs + (2 * s + 1) * Tile::kSlabElems, d_o + col0, p.do_row_stride, rows_left,
                                   width);
    }
    ptx::cp_async_commit();
    ptx::cp_async_wait<0>();
    __syncthreads();
    for (int s = 0; s < round; ++s) {
      const int col0 = (first + s) * Tile::kHeadDim;
      const uint32_t tile_o = ptx::smem_addr(slabs + (2 * s) * Tile::kSlabElems);
      const uint32_t tile_do = ptx::smem_addr(slabs + (2 * s + 1) * Tile::kSlabElems);
#pragma unroll
      for (int kk = 0; kk < Tile::kHeadDim / 16; ++kk) {
        if (col0 + 16 * kk >= p.head_dim) break;
        // A = O rows 0-15 (matrices: rows 0-7 / 8-15 × k 0-7, then k 8-15); B = dO rows as columns
        // (matrices: rows 0-7 × k 0-7 / 8-15, then rows 8-15)
        uint32_t a[4], b[4];
        ptx::ldmatrix_x4(a, tile_o + 2 * swizzled<Tile::kHeadDim>(16 * warp + lane % 16, 2 * kk + lane / 16));
        ptx::ldmatrix_x4(b, tile_do + 2 * swizzled<Tile::kHeadDim>(16 * warp + lane / 16 * 8 + lane % 8,
                                                                   2 * kk + lane / 8 % 2));
        ptx::mma_16816<T>(c[0], a, b[0], b[1]);
        ptx::mma_16816<T>(c[1], a, b[2], b[3]);
      }
    }
  }
  // The diagonal: row group (tile 0, column group) and row group + 8 (tile 1, column group) sit
  // in the lane whose columns 2 quad, 2 quad + 1 hold group.
  const int group = lane / 4, quad = lane % 4;
  if (quad != group / 2) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + 16 * warp + group + 8 * r;
    if (row >= rows) continue;
    const float sum = group % 2 ? c[r][2 * r + 1] : c[r][2 * r];
    const int64_t lse_at = batch * p.lse_batch_stride + head * p.lse_head_stride + row;
    const float lse = p.lse[lse_at];
    const int64_t stat = batch * w.stats_batch_stride + head * w.stats_head_stride + row;
    // A used lse adds dlse · P to dS = P ∘ (dP − D): the same as D − dlse in place of D.
    w.dsum[stat] = p.dlse != nullptr ? sum - p.dlse[lse_at] : sum;
    w.lse2[stat] = lse == -INFINITY ? INFINITY : lse * kLog2e;
  }
}

// dq = dq_accum · softmax_scale in q's dtype: a block per (query block, head, batch entry) with
// the main kernel's dQ warp grid, each thread reading the fragments it added (16 bytes, a warp 512
// contiguous) and writing them to their rows and columns.
template <typename T, typename Config>
__global__ void __launch_bounds__(Config::kThreads) flash_bwd_convert_dq(const FlashBwdParams p, const BwdWorkspace w) {
  constexpr int kBlockM = Config::kBlockM, kDqRowTiles = Config::kDqRowTiles, kDqPairs = Config::kDqCols / 16;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int m0 = blockIdx.x * kBlockM, head = blockIdx.y, batch = blockIdx.z;
  const SequenceRows seq = sequence_rows(p, batch);  // (tiles.cuh: clamped as the forward's)
  if (m0 >= seq.seqlen_q) return;
  const float* tile = bwd_dq_tile<Config>(p, w, bwd_dq_first_tile_row<kBlockM>(p, batch, seq.q_start) + blockIdx.x, head);
  const int row0 = m0 + (warp % Config::kDqRowWarps) * 16 * kDqRowTiles + lane / 4;
  const int col0 = (warp / Config::kDqRowWarps) * Config::kDqCols + 2 * (lane % 4);
  T* dq = static_cast<T*>(p.dq) + (p.cu_seqlens_q != nullptr ? seq.q_start * p.dq_row_stride : batch * p.dq_batch_stride) +
          head * p.dq_head_stride;
  const float s = p.softmax_scale;
#pragma unroll
  for (int i = 0; i < kDqRowTiles; ++i) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + 16 * i + 8 * r;
      if (row >= seq.seqlen_q) continue;
#pragma unroll
      for (int tp = 0; tp < kDqPairs; ++tp) {
        const float4 a = *reinterpret_cast<const float4*>(tile + bwd_dq_slot<Config>(i, r, tp));
        const int col = col0 + 16 * tp;
        T* out = dq + int64_t(row) * p.dq_row_stride + col;
        if (col < p.head_dim) *reinterpret_cast<uint32_t*>(out) = ptx::pack2<T>(a.x * s, a.y * s);
        if (col + 8 < p.head_dim) *reinterpret_cast<uint32_t*>(out + 8) = ptx::pack2<T>(a.z * s, a.w * s);
      }
    }
  }
}

// Zero an array of mma accumulators (m16 tiles × n8 tiles × 4 values).
template <int kRowTiles, int kColTiles>
FX_DEVICE void zero_accumulators(float (&acc)[kRowTiles][kColTiles][4]) {
#pragma unroll
  for (int i = 0; i < kRowTiles; ++i)
#pragma unroll
    for (int j = 0; j < kColTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
}

template <typename T, typename Config>
__global__ void __launch_bounds__(Config::kThreads, 1) flash_bwd_kernel(const FlashBwdParams p, const BwdWorkspace w) {
  constexpr int kHeadDim = Config::kHeadDim, kBlockM = Config::kBlockM, kBlockN = Config::kBlockN;
  constexpr int kSKeyTiles = Config::kSKeyTiles, kSTiles = Config::kQCols / 8;  // Sᵀ: m16 key tiles × n8 query tiles
  constexpr int kKVKeyTiles = Config::kKVKeyTiles, kDTiles = Config::kDCols / 8;  // dK, dV: m16 × n8 tiles
  constexpr int kDqRowTiles = Config::kDqRowTiles, kDqTiles = Config::kDqCols / 8 / Config::kDqPasses;  // dQ, a pass
  constexpr uint32_t kRowBytes = 2 * kHeadDim, kSRowBytes = 2 * kBlockM;  // Q/K/V/dO rows; Pᵀ/dSᵀ rows
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* smem_k = reinterpret_cast<T*>(smem_raw);
  T* smem_v = smem_k + Config::kTileKV;
  T* smem_q = smem_v + Config::kTileKV;  // kQBuffers buffers
  T* smem_do = smem_q + Config::kQBuffers * Config::kTileQ;  // kQBuffers buffers
  T* smem_p = smem_do + Config::kQBuffers * Config::kTileQ;  // Pᵀ, rows = keys
  T* smem_ds = smem_p + Config::kTileS;                       // dSᵀ, rows = keys
  float* smem_stats = reinterpret_cast<float*>(smem_ds + Config::kTileS);
  // smem_stats[buffer][0 .. kBlockM): lse · log2 e, [kBlockM .. 2 · kBlockM): D

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;
  // This warp's tile in each GEMM phase (FlashBwdConfig): Sᵀ/dPᵀ rows s_key0 + [0, 16 · kSKeyTiles)
  // × columns s_query0 + [0, kQCols); dK/dV rows kv_key0 + ... × head-dim columns kv_col0 + ...;
  // dQ rows dq_row0 + ... × head-dim columns dq_col0 + ....
  const int s_key0 = (warp % Config::kSKeyWarps) * 16 * kSKeyTiles;
  const int s_query0 = (warp / Config::kSKeyWarps) * Config::kQCols;
  const int kv_key0 = (warp % Config::kKVKeyWarps) * 16 * kKVKeyTiles;
  const int kv_col0 = (warp / Config::kKVKeyWarps) * Config::kDCols;
  const int dq_row0 = (warp % Config::kDqRowWarps) * 16 * kDqRowTiles;
  const int dq_col0 = (warp / Config::kDqRowWarps) * Config::kDqCols;
  const int n_block = bwd_key_block(p, p.deterministic);
  const int kv_head = blockIdx.y, batch = blockIdx.z;
  const SequenceRows seq = sequence_rows(p, batch);  // (tiles.cuh: clamped as the forward's)
  const int n_start = n_block * kBlockN;
  if (n_start >= seq.seqlen_k) return;  // past this sequence (its dk, dv rows do not exist)
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t q_base = varlen ? seq.q_start * p.q_row_stride : batch * p.q_batch_stride;
  const int64_t do_base = varlen ? seq.q_start * p.do_row_stride : batch * p.do_batch_stride;
  const int64_t k_base = varlen ? seq.k_start * p.k_row_stride : batch * p.k_batch_stride;
  const int64_t v_base = varlen ? seq.k_start * p.v_row_stride : batch * p.v_batch_stride;
  const int64_t stats_base = varlen ? seq.q_start : batch * w.stats_batch_stride;
  const int64_t dq_tile_row0 = bwd_dq_first_tile_row<kBlockM>(p, batch, seq.q_start);  // dq_accum's tiles
  const int group_size = p.heads / p.heads_kv;

  // The query rows that can see a key of [n_start, n_start + kBlockN): key j is visible to row i
  // when i + diag − window_left ≤ j ≤ i + diag + window_right (−1: unbounded).
  const int diag = p.align_top_left ? 0 : seq.seqlen_k - seq.seqlen_q;
  const int n_last = n_start + kBlockN - 1;
  int m_lo = 0, m_hi = seq.seqlen_q;
  if (p.window_right >= 0) m_lo = max(0, n_start - diag - p.window_right) / kBlockM * kBlockM;
  if (p.window_left >= 0) m_hi = min(seq.seqlen_q, n_last - diag + p.window_left + 1);
  const int num_m = m_hi > m_lo ? (m_hi - m_lo + kBlockM - 1) / kBlockM : 0;
  const int num_steps = num_m * group_size;

  const bool softcap_on = p.softcap > 0.0f;
  const float score_scale = softcap_on ? kLog2e : p.softmax_scale * kLog2e;
  const float cap_scale = softcap_on ? p.softmax_scale / p.softcap : 0.0f;
  const float inv_softcap = softcap_on ? 1.0f / p.softcap : 0.0f;

  const T* k = static_cast<const T*>(p.k) + k_base + kv_head * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + v_base + kv_head * p.v_head_stride;
  // Step s: query head kv_head · group + s / num_m, query block m_lo / kBlockM + s % num_m (the
  // loop below steps (head, m) along without dividing).
  const int m_end = m_lo + num_m * kBlockM;
  const auto load_q_do = [&](int head, int m, int buffer) {
    load_tile<Config, kBlockM>(smem_q + buffer * Config::kTileQ,
                               static_cast<const T*>(p.q) + q_base + head * p.q_head_stride + int64_t(m) * p.q_row_stride,
                               p.q_row_stride, seq.seqlen_q - m, p.head_dim);
    load_tile<Config, kBlockM>(smem_do + buffer * Config::kTileQ,
                               static_cast<const T*>(p.dout) + do_base + head * p.do_head_stride +
                                   int64_t(m) * p.do_row_stride,
                               p.do_row_stride, seq.seqlen_q - m, p.head_dim);
  };
  // Thread t < 2 · kBlockM reads one row statistic of step s (0 past the sequence: such rows have
  // zero Q and dO and are masked).
  const auto load_stat = [&](int head, int m) {
    const int t = threadIdx.x, row = m + t % kBlockM;
    if (t >= 2 * kBlockM || row >= seq.seqlen_q) return 0.0f;
    const float* src = t < kBlockM ? w.lse2 : w.dsum;
    return src[stats_base + head * w.stats_head_stride + row];
  };

  // dK and dV of this warp's 16 · kKVKeyTiles keys × kDCols columns.
  float acc_dk[kKVKeyTiles][kDTiles][4], acc_dv[kKVKeyTiles][kDTiles][4];
  zero_accumulators(acc_dk);
  zero_accumulators(acc_dv);

  // Prologue: K and V, then the first step's Q, dO and row statistics (a key block that no query
  // sees only writes its zero dK and dV).
  if (num_steps > 0) {
    load_tile<Config, kBlockN>(smem_k, k + int64_t(n_start) * p.k_row_stride, p.k_row_stride,
                               seq.seqlen_k - n_start, p.head_dim);
    load_tile<Config, kBlockN>(smem_v, v + int64_t(n_start) * p.v_row_stride, p.v_row_stride,
                               seq.seqlen_k - n_start, p.head_dim);
    load_q_do(kv_head * group_size, m_lo, 0);
    if (threadIdx.x < 2 * kBlockM) smem_stats[threadIdx.x] = load_stat(kv_head * group_size, m_lo);
  }
  ptx::cp_async_commit();

  // ldmatrix lane addresses (chunk 0 or 1 of the lane's row; swizzled_chunk_addr reaches the rest;
  // a further m16 tile is 16 rows on, the same swizzle):
  //   A from a row-major tile (K, V: this warp's keys; Pᵀ, dSᵀ: its keys of those tiles),
  //   B from an n-major tile (Q, dO rows as n), B transposed from a k-major tile (dO, Q, K rows as k),
  //   A transposed from the k-major dSᵀ tile (keys as k).
  const int a_row = lane % 16, a_chunk = lane / 16;
  const int b_row = lane % 8 + (lane / 16) * 8, b_chunk = (lane / 8) % 2;
  const int bt_row = lane % 8 + ((lane / 8) % 2) * 8, bt_chunk = lane / 16;
  const uint32_t k_a = ptx::smem_addr(smem_k) + 2 * swizzled<kHeadDim>(s_key0 + a_row, a_chunk);
  const uint32_t v_a = ptx::smem_addr(smem_v) + 2 * swizzled<kHeadDim>(s_key0 + a_row, a_chunk);
  const uint32_t p_a = ptx::smem_addr(smem_p) + 2 * swizzled<kBlockM>(kv_key0 + a_row, a_chunk);
  const uint32_t ds_a = ptx::smem_addr(smem_ds) + 2 * swizzled<kBlockM>(kv_key0 + a_row, a_chunk);
  const uint32_t k_bt = ptx::smem_addr(smem_k) + 2 * swizzled<kHeadDim>(bt_row, bt_chunk);
  const uint32_t ds_at = ptx::smem_addr(smem_ds) + 2 * swizzled<kBlockM>(b_row, b_chunk);

  // acc[i][j] += A_i B_j over k16 steps kk < kSteps, A fragments of kATiles m16 tiles (a(kk, i)
  // loads tile i's) and B fragments in n8 pairs (b(kk, jp) loads pair jp): one A fragment per m16
  // tile per step, reused by every n8 tile of the warp. An on_step(kk) hook puts other work
  // between the steps' MMAs (in-order issue: work placed before or after a GEMM waits for it).
  const auto gemm = [](auto& acc, auto steps, auto a_tiles, auto b_pairs, auto a_frag, auto b_frag,
                       auto... on_step) {
    constexpr int kSteps = decltype(steps)::value, kATiles = decltype(a_tiles)::value;
    constexpr int kBPairs = decltype(b_pairs)::value;
#pragma unroll
    for (int kk = 0; kk < kSteps; ++kk) {
      (on_step(kk), ...);  // other work to interleave with this k-step's MMAs
      uint32_t a[kATiles][4];
#pragma unroll
      for (int i = 0; i < kATiles; ++i) a_frag(a[i], kk, i);
#pragma unroll
      for (int jp = 0; jp < kBPairs; ++jp) {
        uint32_t b[4];
        b_frag(b, kk, jp);
#pragma unroll
        for (int i = 0; i < kATiles; ++i) {
          ptx::mma_16816<T>(acc[i][2 * jp], a[i], b[0], b[1]);
          ptx::mma_16816<T>(acc[i][2 * jp + 1], a[i], b[2], b[3]);
        }
      }
    }
  };
  using SSteps = std::integral_constant<int, kHeadDim / 16>;
  using SKeyTiles = std::integral_constant<int, kSKeyTiles>;
  using SPairs = std::integral_constant<int, kSTiles / 2>;

  int head = kv_head * group_size, m_start = m_lo;  // this step's query head and block
  for (int step = 0; step < num_steps; ++step) {
    const int buffer = step % 2;  // of the row statistics; of Q and dO when double-buffered
    const int q_buffer = Config::kQBuffers == 2 ? buffer : 0;
    const bool has_next = step + 1 < num_steps;
    const int next_m = m_start + kBlockM < m_end ? m_start + kBlockM : m_lo;
    const int next_head = next_m == m_lo ? head + 1 : head;
    ptx::cp_async_wait<0>();
    __syncthreads();  // this step's tiles are in; every warp is done with the last step's
    const float next_stat = has_next ? load_stat(next_head, next_m) : 0.0f;
    if (Config::kQBuffers == 2 && has_next) load_q_do(next_head, next_m, buffer ^ 1);
    ptx::cp_async_commit();
    const uint32_t q_tile = ptx::smem_addr(smem_q + q_buffer * Config::kTileQ);
    const uint32_t do_tile = ptx::smem_addr(smem_do + q_buffer * Config::kTileQ);
    const float* lse2 = smem_stats + buffer * 2 * kBlockM;
    const float* dsum = lse2 + kBlockM;

    // Sᵀ = K Qᵀ: this warp's keys × kQCols queries.
    float s[kSKeyTiles][kSTiles][4];
    zero_accumulators(s);
    const uint32_t q_b = q_tile + 2 * swizzled<kHeadDim>(s_query0 + b_row, b_chunk);
    const uint32_t do_b = do_tile + 2 * swizzled<kHeadDim>(s_query0 + b_row, b_chunk);
    gemm(
        s, SSteps{}, SKeyTiles{}, SPairs{},
        [&](uint32_t(&a)[4], int kk, int i) { ptx::ldmatrix_x4(a, swizzled_chunk_addr(k_a, 2 * kk) + 16 * i * kRowBytes); },
        [&](uint32_t(&b)[4], int kk, int jp) { ptx::ldmatrix_x4(b, swizzled_chunk_addr(q_b, 2 * kk) + 16 * jp * kRowBytes); });

    // Soft-cap (rare: a uniform branch), then the mask, only on blocks that cross a boundary;
    // element (i, j, e) of this thread is key key0 + 16 · i + 8 · (e / 2), query query0 + 8 · j + e % 2.
    const int key0 = n_start + s_key0 + group, query0 = m_start + s_query0 + 2 * quad;
    if (softcap_on) {
#pragma unroll
      for (int i = 0; i < kSKeyTiles; ++i)
#pragma unroll
        for (int j = 0; j < kSTiles; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[i][j][e] = p.softcap * tanhf(s[i][j][e] * cap_scale);
    }
    const bool full_block = n_start + kBlockN <= seq.seqlen_k && m_start + kBlockM <= seq.seqlen_q &&
                            (p.window_right < 0 || n_last <= m_start + diag + p.window_right) &&
                            (p.window_left < 0 || n_start >= m_start + kBlockM - 1 + diag - p.window_left);
    if (!full_block) {
      // Per key row the visible queries are [lo, hi) (key j sees row i when i + diag −
      // window_left ≤ j ≤ i + diag + window_right); relative to query0 each element is one
      // compare against a constant per bound after unrolling. Keys past the sequence see none.
      // Without window_right (no lower bound: neither causal nor a right window) that test is
      // compiled out.
      const auto mask = [&](auto with_lo) {
        constexpr bool kWithLo = decltype(with_lo)::value;
#pragma unroll
        for (int i = 0; i < kSKeyTiles; ++i) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int key = key0 + 16 * i + 8 * r;
            const int hi = key >= seq.seqlen_k ? 0
                           : p.window_left < 0 ? seq.seqlen_q
                                               : min(seq.seqlen_q, key - diag + p.window_left + 1);
            const int hi_rel = hi - query0, lo_rel = key - diag - p.window_right - query0;
#pragma unroll
            for (int j = 0; j < kSTiles; ++j) {
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                if (8 * j + e >= hi_rel || (kWithLo && 8 * j + e < lo_rel)) s[i][j][2 * r + e] = -INFINITY;
              }
            }
          }
        }
      };
      if (p.window_right < 0) {
        mask(std::false_type{});
      } else {
        mask(std::true_type{});
      }
    }

    // P = 2^(s · c − lse · log2 e) (0 where masked, and for a row that saw no key: lse2 = +inf)
    // spread over the k-steps of dPᵀ = V dOᵀ, so the exponentials issue between its MMAs instead
    // of holding them back; then dS = P ∘ (dP − D), soft-capped ∘ (1 − tanh²), and Pᵀ, dSᵀ to
    // shared memory in 16 bits: the dV/dK GEMMs read them with other warps' keys than the ones
    // that computed them, and dQ = dS K reads dSᵀ transposed. One basic block per soft-cap setting
    // (a template lambda). The row statistics of this thread's two columns per n8 tile are one
    // 8-byte shared load each.
    const auto probs_and_ds = [&](auto capped) {
      constexpr bool kCapped = decltype(capped)::value;
      constexpr int kElems = kSKeyTiles * kSTiles * 4, kPerStep = (kElems + SSteps::value - 1) / SSteps::value;
      float2 l2[kSTiles];
#pragma unroll
      for (int j = 0; j < kSTiles; ++j) l2[j] = *reinterpret_cast<const float2*>(lse2 + s_query0 + 8 * j + 2 * quad);
      float prob[kSKeyTiles][kSTiles][4], dp[kSKeyTiles][kSTiles][4];
      zero_accumulators(dp);
      const auto probs_part = [&](int kk) {  // elements [kk · kPerStep, (kk + 1) · kPerStep) of P
#pragma unroll
        for (int n = kk * kPerStep; n < (kk + 1) * kPerStep && n < kElems; ++n) {
          const int e = n % 4, j = n / 4 % kSTiles, i = n / 4 / kSTiles;
          const float x = s[i][j][e];
          prob[i][j][e] = ptx::exp2_approx(fmaf(x, score_scale, -(e % 2 ? l2[j].y : l2[j].x)));
          if constexpr (kCapped) {
            const float t = x * inv_softcap;
            s[i][j][e] = prob[i][j][e] > 0.0f ? 1.0f - t * t : 0.0f;  // d capped / d raw (masked: x = −inf)
          }
        }
      };
      gemm(
          dp, SSteps{}, SKeyTiles{}, SPairs{},
          [&](uint32_t(&a)[4], int kk, int i) { ptx::ldmatrix_x4(a, swizzled_chunk_addr(v_a, 2 * kk) + 16 * i * kRowBytes); },
          [&](uint32_t(&b)[4], int kk, int jp) { ptx::ldmatrix_x4(b, swizzled_chunk_addr(do_b, 2 * kk) + 16 * jp * kRowBytes); },
          probs_part);
#pragma unroll
      for (int j = 0; j < kSTiles; ++j) {
        const float2 d2 = *reinterpret_cast<const float2*>(dsum + s_query0 + 8 * j + 2 * quad);
#pragma unroll
        for (int i = 0; i < kSKeyTiles; ++i) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            dp[i][j][e] = prob[i][j][e] * (dp[i][j][e] - (e % 2 ? d2.y : d2.x));
            if constexpr (kCapped) dp[i][j][e] *= s[i][j][e];
          }
        }
      }
#pragma unroll
      for (int i = 0; i < kSKeyTiles; ++i) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = s_key0 + 16 * i + group + 8 * r;
#pragma unroll
          for (int j = 0; j < kSTiles; ++j) {
            const int at = swizzled<kBlockM>(row, (s_query0 + 8 * j) / 8) + 2 * quad;
            *reinterpret_cast<uint32_t*>(smem_p + at) = ptx::pack2<T>(prob[i][j][2 * r], prob[i][j][2 * r + 1]);
            *reinterpret_cast<uint32_t*>(smem_ds + at) = ptx::pack2<T>(dp[i][j][2 * r], dp[i][j][2 * r + 1]);
          }
        }
      }
    };
    if (softcap_on) {
      probs_and_ds(std::true_type{});
    } else {
      probs_and_ds(std::false_type{});
    }
    __syncthreads();  // Pᵀ and dSᵀ are whole

    // dV += Pᵀ dO and dK += dSᵀ Q: this warp's keys × kDCols columns, k = the block's queries.
    using KVSteps = std::integral_constant<int, kBlockM / 16>;
    using KVKeyTiles = std::integral_constant<int, kKVKeyTiles>;
    using KVPairs = std::integral_constant<int, kDTiles / 2>;
    const uint32_t do_bt = do_tile + 2 * swizzled<kHeadDim>(bt_row, bt_chunk);
    const uint32_t q_bt = q_tile + 2 * swizzled<kHeadDim>(bt_row, bt_chunk);
    gemm(
        acc_dv, KVSteps{}, KVKeyTiles{}, KVPairs{},
        [&](uint32_t(&a)[4], int kk, int i) { ptx::ldmatrix_x4(a, swizzled_chunk_addr(p_a, 2 * kk) + 16 * i * kSRowBytes); },
        [&](uint32_t(&b)[4], int kk, int tp) {
          ptx::ldmatrix_x4_trans(b, swizzled_chunk_addr(do_bt, kv_col0 / 8 + 2 * tp) + 16 * kk * kRowBytes);
        });
    gemm(
        acc_dk, KVSteps{}, KVKeyTiles{}, KVPairs{},
        [&](uint32_t(&a)[4], int kk, int i) { ptx::ldmatrix_x4(a, swizzled_chunk_addr(ds_a, 2 * kk) + 16 * i * kSRowBytes); },
        [&](uint32_t(&b)[4], int kk, int tp) {
          ptx::ldmatrix_x4_trans(b, swizzled_chunk_addr(q_bt, kv_col0 / 8 + 2 * tp) + 16 * kk * kRowBytes);
        });
    // Single-buffered Q and dO: every warp is done with them, so the next step's load under the dQ GEMM.
    if constexpr (Config::kQBuffers == 1) {
      __syncthreads();
      if (has_next) load_q_do(next_head, next_m, 0);
      ptx::cp_async_commit();
    }

    // dQ (this block's keys' share) = dS K: this warp's 16 · kDqRowTiles queries × kDqCols columns,
    // added into dq_accum (fp32 atomics; scaled by softmax_scale when converted).
    {
      // In kDqPasses passes over the head dim (D = 256 with 128 queries: two of 64 accumulator
      // registers); the first before the deterministic wait, so its MMAs follow dK's unbroken.
      float acc_dq[kDqRowTiles][kDqTiles][4];
      const auto dq_gemm = [&](int pass) {
        zero_accumulators(acc_dq);
        // A: dSᵀ rows (keys) 16 · kk + ..., columns (queries) dq_row0 + 16 · i + ..., transposed.
        gemm(
            acc_dq, std::integral_constant<int, kBlockN / 16>{}, std::integral_constant<int, kDqRowTiles>{},
            std::integral_constant<int, kDqTiles / 2>{},
            [&](uint32_t(&a)[4], int kk, int i) {
              ptx::ldmatrix_x4_trans(a, swizzled_chunk_addr(ds_at, dq_row0 / 8 + 2 * i) + 16 * kk * kSRowBytes);
            },
            [&](uint32_t(&b)[4], int kk, int tp) {
              ptx::ldmatrix_x4_trans(b, swizzled_chunk_addr(k_bt, dq_col0 / 8 + pass * kDqTiles + 2 * tp) +
                                            16 * kk * kRowBytes);
            });
      };
      dq_gemm(0);
      // Deterministic: this block adds after the key blocks that see the same query block and come
      // before it in bwd_dq_turn's order, with plain loads and stores through L2.
      int* counter = bwd_dq_counter<kBlockM>(p, w, batch, head, m_start);
      if (p.deterministic) {
        if (threadIdx.x == 0) {
          const int turn = bwd_dq_turn<kBlockM, kBlockN>(p, seq.seqlen_k, diag, m_start, n_block);
          while (ptx::ld_acquire(counter) != turn) {
          }
        }
        __syncthreads();
      }
      // Into this query block's accumulator tile (bwd_accum_bytes): a warp's four floats per
      // thread per (m16 tile, row half, n8 pair) are 512 contiguous bytes.
      float* dq_tile = bwd_dq_tile<Config>(p, w, dq_tile_row0 + m_start / kBlockM, head);
      const auto add_dq = [&](auto deterministic, int pass) {
#pragma unroll
        for (int i = 0; i < kDqRowTiles; ++i) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
#pragma unroll
            for (int tp = 0; tp < kDqTiles / 2; ++tp) {
              float* dst = dq_tile + bwd_dq_slot<Config>(i, r, pass * (kDqTiles / 2) + tp);
              const float x = acc_dq[i][2 * tp][2 * r], y = acc_dq[i][2 * tp][2 * r + 1];
              const float z = acc_dq[i][2 * tp + 1][2 * r], u = acc_dq[i][2 * tp + 1][2 * r + 1];
              if constexpr (decltype(deterministic)::value) {
                const float4 old = __ldcg(reinterpret_cast<const float4*>(dst));
                __stcg(reinterpret_cast<float4*>(dst), make_float4(old.x + x, old.y + y, old.z + z, old.w + u));
              } else {
                ptx::red_add_f32x4(dst, x, y, z, u);
              }
            }
          }
        }
      };
#pragma unroll
      for (int pass = 0; pass < Config::kDqPasses; ++pass) {
        if (pass > 0) dq_gemm(pass);
        if (p.deterministic) {
          add_dq(std::true_type{}, pass);
        } else {
          add_dq(std::false_type{}, pass);
        }
      }
      if (p.deterministic) {
        __syncthreads();  // every thread's additions are issued
        if (threadIdx.x == 0) {
          __threadfence();  // cumulative: the block's additions are visible before the count moves
          atomicAdd(counter, 1);
        }
      }
    }
    if (threadIdx.x < 2 * kBlockM) smem_stats[(buffer ^ 1) * 2 * kBlockM + threadIdx.x] = next_stat;
    head = next_head;
    m_start = next_m;
  }

  // dK · softmax_scale and dV of this warp's keys, straight from the accumulators.
  T* dk = static_cast<T*>(p.dk) + (varlen ? seq.k_start * p.dk_row_stride : batch * p.dk_batch_stride) +
          kv_head * p.dk_head_stride;
  T* dv = static_cast<T*>(p.dv) + (varlen ? seq.k_start * p.dv_row_stride : batch * p.dv_batch_stride) +
          kv_head * p.dv_head_stride;
#pragma unroll
  for (int i = 0; i < kKVKeyTiles; ++i) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = n_start + kv_key0 + 16 * i + group + 8 * r;
      if (key >= seq.seqlen_k) continue;
#pragma unroll
      for (int t = 0; t < kDTiles; ++t) {
        const int col = kv_col0 + 8 * t + 2 * quad;
        if (col < p.head_dim) {
          *reinterpret_cast<uint32_t*>(dk + int64_t(key) * p.dk_row_stride + col) =
              ptx::pack2<T>(acc_dk[i][t][2 * r] * p.softmax_scale, acc_dk[i][t][2 * r + 1] * p.softmax_scale);
          *reinterpret_cast<uint32_t*>(dv + int64_t(key) * p.dv_row_stride + col) =
              ptx::pack2<T>(acc_dv[i][t][2 * r], acc_dv[i][t][2 * r + 1]);
        }
      }
    }
  }
}

template <typename T, typename Config>
cudaError_t launch_flash_bwd_config(const FlashBwdParams& p, const BwdWorkspace& w, cudaStream_t stream) {
  auto kernel = flash_bwd_kernel<T, Config>;
  FX_RETURN_IF_ERROR(allow_dynamic_smem(kernel, Config::kSmemBytes));
  const dim3 grid(unsigned((p.seqlen_k + Config::kBlockN - 1) / Config::kBlockN), unsigned(p.heads_kv),
                  unsigned(p.batch));
  if (grid.x > 0) {  // else no key: dq is the zeroed accumulator's zeros
    kernel<<<grid, Config::kThreads, Config::kSmemBytes, stream>>>(p, w);
    FX_RETURN_IF_ERROR(cudaGetLastError());
  }
  const dim3 convert_grid(unsigned((p.seqlen_q + Config::kBlockM - 1) / Config::kBlockM), unsigned(p.heads),
                          unsigned(p.batch));
  if (convert_grid.x == 0) return cudaSuccess;
  flash_bwd_convert_dq<T, Config><<<convert_grid, Config::kThreads, 0, stream>>>(p, w);
  return cudaGetLastError();
}

// The shared memory the backward's main kernel needs per block at this head dim: with
// `max_smem_per_block` bytes available, the full tiles, else the compact ones, else 0 (none fits).
template <int kHeadDim>
int bwd_smem_bytes(int max_smem_per_block) {
  using Full = FlashBwdConfig<kHeadDim>;
  using Compact = FlashBwdConfig<kHeadDim, true>;
  if (max_smem_per_block >= Full::kSmemBytes) return Full::kSmemBytes;
  return max_smem_per_block >= Compact::kSmemBytes ? Compact::kSmemBytes : 0;
}

// The workspace readied for either backward (this one's and flash_bwd_sm90.cu's): the deterministic
// mode's counters zeroed, then D and lse · log2 e and a zeroed dq_accum by the first kernel, over
// every (query row, head) pair.
template <typename T>
cudaError_t launch_bwd_preprocess(const FlashBwdParams& p, const BwdWorkspace& w, cudaStream_t stream) {
  const int64_t pairs = bwd_rows(p) * p.heads;
  if (pairs == 0) return cudaSuccess;
  if (p.deterministic) {
    FX_RETURN_IF_ERROR(cudaMemsetAsync(w.dq_counters, 0, size_t(bwd_counter_count(p)) * 4, stream));
  }
  using Tile = BwdPreprocessTile;
  flash_bwd_preprocess<T>
      <<<unsigned(Tile::blocks(p)), Tile::kThreads, Tile::smem_bytes(p.head_dim, sizeof(T)), stream>>>(p, w);
  return cudaGetLastError();
}

template <typename T, int kHeadDim>
cudaError_t launch_flash_bwd(const FlashBwdParams& p, void* workspace, cudaStream_t stream) {
  using Full = FlashBwdConfig<kHeadDim>;
  using Compact = FlashBwdConfig<kHeadDim, true>;
  static_assert(Full::kBlockM % kBwdCounterRows == 0 && Compact::kBlockM % kBwdCounterRows == 0,
                "the workspace's counters cover either configuration's query blocks");
  const int budget = p.max_smem_per_block > 0 ? p.max_smem_per_block : current_device_max_smem_per_block();
  const int smem = bwd_smem_bytes<kHeadDim>(budget);
  if (smem == 0) return cudaErrorInvalidConfiguration;  // the glue says so in words first
  const BwdWorkspace w = bwd_workspace<kHeadDim>(p, workspace);
  if (bwd_rows(p) * p.heads == 0) return cudaSuccess;
  FX_RETURN_IF_ERROR(launch_bwd_preprocess<T>(p, w, stream));
  if (smem != Full::kSmemBytes) return launch_flash_bwd_config<T, Compact>(p, w, stream);
  return launch_flash_bwd_config<T, Full>(p, w, stream);
}

}  // namespace attention_detail
}  // namespace flashext
