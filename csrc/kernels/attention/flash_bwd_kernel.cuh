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
// each block's dQ into an fp32 buffer (atomics); flash_bwd_convert_dq scales that buffer into dq.
//
// Main kernel. Grid: (key blocks, KV heads, batch); block: 8 warps. Everything is computed
// transposed, keys as rows: Sᵀ = K Qᵀ and dPᵀ = V dOᵀ have the layout of an mma accumulator whose
// rows are keys, which is the A-operand layout of dV = Pᵀ dO and dK = dSᵀ Q, so Pᵀ and dSᵀ feed
// those from registers. Warp (wk, wq) owns keys 16 · wk + [0, 16) and, of the query block,
// columns wq · kQCols + [0, kQCols) of Sᵀ and dPᵀ and head-dim columns wq · kDCols + [0, kDCols)
// of dK and dV; with two warps per key slab (D = 256) Pᵀ and dSᵀ go through shared memory. dSᵀ
// always does: dQ = dS K needs it with queries as rows (warp w: query rows 16 · (w % 4) + [0, 16),
// head-dim columns (w / 4) · kHeadDim / 2 + ...), read back transposed by ldmatrix.trans.
//
//   D     keys × queries  warps (keys × split)  shared memory
//   64    128 × 64        8 × 1                 K, V 2·16 + Q, dO 2·2·8 + dSᵀ 16 = 80 KiB
//   128   128 × 64        8 × 1                 K, V 2·32 + Q, dO 2·2·16 + dSᵀ 16 = 144 KiB
//   256    64 × 64        4 × 2                 K, V 2·32 + Q, dO 2·2·32 + dSᵀ, Pᵀ 2·8 = 208 KiB
// Q, dO and the rows' (lse, D) are double-buffered: the next query block loads under this one.
// GPUs with less shared memory per block get the compact tiles (FlashBwdConfig): D = 128 64 × 64,
// 4 × 2 warps, 80 KiB; D = 256 144 KiB (Q, dO single-buffered at both).
#pragma once

#include <cuda_runtime.h>

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
// sm_86/89 99): 64 keys at D = 128 and Q, dO single-buffered at D ≥ 128 (the next query block then
// loads under the dQ GEMM only). D = 64 needs no compact form.
template <int kHeadDim_, bool kCompact_ = false>
struct FlashBwdConfig {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kCompact = kCompact_;
  static constexpr int kNWarps = 8;
  static constexpr int kThreads = 32 * kNWarps;
  static constexpr int kBlockN = kHeadDim <= 64 || (kHeadDim <= 128 && !kCompact) ? 128 : 64;  // keys per block
  static constexpr int kBlockM = 64;                          // queries per step
  static constexpr int kWarpsKey = kBlockN / 16;              // key slabs of 16
  static constexpr int kWarpsSplit = kNWarps / kWarpsKey;     // warps per key slab
  static constexpr int kQCols = kBlockM / kWarpsSplit;        // Sᵀ columns (queries) per warp
  static constexpr int kDCols = kHeadDim / kWarpsSplit;       // dK, dV columns per warp
  static constexpr bool kPThroughSmem = kWarpsSplit > 1;
  static constexpr int kDqRowTiles = kBlockM / 16;            // dQ: m16 row tiles
  static constexpr int kDqCols = kHeadDim / (kNWarps / kDqRowTiles);
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr int kTileKV = kBlockN * kHeadDim;
  static constexpr int kTileQ = kBlockM * kHeadDim;
  static constexpr int kTileS = kBlockN * kBlockM;  // dSᵀ or Pᵀ, rows = keys
  static constexpr int kQBuffers = kCompact ? 1 : 2;  // Q and dO tiles each
  static constexpr int kSmemBytes =
      (2 * kTileKV + 2 * kQBuffers * kTileQ + (kPThroughSmem ? 2 : 1) * kTileS) * 2 + 2 * 2 * kBlockM * 4;
  static_assert(kNWarps % kWarpsKey == 0 && kNWarps % kDqRowTiles == 0, "warp layouts");
  static_assert(kBlockM == 64, "dSᵀ rows are 64 queries: 128 bytes, the swizzle's unit");
  static_assert(kQCols % 16 == 0 && kDCols % 16 == 0 && kDqCols % 16 == 0, "whole k16 steps and n8 pairs");
  static_assert(kThreads >= 2 * kBlockM, "one thread per row statistic");
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than one block may have (sm_90)");
};

