// flashext FlashAttention forward on Hopper (sm_90a): the design in
// docs/notes/attention_sm90_fwd.md (versions and figures there) with the
// overlap inside a warpgroup (block j's softmax while block j - 1's P V runs)
// (flash_fwd_sm90.h says who calls, checks and times it).
//
// D = 64, 128 and 256 (other multiples of 8 up to 256 on the next of these: the TMA reads q, k
// and v's columns past their head dim as zeros, and the epilogue stores only O's own), dense or
// packed varlen batches, fp16 / bf16. A CTA per (query block of 192 rows at D = 64 unless a causal
// or windowed call's rows see under 4K keys, else 128, head, sequence): warpgroup 0 is the
// producer (one thread issues every TMA), warpgroups 1, 2 (and 3) consume 64 query rows each. Q
// and two stages of K and V (four at D = 64) live in shared memory as 64-column slabs with the
// 128-byte swizzle (TMA writes them so; wgmma reads them so). Per key block, each consumer:
// S = Q Kᵀ (wgmma SS, m64nN with N the block's keys), the online softmax in registers, O += P V
// (wgmma RS: P from registers, V read MN-major as stored; n64 or n128 per instruction), then
// releases the stage. A CTA walks tiles (query block, head, sequence), the last query blocks of a
// head first: a CTA per SM striding over tiles of equal work (no mask) or over causal units of two
// tiles of equal work together (query blocks m and num_m − 1 − m; at D = 256 the shorter first),
// where the producer loads the next tile's Q (a second buffer where it fits) and first K / V during
// this tile's last blocks and epilogue; one tile per CTA for windowed and varlen calls (tiles of
// unequal work, which the hardware's block scheduler balances). K and V have full barriers of their
// own (one arrival plus the tile's bytes), so S starts while V still lands (at D ≤ 128; D = 256
// waits for V first, kWaitVBeforeS). K and V have empty barriers of their own too (one arrival per
// consumer warpgroup): a K stage is free once its S has retired, a V stage once its P V has, and
// the producer loads V one block behind K, so the next K never waits behind a V release. A dense
// call's O leaves through shared memory: each consumer warpgroup writes its 64 rows to its part of
// an O tile (stmatrix) and one of its threads stores them by TMA, so the warpgroup goes on to its
// next tile while the copy engine writes; at D = 256, where no O tile fits, through a stage of the
// tile's last block (warpgroup 0 K's, 1 V's), released once the copy has read it. (Varlen calls,
// D = 256 tiles with no key block and outputs no map can address write O from registers.)
//
//   D     query × key block   shared memory (Q buffers + stages × (K + V) + O)   registers per consumer thread
//   64    192 × 128           2 · 24 + 4 · (16 + 16) + 24 = 200 KiB       S 64, O 32, P 32 (of 160)
//         128 × 128 masked    2 · 16 + 4 · (16 + 16) + 16 = 176 KiB       S 64, O 32, P 32 (of 240)
//   128   128 × 128           2 · 32 + 2 · (32 + 32) + 32 = 224 KiB       S 64, O 64, P 32
//   256   128 × 64            64 + 2 · (32 + 32) = 192 KiB                S 32, O 128, P 16
//         128 × 80 unmasked   64 + 2 · (40 + 40) = 224 KiB                S 40, O 128, P 20
// FLOPs per key block and consumer warpgroup: 4 · 64 · N · D (S and P V), 4 MFLOP at D = 128.
// At D = 64 a warpgroup's exponentials (8K per block) take about as long as its two GEMMs, so a
// third consumer warpgroup keeps the tensor cores fed while the other two exponentiate (as
// FlashAttention-3 does there); at D = 128 and 256 the GEMMs dominate and two suffice, and at
// D = 128 they take turns issuing them (kPingPong: one's softmax runs under the other's GEMMs).
// At D = 128 and in D = 64's 192-row kernels a tile's epilogue runs under the GEMMs
// beside it: its row sums and lse under its last P V, its O under the next tile's first S
// (kEpilogueUnderGemms).
// Causal and windowed calls at D = 64 whose rows see under 4K keys take 128-row blocks on two (a
// third less masked work on the diagonal blocks). Those, and unmasked dense D = 64 calls under 2K
// keys (192 rows), run the short-tile form (Sm90FwdConfig::kShortTiles).
//
// Varlen: the TMA maps span the packed rows (batch dim 1) and a sequence's tiles start at its
// first row, so a tile's rows past the sequence belong to the next one (or are zero past the
// tensor): masked as keys, never written as queries, and, in V, zeroed in shared memory before
// P V reads them (P is 0 there, but 0 · inf or 0 · NaN from another sequence's rows is not).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../common/device.h"
#include "../common/online_softmax.h"
#include "../common/ptx.cuh"
#include "../common/sm90.cuh"
#include "../common/tma.h"
#include "../common/vec.cuh"
#include "dispatch.h"
#include "tiles.cuh"
#include "flash_fwd_sm90.h"
#include "sm90_tile_walk.h"
#include "flashext/common.h"

