// flashext FlashAttention backward on Hopper (sm_90a); flash_bwd_sm90.h gives its scope and who
// calls it. The design and its measurements: docs/notes/attention_sm90_bwd.md.
//
// With P = softmax of the forward (recomputed from Q, K and the saved lse), per query row i:
//   dV = Pᵀ dO,  dP = dO Vᵀ,  dS = P ∘ (dP − D),  D_i = Σ_d dO_id O_id,  dK = dSᵀ Q · scale,
//   dQ = dS K · scale.
// Three kernels: flash_bwd_preprocess (the FA2-design backward's: D and lse · log2 e into the
// workspace, dq_accum zeroed), flash_bwd_sm90_kernel, and flash_bwd_sm90_convert_dq (dq_accum ·
// scale into dq).
//
// Main kernel, D = 64 or 128 (head dims under them on the next: the maps read q, k, v and dout's
// columns past their head dim as zeros and store only dk and dv's own; the dQ conversion writes
// dq's own). A CTA per (key block of 128, KV head, batch entry or packed varlen
// sequence). Warpgroup 0 produces: thread 0 issues the TMA loads (K and V once; Q, dO, and the
// block's lse · log2 e and D by bulk copies, of each query block of M = kBlockM into two stages).
// Warpgroups 1 and 2 consume, consumer c owning keys 64 c + [0, 64) of the block. For every query
// head of the KV head's group and every query block that sees the key block:
//   Sᵀ = K_c Qᵀ, dPᵀ = V_c dOᵀ           wgmma m64nM SS, k over D (all four tiles K-major, as TMA
//                                         wrote them)
//   Pᵀ = 2^(Sᵀ · scale · log2 e − lse₂),  dSᵀ = Pᵀ ∘ (dPᵀ − D)    in registers, masked at window
//   edges (causal: window_right 0) and soft-capped where asked
//   dV_c += Pᵀ dO, dK_c += dSᵀ Q          wgmma m64nD RS, k over M (Pᵀ, dSᵀ from registers; dO, Q
//                                         MN-major)
//   dS → shared memory (queries × keys, K-major; both consumers' halves), then dQ = dS K over the
//   block's 128 keys, wgmma m64n64 SS (K MN-major), split between the consumers:
//     D = 128 (M = 64):  dQ[:, 64 c + [0, 64)] = dS K[:, 64 c + [0, 64)]   (head-dim halves)
//     D = 64 (M = 128):  dQ[64 c + [0, 64), :] = dS[64 c + [0, 64), :] K   (query halves)
//   dQ (fp32, M × D = 32 KiB at both) through shared memory into dq_accum by one bulk reduce-add
//   after a barrier of both consumers (which also keeps one consumer's next dS stores behind the
//   other's dQ reads: one dS buffer). Deterministic: the adds into a query block's tile go in key
//   block order, each after the count of the ones before it (the FA2-design backward's counters).
// dK · scale and dV leave at the end by stmatrix into Q's and dO's stages and TMA stores.
// dq_accum's tiles are the FA2-design backward's (one M × D tile per (query block, head)),
// row-major inside, each row's 16-byte chunks permuted (sm90_dq_col: conflict-free stores into
// shared memory).
// Varlen (packed sequences): the maps span the packed rows as one batch entry; CTAs past a
// sequence's keys leave at once; rows of a block past its sequence (the next sequence's, or rows
// no sequence covers: any bits) are zeroed in shared memory once landed; a block's statistics are
// copied as the 16-byte aligned superset of its rows (kStatsSlot); a consumer's dK / dV box that
// would reach past the sequence leaves by its warpgroup's 16-byte stores instead of TMA.
// Why 128-query steps at D = 64: a step's five GEMMs and its dQ tile are then D = 128's (each GEMM
// 64 · 64 · 128 multiply-adds per consumer, 32 KiB of fp32 reduce-add per step), so the dQ bytes
// per FLOP stay D = 128's; 64-query steps with a partial dQ per consumer would double them.
//
//   shared memory (KiB), K, V + Q, dO (2 stages) + dS + dQ + lse₂, D:
//                  D = 128: 2 · 32 + 2 · 2 · 16 + 16 + 32 + 1 = 177
//                  D = 64:  2 · 16 + 2 · 2 · 16 + 32 + 32 + 2 = 162
//   (one more KiB each for the barriers and the 1024-byte alignment slack)
//   registers per consumer thread (not all live at once):
//                  D = 128: dK 64, dV 64, Sᵀ 32, dPᵀ 32, Pᵀ and dSᵀ 16-bit 16 + 16, dQ 32
//                  D = 64:  dK 32, dV 32, Sᵀ 64, dPᵀ 64, Pᵀ and dSᵀ 16-bit 32 + 32, dQ 32
// Schedule: Sᵀ and dPᵀ are issued as two groups. D = 128: Pᵀ's exponentials run under dPᵀ's GEMM,
// dV is issued as soon as Pᵀ is, dSᵀ is computed under dV's GEMM. D = 64: both are waited for, then
// Pᵀ and dSᵀ are computed 16 queries at a time, each k16 step of dV issued as soon as its Pᵀ is in,
// so that Sᵀ's and dPᵀ's registers free as Pᵀ's and dSᵀ's fill (Pᵀ beside Sᵀ, dPᵀ in flight, dK
// and dV would take 224 of the 240). Then dK; dS goes to shared memory and dQ is issued while dV
// and dK run; one wait retires the three. Steps away from the edges (no window edge, no keys or
// queries past the end) run the tiles' code without the mask and tail checks (`edge_step`). The
// dense D = 64 kernel reads its lse₂ and D pairs from shared memory two n8 tiles ahead of use, so
// that their latency runs under the GEMMs (`kEarlyStats`).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../common/device.h"
#include "../common/ptx.cuh"
#include "../common/sm90.cuh"
#include "../common/tma.h"
#include "dispatch.h"
#include "flash_bwd_kernel.cuh"
#include "flash_bwd_sm90.h"
#include "flash_bwd_sm90_tiles.cuh"