// Workspace layout: D and lse · log2 e (fp32) per (head, row): dense [b][h][row] with rows padded
// to a multiple of 4, varlen [h][row of the packed q]; dq_accum like q, fp32, contiguous; then the
// deterministic mode's counters, int32 [b][h][query block].
struct BwdWorkspace {
  float* dsum;
  float* lse2;
  float* dq_accum;
  int* dq_counters;  // deterministic: per (batch, head, query block), the key blocks added so far
  int64_t stats_head_stride;   // between heads
  int64_t stats_batch_stride;  // dense: between batch entries (varlen: 0)
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

inline int64_t bwd_accum_bytes(const FlashBwdParams& p) { return (bwd_rows(p) * p.heads * p.head_dim * 4 + 255) / 256 * 256; }

template <int kBlockM>
int64_t bwd_counter_count(const FlashBwdParams& p) {
  return p.deterministic ? int64_t(p.batch) * p.heads * ((p.seqlen_q + kBlockM - 1) / kBlockM) : 0;
}

template <int kBlockM>
BwdWorkspace bwd_workspace(const FlashBwdParams& p, void* base) {
  const BwdStatsLayout layout = bwd_stats_layout(p);
  char* b = static_cast<char*>(base);
  return {reinterpret_cast<float*>(b), reinterpret_cast<float*>(b + layout.bytes),
          reinterpret_cast<float*>(b + 2 * layout.bytes),
          reinterpret_cast<int*>(b + 2 * layout.bytes + bwd_accum_bytes(p)), layout.head_stride, layout.batch_stride};
}

template <int kBlockM>
size_t bwd_workspace_bytes(const FlashBwdParams& p) {
  return size_t(2 * bwd_stats_layout(p).bytes + bwd_accum_bytes(p) + bwd_counter_count<kBlockM>(p) * 4);
}

// This sequence's rows (dense batch or packed varlen), clamped as the forward clamps them.
struct BwdSequence {
  int seqlen_q, seqlen_k;
  int64_t q_start, k_start;  // varlen: first packed row; dense: 0
};

FX_DEVICE BwdSequence bwd_sequence(const FlashBwdParams& p, int batch) {
  BwdSequence s{p.seqlen_q, p.seqlen_k, 0, 0};
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

// D = rowsum(dO ∘ O) (− dlse when given) and lse · log2 e (+inf where lse = −inf) for every
// (row, head): one warp per pair, a lane per 8 elements of the row. Also zeroes dq_accum's rows
// of those pairs.
template <typename T>
__global__ void __launch_bounds__(256) flash_bwd_preprocess(const FlashBwdParams p, const BwdWorkspace w) {
  const int lane = threadIdx.x % 32;
  const int64_t pair = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t rows = varlen ? p.total_q : int64_t(p.batch) * p.seqlen_q;
  if (pair >= rows * p.heads) return;
  const int head = int(pair % p.heads);
  const int64_t row_all = pair / p.heads;  // dense: b · Sq + row
  const int64_t batch = varlen ? 0 : row_all / p.seqlen_q;
  const int64_t row = varlen ? row_all : row_all % p.seqlen_q;
  const T* o = static_cast<const T*>(p.o) + batch * p.o_batch_stride + row * p.o_row_stride + head * p.o_head_stride;
  const T* d_o =
      static_cast<const T*>(p.dout) + batch * p.do_batch_stride + row * p.do_row_stride + head * p.do_head_stride;
  float* accum = w.dq_accum + (row_all * p.heads + head) * p.head_dim;
  float sum = 0.0f;
  for (int c = lane; c * 8 < p.head_dim; c += 32) {
    const uint4 ov = *reinterpret_cast<const uint4*>(o + c * 8);
    const uint4 dv = *reinterpret_cast<const uint4*>(d_o + c * 8);
    const T* oe = reinterpret_cast<const T*>(&ov);
    const T* de = reinterpret_cast<const T*>(&dv);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum += to_float(oe[e]) * to_float(de[e]);
    reinterpret_cast<float4*>(accum + c * 8)[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    reinterpret_cast<float4*>(accum + c * 8)[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if (lane == 0) {
    const int64_t stat = batch * w.stats_batch_stride + head * w.stats_head_stride + row;
    const int64_t at = batch * p.lse_batch_stride + head * p.lse_head_stride + row;
    const float lse = p.lse[at];
    // A used lse adds dlse · P to dS = P ∘ (dP − D): the same as D − dlse in place of D.
    w.dsum[stat] = p.dlse != nullptr ? sum - p.dlse[at] : sum;
    w.lse2[stat] = lse == -INFINITY ? INFINITY : lse * kLog2e;
  }
}

// dq = dq_accum · softmax_scale in q's dtype, 8 elements per thread.
template <typename T>
__global__ void __launch_bounds__(256) flash_bwd_convert_dq(const FlashBwdParams p, const BwdWorkspace w) {
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t rows = varlen ? p.total_q : int64_t(p.batch) * p.seqlen_q;
  const int chunks = p.head_dim / 8;
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * p.heads * chunks) return;
  const int c = int(id % chunks);
  const int64_t pair = id / chunks;
  const int head = int(pair % p.heads);
  const int64_t row_all = pair / p.heads;
  const int64_t batch = varlen ? 0 : row_all / p.seqlen_q;
  const int64_t row = varlen ? row_all : row_all % p.seqlen_q;
  const float4* src = reinterpret_cast<const float4*>(w.dq_accum + (row_all * p.heads + head) * p.head_dim + c * 8);
  const float4 a = src[0], b = src[1];
  const float s = p.softmax_scale;
  uint4 out;
  out.x = ptx::pack2<T>(a.x * s, a.y * s);
  out.y = ptx::pack2<T>(a.z * s, a.w * s);
  out.z = ptx::pack2<T>(b.x * s, b.y * s);
  out.w = ptx::pack2<T>(b.z * s, b.w * s);
  T* dq = static_cast<T*>(p.dq) + batch * p.dq_batch_stride + row * p.dq_row_stride + head * p.dq_head_stride;
  *reinterpret_cast<uint4*>(dq + c * 8) = out;
}

template <typename T, typename Config>
__global__ void __launch_bounds__(Config::kThreads, 1) flash_bwd_kernel(const FlashBwdParams p, const BwdWorkspace w) {
  constexpr int kHeadDim = Config::kHeadDim, kBlockM = Config::kBlockM, kBlockN = Config::kBlockN;
  constexpr int kQCols = Config::kQCols, kDCols = Config::kDCols, kDqCols = Config::kDqCols;
  constexpr int kSTiles = kQCols / 8;   // n8 tiles of Sᵀ per warp
  constexpr int kDTiles = kDCols / 8;   // n8 tiles of dK / dV per warp
  constexpr int kDqTiles = kDqCols / 8;  // n8 tiles of dQ per warp
  constexpr uint32_t kRowBytes = 2 * kHeadDim;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* smem_k = reinterpret_cast<T*>(smem_raw);
  T* smem_v = smem_k + Config::kTileKV;
  T* smem_q = smem_v + Config::kTileKV;  // kQBuffers buffers
  T* smem_do = smem_q + Config::kQBuffers * Config::kTileQ;  // kQBuffers buffers
  T* smem_ds = smem_do + Config::kQBuffers * Config::kTileQ;  // dSᵀ, then Pᵀ when kPThroughSmem
  T* smem_p = smem_ds + Config::kTileS;
  float* smem_stats = reinterpret_cast<float*>(smem_ds + (Config::kPThroughSmem ? 2 : 1) * Config::kTileS);
  // smem_stats[buffer][0 .. kBlockM): lse · log2 e, [kBlockM .. 2 · kBlockM): D

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = lane / 4, quad = lane % 4;
  const int wk = warp % Config::kWarpsKey, wq = warp / Config::kWarpsKey;
  const int n_block = blockIdx.x, kv_head = blockIdx.y, batch = blockIdx.z;
  const BwdSequence seq = bwd_sequence(p, batch);
  const int n_start = n_block * kBlockN;
  if (n_start >= seq.seqlen_k) return;  // past this sequence (its dk, dv rows do not exist)
  const bool varlen = p.cu_seqlens_q != nullptr;
  const int64_t q_base = varlen ? seq.q_start * p.q_row_stride : batch * p.q_batch_stride;
  const int64_t do_base = varlen ? seq.q_start * p.do_row_stride : batch * p.do_batch_stride;
  const int64_t k_base = varlen ? seq.k_start * p.k_row_stride : batch * p.k_batch_stride;
  const int64_t v_base = varlen ? seq.k_start * p.v_row_stride : batch * p.v_batch_stride;
  const int64_t stats_base = varlen ? seq.q_start : batch * w.stats_batch_stride;
  // dq_accum rows: dense b · Sq + row, varlen the packed row.
  const int64_t accum_row0 = varlen ? seq.q_start : int64_t(batch) * p.seqlen_q;
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

  // dK and dV of this warp's 16 keys × kDCols columns.
  float acc_dk[kDTiles][4], acc_dv[kDTiles][4];
#pragma unroll
  for (int t = 0; t < kDTiles; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[t][e] = acc_dv[t][e] = 0.0f;

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

  // ldmatrix lane addresses (chunk 0 or 1 of the lane's row; swizzled_chunk_addr reaches the rest):
  //   A from a row-major tile (K, V: this warp's 16 keys; Pᵀ: the same keys of the Pᵀ tile),
  //   B from an n-major tile (Q, dO rows as n), B transposed from a k-major tile (dO, Q, K rows as k),
  //   A transposed from the k-major dSᵀ tile (keys as k).
  const int a_row = lane % 16, a_chunk = lane / 16;
  const int b_row = lane % 8 + (lane / 16) * 8, b_chunk = (lane / 8) % 2;
  const int bt_row = lane % 8 + ((lane / 8) % 2) * 8, bt_chunk = lane / 16;
  const uint32_t k_a = ptx::smem_addr(smem_k) + 2 * swizzled<kHeadDim>(16 * wk + a_row, a_chunk);
  const uint32_t v_a = ptx::smem_addr(smem_v) + 2 * swizzled<kHeadDim>(16 * wk + a_row, a_chunk);
  const uint32_t k_bt = ptx::smem_addr(smem_k) + 2 * swizzled<kHeadDim>(bt_row, bt_chunk);
  const uint32_t ds_at = ptx::smem_addr(smem_ds) + 2 * swizzled<kBlockM>(b_row, b_chunk);
  const uint32_t p_a = ptx::smem_addr(smem_p) + 2 * swizzled<kBlockM>(16 * wk + a_row, a_chunk);
  const uint32_t ds_a = ptx::smem_addr(smem_ds) + 2 * swizzled<kBlockM>(16 * wk + a_row, a_chunk);

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

    // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ: this warp's 16 keys × kQCols queries.
    float s[kSTiles][4], dp[kSTiles][4];
#pragma unroll
    for (int j = 0; j < kSTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[j][e] = dp[j][e] = 0.0f;
    const uint32_t q_b = q_tile + 2 * swizzled<kHeadDim>(wq * kQCols + b_row, b_chunk);
    const uint32_t do_b = do_tile + 2 * swizzled<kHeadDim>(wq * kQCols + b_row, b_chunk);
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t k_frag[4], v_frag[4];
      ptx::ldmatrix_x4(k_frag, swizzled_chunk_addr(k_a, 2 * kk));
      ptx::ldmatrix_x4(v_frag, swizzled_chunk_addr(v_a, 2 * kk));
#pragma unroll
      for (int jp = 0; jp < kSTiles / 2; ++jp) {
        uint32_t q_frag[4], do_frag[4];
        ptx::ldmatrix_x4(q_frag, swizzled_chunk_addr(q_b, 2 * kk) + 16 * jp * kRowBytes);
        ptx::ldmatrix_x4(do_frag, swizzled_chunk_addr(do_b, 2 * kk) + 16 * jp * kRowBytes);
        ptx::mma_16816<T>(s[2 * jp], k_frag, q_frag[0], q_frag[1]);
        ptx::mma_16816<T>(s[2 * jp + 1], k_frag, q_frag[2], q_frag[3]);
        ptx::mma_16816<T>(dp[2 * jp], v_frag, do_frag[0], do_frag[1]);
        ptx::mma_16816<T>(dp[2 * jp + 1], v_frag, do_frag[2], do_frag[3]);
      }
    }

    // Soft-cap (rare: a uniform branch), then the mask, only on blocks that cross a boundary;
    // element (j, e) of this thread is key key0 + 8 · (e / 2), query query0 + 8 · j + e % 2.
    const int key0 = n_start + 16 * wk + group, query0 = m_start + wq * kQCols + 2 * quad;
    if (softcap_on) {
#pragma unroll
      for (int j = 0; j < kSTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = p.softcap * tanhf(s[j][e] * cap_scale);
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
        for (int r = 0; r < 2; ++r) {
          const int key = key0 + 8 * r;
          const int hi = key >= seq.seqlen_k ? 0
                         : p.window_left < 0 ? seq.seqlen_q
                                             : min(seq.seqlen_q, key - diag + p.window_left + 1);
          const int hi_rel = hi - query0, lo_rel = key - diag - p.window_right - query0;
#pragma unroll
          for (int j = 0; j < kSTiles; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              if (8 * j + e >= hi_rel || (kWithLo && 8 * j + e < lo_rel)) s[j][2 * r + e] = -INFINITY;
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
    // and dS = P ∘ (dP − D), soft-capped ∘ (1 − tanh²). The row statistics of this thread's two
    // columns per n8 tile are one 8-byte shared load each.
    const auto probs_and_ds = [&](auto capped) {
      constexpr bool kCapped = decltype(capped)::value;
#pragma unroll
      for (int j = 0; j < kSTiles; ++j) {
        const int col = wq * kQCols + 8 * j + 2 * quad;
        const float2 l2 = *reinterpret_cast<const float2*>(lse2 + col);
        const float2 d2 = *reinterpret_cast<const float2*>(dsum + col);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float x = s[j][e];
          const float prob = ptx::exp2_approx(fmaf(x, score_scale, -(e % 2 ? l2.y : l2.x)));
          float ds = prob * (dp[j][e] - (e % 2 ? d2.y : d2.x));
          if constexpr (kCapped) {
            const float t = x * inv_softcap;
            ds = prob > 0.0f ? ds * (1.0f - t * t) : 0.0f;  // (masked: x = −inf)
          }
          s[j][e] = prob;
          dp[j][e] = ds;
        }
      }
    };
    if (softcap_on) {
      probs_and_ds(std::true_type{});
    } else {
      probs_and_ds(std::false_type{});
    }

    // Pᵀ and dSᵀ as 16-bit A fragments: k16 step kk covers this warp's queries 16 · kk + [0, 16).
    uint32_t p16[kSTiles][2], ds16[kSTiles][2];
#pragma unroll
    for (int j = 0; j < kSTiles; ++j) {
      p16[j][0] = ptx::pack2<T>(s[j][0], s[j][1]);
      p16[j][1] = ptx::pack2<T>(s[j][2], s[j][3]);
      ds16[j][0] = ptx::pack2<T>(dp[j][0], dp[j][1]);
      ds16[j][1] = ptx::pack2<T>(dp[j][2], dp[j][3]);
    }
    // dSᵀ to shared memory (rows = keys), for dQ; and Pᵀ too when a key slab spans two warps.
    {
      const int row = 16 * wk + group;
#pragma unroll
      for (int j = 0; j < kSTiles; ++j) {
        const int chunk = (wq * kQCols + 8 * j) / 8;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          *reinterpret_cast<uint32_t*>(smem_ds + swizzled<kBlockM>(row + 8 * r, chunk) + 2 * quad) = ds16[j][r];
          if constexpr (Config::kPThroughSmem) {
            *reinterpret_cast<uint32_t*>(smem_p + swizzled<kBlockM>(row + 8 * r, chunk) + 2 * quad) = p16[j][r];
          }
        }
      }
    }
    if constexpr (Config::kPThroughSmem) __syncthreads();  // every key slab's Pᵀ and dSᵀ are whole

    // dV += Pᵀ dO and dK += dSᵀ Q: this warp's 16 keys × kDCols columns, k = the block's queries.
    const uint32_t do_bt = do_tile + 2 * swizzled<kHeadDim>(bt_row, bt_chunk);
    const uint32_t q_bt = q_tile + 2 * swizzled<kHeadDim>(bt_row, bt_chunk);
#pragma unroll
    for (int kk = 0; kk < kBlockM / 16; ++kk) {
      uint32_t pa[4], dsa[4];
      if constexpr (Config::kPThroughSmem) {
        ptx::ldmatrix_x4(pa, swizzled_chunk_addr(p_a, 2 * kk));
        ptx::ldmatrix_x4(dsa, swizzled_chunk_addr(ds_a, 2 * kk));
      } else {
        pa[0] = p16[2 * kk][0], pa[1] = p16[2 * kk][1], pa[2] = p16[2 * kk + 1][0], pa[3] = p16[2 * kk + 1][1];
        dsa[0] = ds16[2 * kk][0], dsa[1] = ds16[2 * kk][1], dsa[2] = ds16[2 * kk + 1][0], dsa[3] = ds16[2 * kk + 1][1];
      }
#pragma unroll
      for (int tp = 0; tp < kDTiles / 2; ++tp) {
        const int chunk = wq * (kDCols / 8) + 2 * tp;
        uint32_t do_frag[4], q_frag[4];
        ptx::ldmatrix_x4_trans(do_frag, swizzled_chunk_addr(do_bt, chunk) + 16 * kk * kRowBytes);
        ptx::ldmatrix_x4_trans(q_frag, swizzled_chunk_addr(q_bt, chunk) + 16 * kk * kRowBytes);
        ptx::mma_16816<T>(acc_dv[2 * tp], pa, do_frag[0], do_frag[1]);
        ptx::mma_16816<T>(acc_dv[2 * tp + 1], pa, do_frag[2], do_frag[3]);
        ptx::mma_16816<T>(acc_dk[2 * tp], dsa, q_frag[0], q_frag[1]);
        ptx::mma_16816<T>(acc_dk[2 * tp + 1], dsa, q_frag[2], q_frag[3]);
      }
    }
    // dSᵀ is whole (split warps: already); single-buffered, every warp is also done with Q and dO,
    // so the next step's tiles load under the dQ GEMM.
    if constexpr (!Config::kPThroughSmem || Config::kQBuffers == 1) __syncthreads();
    if constexpr (Config::kQBuffers == 1) {
      if (has_next) load_q_do(next_head, next_m, 0);
      ptx::cp_async_commit();
    }

    // dQ (this block's keys' share) = dS K: warp rows 16 · (warp % 4), columns (warp / 4) · kDqCols;
    // added into dq_accum (fp32 atomics; scaled by softmax_scale when converted).
    {
      const int rt = warp % Config::kDqRowTiles, col0 = (warp / Config::kDqRowTiles) * kDqCols;
      float acc_dq[kDqTiles][4];
#pragma unroll
      for (int t = 0; t < kDqTiles; ++t) acc_dq[t][0] = acc_dq[t][1] = acc_dq[t][2] = acc_dq[t][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        uint32_t dsa[4];
        // dSᵀ rows (keys) 16 · kk + ..., columns (queries) 16 · rt + ...: transposed, the A fragment of dS.
        ptx::ldmatrix_x4_trans(dsa, swizzled_chunk_addr(ds_at, 2 * rt) + 16 * kk * (2 * kBlockM));
#pragma unroll
        for (int tp = 0; tp < kDqTiles / 2; ++tp) {
          uint32_t k_frag[4];
          ptx::ldmatrix_x4_trans(k_frag, swizzled_chunk_addr(k_bt, col0 / 8 + 2 * tp) + 16 * kk * kRowBytes);
          ptx::mma_16816<T>(acc_dq[2 * tp], dsa, k_frag[0], k_frag[1]);
          ptx::mma_16816<T>(acc_dq[2 * tp + 1], dsa, k_frag[2], k_frag[3]);
        }
      }
      // Deterministic: this block adds after every key block before it that sees the same query
      // block (they run the same steps in the same order; blocks start in grid order, so the
      // ones waited for are running or done), with plain loads and stores through L2.
      int* counter = w.dq_counters + (int64_t(batch) * p.heads + head) * ((p.seqlen_q + kBlockM - 1) / kBlockM) +
                     m_start / kBlockM;
      if (p.deterministic) {
        if (threadIdx.x == 0) {
          int first = 0;  // the first key block whose query range holds m_start
          if (p.window_left >= 0) {
            const int x = m_start + diag - p.window_left - (kBlockN - 1);
            first = x <= 0 ? 0 : (x + kBlockN - 1) / kBlockN;
          }
          while (ptx::ld_acquire(counter) != n_block - first) {
          }
        }
        __syncthreads();
      }
      // Rows past the sequence and columns past head_dim are skipped (whole blocks test nothing).
      const bool whole = m_start + kBlockM <= seq.seqlen_q && p.head_dim == kHeadDim;
      const auto add_dq = [&](auto deterministic, auto checked) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = m_start + 16 * rt + group + 8 * r;
          float* dst = w.dq_accum + ((accum_row0 + row) * p.heads + head) * p.head_dim + col0 + 2 * quad;
#pragma unroll
          for (int t = 0; t < kDqTiles; ++t) {
            if constexpr (decltype(checked)::value) {
              if (row >= seq.seqlen_q || col0 + 8 * t + 2 * quad >= p.head_dim) continue;
            }
            if constexpr (decltype(deterministic)::value) {
              const float2 old = __ldcg(reinterpret_cast<const float2*>(dst + 8 * t));
              __stcg(reinterpret_cast<float2*>(dst + 8 * t),
                     make_float2(old.x + acc_dq[t][2 * r], old.y + acc_dq[t][2 * r + 1]));
            } else {
              ptx::red_add_f32x2(dst + 8 * t, acc_dq[t][2 * r], acc_dq[t][2 * r + 1]);
            }
          }
        }
      };
      if (p.deterministic) {
        add_dq(std::true_type{}, std::true_type{});
      } else if (whole) {
        add_dq(std::false_type{}, std::false_type{});
      } else {
        add_dq(std::false_type{}, std::true_type{});
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
  for (int r = 0; r < 2; ++r) {
    const int key = n_start + 16 * wk + group + 8 * r;
    if (key >= seq.seqlen_k) continue;
#pragma unroll
    for (int t = 0; t < kDTiles; ++t) {
      const int col = wq * kDCols + 8 * t + 2 * quad;
      if (col < p.head_dim) {
        *reinterpret_cast<uint32_t*>(dk + int64_t(key) * p.dk_row_stride + col) =
            ptx::pack2<T>(acc_dk[t][2 * r] * p.softmax_scale, acc_dk[t][2 * r + 1] * p.softmax_scale);
        *reinterpret_cast<uint32_t*>(dv + int64_t(key) * p.dv_row_stride + col) =
            ptx::pack2<T>(acc_dv[t][2 * r], acc_dv[t][2 * r + 1]);
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
  if (grid.x == 0) return cudaSuccess;
  kernel<<<grid, Config::kThreads, Config::kSmemBytes, stream>>>(p, w);
  return cudaGetLastError();
}

// The shared memory the backward's main kernel needs per block at this head dim: with
// `max_smem_per_block` bytes available, the full tiles, else the compact ones, else 0 (none fits).
template <int kHeadDim>
int bwd_smem_bytes(int max_smem_per_block) {
  using Full = FlashBwdConfig<kHeadDim>;
  using Compact = FlashBwdConfig<kHeadDim, kHeadDim != 64>;
  if (max_smem_per_block >= Full::kSmemBytes) return Full::kSmemBytes;
  return max_smem_per_block >= Compact::kSmemBytes ? Compact::kSmemBytes : 0;
}

template <typename T, int kHeadDim>
cudaError_t launch_flash_bwd(const FlashBwdParams& p, void* workspace, cudaStream_t stream) {
  using Full = FlashBwdConfig<kHeadDim>;
  static_assert(Full::kBlockM == 64, "flash_bwd_workspace_bytes sizes the counters for 64-row query blocks");
  const int budget = p.max_smem_per_block > 0 ? p.max_smem_per_block : current_device_max_smem_per_block();
  const int smem = bwd_smem_bytes<kHeadDim>(budget);
  if (smem == 0) return cudaErrorInvalidConfiguration;  // the glue says so in words first
  const BwdWorkspace w = bwd_workspace<Full::kBlockM>(p, workspace);
  const int64_t pairs = bwd_rows(p) * p.heads;
  if (pairs == 0) return cudaSuccess;
  if (p.deterministic) {
    FX_RETURN_IF_ERROR(cudaMemsetAsync(w.dq_counters, 0, size_t(bwd_counter_count<Full::kBlockM>(p)) * 4, stream));
  }
  flash_bwd_preprocess<T><<<unsigned((pairs + 7) / 8), 256, 0, stream>>>(p, w);
  FX_RETURN_IF_ERROR(cudaGetLastError());
  if constexpr (kHeadDim != 64) {
    if (smem != Full::kSmemBytes) {
      FX_RETURN_IF_ERROR((launch_flash_bwd_config<T, FlashBwdConfig<kHeadDim, true>>(p, w, stream)));
    } else {
      FX_RETURN_IF_ERROR((launch_flash_bwd_config<T, Full>(p, w, stream)));
    }
  } else {
    FX_RETURN_IF_ERROR((launch_flash_bwd_config<T, Full>(p, w, stream)));
  }
  const int64_t threads = pairs * (p.head_dim / 8);
  flash_bwd_convert_dq<T><<<unsigned((threads + 255) / 256), 256, 0, stream>>>(p, w);
  return cudaGetLastError();
}

}  // namespace attention_detail
}  // namespace flashext