namespace flashext {
namespace attention_detail {
namespace {

// Tiles per head dim (the table above). A tile of R rows is D / 64 slabs of R × 128 bytes.
template <int kHeadDim_, int kBlockN_ = (kHeadDim_ <= 128 ? 128 : 64), int kBlockM_ = (kHeadDim_ == 64 ? 192 : 128),
          bool kShortTiles_ = false>
struct Sm90FwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kConsumers = kBlockM / 64;  // consumer warpgroups, 64 query rows each
  static constexpr int kThreads = 128 * (1 + kConsumers);
  // Registers: the block starts at 65536 / kThreads each, rounded down to a multiple of 8
  // (__launch_bounds__ pins it: 168 with two consumer warpgroups, 128 with three); the producer
  // gives up all but 24 and the consumers take at most what it gave (setmaxnreg.inc draws only on
  // what setmaxnreg.dec released, and waits for it otherwise), a multiple of 8: 240 with two (all
  // of it), 160 with three.
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters =
      std::min(240, (kLaunchRegisters + (kLaunchRegisters - kProducerRegisters) / kConsumers) / 8 * 8);
  static_assert((kLaunchRegisters - kProducerRegisters) >= (kConsumerRegisters - kLaunchRegisters) * kConsumers,
                "setmaxnreg.inc takes only what setmaxnreg.dec gave back");
  static constexpr int kBlockN = kBlockN_;
  // Whether head dims under kHeadDim run here (the epilogue then stops at O's own columns). The
  // 80-key D = 256 kernel takes D = 256 alone: that check cost it 2-3 % (A/B at fd01ad4).
  static constexpr bool kNarrowHeadDims = kBlockN != 80;
  // K and V stages: four each at D = 64, where shared memory is to spare (a stage is refilled only
  // once the slowest consumer warpgroup has released it, so more stages give a load more time to
  // land when the warpgroups drift apart); two elsewhere. Three at D = 128, with one Q buffer and
  // no O tile, cost 5-10 % at S ≤ 1K and gained nothing at 8K (H100 A/B at 47f8242).
  static constexpr int kStages = kHeadDim == 64 ? 4 : 2;
  // Whether a block's wait for the previous block's V comes before its S is issued (D = 256) or
  // while S runs (D ≤ 128). H100 A/B at 10ded41 of V first: D = 256 +0-6 % (causal S ≥ 2K
  // +4-6 %), D = 128 −3 to −4 % non-causal.
  static constexpr bool kWaitVBeforeS = kHeadDim == 256;
  // Whether a causal unit's shorter tile comes first (sm90_tile_walk.h), so that the longer one
  // rereads their shared first K / V blocks from L2, not DRAM: at D = 256, where the heads in
  // flight fill most of the L2 (+5 % at causal S = 512); at D ≤ 128 it paid nothing
  // (docs/notes/attention_sm90_fwd.md, "A causal unit's shorter tile first at D = 256").
  static constexpr bool kShortTileFirst = kHeadDim == 256;
  // The two consumer warpgroups take turns issuing their GEMMs (FlashAttention-3's ping-pong):
  // at D = 128, where a block's GEMMs take about as long as the other warpgroup's softmax. H100
  // A/B at 4e6e00f: causal S = 512-2K +1-4 %, full flat. On D = 64's 128-row blocks it cost
  // 1-3 % at causal 1K-2K (the exponentials there cost as much as the GEMMs), so not there.
  static constexpr bool kPingPong = kHeadDim == 128 && kBlockM == 128;
  // Whether a tile's epilogue runs under the GEMMs beside it: its row sums, 1 / l and lse under its
  // last P V, and its O (stmatrix and TMA store, or the register stores) under the next tile's
  // first S. At D = 128 both consumer warpgroups reach a tile's end within a GEMM turn of each
  // other, and the tensor cores idled through both epilogues until the next tile's first S (the
  // timeline at D = 128 full 1K: 2.2-2.45 µs per warpgroup from the last P V to the next tile's
  // first softmax; the sums and lse about 0.5 µs of it, O's stores 0.35 µs). H100 A/Bs, S = 512-4K,
  // full and causal, two rounds each: at D = 128 the sums and lse (52ec079) +1 % (+0.3-2.7 % in 15
  // of 16 measurements), O under the next S (2ee89d4) another +1.4 % (+0.4-2.5 % in 15 of 16); in
  // D = 64's 192-row kernels both (2865a26, bf16 and fp16) +1.4 % (full 512-2K +1-3 %, full 1K
  // +0.7-2.5 %). Not in D = 64's 128-row kernel (its first block runs inside its key loop, so no
  // first S stands apart to hide O under; the sums alone cost it 3-7 % at causal S ≤ 1K) nor at
  // D = 256 (O leaves through a K / V stage; the sums alone were flat there).
  static constexpr bool kEpilogueUnderGemms = kPingPong || kConsumers == 3;
  static constexpr int kSlabs = kHeadDim / 64;
  static constexpr int kSlabBytesQ = kBlockM * 128, kTileBytesQ = kSlabs * kSlabBytesQ;
  static constexpr int kSlabBytesKV = kBlockN * 128, kTileBytesKV = kSlabs * kSlabBytesKV;
  // At D <= 128 an O tile (Q's shape; each consumer warpgroup's 64 rows a part of their own) for
  // the TMA store of dense calls' outputs (at D = 256 the tile does not fit beside the stages)
  static constexpr int kTileBytesO = kHeadDim <= 128 ? kTileBytesQ : 0;
  // At D = 256, where no O tile fits, each consumer warpgroup writes its 64 rows through a stage of
  // the tile's last key block instead (warpgroup 0 the K stage, 1 the V stage: 64 · 512 bytes, a
  // stage's size at 64 keys), and releases that stage once its TMA store has read it.
  static constexpr bool kOInStage = kTileBytesO == 0;
  static_assert(!kOInStage || (kConsumers == 2 && 64 * kHeadDim * 2 <= kTileBytesKV),
                "O in a stage: two consumer warpgroups, 64 rows each within a stage");
  // The short-tile form, for D = 64's short tiles only: the 128-row kernel (causal and windowed
  // calls under 4K visible keys: tiles of at most 32 key blocks, most of them a few) and a 192-row
  // kernel for unmasked dense calls under 2K keys. The shared memory taken at its declared 1024-byte
  // alignment, the approximate reciprocal and log2 of the epilogue, the producer's suspended
  // waits, and (128 rows: the 192-row kernel's 160 registers spill with it) the right diagonal's
  // one comparison per two scores. They pay where a tile has few key blocks; elsewhere they cost
  // (docs/notes/attention_sm90_fwd.md, "The short-tile form").
  static constexpr bool kShortTiles = kShortTiles_;
  // Whether a tile's first block is peeled off the key loop (its S alone, then its softmax) or
  // runs as the loop's first iteration with an empty wgmma group in its P V's place, which keeps
  // one copy of the softmax in the machine code instead of two: +2-3 % at D = 64 causal 512, whose
  // tiles are short; at D = 128 it lost up to 8 %, and the 192-row kernel spills with it
  // (docs/notes/attention_sm90_fwd.md, "A tile's first block inside the key loop").
  static constexpr bool kPeelFirstBlock = !(kShortTiles && kConsumers == 2);
  static constexpr int kAlignSlack = kShortTiles ? 0 : 1024;
  // Two Q buffers where they fit (the next tile's Q lands during this tile's last blocks), else one
  static constexpr int kQStages =
      2 * kTileBytesQ + 2 * kStages * kTileBytesKV + kTileBytesO + kAlignSlack + 256 <= 227 * 1024 ? 2 : 1;
  // Q, the K and V stages, O, the alignment slack (where the base is rounded up at run time), the
  // barriers
  static constexpr int kSmemBytes =
      kQStages * kTileBytesQ + 2 * kStages * kTileBytesKV + kTileBytesO + kAlignSlack + 256;
  static_assert(kHeadDim % 64 == 0 && kSmemBytes <= 227 * 1024, "tiles must fit shared memory");
};


// S (+)= Q Kᵀ for one k16 step: m64nN SS with N the key block.
template <typename T, int kBlockN>
__device__ __forceinline__ void qk_step(float (&s)[kBlockN / 2], uint64_t desc_q, uint64_t desc_k, int accumulate) {
  if constexpr (kBlockN == 128) {
    flashext::sm90::wgmma_m64n128k16_ss<T, 0>(s, desc_q, desc_k, accumulate);
  } else if constexpr (kBlockN == 64) {
    flashext::sm90::wgmma_m64n64k16_ss<T, 0>(s, desc_q, desc_k, accumulate);
  } else {
    flashext::sm90::wgmma_m64nNk16_ss<T, kBlockN>(s, desc_q, desc_k, accumulate);
  }
}

// O += P V for one k16 step of keys: the D columns of V in instructions of n64 (D = 64) or n128
// (slabs 2 h and 2 h + 1 for O's columns 128 h + [0, 128)).
template <typename T, int kHeadDim>
__device__ __forceinline__ void pv_step(float (&acc_o)[kHeadDim / 2], const uint32_t (&a)[4], uint64_t desc_v,
                                        uint64_t slab_step) {
  if constexpr (kHeadDim == 64) {
    flashext::sm90::wgmma_m64n64k16_rs<T, 1>(acc_o, a, desc_v, 1);
  } else {
#pragma unroll
    for (int h = 0; h < kHeadDim / 128; ++h) {
      flashext::sm90::wgmma_m64n128k16_rs<T, 1>(*reinterpret_cast<float(*)[64]>(&acc_o[64 * h]), a,
                                                desc_v + 2 * h * slab_step, 1);
    }
  }
}

// The max of row r's scores in S's accumulator layout (elements 4 i + 2 r and 4 i + 2 r + 1, i in
// [kLo, kLo + kN)) as a tree of depth log2(2 kN) rather than a chain of 2 kN dependent FMNMX: the
// max is the head of the softmax's serial path (its exponentials wait for it).
template <int kLo, int kN, int kCount>
__device__ __forceinline__ float row_max_tree(const float (&s)[kCount], int r) {
  if constexpr (kN == 1) {
    return fmaxf(s[4 * kLo + 2 * r], s[4 * kLo + 2 * r + 1]);
  } else {
    return fmaxf(row_max_tree<kLo, kN / 2>(s, r), row_max_tree<kLo + kN / 2, kN - kN / 2>(s, r));
  }
}

// The short-tile epilogue's log2 for row_lse (one MUFU op)
struct Log2Approx {
  __device__ float operator()(float x) const { return ptx::log2_approx(x); }
};

struct Sm90Maps {
  CUtensorMap q, k, v, o;  // o: 64-row boxes, valid where store_o
  int store_o;             // O by TMA store: dense calls whose output a map can address
};

template <typename T, typename Config>
__global__ void __launch_bounds__(Config::kThreads, 1)
    flash_fwd_sm90_kernel(const FlashFwdParams p, const __grid_constant__ Sm90Maps maps, const Sm90TileWalk walk) {
  namespace sm90 = flashext::sm90;
  constexpr int kHeadDim = Config::kHeadDim, kBlockM = Config::kBlockM, kBlockN = Config::kBlockN;
  constexpr int kStages = Config::kStages, kSlabs = Config::kSlabs;
  constexpr int kTileBytesQ = Config::kTileBytesQ, kTileBytesKV = Config::kTileBytesKV;
  constexpr int kQStages = Config::kQStages;
  // 1024-byte aligned tiles (the swizzle atom): Q buffers, then K stages, V stages, the O tile (D ≤ 128), then
  // barriers. The short-tile kernel declares the alignment (the dynamic shared memory then starts
  // at a multiple of 1024 bytes, and every address below is a constant offset); the others round
  // the base up at run time.
  // (No static __shared__ in this kernel: it would come first and move the dynamic base off the
  // declared alignment.)
  unsigned char* base;
  if constexpr (Config::kShortTiles) {
    extern __shared__ __align__(1024) unsigned char smem_aligned[];
    base = smem_aligned;
  } else {
    extern __shared__ unsigned char smem_raw[];
    const uint32_t raw = sm90::smem_addr(smem_raw);
    base = smem_raw + ((1024 - raw % 1024) % 1024);
  }
  T* smem_q = reinterpret_cast<T*>(base);
  T* smem_k = reinterpret_cast<T*>(base + kQStages * kTileBytesQ);
  T* smem_v = reinterpret_cast<T*>(base + kQStages * kTileBytesQ + kStages * kTileBytesKV);
  unsigned char* smem_o = base + kQStages * kTileBytesQ + 2 * kStages * kTileBytesKV;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem_o + Config::kTileBytesO);
  uint64_t* q_full = bars;                               // [kQStages]
  uint64_t* q_empty = bars + kQStages;                   // [kQStages]
  uint64_t* k_full = bars + 2 * kQStages;                // [kStages]
  uint64_t* v_full = bars + 2 * kQStages + kStages;      // [kStages]
  uint64_t* k_empty = bars + 2 * kQStages + 2 * kStages;  // [kStages]
  uint64_t* v_empty = bars + 2 * kQStages + 3 * kStages;  // [kStages]
  float* pin_word = reinterpret_cast<float*>(bars + 2 * kQStages + 4 * kStages);  // (never written: see pin_wait)