namespace flashext {
namespace attention_detail {
namespace {

// kGeneral: a left window edge, a soft-cap, packed varlen sequences or the deterministic dQ (a
// kernel of its own: the masks and tanh cost the full and causal calls 4-10 % when built in,
// varlen's unaligned statistics and per-sequence rows 2 %; right edges, causal among them, are
// run-time arguments of both).
template <typename T, int kHeadDim, bool kGeneral>
__global__ void __launch_bounds__(kThreads, 1)
    flash_bwd_sm90_kernel(const FlashBwdParams p, const BwdWorkspace w, const __grid_constant__ Sm90BwdMaps maps) {
  namespace sm90 = flashext::sm90;
  using C = Sm90BwdConfig<kHeadDim>;
  constexpr int kBlockM = C::kBlockM, kBlockN = C::kBlockN, kStages = C::kStages, kSlabs = C::kSlabs;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = sm90::smem_addr(smem_raw);
  unsigned char* base = smem_raw + ((1024 - raw % 1024) % 1024);
  unsigned char* smem_k = base + C::kOffK;
  unsigned char* smem_v = base + C::kOffV;
  unsigned char* smem_q = base + C::kOffQ;    // [stage]
  unsigned char* smem_do = base + C::kOffDo;  // [stage]
  unsigned char* smem_ds = base + C::kOffDs;
  float* smem_dq = reinterpret_cast<float*>(base + C::kOffDq);
  float* stats = reinterpret_cast<float*>(base + C::kOffStats);  // [stage][lse₂ kStatsSlot | D kStatsSlot]
  uint64_t* bars = reinterpret_cast<uint64_t*>(base + C::kOffBars);
  uint64_t* kv_full = bars;
  uint64_t* full = bars + 1;             // [kStages]: Q, dO and the stats (transaction bytes)
  uint64_t* empty = bars + 1 + kStages;  // [kStages]: one arrival per consumer thread

  const int warpgroup = threadIdx.x / 128, lane = threadIdx.x % 32;
  const bool ordered = kGeneral && p.deterministic;  // the deterministic dQ: adds in bwd_dq_turn's order
  const int key_block = bwd_key_block(p, ordered);
  const int kv_head = blockIdx.y, batch = blockIdx.z, n_start = key_block * kBlockN;
  // (varlen: a sequence shorter than the longest has CTAs past its keys: the whole CTA leaves)
  const bool varlen = kGeneral && p.cu_seqlens_q != nullptr;
  const auto rows_of_sequence = [&] {
    return varlen ? sequence_rows(p, batch) : SequenceRows{p.seqlen_q, p.seqlen_k, 0, 0};
  };
  if (varlen && n_start >= rows_of_sequence().seqlen_k) return;
  // This sequence's rows (varlen: in the packed tensors, which the maps span as one batch entry),
  // read again in each role after its register reallocation (fewer values live across the
  // producer's drop to 24 registers), as is the schedule. Query i sees key j when
  // i + diag − window_left ≤ j ≤ i + diag + window_right (−1: unbounded; causal is window_right 0),
  // so the query blocks holding a row that sees a key of the block are [m_first, m_end).
  const auto schedule = [&](int seqlen_q, int diag) {
    const int window_left = kGeneral ? p.window_left : -1;
    const int num_m = (seqlen_q + kBlockM - 1) / kBlockM;
    const int m_first = p.window_right >= 0 ? min(num_m, max(0, n_start - diag - p.window_right) / kBlockM) : 0;
    const int m_end = window_left >= 0
                          ? min(num_m, (max(0, n_start + kBlockN - diag + window_left) + kBlockM - 1) / kBlockM)
                          : num_m;
    const int blocks = max(0, m_end - m_first), group = p.heads / p.heads_kv;
    return BwdSchedule{m_first, blocks, group * blocks, kv_head * group};
  };

  if (threadIdx.x == 0) {
    sm90::mbarrier_init(kv_full, 1);
    for (int s = 0; s < kStages; ++s) {
      sm90::mbarrier_init(&full[s], 1);  // thread 0's expect_tx
      sm90::mbarrier_init(&empty[s], kThreads - 128);
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {  // producer
    sm90::setmaxnreg_dec<kProducerRegisters>();
    const SequenceRows seq = rows_of_sequence();
    const int seqlen_q = seq.seqlen_q;
    const BwdSchedule sched = schedule(seqlen_q, p.align_top_left ? 0 : seq.seqlen_k - seqlen_q);
    const int warp = threadIdx.x / 32;
    if (warp == 0 && lane == 0) {
      const int q_row0 = varlen ? int(seq.q_start) : 0, k_row0 = varlen ? int(seq.k_start) : 0;
      const int map_batch = varlen ? 0 : batch;
      sm90::mbarrier_arrive_expect_tx(kv_full, 2 * C::kTileBytesKV);
      for (int slab = 0; slab < kSlabs; ++slab) {
        sm90::tma_load_4d(smem_k + slab * C::kSlabBytesKV, &maps.k, kv_full, 64 * slab, kv_head, k_row0 + n_start,
                          map_batch);
        sm90::tma_load_4d(smem_v + slab * C::kSlabBytesKV, &maps.v, kv_full, 64 * slab, kv_head, k_row0 + n_start,
                          map_batch);
      }
      for (int it = 0; it < sched.iterations; ++it) {
        const int stage = it % kStages, head = sched.head(it), m_start = sched.m_block(it) * kBlockM;
        // The block's statistics rows that exist, in whole 16-byte chunks; the consumers ignore
        // rows past the sequence.
        const BwdStatsSpan span = bwd_stats_span<kBlockM>(w, batch, head, seq.q_start, m_start, seqlen_q);
        const uint32_t stats_bytes = 4 * uint32_t(span.floats);
        if (it >= kStages) sm90::mbarrier_wait(&empty[stage], ((it / kStages) & 1) ^ 1);
        sm90::mbarrier_arrive_expect_tx(&full[stage], 2 * C::kTileBytesQ + 2 * stats_bytes);
        for (int slab = 0; slab < kSlabs; ++slab) {
          sm90::tma_load_4d(smem_q + stage * C::kTileBytesQ + slab * C::kSlabBytesQ, &maps.q, &full[stage], 64 * slab,
                            head, q_row0 + m_start, map_batch);
          sm90::tma_load_4d(smem_do + stage * C::kTileBytesQ + slab * C::kSlabBytesQ, &maps.dout, &full[stage],
                            64 * slab, head, q_row0 + m_start, map_batch);
        }
        float* st = stats + stage * C::kStatsFloats;
        sm90::bulk_load(st, w.lse2 + (span.at - span.shift), stats_bytes, &full[stage]);
        sm90::bulk_load(st + C::kStatsSlot, w.dsum + (span.at - span.shift), stats_bytes, &full[stage]);
      }
    } else if (warp == 1 && ordered) {
      // The deterministic dQ: each step's tile is added after the key blocks that see its query
      // block and come before this one in bwd_dq_turn's order (flash_bwd_kernel.cuh; with a right
      // edge the grid starts from the last key block, key_block), and counted once complete.
      const int diag = p.align_top_left ? 0 : seq.seqlen_k - seqlen_q;
      for (int it = 0; it < sched.iterations; ++it) {
        const int head = sched.head(it), m_block = sched.m_block(it), m_start = m_block * kBlockM;
        sm90::named_barrier_sync(kBarrierDq, 256 + 32);
        if (lane == 0) {
          int* counter = bwd_dq_counter<kBwdCounterRows>(p, w, batch, head, m_start);
          const int turn = bwd_dq_turn<kBlockM, kBlockN>(p, seq.seqlen_k, diag, m_start, key_block);
          while (ptx::ld_acquire(counter) != turn) {
          }
          sm90::fence_proxy_async_global();
          sm90::bulk_reduce_add_f32(sm90_dq_tile<C>(p, w, batch, seq.q_start, m_block, head), smem_dq,
                                    C::kTileBytesDq);
          sm90::bulk_commit_group();
          sm90::bulk_wait_group<0>();
          sm90::fence_proxy_async_global();
          __threadfence();
          atomicAdd(counter, 1);
        }
        __syncwarp();
        if (it + 1 < sched.iterations) sm90::named_barrier_arrive(kBarrierDqFree, 256 + 32);
      }
    }
    return;
  }

  // Consumers: warpgroup c = 0, 1 owns keys 64 c + [0, 64) of the block; this thread keys key0 and
  // key0 + 8 (within the block) in Sᵀ, dPᵀ, dK and dV, and in dQ query rows dq_row0 + 16 warp +
  // lane / 4 (+ 8) of head dims dq_col0 + [0, 64).
  sm90::setmaxnreg_inc<kConsumerRegisters>();
  // (the sequence's first rows are read again where needed: fewer 64-bit values live in the loop)
  int seqlen_q, seqlen_k, q_start_mod4;
  {
    const SequenceRows seq = rows_of_sequence();
    seqlen_q = seq.seqlen_q, seqlen_k = seq.seqlen_k, q_start_mod4 = int(seq.q_start % 4);
  }
  const int diag = p.align_top_left ? 0 : seqlen_k - seqlen_q;
  const BwdSchedule sched = schedule(seqlen_q, diag);
  const int c = warpgroup - 1, warp = (threadIdx.x / 32) % 4, quad = lane % 4;
  const int key0 = 64 * c + 16 * warp + lane / 4;
  const int dq_row0 = C::kDqRow0 * c, dq_col0 = C::kDqCol0 * c;
  // Soft-cap: scores capped = softcap · tanh(raw · scale / softcap). s then holds the tanh and P =
  // 2^(tanh · softcap · log2 e − lse₂); dS picks up d capped / d raw = 1 − tanh² (the scale comes
  // with dK's and dQ's).
  const bool softcap_on = kGeneral && p.softcap > 0.0f;
  const int window_left = kGeneral ? p.window_left : -1;
  const float score_scale = (softcap_on ? p.softcap : p.softmax_scale) * kLog2e;
  const float cap_scale = softcap_on ? p.softmax_scale / p.softcap : 0.0f;

  // dK, dV in the m64nD accumulator layout: element 4 i + 2 r + e holds key key0 + 8 r, dim 8 i + 2 quad + e
  float acc_dk[kHeadDim / 2], acc_dv[kHeadDim / 2];
#pragma unroll
  for (int e = 0; e < kHeadDim / 2; ++e) acc_dk[e] = acc_dv[e] = 0.0f;

  // Varlen: a block's rows past its sequence are the next sequence's (or rows no sequence covers:
  // any bits, NaN included), and they enter products whose zero factors do not cancel them
  // (0 · NaN): zeroed in shared memory once landed (the key block's at the start, a query block's
  // at its step), as the forward zeroes V's; dense tiles end at the tensor's rows (TMA's zeros).
  const auto zero_rows_past = [&](unsigned char* tile, int slab_bytes, int rows, int first) {
    sm90::zero_tile_rows(tile, kSlabs, slab_bytes, rows, first, threadIdx.x - 128, 256);
  };
  // A pair of statistics: one 8-byte load, or two single floats in the general kernel (where a
  // varlen block's statistics start `shift` floats into the stage's slot). The pairs' float
  // indices are even, so a dense pair is 8-byte aligned while the slots and stages are.
  static_assert(C::kOffStats % 8 == 0 && C::kStatsSlot % 2 == 0, "statistics pairs must be 8-byte aligned");
  const auto stat_pair = [&](const float* at) {
    return kGeneral ? make_float2(at[0], at[1]) : *reinterpret_cast<const float2*>(at);
  };
  sm90::mbarrier_wait(kv_full, 0);
  if (varlen && n_start + kBlockN > seqlen_k) {
    zero_rows_past(smem_k, C::kSlabBytesKV, kBlockN, seqlen_k - n_start);
    zero_rows_past(smem_v, C::kSlabBytesKV, kBlockN, seqlen_k - n_start);
    sm90::fence_proxy_async();  // (before wgmma reads them)
    sm90::named_barrier_sync(kBarrierDs, 256);
  }
  // Sᵀ's and dPᵀ's A: this warpgroup's 64 rows of K and V (64 · 128 bytes into every slab).
  const uint64_t desc_k_rows = sm90::smem_descriptor(smem_k + 64 * 128 * c, 16, 1024);
  const uint64_t desc_v_rows = sm90::smem_descriptor(smem_v + 64 * 128 * c, 16, 1024);
  // dQ's B: K's slab dq_col0 / 64 (head dims dq_col0 + [0, 64)) read MN-major, a k16 step 16 keys
  // (2048 bytes) in.
  const uint64_t desc_k_cols =
      sm90::smem_descriptor(smem_k + (dq_col0 / 64) * C::kSlabBytesKV, C::kSlabBytesKV, 1024);
  // dQ's A: dS (queries × keys) K-major, keys 64 h + [0, 64) in slab h; query rows dq_row0 + [0, 64).
  const uint64_t desc_ds = sm90::smem_descriptor(smem_ds + dq_row0 * 128, 16, 1024);

  for (int it = 0; it < sched.iterations; ++it) {
    const int stage = it % kStages, head = sched.head(it), m_block = sched.m_block(it);
    const int m_start = m_block * kBlockM;
    sm90::mbarrier_wait(&full[stage], (it / kStages) & 1);
    unsigned char* q_tile = smem_q + stage * C::kTileBytesQ;
    unsigned char* do_tile = smem_do + stage * C::kTileBytesQ;
    if (varlen && m_start + kBlockM > seqlen_q) {
      zero_rows_past(q_tile, C::kSlabBytesQ, kBlockM, seqlen_q - m_start);
      zero_rows_past(do_tile, C::kSlabBytesQ, kBlockM, seqlen_q - m_start);
      sm90::fence_proxy_async();
      sm90::named_barrier_sync(kBarrierDs, 256);
    }
    // (this block's statistics, bwd_stats_span's shift floats into the stage's slots, m_start being
    // a multiple of 4; dense statistics are 16-byte aligned, shift 0)
    // (varlen statistics are [head][total_q], no batch stride)
    const int shift = varlen ? int((q_start_mod4 + head * (w.stats_head_stride % 4)) % 4) : 0;
    const float* lse2 = stats + stage * C::kStatsFloats + shift;
    const float* dsum = lse2 + C::kStatsSlot;

    // Sᵀ = K_c Qᵀ and dPᵀ = V_c dOᵀ (m64nM): head-dim k16 step kk is slab kk / 4, 32 bytes × (kk % 4)
    // in. Two commit groups, so (D = 128) Pᵀ's exponentials run while dPᵀ's GEMM does.
    float s[kBlockM / 2], dp[kBlockM / 2];
    const uint64_t desc_q = sm90::smem_descriptor(q_tile, 16, 1024);
    const uint64_t desc_do = sm90::smem_descriptor(do_tile, 16, 1024);
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < C::kHeadDim / 16; ++kk) {
      const uint64_t in_slab = uint64_t(2 * (kk % 4));
      wgmma_ss<T, 0>(s, desc_k_rows + uint64_t((kk / 4) * (C::kSlabBytesKV >> 4)) + in_slab,
                     desc_q + uint64_t((kk / 4) * (C::kSlabBytesQ >> 4)) + in_slab, kk > 0);
    }
    sm90::wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < C::kHeadDim / 16; ++kk) {
      const uint64_t in_slab = uint64_t(2 * (kk % 4));
      wgmma_ss<T, 0>(dp, desc_v_rows + uint64_t((kk / 4) * (C::kSlabBytesKV >> 4)) + in_slab,
                     desc_do + uint64_t((kk / 4) * (C::kSlabBytesQ >> 4)) + in_slab, kk > 0);
    }
    sm90::wgmma_commit();

    // The dense D = 64 kernel reads this thread's statistics (query pairs 8 i + 2 quad + {0, 1})
    // from shared memory ahead of their use, so that the loads' latency runs under a GEMM instead
    // of in front of the exponentials and the dS: the first two n8 tiles' before the waits, then
    // each pair of tiles' during the previous pair (holding all pairs of its 128-query step
    // spills). At D = 128 the same reads ahead (all pairs, before Sᵀ's and dPᵀ's waits) measured
    // 1-3 % slower; there, and in the general kernel (which spills with the pairs held), each
    // tile reads its own.
    constexpr bool kEarlyStats = !kGeneral && !C::kExpUnderDp;
    float2 lse_pairs[kBlockM / 8], d_pairs[kBlockM / 8];
    const auto pair_at = [&](const float2(&pairs)[kBlockM / 8], const float* at, int i) {
      if constexpr (kEarlyStats) {
        return pairs[i];
      } else {
        return stat_pair(at + 8 * i + 2 * quad);
      }
    };
    const auto load_tiles = [&](int i0) {  // tiles i0 and i0 + 1
#pragma unroll
      for (int i = i0; i < i0 + 2; ++i) {
        lse_pairs[i] = stat_pair(lse2 + 8 * i + 2 * quad);
        d_pairs[i] = stat_pair(dsum + 8 * i + 2 * quad);
      }
    };
    if constexpr (kEarlyStats) load_tiles(0);
    if constexpr (C::kExpUnderDp) {
      sm90::wgmma_wait<1>();  // Sᵀ is in (groups retire in order); dPᵀ still runs (the schedules below)
      sm90::fence_operands(s);
    } else {
      sm90::wgmma_wait<0>();  // Sᵀ and dPᵀ are in
      sm90::fence_operands(s);
      sm90::fence_operands(dp);
    }

    // Pᵀ rounded to T (for dV), and in s, fp32, Pᵀ times the soft-cap's derivative where capped
    // (for dS). Element 4 i + 2 r + e: key key0 + 8 r, query m_start + 8 i + 2 quad + e. The mask
    // only where the block crosses a window's edge or the keys' end; rows past the sequence (their
    // stats not copied, or the next sequence's: whatever the stage holds) get P = 0 and D = 0.
    if (softcap_on) {  // (a uniform branch around the loop)
#pragma unroll
      for (int e = 0; e < kBlockM / 2; ++e) s[e] = tanhf(s[e] * cap_scale);
    }
    const bool masked = (p.window_right >= 0 && n_start + kBlockN - 1 > m_start + diag + p.window_right) ||
                        (window_left >= 0 && n_start < m_start + kBlockM - 1 + diag - window_left) ||
                        n_start + kBlockN > seqlen_k;
    const bool tail = m_start + kBlockM > seqlen_q;
    // Query rows are compared as offsets from `origin` (C::kQueryOffsets: this thread's first query
    // row, so that an element's offset 8 i + e is a constant; else 0).
    const int origin = C::kQueryOffsets ? m_start + 2 * quad : 0;
    const int m_rel = m_start - origin, seq_end = seqlen_q - origin;
    // Where masked, this thread's key rows r see queries [q_lo[r], q_hi[r]) (none past the keys)
    int q_lo[2] = {INT32_MIN, INT32_MIN}, q_hi[2] = {INT32_MAX, INT32_MAX};
    if (masked) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int key = n_start + key0 + 8 * r;
        if (p.window_right >= 0) q_lo[r] = key - diag - p.window_right - origin;
        if (window_left >= 0) q_hi[r] = key - diag + window_left + 1 - origin;
        if (key >= seqlen_k) q_hi[r] = INT32_MIN;
      }
    }
    uint32_t p16[kBlockM / 8][2], ds16[kBlockM / 8][2];
    // The tiles below take `checked` (std::bool_constant): whether the step applies the mask and
    // the tail rows at all. A uniform branch picks the step's code: with run-time `masked` and
    // `tail` inside, the compiler evaluates the (then neutral) comparisons and selects of every
    // element in every step, close to a third of the full backward's instructions.
    // Pᵀ of the n8 tile i (queries m_start + 8 i + [0, 8)): into p16[i] and s
    const auto p_tile = [&](int i, auto checked) {
      float2 l2 = pair_at(lse_pairs, lse2, i);
      if (decltype(checked)::value && tail) {
        const int query = m_rel + 8 * i + 2 * quad;
        if (query >= seq_end) l2.x = INFINITY;
        if (query + 1 >= seq_end) l2.y = INFINITY;
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float pr[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int idx = 4 * i + 2 * r + e;
          float pe = ptx::exp2_approx(fmaf(s[idx], score_scale, -(e == 0 ? l2.x : l2.y)));  // +inf lse₂ → 0
          if (decltype(checked)::value && masked) {
            const int query = m_rel + 8 * i + 2 * quad + e;
            if (query < q_lo[r] || query >= q_hi[r]) pe = 0.0f;
          }
          pr[e] = pe;
          s[idx] = softcap_on ? pe * (1.0f - s[idx] * s[idx]) : pe;
        }
        p16[i][r] = ptx::pack2<T>(pr[0], pr[1]);
      }
    };
    // dSᵀ = Pᵀ ∘ (dPᵀ − D) of the n8 tile i, from s (Pᵀ, soft-capped) and dp: into ds16[i]
    const auto ds_tile = [&](int i, auto checked) {
      float2 dd = pair_at(d_pairs, dsum, i);
      if (decltype(checked)::value && tail) {
        const int query = m_rel + 8 * i + 2 * quad;
        if (query >= seq_end) dd.x = 0.0f;
        if (query + 1 >= seq_end) dd.y = 0.0f;
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int idx = 4 * i + 2 * r;
        ds16[i][r] = ptx::pack2<T>(s[idx] * (dp[idx] - dd.x), s[idx + 1] * (dp[idx + 1] - dd.y));
      }
    };
    // dV_c += Pᵀ dO, and later dK_c += dSᵀ Q (m64nD): query k16 step kk is n8 tiles 2 kk and 2 kk + 1
    // (the A fragment); dO and Q MN-major, head dims in D / 64 slabs (the leading offset), 16 rows
    // per step.
    const uint64_t desc_do_cols = sm90::smem_descriptor(do_tile, C::kSlabBytesQ, 1024);
    const uint64_t desc_q_cols = sm90::smem_descriptor(q_tile, C::kSlabBytesQ, 1024);
    const auto dv_step = [&](int kk) {
      const uint32_t a[4] = {p16[2 * kk][0], p16[2 * kk][1], p16[2 * kk + 1][0], p16[2 * kk + 1][1]};
      wgmma_rs<T, 1>(acc_dv, a, desc_do_cols + uint64_t(128 * kk), 1);
    };
    // (the general kernel at D = 128 checks every step: the two versions spill there)
    const bool edge_step = kGeneral && kHeadDim == 128 ? true : masked || tail;
    const auto either = [&](auto tiles) {  // tiles(std::bool_constant): ALU code only, no wgmma
      if (edge_step) {
        tiles(std::true_type{});
      } else {
        tiles(std::false_type{});
      }
    };
    if constexpr (C::kExpUnderDp) {
      // D = 128: Pᵀ while dPᵀ's GEMM runs; dV issued as soon as Pᵀ is in (while dPᵀ may still run),
      // then dSᵀ while dV's GEMM runs.
      either([&](auto check) {
#pragma unroll
        for (int i = 0; i < kBlockM / 8; ++i) p_tile(i, check);
      });
#pragma unroll
      for (int i = 0; i < kBlockM / 8; ++i) sm90::fence_operands(p16[i]);
      sm90::fence_operands(acc_dv);
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) dv_step(kk);
      sm90::wgmma_commit();
      sm90::wgmma_wait<1>();  // dPᵀ is in; dV still runs
      sm90::fence_operands(dp);
      either([&](auto check) {
#pragma unroll
        for (int i = 0; i < kBlockM / 8; ++i) ds_tile(i, check);
      });
    } else {
      // D = 64: Sᵀ and dPᵀ both waited for, then Pᵀ and dSᵀ two tiles at a time, dV's k16 step kk
      // issued as soon as its tiles 2 kk and 2 kk + 1 of Pᵀ are in, so that Sᵀ's and dPᵀ's registers
      // free as Pᵀ's and dSᵀ's fill (issuing all of dV after the loop lets later tiles' exponentials
      // run early).
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        if constexpr (kEarlyStats) {
          if (kk + 1 < kBlockM / 16) load_tiles(2 * kk + 2);
        }
        either([&](auto check) {
#pragma unroll
          for (int i = 2 * kk; i < 2 * kk + 2; ++i) {
            p_tile(i, check);
            ds_tile(i, check);
          }
        });
        sm90::fence_operands(p16[2 * kk]);
        sm90::fence_operands(p16[2 * kk + 1]);
        if (kk == 0) sm90::fence_operands(acc_dv);
        sm90::wgmma_fence();
        dv_step(kk);
      }
      sm90::wgmma_commit();
    }
    // dS into shared memory: query j, key 64 c + kl at slab c, row j, 16-byte chunk kl / 8 ^ j % 8
    // (the 128-byte swizzle). dSᵀ's fragment (i, r) is an 8 × 8 matrix of keys 16 warp + 8 r +
    // [0, 8) × queries 8 i + [0, 8); stored transposed, its row jj (query 8 i + jj) is the 16-byte
    // chunk 2 warp + r of that query's row: M / 16 stmatrix.trans per warp, fragments 2 t and 2 t + 1
    // (lane 8 m + jj addresses row jj of matrix m = 2 (i − 2 t) + r). They go before dK is
    // issued, which takes ds16 as its A registers: a wgmma's A registers may not be accessed at all
    // (read or written) until its group retires. Both consumers' halves must be in before either
    // reads them, and the last bulk add must have read the dQ buffer before it is rewritten (its
    // issuer waits first).
    {
      const int m = lane / 8, jj = lane % 8;
      unsigned char* row = smem_ds + c * C::kSlabBytesDs + (8 * (m / 2) + jj) * 128 + (((2 * warp + m % 2) ^ jj) << 4);
#pragma unroll
      for (int t = 0; t < kBlockM / 16; ++t) {
        sm90::stmatrix_x4_trans(row + t * 16 * 128, ds16[2 * t][0], ds16[2 * t][1], ds16[2 * t + 1][0],
                                ds16[2 * t + 1][1]);
      }
    }
#pragma unroll
    for (int i = 0; i < kBlockM / 8; ++i) sm90::fence_operands(ds16[i]);
    sm90::fence_operands(acc_dk);
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      const uint32_t a[4] = {ds16[2 * kk][0], ds16[2 * kk][1], ds16[2 * kk + 1][0], ds16[2 * kk + 1][1]};
      wgmma_rs<T, 1>(acc_dk, a, desc_q_cols + uint64_t(128 * kk), 1);
    }
    sm90::wgmma_commit();  // (dV and dK run while dS is ordered for the async proxy and dQ is issued)

    sm90::fence_proxy_async();  // (the generic stores before wgmma's async-proxy reads)
    if (threadIdx.x == 128) sm90::bulk_wait_group_read<0>();
    sm90::named_barrier_sync(kBarrierDs, 256);

    // dQ[dq_row0 + [0, 64), dq_col0 + [0, 64)] = dS[dq_row0 + [0, 64), :] K[:, dq_col0 + [0, 64)] over
    // the block's 128 keys: key k16 step kk is dS's slab kk / 4, 32 bytes × (kk % 4) in, and K's rows
    // 16 kk (2048 bytes × kk).
    float dq[32];
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      sm90::wgmma_m64n64k16_ss<T, 1>(dq, desc_ds + uint64_t((kk / 4) * (C::kSlabBytesDs >> 4) + 2 * (kk % 4)),
                                     desc_k_cols + uint64_t(128 * kk), kk > 0);
    }
    sm90::wgmma_commit();
    sm90::wgmma_wait<0>();  // dV, dK and dQ
    sm90::fence_operands(acc_dv);
    sm90::fence_operands(acc_dk);
    sm90::fence_operands(dq);
