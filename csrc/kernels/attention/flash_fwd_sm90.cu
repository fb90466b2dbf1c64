// flashext FlashAttention forward on Hopper (sm_90a), version 2: the structure of the plan in
// docs/notes/attention.md ("Plan for the Hopper forward"), with the overlap inside a warpgroup and
// not yet the ping-pong between warpgroups. Not yet dispatched to (flash_fwd_sm90.h says what
// checks and times it).
//
// D = 128, dense batch (no varlen), fp16 / bf16. A CTA per (query block of 128 rows, head, batch):
// warpgroup 0 is the producer (one thread issues every TMA), warpgroups 1 and 2 consume 64 query
// rows each. Q and two stages of K and V (128 keys each) live in shared memory as 64-column slabs
// with the 128-byte swizzle (TMA writes them so; wgmma reads them so). K and V have full barriers
// of their own (one arrival plus the tile's bytes); the empty barrier takes one arrival per
// consumer warpgroup. Per key block j, each consumer issues S_j = Q K_jᵀ (wgmma SS, m64n128: all
// 128 keys per instruction) and then O += P_{j-1} V_{j-1} (wgmma RS m64n128: P from registers, V
// read MN-major as stored), waits for S_j alone, runs S_j's online softmax while that P V runs,
// then waits for it, releases stage j − 1 and rescales O. P lives in two register sets that swap
// roles, one read by the P V in flight while the softmax writes the other.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "../common/device.h"
#include "../common/online_softmax.h"
#include "../common/ptx.cuh"
#include "../common/sm90.cuh"
#include "../common/tma.h"
#include "../common/vec.cuh"
#include "dispatch.h"
#include "flash_fwd_sm90.h"
#include "flashext/common.h"