  const int warpgroup = threadIdx.x / 128, lane = threadIdx.x % 32;
  const bool varlen = p.cu_seqlens_q != nullptr;
  // Tiles (query block, head, sequence) by index t, walked as sm90_tile_walk.h says: a CTA per
  // tile, or a persistent grid striding over them (causal calls over units of two tiles of equal
  // work).
  struct Tile {
    int head, batch, kv_head, seqlen_q, seqlen_k, m_start, m_last, diag, n_lo, num_n_blocks, tma_batch;
    int64_t row_q, row_k;
    bool rows;  // whether the block holds any of its sequence's query rows
  };
  const auto tile_at = [&](int t) {
    Tile x;
    const Sm90TileCoords at = sm90_tile_coords<Config::kShortTileFirst>(walk, t);
    x.head = at.head;
    x.batch = at.batch;
    x.kv_head = at.kv_head;
    // This sequence's rows (row_q / row_k: its first packed row; tma_batch: the maps' batch index).
    const SequenceRows seq = sequence_rows(p, x.batch);
    x.seqlen_q = seq.seqlen_q;
    x.seqlen_k = seq.seqlen_k;
    x.tma_batch = varlen ? 0 : x.batch;
    x.row_q = seq.q_start;
    x.row_k = seq.k_start;
    x.m_start = at.m_block * kBlockM;
    x.rows = !at.skip && x.m_start < x.seqlen_q;
    x.diag = p.align_top_left ? 0 : x.seqlen_k - x.seqlen_q;
    x.m_last = x.m_start + kBlockM - 1;
    int n_lo = 0, n_hi = x.seqlen_k;
    if (p.window_left >= 0) n_lo = max(0, x.m_start + x.diag - p.window_left) / kBlockN * kBlockN;
    if (p.window_right >= 0) n_hi = min(x.seqlen_k, x.m_last + x.diag + p.window_right + 1);
    x.n_lo = n_lo;
    x.num_n_blocks = x.rows && n_hi > n_lo ? (n_hi - n_lo + kBlockN - 1) / kBlockN : 0;
    return x;
  };