#pragma unroll
    for (int i = 0; i < kBlockM / 8; ++i) {
      sm90::fence_operands(p16[i]);
      sm90::fence_operands(ds16[i]);
    }
    // This stage's Q, dO and stats are read for the last time: the producer may refill it. Every
    // consumer thread arrives: an arrival releases only the arriving thread's own reads (of the
    // stats, by generic loads), so no thread may arrive for another.
    sm90::mbarrier_arrive(&empty[stage]);

    // dQ (fp32) row-major (chunks permuted, sm90_dq_col) into shared memory (rows dq_row0 + 16 warp +
    // lane / 4 + 8 r, dims dq_col0 + 8 i + 2 quad + e), then one bulk reduce-add of the M × D tile into
    // dq_accum. (After the barrier both warpgroups are also done reading dS, so the next iteration
    // may rewrite it.) Deterministic: the producer's warp 1 adds it, in turn, and frees the buffer.
    if (ordered && it > 0) sm90::named_barrier_sync(kBarrierDqFree, 256 + 32);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = dq_row0 + 16 * warp + lane / 4 + 8 * r, col = dq_col0 + 8 * i + 2 * quad;
        *reinterpret_cast<float2*>(smem_dq + row * C::kHeadDim + sm90_dq_col(row, col)) =
            make_float2(dq[4 * i + 2 * r], dq[4 * i + 2 * r + 1]);
      }
    }
    sm90::fence_proxy_async();
    sm90::named_barrier_sync(kBarrierDq, ordered ? 256 + 32 : 256);
    if (!ordered && threadIdx.x == 128) {
      sm90::bulk_reduce_add_f32(sm90_dq_tile<C>(p, w, batch, rows_of_sequence().q_start, m_block, head),
                                smem_dq, C::kTileBytesDq);
      sm90::bulk_commit_group();
    }
  }

  // dK · scale and dV out through shared memory by TMA: consumer c's 64 key rows of each as D / 64
  // 64-column slabs (128-byte swizzled, as the maps' boxes are), in Q's and dO's stages (c = 0 Q's,
  // 1 dO's), free once both consumers' last GEMMs have retired: the last step's dQ barrier comes
  // after each one's final wait. Rows past the keys are left out by the maps; varlen: a box that
  // would reach past its sequence (into the next one's rows) is copied out by the warpgroup instead.
  {
    unsigned char* out = smem_q + c * C::kStages * C::kTileBytesQ;  // dK's slabs, then dV's
    constexpr int kSlabBytesOut = (kBlockN / 2) * 128;
    static_assert(2 * C::kSlabs * kSlabBytesOut <= C::kStages * C::kTileBytesQ,
                  "Q's (dO's) stages hold consumer 0's (1's) dK and dV");
    static_assert(kBlockN / 2 == 64, "a consumer's keys are the 64 rows stmatrix_accumulator writes");
    sm90::stmatrix_accumulator<T, C::kHeadDim>(out, kSlabBytesOut, acc_dk, p.softmax_scale, p.softmax_scale);
    sm90::stmatrix_accumulator<T, C::kHeadDim>(out + C::kSlabs * kSlabBytesOut, kSlabBytesOut, acc_dv, 1.0f, 1.0f);
    sm90::fence_proxy_async();  // (the generic stores before the TMA's reads)
    sm90::named_barrier_sync(kBarrierDs, 256);
    const int first_key = n_start + (kBlockN / 2) * c;
    if (varlen && first_key + kBlockN / 2 > seqlen_k) {
      // 16-byte chunks of the rows in the sequence: chunk h of a row is slab h / 8, swizzled h % 8
      // (of a head dim under the kernel's, only the tensors' own chunks).
      const int64_t k_row = rows_of_sequence().k_start + first_key;
      T* dk = static_cast<T*>(p.dk) + k_row * p.dk_row_stride + int64_t(kv_head) * p.dk_head_stride;
      T* dv = static_cast<T*>(p.dv) + k_row * p.dv_row_stride + int64_t(kv_head) * p.dv_head_stride;
      constexpr int kChunks = C::kHeadDim / 8;
      for (int i = threadIdx.x % 128; i < (seqlen_k - first_key) * kChunks; i += 128) {
        const int row = i / kChunks, h = i % kChunks;
        if (8 * h >= p.head_dim) continue;
        const unsigned char* at = out + (h / 8) * kSlabBytesOut + row * 128 + (((h % 8) ^ (row % 8)) << 4);
        *reinterpret_cast<uint4*>(dk + int64_t(row) * p.dk_row_stride + 8 * h) = *reinterpret_cast<const uint4*>(at);
        *reinterpret_cast<uint4*>(dv + int64_t(row) * p.dv_row_stride + 8 * h) =
            *reinterpret_cast<const uint4*>(at + C::kSlabs * kSlabBytesOut);
      }
    } else if (threadIdx.x % 128 == 0) {
      const int key_row = int(rows_of_sequence().k_start) + first_key;
      const int map_batch = varlen ? 0 : batch;
      for (int slab = 0; slab < C::kSlabs; ++slab) {
        sm90::tma_store_4d(&maps.dk, out + slab * kSlabBytesOut, 64 * slab, kv_head, key_row, map_batch);
        sm90::tma_store_4d(&maps.dv, out + (C::kSlabs + slab) * kSlabBytesOut, 64 * slab, kv_head, key_row,
                           map_batch);
      }
      sm90::bulk_commit_group();
    }
    // (this thread's dQ adds and dK / dV stores have read their shared memory before the CTA exits)
    if (threadIdx.x % 128 == 0) sm90::bulk_wait_group_read<0>();
  }
}