namespace flashext {
namespace attention_detail {
namespace {

constexpr int kHeadDim = 128, kBlockM = 128, kBlockN = 128, kStages = 2;
constexpr int kThreads = 3 * 128;
constexpr int kSlabBytes = 128 * 128;                  // 128 rows × 64 columns × 2 bytes
constexpr int kTileBytes = 2 * kSlabBytes;            // 128 rows × 128 columns (two slabs)
constexpr int kSmemBytes = kTileBytes * (1 + 2 * kStages) + 1024 + 64;  // Q, K, V stages; alignment; barriers
// Registers: the block starts at 65536 / kThreads = 168 each (__launch_bounds__ pins it); the
// producer gives up to 24 and the consumers take 240, exactly the whole file.
constexpr int kEntryRegisters = 168, kProducerRegisters = 24, kConsumerRegisters = 240;
static_assert(kThreads * kEntryRegisters <= 65536 &&
                  128 * kProducerRegisters + 256 * kConsumerRegisters <= kThreads * kEntryRegisters,
              "setmaxnreg must balance within the block's registers");

struct Sm90Maps {
  CUtensorMap q, k, v;
};

// The two 16-bit values of a pair of fp32 accumulators, the first in the low half.
template <typename T>
FX_DEVICE uint32_t pack(float lo, float hi) {
  return ptx::pack2<T>(lo, hi);
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    flash_fwd_sm90_kernel(const FlashFwdParams p, const __grid_constant__ Sm90Maps maps) {
  namespace sm90 = flashext::sm90;
  extern __shared__ unsigned char smem_raw[];
  // 1024-byte aligned tiles (the swizzle atom): Q, then K stages, then V stages, then barriers.
  const uint32_t raw = sm90::smem_addr(smem_raw);
  unsigned char* base = smem_raw + ((1024 - raw % 1024) % 1024);
  T* smem_q = reinterpret_cast<T*>(base);
  T* smem_k = reinterpret_cast<T*>(base + kTileBytes);
  T* smem_v = reinterpret_cast<T*>(base + kTileBytes * (1 + kStages));
  uint64_t* bars = reinterpret_cast<uint64_t*>(base + kTileBytes * (1 + 2 * kStages));
  uint64_t* q_full = bars;
  uint64_t* k_full = bars + 1;                // [kStages]
  uint64_t* v_full = bars + 1 + kStages;      // [kStages]
  uint64_t* empty = bars + 1 + 2 * kStages;  // [kStages]

  const int warpgroup = threadIdx.x / 128, lane = threadIdx.x % 32;
  const int m_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const int kv_head = head / (p.heads / p.heads_kv);
  const int seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k, m_start = m_block * kBlockM;
  const int diag = p.align_top_left ? 0 : seqlen_k - seqlen_q;
  const int m_last = m_start + kBlockM - 1;
  int n_lo = 0, n_hi = seqlen_k;
  if (p.window_left >= 0) n_lo = max(0, m_start + diag - p.window_left) / kBlockN * kBlockN;
  if (p.window_right >= 0) n_hi = min(seqlen_k, m_last + diag + p.window_right + 1);
  const int num_n_blocks = n_hi > n_lo ? (n_hi - n_lo + kBlockN - 1) / kBlockN : 0;

  if (threadIdx.x == 0) {
    sm90::mbarrier_init(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      sm90::mbarrier_init(&k_full[s], 1);
      sm90::mbarrier_init(&v_full[s], 1);
      sm90::mbarrier_init(&empty[s], 2);  // one thread of each consumer warpgroup
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();

  if (warpgroup == 0) {  // producer: one thread issues the copies, the rest give their registers up
    sm90::setmaxnreg_dec<kProducerRegisters>();
    if (threadIdx.x == 0 && num_n_blocks > 0) {
      sm90::mbarrier_arrive_expect_tx(q_full, kTileBytes);
      for (int slab = 0; slab < 2; ++slab) {
        sm90::tma_load_4d(reinterpret_cast<unsigned char*>(smem_q) + slab * kSlabBytes, &maps.q, q_full, 64 * slab,
                          head, m_start, batch);
      }
      for (int it = 0; it < num_n_blocks; ++it) {
        const int stage = it % kStages, n_start = n_lo + it * kBlockN;
        if (it >= kStages) sm90::mbarrier_wait(&empty[stage], ((it / kStages) & 1) ^ 1);
        unsigned char* k_tile = reinterpret_cast<unsigned char*>(smem_k) + stage * kTileBytes;
        unsigned char* v_tile = reinterpret_cast<unsigned char*>(smem_v) + stage * kTileBytes;
        sm90::mbarrier_arrive_expect_tx(&k_full[stage], kTileBytes);
        for (int slab = 0; slab < 2; ++slab) {
          sm90::tma_load_4d(k_tile + slab * kSlabBytes, &maps.k, &k_full[stage], 64 * slab, kv_head, n_start, batch);
        }
        sm90::mbarrier_arrive_expect_tx(&v_full[stage], kTileBytes);
        for (int slab = 0; slab < 2; ++slab) {
          sm90::tma_load_4d(v_tile + slab * kSlabBytes, &maps.v, &v_full[stage], 64 * slab, kv_head, n_start, batch);
        }
      }
    }
    return;
  }

  // Consumers: warpgroup c = 0, 1 owns query rows 64 c + [0, 64); this thread rows row0 and row0 + 8.
  sm90::setmaxnreg_inc<kConsumerRegisters>();
  const int c = warpgroup - 1, warp = (threadIdx.x / 32) % 4, quad = lane % 4;
  const int row0 = 64 * c + 16 * warp + lane / 4;  // within the block
  const bool softcap_on = p.softcap > 0.0f;
  const float score_scale = softcap_on ? kLog2e : p.softmax_scale * kLog2e;
  const float cap_scale = softcap_on ? p.softmax_scale / p.softcap : 0.0f;

  float acc_o[64];  // O in the wgmma m64n128 accumulator layout: dims 8 i + 2 quad + {0, 1} at 4 i + ...
#pragma unroll
  for (int e = 0; e < 64; ++e) acc_o[e] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

  // Q's descriptors: slab s, this warpgroup's 64 rows (64 · 128 bytes in).
  const uint64_t desc_q0 = sm90::smem_descriptor(reinterpret_cast<unsigned char*>(smem_q) + 64 * 128 * c, 16, 1024);
  float s[64];  // S of the key block in hand
  // P of two blocks in turn, [n8 tile][row r] (this thread's column pair): one read by the P V in
  // flight, the other written by the softmax meanwhile (swapping roles, never copied).
  uint32_t p_a[16][2], p_b[16][2];

  // S = Q Kᵀ of the stage's K over all 128 keys (rows of every slab), issued and committed; a
  // head-dim k16 step kk is slab kk / 4, 32 bytes × (kk % 4) in. (Callers fence first.)
  const auto issue_s = [&](int stage) {
    const uint64_t desc_k0 =
        sm90::smem_descriptor(reinterpret_cast<const unsigned char*>(smem_k) + stage * kTileBytes, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      const uint64_t step = uint64_t((kk / 4) * (kSlabBytes >> 4) + 2 * (kk % 4));
      sm90::wgmma_m64n128k16_ss<T, 0>(s, desc_q0 + step, desc_k0 + step, kk > 0);
    }
    sm90::wgmma_commit();
  };
  // O += P V of the stage's V with P = p_in: key k16 step kk is n8 tiles 2 kk and 2 kk + 1 of P (the
  // A fragment: rows r, r + 8 × keys 0-7, 8-15); V is MN-major, dims 64 h + [0, 64) in slab h (the
  // descriptor's leading offset: a slab), a k16 step 16 keys × 128 bytes in. Issued and committed.
  const auto issue_pv = [&](int stage, const uint32_t(&p_in)[16][2]) {
    const uint64_t desc_v0 =
        sm90::smem_descriptor(reinterpret_cast<const unsigned char*>(smem_v) + stage * kTileBytes, kSlabBytes, 1024);
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      const uint32_t a[4] = {p_in[2 * kk][0], p_in[2 * kk][1], p_in[2 * kk + 1][0], p_in[2 * kk + 1][1]};
      sm90::wgmma_m64n128k16_rs<T, 1>(acc_o, a, desc_v0 + uint64_t(128 * kk), 1);
    }
    sm90::wgmma_commit();
  };
  // Soft-cap and mask S (element 4 i + e: row row0 + 8 · (e / 2), key n_start + 8 i + 2 quad + e % 2),
  // then the online softmax per row (its 4 owners are one lane quad) into p_out; P rounded to T
  // and summed as rounded, so a row's weights add up to 1 whatever the rounding. Returns in alpha
  // the factors O must be rescaled by once the P V in flight is done. A register a wgmma wrote may
  // not be redefined while another wgmma group is in flight (ptxas would serialise every wgmma of
  // the kernel), so a block that rewrites S (the soft-cap; the mask of a block crossing a
  // boundary: the diagonal, the tails) first waits for the P V: only full blocks overlap.
  const auto softmax = [&](int n_start, float (&alpha)[2], uint32_t(&p_out)[16][2]) {
    const bool full_block = n_start + kBlockN <= seqlen_k &&
                            (p.window_right < 0 || n_start + kBlockN - 1 <= m_start + diag + p.window_right) &&
                            (p.window_left < 0 || n_start >= m_last + diag - p.window_left);
    if (softcap_on || !full_block) {  // (uniform branches around the loops, not one per score)
      sm90::wgmma_wait<0>();
      sm90::fence_operands(acc_o);
      if (softcap_on) {
#pragma unroll
        for (int e = 0; e < 64; ++e) s[e] = p.softcap * tanhf(s[e] * cap_scale);
      }
      if (!full_block) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = m_start + row0 + 8 * r;
          const int right = p.window_right < 0 ? seqlen_k : min(seqlen_k, row + diag + p.window_right + 1);
          const int left = p.window_left < 0 ? INT32_MIN : row + diag - p.window_left;
#pragma unroll
          for (int i = 0; i < 16; ++i)
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
      float tile_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < 16; ++i) tile_max = fmaxf(tile_max, fmaxf(s[4 * i + 2 * r], s[4 * i + 2 * r + 1]));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float new_max = fmaxf(row_max[r], tile_max);
      alpha[r] = rescale_factor(row_max[r], new_max, score_scale);
      const float base_max = safe_row_max(new_max) * score_scale;
      float tile_sum = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const uint32_t pair = pack<T>(ptx::exp2_approx(fmaf(s[4 * i + 2 * r], score_scale, -base_max)),
                                      ptx::exp2_approx(fmaf(s[4 * i + 2 * r + 1], score_scale, -base_max)));
        p_out[i][r] = pair;
        const T* halves = reinterpret_cast<const T*>(&pair);
        tile_sum += to_float(halves[0]) + to_float(halves[1]);
      }
      row_sum[r] = row_sum[r] * alpha[r] + tile_sum;
      row_max[r] = new_max;
    }
  };
  const auto rescale_o = [&](const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      acc_o[4 * i] *= alpha[0];
      acc_o[4 * i + 1] *= alpha[0];
      acc_o[4 * i + 2] *= alpha[1];
      acc_o[4 * i + 3] *= alpha[1];
    }
  };
  const auto release = [&](int stage) {  // the warpgroup's GEMMs on the stage are done (wgmma is
    if (threadIdx.x % 128 == 0) sm90::mbarrier_arrive(&empty[stage]);  // collective: every warp issued them)
  };