  if (threadIdx.x == 0) {
    for (int s = 0; s < kQStages; ++s) {
      sm90::mbarrier_init(&q_full[s], 1);
      sm90::mbarrier_init(&q_empty[s], Config::kConsumers);  // one thread of each consumer warpgroup
    }
    for (int s = 0; s < kStages; ++s) {
      sm90::mbarrier_init(&k_full[s], 1);
      sm90::mbarrier_init(&v_full[s], 1);
      sm90::mbarrier_init(&k_empty[s], Config::kConsumers);
      sm90::mbarrier_init(&v_empty[s], Config::kConsumers);
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {  // producer: one thread issues the copies, the rest give their registers up
    sm90::setmaxnreg_dec<Config::kProducerRegisters>();
    if (threadIdx.x == 0) {
      // Q loads and K / V blocks counted over every tile of this CTA: a stage's use g waits for
      // the release of its use g − stages (the empty barrier's phase g / stages − 1).
      const auto producer_wait = [](uint64_t* bar, uint32_t phase) {
        if constexpr (Config::kShortTiles) {
          sm90::mbarrier_wait_suspended(bar, phase);
        } else {
          sm90::mbarrier_wait(bar, phase);
        }
      };
      int q_uses = 0, kv_uses = 0;
      for (int t = blockIdx.x; t < walk.loop_tiles; t += walk.grid) {
        const Tile x = tile_at(t);
        if (x.num_n_blocks == 0) continue;  // nothing to load: the consumers write zeros
        const int qs = q_uses % kQStages;
        if (q_uses >= kQStages) producer_wait(&q_empty[qs], ((q_uses / kQStages) & 1) ^ 1);
        sm90::mbarrier_arrive_expect_tx(&q_full[qs], kTileBytesQ);
        for (int slab = 0; slab < kSlabs; ++slab) {
          sm90::tma_load_4d(reinterpret_cast<unsigned char*>(smem_q) + qs * kTileBytesQ + slab * Config::kSlabBytesQ,
                            &maps.q, &q_full[qs], 64 * slab, x.head, int(x.row_q) + x.m_start, x.tma_batch);
        }
        ++q_uses;
        // Block b's K, then (one block behind) block b - 1's V: each waits only for its own stage's
        // release (the stage's previous user, kStages blocks earlier).
        const auto load = [&](const CUtensorMap* map, unsigned char* tiles, uint64_t* full, uint64_t* empty, int b) {
          const int g = kv_uses + b, stage = g % kStages;
          if (g >= kStages) producer_wait(&empty[stage], ((g / kStages) & 1) ^ 1);
          sm90::mbarrier_arrive_expect_tx(&full[stage], kTileBytesKV);
          for (int slab = 0; slab < kSlabs; ++slab) {
            sm90::tma_load_4d(tiles + stage * kTileBytesKV + slab * Config::kSlabBytesKV, map, &full[stage], 64 * slab,
                              x.kv_head, int(x.row_k) + x.n_lo + b * kBlockN, x.tma_batch);
          }
        };
        unsigned char* k_tiles = reinterpret_cast<unsigned char*>(smem_k);
        unsigned char* v_tiles = reinterpret_cast<unsigned char*>(smem_v);
        load(&maps.k, k_tiles, k_full, k_empty, 0);
        for (int b = 1; b <= x.num_n_blocks; ++b) {
          if (b < x.num_n_blocks) load(&maps.k, k_tiles, k_full, k_empty, b);
          load(&maps.v, v_tiles, v_full, v_empty, b - 1);
        }
        kv_uses += x.num_n_blocks;
      }
    }
    return;
  }

  // Consumers: warpgroup c = 0, 1 (, 2) owns query rows 64 c + [0, 64); this thread rows row0 and row0 + 8.
  sm90::setmaxnreg_inc<Config::kConsumerRegisters>();
  const int c = warpgroup - 1, warp = (threadIdx.x / 32) % 4, quad = lane % 4;
  const int row0 = 64 * c + 16 * warp + lane / 4;  // within the block
  const bool softcap_on = p.softcap > 0.0f;
  const float score_scale = softcap_on ? kLog2e : p.softmax_scale * kLog2e;
  const float cap_scale = softcap_on ? p.softmax_scale / p.softcap : 0.0f;

  // O in the wgmma accumulator layout: element 4 i + 2 r + e holds row row0 + 8 r, dim 8 i + 2 quad + e
  float acc_o[kHeadDim / 2];
#pragma unroll
  for (int e = 0; e < kHeadDim / 2; ++e) acc_o[e] = 0.0f;
  float row_max[2], row_sum[2];
  Tile x{};              // the tile in hand (the steps below read it)
  uint64_t desc_q0 = 0;  // its Q buffer's descriptor: slab 0, this warpgroup's 64 rows (64 · 128 bytes in)
  // Zeroes rows [first, kBlockN) of a landed V tile (every slab; the swizzle moves 16-byte chunks
  // only within a row's 128 bytes), all consumer threads together, then orders the stores before
  // any warpgroup's wgmma reads the tile (named barrier 3: every consumer warpgroup).
  const auto zero_rows_past = [&](unsigned char* tile, int first) {
    sm90::zero_tile_rows(tile, kSlabs, Config::kSlabBytesKV, kBlockN, first, threadIdx.x - 128,
                         128 * Config::kConsumers);
    sm90::fence_proxy_async();
    sm90::named_barrier_sync(3, 128 * Config::kConsumers);
  };
  // Varlen: the V rows of the tile's last block (the only one that reaches past the keys) past the
  // sequence, zeroed once it has landed.
  const auto guard_last_v = [&](uint32_t stage) {
    const int n_start = x.n_lo + (x.num_n_blocks - 1) * kBlockN;
    if (varlen && n_start + kBlockN > x.seqlen_k) {
      zero_rows_past(reinterpret_cast<unsigned char*>(smem_v) + stage * kTileBytesKV, x.seqlen_k - n_start);
    }
  };
  float s[kBlockN / 2];          // S of the key block in hand; its exponentials in place
  uint32_t p16[kBlockN / 8][2];  // P in 16 bits, [n8 tile][row r] (this thread's column pair), as P V reads it
  float alpha[2];       // what O must be rescaled by once the P V in flight retires

  // S = Q Kᵀ of the stage's K over the block's keys (rows of every slab), issued and committed; a
  // head-dim k16 step kk is slab kk / 4, 32 bytes × (kk % 4) in (descriptor units of 16 bytes).
  // (a stage's tile is kTileBytesKV on: its descriptor's address field, in 16-byte units, that
  // much further than stage 0's; shared addresses stay under the field's 256 KiB)
  const auto issue_s = [&](uint32_t stage) {
    const uint64_t desc_k0 = sm90::smem_descriptor(smem_k, 16, 1024) + uint64_t(stage * (kTileBytesKV >> 4));
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint64_t in_slab = uint64_t(2 * (kk % 4));
      qk_step<T, kBlockN>(s, desc_q0 + uint64_t((kk / 4) * (Config::kSlabBytesQ >> 4)) + in_slab,
                          desc_k0 + uint64_t((kk / 4) * (Config::kSlabBytesKV >> 4)) + in_slab, kk > 0);
    }
    sm90::wgmma_commit();
  };
  // O += P V of the stage's V: key k16 step kk is n8 tiles 2 kk and 2 kk + 1 of P (the A fragment:
  // rows r, r + 8 × keys 0-7, 8-15); V is MN-major, dims 64 h + [0, 64) in slab h (the
  // descriptor's leading offset: a slab), a k16 step 16 keys × 128 bytes in. Issued, committed.
  const auto issue_pv = [&](uint32_t stage) {
    const uint64_t desc_v0 =
        sm90::smem_descriptor(smem_v, Config::kSlabBytesKV, 1024) + uint64_t(stage * (kTileBytesKV >> 4));
    sm90::fence_operands(acc_o);
#pragma unroll
    for (int i = 0; i < kBlockN / 8; ++i) sm90::fence_operands(p16[i]);
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      const uint32_t a[4] = {p16[2 * kk][0], p16[2 * kk][1], p16[2 * kk + 1][0], p16[2 * kk + 1][1]};
      pv_step<T, kHeadDim>(acc_o, a, desc_v0 + uint64_t(128 * kk), uint64_t(Config::kSlabBytesKV >> 4));
    }
    sm90::wgmma_commit();
  };
  // Soft-cap, then the mask where the block crosses a boundary (element 4 i + e: row row0 + 8 ·
  // (e / 2), key n_start + 8 i + 2 quad + e % 2), then the online softmax per row (its 4 owners
  // are one lane quad): the new max, alpha, the exponentials in place in S and the row sums (of
  // fp32 P, as the D = 256 FA2 kernel sums them). It writes only S, so it may run while the
  // previous block's P V is in flight.
  // The short-tile kernel's cheaper mask (below) where only the right diagonal bounds the keys.
  const bool right_only = Config::kShortTiles && Config::kConsumers == 2 && p.window_left < 0 && p.window_right >= 0;
  const auto softmax = [&](int n_start, bool full_block) {
    if (softcap_on) {  // (a uniform branch around the loop, not one per score)
#pragma unroll
      for (int e = 0; e < kBlockN / 2; ++e) s[e] = p.softcap * tanhf(s[e] * cap_scale);
    }
    if (!full_block) {
      if (right_only && n_start + kBlockN <= x.seqlen_k) {
        // Only the right diagonal crosses the block (causal): key ≥ row + diag + window_right + 1,
        // i.e. 8 (i − r) + e ≥ lim with one lim per thread, so score i of row 0 and score i + 1
        // of row 1 share a comparison (kBlockN / 4 + 2 of them for kBlockN / 2 scores).
        const int lim = x.m_start + row0 + x.diag + p.window_right + 1 - n_start - 2 * quad;
#pragma unroll
        for (int j = -1; j < kBlockN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const bool out = 8 * j + e >= lim;
            if (j >= 0 && out) s[4 * j + e] = -INFINITY;
            if (j + 1 < kBlockN / 8 && out) s[4 * (j + 1) + 2 + e] = -INFINITY;
          }
      } else {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = x.m_start + row0 + 8 * r;
          const int right = p.window_right < 0 ? x.seqlen_k : min(x.seqlen_k, row + x.diag + p.window_right + 1);
          const int left = p.window_left < 0 ? INT32_MIN : row + x.diag - p.window_left;
#pragma unroll
          for (int i = 0; i < kBlockN / 8; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int key = n_start + 8 * i + 2 * quad + e;
              if (key >= right || key < left) s[4 * i + 2 * r + e] = -INFINITY;
            }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float tile_max = row_max_tree<0, kBlockN / 8>(s, r);
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float new_max = fmaxf(row_max[r], tile_max);
      alpha[r] = rescale_factor(row_max[r], new_max, score_scale);
      // 2^((s − m) · scale): the max's own weight exactly 1 (fp32 P is summed as is, not as P V
      // rounds it, so the fold 2^(s · scale − m · scale) would leave a one-key row at 0.9995 for
      // logits near 1e4; online_softmax.h)
      const float base_max = safe_row_max(new_max);
      float tile_sum = 0.0f;
#pragma unroll
      for (int e = 0; e < kBlockN / 4; ++e) {
        const int idx = 4 * (e / 2) + 2 * r + e % 2;
        s[idx] = ptx::exp2_approx((s[idx] - base_max) * score_scale);
        tile_sum += s[idx];
      }
      row_sum[r] = row_sum[r] * alpha[r] + tile_sum;
      row_max[r] = new_max;
    }
  };
  // ptxas schedules wait_group 0 as early as it may, which is above the whole softmax (and the
  // overlap with the P V is gone), unless a memory instruction earlier in program order holds it:
  // a shared store of a value made from what is to come first (the final row sums, or their
  // reciprocals), predicated on a comparison that never holds (the value is ≥ 0 or NaN, never
  // −1), so nothing is written.
  const auto pin_wait = [&](float made) {
    asm volatile("{\n.reg .pred q;\nsetp.eq.f32 q, %1, 0fBF800000;\n@q st.shared.f32 [%0], %1;\n}\n" ::"r"(
                     sm90::smem_addr(pin_word)),
                 "f"(made)
                 : "memory");
  };
  // P to 16 bits (once no P V reads p16) and O to the new max.
  const auto round_p = [&] {
#pragma unroll
    for (int i = 0; i < kBlockN / 8; ++i)
#pragma unroll
      for (int r = 0; r < 2; ++r) p16[i][r] = ptx::pack2<T>(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]);
  };
  const auto rescale_o = [&] {
#pragma unroll
    for (int i = 0; i < kHeadDim / 8; ++i) {
      acc_o[4 * i] *= alpha[0];
      acc_o[4 * i + 1] *= alpha[0];
      acc_o[4 * i + 2] *= alpha[1];
      acc_o[4 * i + 3] *= alpha[1];
    }
  };
  // A tile's rows once its last softmax is done: row r's sum over its lane quad (returned) and
  // 1 / l (0 for a row that saw no key); row r's lse stored at `row` (offset: the sequence's).
  const auto row_total = [&](int r, float& inv) {
    float total = row_sum[r];
    total += __shfl_xor_sync(0xffffffffu, total, 1);
    total += __shfl_xor_sync(0xffffffffu, total, 2);
    if constexpr (Config::kShortTiles) {
      // (total ≥ 1 where a key was seen, the max's own weight being exactly 1: the approximate
      // reciprocal is within an fp32 ulp of 1 / total, and the lse's approximate log2 within
      // about 2^-22 of log2(total), absolute)
      inv = total > 0.0f ? ptx::rcp_approx(total) : 0.0f;
    } else {
      inv = total > 0.0f ? 1.0f / total : 0.0f;
    }
    return total;
  };
  const auto lse_offset = [&] { return varlen ? x.row_q : int64_t(x.batch) * p.lse_batch_stride; };
  const auto store_lse = [&](int r, int row, float total, int64_t offset) {
    if (p.lse != nullptr && quad == 0) {
      using Log2 = std::conditional_t<Config::kShortTiles, Log2Approx, Log2f>;
      p.lse[offset + int64_t(x.head) * p.lse_head_stride + row] = row_lse({row_max[r] * score_scale, total}, Log2{});
    }
  };
  // Both rows' sums, 1 / l and lse (Config::kEpilogueUnderGemms: under the tile's last P V).
  const auto finish_rows = [&](float (&inv)[2]) {
    const int64_t offset = lse_offset();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float total = row_total(r, inv[r]);
      const int row = x.m_start + row0 + 8 * r;
      if (row < x.seqlen_q) store_lse(r, row, total, offset);
    }
  };
  // O / l of tile y out of acc_o (Config::kEpilogueUnderGemms), by TMA through this warpgroup's
  // part of the O tile or from registers: as the epilogue below writes it (no O in a stage there).
  // (Written out twice: one helper for both lengthened D = 256's 80-key loop by six instructions,
  // 1.3 % slower there; docs/notes/attention_sm90_fwd.md, "Measured and rejected".)
  const auto write_o = [&](const Tile& y, bool tma, const float (&iv)[2]) {
    static_assert(!Config::kEpilogueUnderGemms || (!Config::kOInStage && Config::kPeelFirstBlock),
                  "a deferred O has no stage of its own and leaves under a peeled first S");
    if (!tma) {
      const int64_t o_offset = varlen ? y.row_q * p.o_row_stride : int64_t(y.batch) * p.o_batch_stride;
      T* o = static_cast<T*>(p.o) + o_offset + int64_t(y.head) * p.o_head_stride;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = y.m_start + row0 + 8 * r;
        if (row >= y.seqlen_q) continue;
#pragma unroll
        for (int i = 0; i < kHeadDim / 8; ++i) {
          if constexpr (Config::kNarrowHeadDims) {  // (a head dim under the kernel's: O has only its own columns)
            if (8 * i >= p.head_dim) break;
          }
          const int col = 8 * i + 2 * quad;
          *reinterpret_cast<uint32_t*>(o + int64_t(row) * p.o_row_stride + col) =
              ptx::pack2<T>(acc_o[4 * i + 2 * r] * iv[r], acc_o[4 * i + 2 * r + 1] * iv[r]);
        }
      }
      return;
    }
    unsigned char* part = smem_o + c * (64 * 128 * kSlabs);
    if (threadIdx.x % 128 == 0) sm90::bulk_wait_group_read<0>();
    sm90::named_barrier_sync(4 + c, 128);
    sm90::stmatrix_accumulator<T, kHeadDim>(part, 64 * 128, acc_o, iv[0], iv[1]);
    sm90::fence_proxy_async();  // (the generic stores before the copy engine's reads)
    sm90::named_barrier_sync(4 + c, 128);
    if (threadIdx.x % 128 == 0) {
      for (int slab = 0; slab < kSlabs; ++slab) {
        sm90::tma_store_4d(&maps.o, part + slab * (64 * 128), 64 * slab, y.head, int(y.row_q) + y.m_start + 64 * c,
                           y.tma_batch);
      }
      sm90::bulk_commit_group();
    }
  };
  // A tile whose O waits for the next tile's first S to be issued (Config::kEpilogueUnderGemms):
  // its fields, whether its O leaves by TMA, its 1 / l. (done_tma is always store_o below; read
  // from store_o instead, ptxas allocated the loops' registers differently and D = 128 measured
  // 0.3-0.5 % slower, so the copy stays.)
  Tile done{};
  bool o_pending = false, done_tma = false;
  float done_inv[2] = {0.0f, 0.0f};
  const auto flush_o = [&] {
    if (o_pending) write_o(done, done_tma, done_inv);
    o_pending = false;
  };
  // A stage's GEMMs of this warpgroup are done (wgmma is collective: every warp issued them);
  // unless `keep`: a stage this warpgroup writes O through, released after the store (below).
  const auto release = [&](uint64_t* empty, int stage, bool keep = false) {
    if (threadIdx.x % 128 == 0 && !keep) sm90::mbarrier_arrive(&empty[stage]);
  };

  // Block j's S is issued before block j − 1's P V, and its softmax runs while that P V does
  // (FlashAttention-3's intra-warpgroup overlap): the tensor cores have the next GEMM while the
  // warpgroup computes exponentials. P is rewritten only once its P V has retired. Stages and
  // phases count this CTA's Q loads and K / V blocks over its tiles, as the producer counts them.
  const bool store_o = maps.store_o != 0;  // (the epilogue below)
  // Whether warpgroup 0 keeps the K stage and warpgroup 1 the V stage of a tile's last block to
  // write O through (Config::kOInStage): warpgroup 0 releases that K stage only once its store has
  // read it, and writes it only once warpgroup 1 has said (named barrier 7) that its own last S
  // has retired; likewise warpgroup 1 and V's stage, after warpgroup 0's last P V (barrier 8).
  // (Named barriers: 1 and 2 the ping-pong's, 3 all consumers', 4 + c each warpgroup's own.)
  // (Predicates on the releases, not branches: a branch on the warpgroup inside the key loop
  // costs the loop its uniform descriptor arithmetic.)
  const bool hold_k = Config::kOInStage && store_o && c == 0, hold_v = Config::kOInStage && store_o && c == 1;
  // Ping-pong: warpgroup c issues its GEMMs once named barrier 1 + c has seen it and the other
  // warpgroup's arrival (the other's GEMMs of that turn are issued), then hands the turn over.
  // Both issue the same number of times (a tile's first S, its blocks, its last P V), warpgroup 0
  // first: warpgroup 1 arrives once at the start, and warpgroup 0 takes that extra arrival back
  // at the end, so no barrier is left half-arrived.
  const auto my_turn = [&] {
    if constexpr (Config::kPingPong) sm90::named_barrier_sync(1 + c, 256);
  };
  const auto your_turn = [&] {
    if constexpr (Config::kPingPong) sm90::named_barrier_arrive(2 - c, 256);
  };
  if constexpr (Config::kPingPong) {
    if (c == 1) sm90::named_barrier_arrive(1, 256);
  }
  uint32_t q_uses = 0, kv_uses = 0;
  for (int t = blockIdx.x; t < walk.loop_tiles; t += walk.grid) {
    x = tile_at(t);
    if (!x.rows) continue;  // the whole block past this sequence
    // The tile's blocks that need no mask: it in [full_lo, full_hi), where block it (keys n_lo +
    // it · kBlockN on) ends within the keys (n + kBlockN ≤ seqlen_k) and within every row's window
    // (n + kBlockN − 1 ≤ m_start + diag + right; n ≥ m_last + diag − left): bounds linear in it.
    int upper = x.seqlen_k - kBlockN - x.n_lo;
    if (p.window_right >= 0) upper = min(upper, x.m_start + x.diag + p.window_right + 1 - kBlockN - x.n_lo);
    const int full_hi = upper < 0 ? 0 : upper / kBlockN + 1;
    const int lower = p.window_left < 0 ? 0 : x.m_last + x.diag - p.window_left - x.n_lo;
    const int full_lo = lower <= 0 ? 0 : (lower + kBlockN - 1) / kBlockN;
    if constexpr (!Config::kEpilogueUnderGemms) {
#pragma unroll
      for (int e = 0; e < kHeadDim / 2; ++e) acc_o[e] = 0.0f;
    }
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.0f;
    const int n_lo = x.n_lo, num_n_blocks = x.num_n_blocks;
    float inv[2];  // 1 / l of this thread's two rows (finish_rows)
    uint32_t last_stage = 0;  // the K / V stage of the tile's last block (where it has one)
    if (num_n_blocks > 0) {
      const uint32_t qs = q_uses % kQStages;
      desc_q0 = sm90::smem_descriptor(reinterpret_cast<unsigned char*>(smem_q) + qs * kTileBytesQ + 64 * 128 * c, 16,
                                      1024);
      // (as lane 0's: the compiler then knows it is the same in every lane and keeps it in uniform
      // registers, instead of moving it there for every wgmma of every block)
      desc_q0 = (uint64_t(__shfl_sync(0xffffffffu, uint32_t(desc_q0 >> 32), 0)) << 32) |
                __shfl_sync(0xffffffffu, uint32_t(desc_q0), 0);
      sm90::mbarrier_wait(&q_full[qs], (q_uses / kQStages) & 1);
      if constexpr (Config::kPeelFirstBlock) {
        sm90::mbarrier_wait(&k_full[kv_uses % kStages], (kv_uses / kStages) & 1);
        my_turn();
        issue_s(kv_uses % kStages);
        your_turn();
        if constexpr (Config::kEpilogueUnderGemms) {
          // The previous tile's O, under this S. (wait_group 1: every group but this S is done,
          // as the previous tile's last P V is; ptxas then knows acc_o is free to read and does
          // not insert a wait of its own, which would serialise the wgmmas.)
          sm90::wgmma_wait<1>();
          flush_o();
#pragma unroll
          for (int e = 0; e < kHeadDim / 2; ++e) acc_o[e] = 0.0f;
        }
        sm90::wgmma_wait<0>();
        sm90::fence_operands(s);
        release(k_empty, kv_uses % kStages, hold_k && num_n_blocks == 1);
        if (num_n_blocks == 1) release(q_empty, qs);  // Q's last read: the next tile's may land
        softmax(n_lo, full_lo <= 0 && 0 < full_hi);
        round_p();  // (O is 0: nothing to rescale)
      }
      for (int it = Config::kPeelFirstBlock ? 1 : 0; it < num_n_blocks; ++it) {
        const uint32_t g = kv_uses + it, stage = g % kStages, prev = (g - 1) % kStages;
        const bool pv = Config::kPeelFirstBlock || it > 0;  // a previous block's P V to issue
        sm90::mbarrier_wait(&k_full[stage], (g / kStages) & 1);
        // V of block it − 1 (loaded after block it's K): waited for while S is issued, or before
        // (Config::kWaitVBeforeS)
        if constexpr (Config::kWaitVBeforeS) {
          if (pv) sm90::mbarrier_wait(&v_full[prev], ((g - 1) / kStages) & 1);
        }
        my_turn();
        issue_s(stage);
        if (pv) {
          if constexpr (!Config::kWaitVBeforeS) sm90::mbarrier_wait(&v_full[prev], ((g - 1) / kStages) & 1);
          issue_pv(prev);  // (not the tile's last block: no guard_last_v)
        } else {
          // an empty group in the P V's place, so that the waits below stay as they are (the
          // fence: ptxas would insert one itself, info C7519)
          sm90::wgmma_fence();
          sm90::wgmma_commit();
        }
        your_turn();
        sm90::wgmma_wait<1>();  // S is in (groups complete in order); P V still runs
        sm90::fence_operands(s);
        // the producer may load block it + kStages's K now
        release(k_empty, stage, hold_k && it == num_n_blocks - 1);
        if (it == num_n_blocks - 1) release(q_empty, qs);  // Q's last read: the next tile's may land
        softmax(n_lo + it * kBlockN, it >= full_lo && it < full_hi);
        pin_wait(row_sum[0] + row_sum[1]);
        sm90::wgmma_wait<0>();
        sm90::fence_operands(acc_o);
#pragma unroll
        for (int i = 0; i < kBlockN / 8; ++i) sm90::fence_operands(p16[i]);
        if (pv) release(v_empty, prev);
        round_p();
        rescale_o();  // (the first block: alpha 0 on O's zeros)
      }
      if (hold_v) sm90::named_barrier_arrive(7, 256);  // (this warpgroup's last S has retired)
      const uint32_t g_last = kv_uses + num_n_blocks - 1, last = g_last % kStages;
      last_stage = last;
      sm90::mbarrier_wait(&v_full[last], (g_last / kStages) & 1);
      guard_last_v(last);
      my_turn();
      issue_pv(last);
      your_turn();
      if constexpr (Config::kEpilogueUnderGemms) {
        finish_rows(inv);
        pin_wait(inv[0] + inv[1]);
      }
      sm90::wgmma_wait<0>();
      sm90::fence_operands(acc_o);
      release(v_empty, last, hold_v);
      ++q_uses;
      kv_uses += num_n_blocks;
    }

    // Epilogue: O / l (0 for a row that saw no key) and the lse (a tile with no key block has
    // none: O 0 and lse −inf), O's own columns. Where the call has a map of O, each warpgroup
    // writes its 64 rows through its part of the O tile (D ≤ 128) or the stage it kept (D = 256, a
    // tile that loaded one) and one TMA store per slab (rows past the sequence and columns past
    // the head dim left out), and goes on to its next tile while the copy engine writes them
    // (D = 256: once the copy has read the stage, which it then releases); otherwise O goes
    // straight from registers. Where kEpilogueUnderGemms holds, the lse was done under the last
    // P V, and O is written under the next tile's first S (write_o, flush_o).
    if constexpr (Config::kEpilogueUnderGemms) {
      if (num_n_blocks > 0) {  // O leaves under the next tile's first S (or after the last tile)
        done = x;
        done_tma = store_o;
        done_inv[0] = inv[0];
        done_inv[1] = inv[1];
        o_pending = true;
      } else {  // no key block: the previous tile's O, then this one's zeros
        flush_o();
#pragma unroll
        for (int e = 0; e < kHeadDim / 2; ++e) acc_o[e] = 0.0f;
        finish_rows(inv);
        write_o(x, store_o, inv);
      }
      continue;
    }
    const bool tma_o = store_o && (!Config::kOInStage || num_n_blocks > 0);
    // (row by row: the sum, O from registers, the lse. In finish_rows' order, lse before O, ptxas
    // allocates these kernels' registers differently, up to an extra instruction in D = 256's
    // 80-key loop; this order keeps the machine code that was measured.)
    const int64_t o_offset = varlen ? x.row_q * p.o_row_stride : int64_t(x.batch) * p.o_batch_stride;
    const int64_t offset = lse_offset();
    T* o = static_cast<T*>(p.o) + o_offset + int64_t(x.head) * p.o_head_stride;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float total = row_total(r, inv[r]);
      const int row = x.m_start + row0 + 8 * r;
      if (row >= x.seqlen_q) continue;
      if (!tma_o) {
#pragma unroll
        for (int i = 0; i < kHeadDim / 8; ++i) {
          if constexpr (Config::kNarrowHeadDims) {  // (a head dim under the kernel's: O has only its own columns)
            if (8 * i >= p.head_dim) break;
          }
          const int col = 8 * i + 2 * quad;
          *reinterpret_cast<uint32_t*>(o + int64_t(row) * p.o_row_stride + col) =
              ptx::pack2<T>(acc_o[4 * i + 2 * r] * inv[r], acc_o[4 * i + 2 * r + 1] * inv[r]);
        }
      }
      store_lse(r, row, total, offset);
    }
    if (tma_o) {
      unsigned char* part;  // this warpgroup's 64 rows: slabs of 64 rows × 128 bytes
      if constexpr (Config::kOInStage) {
        // Warpgroup 0 waits for warpgroup 1's last S to retire (barrier 7), at once tells
        // warpgroup 1 that its own last P V has (barrier 8: V's stage free), then writes through
        // the K stage.
        part = reinterpret_cast<unsigned char*>(c == 0 ? smem_k : smem_v) + last_stage * kTileBytesKV;
        if (c == 0) {
          sm90::named_barrier_sync(7, 256);
          sm90::named_barrier_arrive(8, 256);
        } else {
          sm90::named_barrier_sync(8, 256);
        }
      } else {
        // This warpgroup's previous store has read its part of the O tile (its issuer waits, the
        // others at the barrier, named 4 + c: this warpgroup's own).
        part = smem_o + c * (64 * 128 * kSlabs);
        if (threadIdx.x % 128 == 0) sm90::bulk_wait_group_read<0>();
        sm90::named_barrier_sync(4 + c, 128);
      }
      sm90::stmatrix_accumulator<T, kHeadDim>(part, 64 * 128, acc_o, inv[0], inv[1]);
      sm90::fence_proxy_async();  // (the generic stores before the copy engine's reads)
      sm90::named_barrier_sync(4 + c, 128);
      if (threadIdx.x % 128 == 0) {
        // (no box wholly past O's columns: only the D = 256 kernel serves head dims, 136-192, that
        // leave a slab past them)
        for (int slab = 0; slab < kSlabs && (kSlabs <= 2 || 64 * slab < p.head_dim); ++slab) {
          sm90::tma_store_4d(&maps.o, part + slab * (64 * 128), 64 * slab, x.head,
                             int(x.row_q) + x.m_start + 64 * c, x.tma_batch);
        }
        sm90::bulk_commit_group();
        if constexpr (Config::kOInStage) {  // the stage goes back to the producer once the copy has read it
          sm90::bulk_wait_group_read<0>();
          sm90::mbarrier_arrive(c == 0 ? &k_empty[last_stage] : &v_empty[last_stage]);
        }
      }
    }
  }
  if constexpr (Config::kEpilogueUnderGemms) flush_o();  // the last tile's O
  if constexpr (Config::kPingPong) {
    if (c == 0) sm90::named_barrier_sync(1, 256);  // (warpgroup 1's last hand-over)
  }
  // The last stores have read shared memory before the block exits.
  if (store_o && threadIdx.x % 128 == 0) sm90::bulk_wait_group_read<0>();
}