// dq = dq_accum · softmax_scale: a block per (query block, head, batch entry), row-major tiles
// (chunks permuted by sm90_dq_col).
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(128) flash_bwd_sm90_convert_dq(const FlashBwdParams p, const BwdWorkspace w) {
  using C = Sm90BwdConfig<kHeadDim>;
  constexpr int kBlockM = C::kBlockM;
  const int m_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const SequenceRows seq = sequence_rows(p, batch);
  if (m_block * kBlockM >= seq.seqlen_q) return;
  const float* tile = sm90_dq_tile<C>(p, w, batch, seq.q_start, m_block, head);
  T* dq = static_cast<T*>(p.dq) +
          (p.cu_seqlens_q != nullptr ? seq.q_start * p.dq_row_stride : int64_t(batch) * p.dq_batch_stride) +
          int64_t(head) * p.dq_head_stride;
  for (int pair = threadIdx.x; pair < kBlockM * kHeadDim / 2; pair += blockDim.x) {
    const int row = pair / (kHeadDim / 2), col = 2 * (pair % (kHeadDim / 2));
    const int query = m_block * kBlockM + row;
    if (query >= seq.seqlen_q) break;  // (rows ascend with pair)
    if (col >= p.head_dim) continue;   // (a head dim under the kernel's: dq has only its own columns)
    const float2 a = *reinterpret_cast<const float2*>(tile + row * kHeadDim + sm90_dq_col(row, col));
    *reinterpret_cast<uint32_t*>(dq + int64_t(query) * p.dq_row_stride + col) =
        ptx::pack2<T>(a.x * p.softmax_scale, a.y * p.softmax_scale);
  }
}