  // Block j's S is issued before block j − 1's P V, and its softmax runs while that P V does: the
  // tensor cores have the next GEMM while the warpgroup computes exponents.
  const auto pin = [&](uint32_t(&p16)[16][2]) {
#pragma unroll
    for (int i = 0; i < 16; ++i) sm90::fence_operands(p16[i]);
  };
  float alpha[2];
  // Block it: S_it issued beside P_{it-1} V_{it-1} (P from p_in), S_it's softmax into p_out.
  const auto step = [&](int it, uint32_t(&p_in)[16][2], uint32_t(&p_out)[16][2]) {
    const int stage = it % kStages, prev = (it - 1) % kStages;
    sm90::fence_operands(acc_o);
    pin(p_in);
    sm90::mbarrier_wait(&k_full[stage], (it / kStages) & 1);
    sm90::mbarrier_wait(&v_full[prev], ((it - 1) / kStages) & 1);  // (V landed with block it − 1's K)
    sm90::wgmma_fence();
    issue_s(stage);
    issue_pv(prev, p_in);
    sm90::wgmma_wait<1>();  // S is in (groups complete in order); P V still runs
    sm90::fence_operands(s);
    softmax(n_lo + it * kBlockN, alpha, p_out);
    sm90::wgmma_wait<0>();
    sm90::fence_operands(acc_o);
    pin(p_in);  // (its registers stay P until its P V is done)
    release(prev);
    rescale_o(alpha);
  };
  const auto last_pv = [&](uint32_t(&p_in)[16][2]) {
    const int last = (num_n_blocks - 1) % kStages;
    sm90::fence_operands(acc_o);
    pin(p_in);
    sm90::mbarrier_wait(&v_full[last], ((num_n_blocks - 1) / kStages) & 1);
    sm90::wgmma_fence();
    issue_pv(last, p_in);
    sm90::wgmma_wait<0>();
    sm90::fence_operands(acc_o);
    pin(p_in);
    release(last);
  };
  if (num_n_blocks > 0) {
    sm90::mbarrier_wait(q_full, 0);
    sm90::mbarrier_wait(&k_full[0], 0);
    sm90::wgmma_fence();
    issue_s(0);
    sm90::wgmma_wait<0>();
    sm90::fence_operands(s);
    softmax(n_lo, alpha, p_a);  // (O is 0: nothing to rescale)
    int it = 1;
    for (; it + 1 < num_n_blocks; it += 2) {
      step(it, p_a, p_b);
      step(it + 1, p_b, p_a);
    }
    if (it < num_n_blocks) {  // one block left: its S's P lands in p_b
      step(it, p_a, p_b);
      last_pv(p_b);
    } else {
      last_pv(p_a);
    }
  }