template <typename T, typename Config>
cudaError_t launch(const FlashFwdParams& p, cudaStream_t stream) {
  // The walk's indices are 31-bit (sm90_tile_walk.h); a call of 2^28 tiles or more (only tiny head
  // dims over millions of sequences reach it; through torch, batch and heads stop at 65535 and no
  // call comes near) takes the FA2-design kernel.
  const int64_t num_m = (p.seqlen_q + int64_t(Config::kBlockM) - 1) / Config::kBlockM;
  const int64_t tiles = num_m * p.heads * p.batch, units = (num_m + 1) / 2 * p.heads * p.batch;
  if (tiles >= kSm90MaxTiles) return run_flash_fwd(p, stream);
  if (!Config::kNarrowHeadDims && p.head_dim != Config::kHeadDim) return cudaErrorInvalidValue;
  Sm90Maps maps;
  // Varlen: one batch of all the packed rows. The maps span the tensors' own head dim: a smaller
  // one than the kernel's reads as zero columns past it (which add nothing to S and make O's
  // columns there 0).
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t rows_q = varlen ? p.total_q : p.seqlen_q, rows_k = varlen ? p.total_k : p.seqlen_k;
  const int64_t batch = varlen ? 1 : p.batch;
  FX_RETURN_IF_ERROR(make_tma_attention_map(&maps.q, p.q, p.head_dim, p.heads, rows_q, batch,
                                            p.q_row_stride, p.q_head_stride, p.q_batch_stride, Config::kBlockM));
  FX_RETURN_IF_ERROR(make_tma_attention_map(&maps.k, p.k, p.head_dim, p.heads_kv, rows_k, batch,
                                            p.k_row_stride, p.k_head_stride, p.k_batch_stride, Config::kBlockN));
  FX_RETURN_IF_ERROR(make_tma_attention_map(&maps.v, p.v, p.head_dim, p.heads_kv, rows_k, batch,
                                            p.v_row_stride, p.v_head_stride, p.v_batch_stride, Config::kBlockN));
  // O by TMA store (through the O tile, or at D = 256 a stage) where the output's pointer and
  // strides suit a map (varlen: a 64-row box would write the next sequence's rows)
  maps.store_o = !varlen &&
                 make_tma_attention_map(&maps.o, p.o, p.head_dim, p.heads, rows_q, batch, p.o_row_stride,
                                        p.o_head_stride, p.o_batch_stride, 64) == cudaSuccess;
  // Tiles of equal work (no causal mask, no window, a dense batch), or causal units of two tiles
  // of equal work: a CTA per SM walking them, so a tile's prologue
  // overlaps the previous one's end; else a CTA per tile, longest first.
  auto kernel = flash_fwd_sm90_kernel<T, Config>;
  FX_RETURN_IF_ERROR(allow_dynamic_smem(kernel, Config::kSmemBytes));
  const int sms = std::max(1, current_device_sm_count());
  const bool uniform = !varlen && p.window_left < 0 && p.window_right < 0;
  // (paired only where the last round of units is nearly full: the rounds' padding at most a
  // tenth of the units, so no CTA takes much more than its share)
  const int64_t rounds = (units + sms - 1) / sms;
  const bool paired = !varlen && p.window_left < 0 && p.window_right == 0 && units >= sms &&
                      (rounds * sms - units) * 10 <= units;
  const int64_t ctas = uniform || paired ? int64_t(sms) : int64_t(INT32_MAX);  // (past it: a stride)
  const int grid = int(std::min(tiles, ctas));
  const Sm90TileWalk walk = make_sm90_tile_walk(int(num_m), p.heads, p.heads_kv, p.batch, grid, paired);
  kernel<<<dim3(unsigned(grid)), Config::kThreads, Config::kSmemBytes, stream>>>(p, maps, walk);
  return cudaGetLastError();
}