template <typename T, int kHeadDim>
cudaError_t launch_bwd_sm90(const FlashBwdParams& p, void* workspace, cudaStream_t stream) {
  using C = Sm90BwdConfig<kHeadDim>;
  const BwdWorkspace w = bwd_workspace<C::kHeadDim>(p, workspace);
  FX_RETURN_IF_ERROR(launch_bwd_preprocess<T>(p, w, stream));
  Sm90BwdMaps maps;
  // Varlen: the maps span the packed rows as one batch entry (a sequence's blocks start at its
  // first row; rows past it are the next sequence's, which the masks and statistics zero out).
  // The maps span the tensors' own head dim: columns past it load as zeros, and stores skip them.
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q, rows_k = varlen ? p.total_k : p.seqlen_k;
  const int map_batches = varlen ? 1 : p.batch;
  FX_RETURN_IF_ERROR(make_tma_attention_map(&maps.q, p.q, p.head_dim, p.heads, rows_q, map_batches,
                                            p.q_row_stride, p.q_head_stride, p.q_batch_stride, C::kBlockM));
  FX_RETURN_IF_ERROR(make_tma_attention_map(&maps.dout, p.dout, p.head_dim, p.heads, rows_q, map_batches,
                                            p.do_row_stride, p.do_head_stride, p.do_batch_stride, C::kBlockM));
  FX_RETURN_IF_ERROR(make_tma_attention_map(&maps.k, p.k, p.head_dim, p.heads_kv, rows_k, map_batches,
                                            p.k_row_stride, p.k_head_stride, p.k_batch_stride, C::kBlockN));
  FX_RETURN_IF_ERROR(make_tma_attention_map(&maps.v, p.v, p.head_dim, p.heads_kv, rows_k, map_batches,
                                            p.v_row_stride, p.v_head_stride, p.v_batch_stride, C::kBlockN));
  FX_RETURN_IF_ERROR(make_tma_attention_map(&maps.dk, p.dk, p.head_dim, p.heads_kv, rows_k, map_batches,
                                            p.dk_row_stride, p.dk_head_stride, p.dk_batch_stride, C::kBlockN / 2));
  FX_RETURN_IF_ERROR(make_tma_attention_map(&maps.dv, p.dv, p.head_dim, p.heads_kv, rows_k, map_batches,
                                            p.dv_row_stride, p.dv_head_stride, p.dv_batch_stride, C::kBlockN / 2));
  const bool general = p.window_left >= 0 || p.softcap > 0.0f || varlen || p.deterministic;
  auto kernel = general ? flash_bwd_sm90_kernel<T, kHeadDim, true> : flash_bwd_sm90_kernel<T, kHeadDim, false>;
  FX_RETURN_IF_ERROR(allow_dynamic_smem(kernel, C::kSmemBytes));
  const dim3 grid(unsigned((p.seqlen_k + C::kBlockN - 1) / C::kBlockN), unsigned(p.heads_kv), unsigned(p.batch));
  kernel<<<grid, kThreads, C::kSmemBytes, stream>>>(p, w, maps);
  FX_RETURN_IF_ERROR(cudaGetLastError());
  if (p.seqlen_q > 0) {
    const dim3 convert_grid(unsigned((p.seqlen_q + C::kBlockM - 1) / C::kBlockM), unsigned(p.heads), unsigned(p.batch));
    flash_bwd_sm90_convert_dq<T, kHeadDim><<<convert_grid, 128, 0, stream>>>(p, w);
  }
  return cudaGetLastError();
}

}  // namespace
}  // namespace attention_detail