  // Epilogue: O / l (0 for a row that saw no key) straight from registers, and the lse.
  T* o = static_cast<T*>(p.o) + int64_t(batch) * p.o_batch_stride + int64_t(head) * p.o_head_stride;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float total = row_sum[r];
    total += __shfl_xor_sync(0xffffffffu, total, 1);
    total += __shfl_xor_sync(0xffffffffu, total, 2);
    const int row = m_start + row0 + 8 * r;
    if (row >= seqlen_q) continue;
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int col = 8 * i + 2 * quad;
      *reinterpret_cast<uint32_t*>(o + int64_t(row) * p.o_row_stride + col) =
          pack<T>(acc_o[4 * i + 2 * r] * inv, acc_o[4 * i + 2 * r + 1] * inv);
    }
    if (p.lse != nullptr && quad == 0) {
      p.lse[int64_t(batch) * p.lse_batch_stride + int64_t(head) * p.lse_head_stride + row] =
          row_lse({row_max[r] * score_scale, total});
    }
  }
}

template <typename T>
cudaError_t launch(const FlashFwdParams& p, cudaStream_t stream) {
  Sm90Maps maps;
  const auto map = [](CUtensorMap* out, const void* base, int64_t heads, int64_t rows, int64_t batch,
                      int64_t row_stride, int64_t head_stride, int64_t batch_stride, uint32_t box_rows) {
    // The stride of a dim of size 1 addresses nothing, but the TMA wants every stride a multiple
    // of 16 bytes: give such dims the dense one.
    head_stride = heads > 1 ? head_stride : kHeadDim;
    row_stride = rows > 1 ? row_stride : heads * head_stride;
    batch_stride = batch > 1 ? batch_stride : rows * row_stride;
    const uint64_t dims[4] = {uint64_t(kHeadDim), uint64_t(heads), uint64_t(rows), uint64_t(batch)};
    const uint64_t strides[3] = {uint64_t(head_stride) * 2, uint64_t(row_stride) * 2, uint64_t(batch_stride) * 2};
    const uint32_t box[4] = {64, 1, box_rows, 1};
    return make_tma_4d_swizzle128(out, base, dims, strides, box);
  };
  FX_RETURN_IF_ERROR(map(&maps.q, p.q, p.heads, p.seqlen_q, p.batch, p.q_row_stride, p.q_head_stride,
                         p.q_batch_stride, kBlockM));
  FX_RETURN_IF_ERROR(map(&maps.k, p.k, p.heads_kv, p.seqlen_k, p.batch, p.k_row_stride, p.k_head_stride,
                         p.k_batch_stride, kBlockN));
  FX_RETURN_IF_ERROR(map(&maps.v, p.v, p.heads_kv, p.seqlen_k, p.batch, p.v_row_stride, p.v_head_stride,
                         p.v_batch_stride, kBlockN));
  auto kernel = flash_fwd_sm90_kernel<T>;
  FX_RETURN_IF_ERROR(allow_dynamic_smem(kernel, kSmemBytes));
  const dim3 grid(unsigned((p.seqlen_q + kBlockM - 1) / kBlockM), unsigned(p.heads), unsigned(p.batch));
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(p, maps);
  return cudaGetLastError();
}

}  // namespace
}  // namespace attention_detail

bool flash_fwd_sm90_supported(int major, int minor) {
  // sm_90a machine code, or compute_90a PTX (either spelling of the arch list holds "90a")
  return major == 9 && minor == 0 && std::strstr(compiled_cuda_archs(), "90a") != nullptr;
}

cudaError_t run_flash_fwd_sm90(const FlashFwdParams& p, cudaStream_t stream) {
  using namespace attention_detail;
  if (p.head_dim != kHeadDim || p.cu_seqlens_q != nullptr || p.batch <= 0 || p.heads <= 0 || p.heads_kv <= 0 ||
      p.heads % p.heads_kv != 0 || p.seqlen_q <= 0 || p.seqlen_k <= 0) {
    return cudaErrorInvalidValue;
  }
  return with_16bit_type(p.dtype, cudaErrorInvalidValue,
                         [&](auto type) { return launch<typename decltype(type)::type>(p, stream); });
}

}  // namespace flashext
