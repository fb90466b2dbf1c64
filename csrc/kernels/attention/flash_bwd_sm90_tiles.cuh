// flashext Hopper FlashAttention backward: the tiles and their indexing, for the kernels in
// flash_bwd_sm90.cu (which alone includes this): Sm90BwdConfig (tile sizes, the per-head-dim
// schedule switches, the shared-memory layout), the block's threads, registers and named
// barriers, the TMA maps, where a step's dQ tile and statistics sit in the workspace, the order
// of a CTA's steps, and the wgmma shapes the steps use.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../common/device.h"
#include "../common/sm90.cuh"
#include "../common/tma.h"
#include "flash_bwd_kernel.cuh"

namespace flashext {
namespace attention_detail {
namespace {

template <int kHeadDim_>
struct Sm90BwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = 128;                        // keys per CTA: 64 per consumer warpgroup
  static constexpr int kBlockM = kHeadDim == 64 ? 128 : 64;  // queries per step (dq_accum's tile rows)
  // dQ = dS K, split between the consumers by head dims (D = 128) or by query rows (D = 64): consumer
  // c's 64 × 64 part starts at row kDqRow0 · c, column kDqCol0 · c.
  static constexpr bool kDqByQueries = kHeadDim == 64;
  static constexpr int kDqRow0 = kDqByQueries ? 64 : 0, kDqCol0 = kDqByQueries ? 0 : 64;
  // Whether Pᵀ's exponentials run under dPᵀ's GEMM and dSᵀ under dV's (the schedule in the header);
  // at D = 64 Sᵀ and dPᵀ alone take 128 registers.
  static constexpr bool kExpUnderDp = kHeadDim == 128;
  // Query rows as offsets from the thread's first one (constants): D = 64's 128 rows won't fit in registers.
  static constexpr bool kQueryOffsets = kHeadDim == 64;
  static constexpr int kStages = 2;
  static constexpr int kSlabs = kHeadDim / 64;
  static constexpr int kSlabBytesKV = kBlockN * 128, kTileBytesKV = kSlabs * kSlabBytesKV;
  static constexpr int kSlabBytesQ = kBlockM * 128, kTileBytesQ = kSlabs * kSlabBytesQ;
  static constexpr int kSlabBytesDs = kBlockM * 128, kTileBytesDs = (kBlockN / 64) * kSlabBytesDs;
  static constexpr int kTileBytesDq = kBlockM * kHeadDim * 4;
  // Per stage: lse · log2 e, then D, each in a slot of kBlockM + 4 floats: a block's statistics are
  // copied from the 16-byte aligned float at or before their first (varlen rows are packed
  // without padding), so they start up to 3 floats into the slot.
  static constexpr int kStatsSlot = kBlockM + 4, kStatsFloats = 2 * kStatsSlot;
  // Offsets from the 1024-byte aligned base (every tile on a swizzle atom).
  static constexpr int kOffK = 0, kOffV = kTileBytesKV, kOffQ = 2 * kTileBytesKV;
  static constexpr int kOffDo = kOffQ + kStages * kTileBytesQ;
  static constexpr int kOffDs = kOffDo + kStages * kTileBytesQ;
  static constexpr int kOffDq = kOffDs + kTileBytesDs;
  static constexpr int kOffStats = kOffDq + kTileBytesDq;
  static constexpr int kOffBars = kOffStats + kStages * kStatsFloats * 4;
  static constexpr int kSmemBytes = kOffBars + 64 + 1024;  // the barriers, and the alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "tiles must fit shared memory");
  static_assert((kHeadDim == 64 || kHeadDim == 128) && kBlockM * kHeadDim == 64 * 128,
                "a step's dQ tile is 64 × 128 or 128 × 64 fp32: each consumer's dQ one m64n64 tile");
};

constexpr int kThreads = 3 * 128;
// Registers: the block starts at 65536 / kThreads = 168 each (__launch_bounds__ pins it); the
// producer gives up to 24 and the consumers take 240, exactly the whole file.
constexpr int kEntryRegisters = 168, kProducerRegisters = 24, kConsumerRegisters = 240;
static_assert(kThreads * kEntryRegisters <= 65536 &&
                  128 * kProducerRegisters + 256 * kConsumerRegisters <= kThreads * kEntryRegisters,
              "setmaxnreg must balance within the block's registers");
// Named barriers: of the two consumer warpgroups, and (kBarrierDq in the deterministic mode,
// kBarrierDqFree) of those and the producer's warp 1.
constexpr int kBarrierDs = 1, kBarrierDq = 2, kBarrierDqFree = 3;

struct Sm90BwdMaps {
  CUtensorMap q, k, v, dout, dk, dv;  // (dk and dv: stores of 64-row boxes)
};

// dq_accum's kBlockM × kHeadDim tile of (batch entry, query block, head; q_start: a varlen
// sequence's first row): the FA2-design backward's tile order (bwd_dq_first_tile_row), row-major
// inside with each row's 16-byte chunks permuted (sm90_dq_col). The main kernel adds into it, the
// convert reads it. bwd_accum_bytes sizes dq_accum for the FA2-design configs' query blocks, which
// hold this config's (the assert), so every tile row it indexes is allocated (dense: B · ⌈Sq / M⌉;
// varlen: sequence b's last tile row ⌊q_start / M⌋ + b + ⌈len / M⌉ − 1 < ⌊total_q / M⌋ + B + 1).
template <typename C>
FX_DEVICE float* sm90_dq_tile(const FlashBwdParams& p, const BwdWorkspace& w, int batch, int64_t q_start, int m_block,
                             int head) {
  static_assert(C::kBlockM == FlashBwdConfig<C::kHeadDim>::kBlockM ||
                    C::kBlockM == FlashBwdConfig<C::kHeadDim, true>::kBlockM,
                "dq_accum is sized (bwd_accum_bytes) for the FA2-design configs' tile rows");
  const int64_t tile_row = bwd_dq_first_tile_row<C::kBlockM>(p, batch, q_start) + m_block;
  return w.dq_accum + (tile_row * p.heads + head) * (C::kBlockM * C::kHeadDim);
}

// Where column `col` of row `row` sits in a dq_accum tile (and in its shared-memory copy, which the
// bulk reduce-add copies byte for byte): 16-byte chunk col / 4 XOR a per-row key, 2 (row % 4) +
// (row / 4) % 2 (the key < 8 permutes the chunks within each 128-byte group of the row). A
// consumer's float2 store covers 8 rows (lane / 4, the first a multiple of 8) × 8 columns (a pair
// of chunks); rows are 256 (D = 64) or 512 bytes (D = 128) apart, so unswizzled every row falls on
// the same 8 banks (an 8-way conflict, 8 wavefronts per store). With the key the four rows of each
// half-warp take four different chunk pairs (keys 0, 2, 4, 6 and 1, 3, 5, 7), so a store takes 2
// wavefronts, the least for 256 bytes, whether the warp or each half-warp is served at once. The
// convert's reads stay within each row's 128-byte groups.
FX_DEVICE int sm90_dq_col(int row, int col) {
  const int key = ((row & 3) << 1) | ((row >> 2) & 1);
  return (((col >> 2) ^ key) << 2) | (col & 3);
}

// Where a query block's statistics start in w.lse2 / w.dsum (the float index), and how many floats
// from the 16-byte aligned one at or before it cover its rows: whole 16-byte chunks, at most
// kBlockM + 3 rounded up to 4 = kStatsSlot; inside the arrays (their sizes are 256-byte multiples).
struct BwdStatsSpan {
  int64_t at;
  int shift, floats;
};
template <int kBlockM>
FX_DEVICE BwdStatsSpan bwd_stats_span(const BwdWorkspace& w, int batch, int head, int64_t q_start, int m_start,
                                      int seqlen_q) {
  const int64_t at = int64_t(batch) * w.stats_batch_stride + int64_t(head) * w.stats_head_stride + q_start + m_start;
  const int shift = int(at % 4), rows = min(kBlockM, seqlen_q - m_start);
  return {at, shift, (shift + rows + 3) / 4 * 4};
}

// The query heads and blocks a CTA visits, in the order producer and consumers share: iteration
// `it` is head `first_head + it / blocks`, query block `m_first + it % blocks`.
struct BwdSchedule {
  int m_first, blocks, iterations, first_head;
  FX_DEVICE int head(int it) const { return first_head + it / blocks; }
  FX_DEVICE int m_block(int it) const { return m_first + it % blocks; }
};

// One k16 step of wgmma m64nN, N = 2 · d's size: n128 for Sᵀ and dPᵀ at D = 64 (128 queries) and
// for dK and dV at D = 128 (128 head dims), n64 for the others. A from shared memory (ss) or from
// registers (rs: the m16n8k16 A fragment of the warp's 16 rows).
template <typename T, int kTransB, int kAccumulators>
FX_DEVICE void wgmma_ss(float (&d)[kAccumulators], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  static_assert(kAccumulators == 32 || kAccumulators == 64, "n64 or n128");
  if constexpr (kAccumulators == 64) {
    flashext::sm90::wgmma_m64n128k16_ss<T, kTransB>(d, desc_a, desc_b, scale_d);
  } else {
    flashext::sm90::wgmma_m64n64k16_ss<T, kTransB>(d, desc_a, desc_b, scale_d);
  }
}
template <typename T, int kTransB, int kAccumulators>
FX_DEVICE void wgmma_rs(float (&d)[kAccumulators], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  static_assert(kAccumulators == 32 || kAccumulators == 64, "n64 or n128");
  if constexpr (kAccumulators == 64) {
    flashext::sm90::wgmma_m64n128k16_rs<T, kTransB>(d, a, desc_b, scale_d);
  } else {
    flashext::sm90::wgmma_m64n64k16_rs<T, kTransB>(d, a, desc_b, scale_d);
  }
}

}  // namespace
}  // namespace attention_detail
}  // namespace flashext