bool flash_bwd_sm90_takes(const FlashBwdParams& p) {
  // The TMA maps: 16-byte aligned tensors and strides (in elements, multiples of 8).
  const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  const auto strides = [](int64_t a, int64_t b, int64_t c) { return a % 8 == 0 && b % 8 == 0 && c % 8 == 0; };
  // Varlen: both offsets, packed rows the maps' int32 coordinates reach.
  const bool varlen = p.cu_seqlens_q != nullptr;
  const bool rows = varlen ? p.cu_seqlens_k != nullptr && p.total_q > 0 && p.total_k > 0 && p.total_q <= INT32_MAX &&
                                 p.total_k <= INT32_MAX
                           : p.cu_seqlens_k == nullptr;
  const int kernel_head_dim = flash_fwd_kernel_head_dim(p.head_dim);  // (its kernels: 64 and 128)
  return (kernel_head_dim == 64 || kernel_head_dim == 128) && rows && p.block_mask == nullptr &&
         p.softcap >= 0.0f && p.lse != nullptr && p.batch >= 0 && p.heads > 0 &&
         p.heads_kv > 0 && p.heads % p.heads_kv == 0 && p.seqlen_q > 0 && p.seqlen_k > 0 && aligned(p.q) &&
         aligned(p.k) && aligned(p.v) && aligned(p.dout) && aligned(p.dk) && aligned(p.dv) &&
         strides(p.q_batch_stride, p.q_row_stride, p.q_head_stride) &&
         strides(p.k_batch_stride, p.k_row_stride, p.k_head_stride) &&
         strides(p.v_batch_stride, p.v_row_stride, p.v_head_stride) &&
         strides(p.do_batch_stride, p.do_row_stride, p.do_head_stride) &&
         strides(p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride) &&
         strides(p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
}

cudaError_t run_flash_bwd_sm90(const FlashBwdParams& p, void* workspace, cudaStream_t stream) {
  using namespace attention_detail;
  // (the workspace's bulk copies and reductions need 16-byte alignment; the contract is 256)
  if (!flash_bwd_sm90_takes(p) || workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 256 != 0) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0) return cudaSuccess;
  return with_16bit_type(p.dtype, cudaErrorInvalidValue, [&](auto type) {
    using T = typename decltype(type)::type;
    return flash_fwd_kernel_head_dim(p.head_dim) == 64 ? launch_bwd_sm90<T, 64>(p, workspace, stream)
                                                       : launch_bwd_sm90<T, 128>(p, workspace, stream);
  });
}

}  // namespace flashext