// The most keys a query row sees: the window's width where both edges are bounded, else all.
int64_t visible_keys(const FlashFwdParams& p) {
  const int64_t width =
      p.window_left >= 0 && p.window_right >= 0 ? int64_t(p.window_left) + p.window_right + 1 : p.seqlen_k;
  return std::min<int64_t>(width, p.seqlen_k);
}

}  // namespace
}  // namespace attention_detail

bool flash_fwd_sm90_supported(int major, int minor) {
  // sm_90a machine code, or compute_90a PTX (either spelling of the arch list holds "90a")
  return major == 9 && minor == 0 && std::strstr(compiled_cuda_archs(), "90a") != nullptr;
}

cudaError_t run_flash_fwd_sm90(const FlashFwdParams& p, cudaStream_t stream) {
  using namespace attention_detail;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int kernel_head_dim = flash_fwd_kernel_head_dim(p.head_dim);  // 64, 128 or 256 (0: none)
  if (kernel_head_dim == 0 || varlen != (p.cu_seqlens_k != nullptr) ||
      p.block_mask != nullptr || p.batch < 0 || p.heads <= 0 || p.heads_kv <= 0 || p.heads % p.heads_kv != 0 ||
      p.seqlen_q < 0) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0 || p.seqlen_q == 0) return cudaSuccess;  // no query rows (as run_flash_fwd)
  if (p.seqlen_k <= 0 || (varlen && (p.total_q <= 0 || p.total_k <= 0))) return cudaErrorInvalidValue;
  return with_16bit_type(p.dtype, cudaErrorInvalidValue, [&](auto type) {
    using T = typename decltype(type)::type;
    // Unmasked dense calls at D = 256 take 80-key blocks: a block's fixed costs (two barrier
    // waits, the row max and sum shuffles, O's 128 registers rescaled) over 1.25x the keys; +4-12 %
    // at S >= 1024 (A/B at 2064ba4). Under a mask the wider diagonal blocks cost more masked work
    // than that saves; at D = 128, 176-key blocks measured 0.98-1.02x (not taken).
    const bool diagonal = p.window_left >= 0 || p.window_right >= 0;  // (causal: window_right 0)
    const bool unmasked = !varlen && !diagonal;
    switch (kernel_head_dim) {
      // Causal and windowed calls at D = 64 whose rows see fewer than 4K keys: 128-row blocks of
      // two consumer warpgroups (a third less masked work on the diagonal blocks, 240 registers
      // each); from 4K keys the 192-row blocks' fewer K / V loads per row win. Varlen calls
      // without a mask keep 192 rows (their only masked blocks are sequence ends). Unmasked dense
      // calls under 2K keys (tiles of at most 16 key blocks) take the 192-row kernel's short-tile
      // form (Sm90FwdConfig::kShortTiles). The measurements behind both thresholds are in
      // docs/notes/attention_sm90_fwd.md, "Tiles per head dim".
      case 64:
        if (diagonal && visible_keys(p) < 4096) return launch<T, Sm90FwdConfig<64, 128, 128, true>>(p, stream);
        return unmasked && p.seqlen_k < 2048 ? launch<T, Sm90FwdConfig<64, 128, 192, true>>(p, stream)
                                             : launch<T, Sm90FwdConfig<64>>(p, stream);
      case 128: return launch<T, Sm90FwdConfig<128>>(p, stream);
      default:  // (80-key blocks take D = 256 itself only: Sm90FwdConfig::kNarrowHeadDims)
        return unmasked && p.head_dim == 256 ? launch<T, Sm90FwdConfig<256, 80>>(p, stream)
                                             : launch<T, Sm90FwdConfig<256>>(p, stream);
    }
  });
}

}  // namespace flashext
