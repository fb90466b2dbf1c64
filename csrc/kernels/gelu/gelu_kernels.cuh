// flashext GeLU epilogue kernels: one pass over HBM for add + GeLU and bias + GeLU, forward and
// backward. Included by gelu_fwd.cu and gelu_bwd.cu, which instantiate them.
//
// add_gelu_kernel<T, kVec, kBackward> (flat, n elements)
//   forward:  out[i]     = gelu(x[i] + y[i])
//   backward: grad_in[i] = grad_out[i] · gelu'(x[i] + y[i])
//   grid: 1-D, kFlatThreads threads; thread t of block b owns pack p = b · kFlatThreads + t
//   (kVec elements, one 16-byte access per input), so each warp access is 512 contiguous bytes.
//   Occupancy, not unrolling, keeps the loads in flight: the __launch_bounds__ hint holds
//   registers to 8 resident blocks per SM forward (6 backward). Measured on the H200, that beat
//   2 or 4 packs per thread at 3-6 blocks per SM by 2-6% (docs/notes/gelu.md). Elements past the
//   last full pack (n % kVec) are done one by one by block 0. kVec = 1 is the path for pointers
//   that are not 16-byte aligned.
//   Napkin math: bf16 fwd moves 6 B/element (2 reads, 1 write); at the measured 4.27 TB/s copy
//   rate 2^28 elements take 377 µs, and the ~25 fp32 instructions of erf-GeLU per element fit
//   well under the 132 SMs' issue rate (~50 instructions per element at that speed).
//
// bias_gelu_kernel<T, kVec, kBackward> (rows × cols, see RowColPlan in plan.h)
//   forward:  out[r, c]    = gelu(x[r, c] + bias[c])
//   backward: grad_x[r, c] = grad_out[r, c] · gelu'(x[r, c] + bias[c]),
//             partial[blockIdx.y, c] = Σ_{rows r of the block} grad_x[r, c]   (fp32)
//   block: kColThreads × kRowThreads; the bias pack is loaded once per thread and kept in
//   registers. Shared memory (backward only): kRowThreads × kColThreads × kVec fp32 partial sums,
//   at most 8 × 32 × 8 × 4 B = 8 KiB, reduced over threadIdx.y.
// bias_grad_reduce_kernel<T>: grad_bias[c] = Σ_g partial[g, c], 32 columns × 8 slices of g per
//   block, then a shared-memory sum over the slices. Deterministic (no atomics).
// bias_gelu_bwd_one_pass_kernel<T, kVec>: the backward for few rows in one launch (BiasBwdOnePass
//   in plan.h): a block per narrow column strip walks every row (each thread's rows
//   streamed through a 2-slot cp.async ring) and writes grad_bias itself. Deterministic as well.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>

#include "../common/device.h"
#include "../common/gelu_math.h"
#include "../common/macros.h"
#include "../common/ptx.cuh"
#include "../common/vec.cuh"
#include "flashext/gelu.h"
#include "plan.h"

// A timeline hook for the one-pass backward (benchmarks/experiments/bias_bwd_timeline.cu defines
// it before including this header to record when each warp reaches each point); empty otherwise.
#ifndef FLASHEXT_GELU_TRACE
#define FLASHEXT_GELU_TRACE(event) ((void)0)
#endif

namespace flashext {
namespace gelu_detail {

constexpr int kFlatThreads = 256;
// Resident blocks per SM asked of the register allocator: ≤ 32 registers per thread forward,
// ≤ 42 backward.
template <bool kBackward>
constexpr int kFlatMinBlocks = kBackward ? 6 : 8;

// A thread's private ring of kStages shared-memory slots, filled by cp.async with one commit group
// per row, as the few-rows kernels below stream their rows (row k in slot k % kStages): only the
// thread fills and reads its slots, so cp.async.wait_group<kStages − 1> before reading row k orders
// them, with no barrier.
//
// Rows 0 … kStages − 1 go out first (ring_prologue), one group per slot, empty past the thread's
// last row, so the group count stays kStages ahead; issue(k) copies row k into its slot. Then
// ring_rows walks the thread's `rows` rows (Count: the kernel's row index type): compute(k, slot)
// reads row k's slot and returns its result; the slot is refilled with row k + kStages (or an empty
// group is committed), behind a compiler barrier that keeps the slot's reads above the copy that
// overwrites it; then store(k, result). The groups left at the end are empty.
template <int kStages, typename Count, typename Issue>
FX_DEVICE void ring_prologue(Count rows, Issue&& issue) {
#pragma unroll
  for (int k = 0; k < kStages; ++k) {
    if (k < rows) issue(Count(k));
    ptx::cp_async_commit();
  }
}

template <int kStages, typename Count, typename Issue, typename Compute, typename Store>
FX_DEVICE void ring_rows(Count rows, Issue&& issue, Compute&& compute, Store&& store) {
  for (Count k = 0; k < rows; ++k) {
    ptx::cp_async_wait<kStages - 1>();  // row k has landed
    FLASHEXT_GELU_TRACE(2 + k);  // the timeline tool's "row k landed"
    const auto result = compute(k, int(k % kStages));
    asm volatile("" ::: "memory");  // result depends on the slot's values, so they have been read: refill it
    if (k + kStages < rows) issue(k + kStages);
    ptx::cp_async_commit();
    store(k, result);
  }
}

// What one flat launch reads and writes; grad_out is null in the forward pass.
struct FlatArgs {
  const void* grad_out;
  const void* x;
  const void* y;
  void* dst;
  int64_t n;
  bool tanh_form;
};

struct RowColArgs {
  const void* grad_out;  // rows × cols contiguous, backward only
  const void* x;  // rows × cols, row stride x_row_stride
  const void* bias;  // cols
  void* dst;  // rows × cols contiguous
  float* partial;  // grid_y × cols, backward only
  int64_t rows;
  int64_t cols;
  int64_t x_row_stride;
  int64_t rows_per_block;
  bool tanh_form;
  void* grad_bias;  // cols, backward in one pass only (bias_gelu_bwd_one_pass_kernel)
};

// dst = gelu(z) forward, g · gelu'(z) backward, for results of type T. The form is a template
// parameter: a runtime branch kept both forms' registers live and cost the 16-bit kernels about 4%
// (spills). With FLASHEXT_GELU_FAST_PHI the exact form of a 16-bit result goes through
// gelu_erf_16 / gelu_erf_16_grad (gelu_math.h: one exponential and one reciprocal, the bf16
// forward with a shorter fit than fp16's) instead of erff, within one rounding step of the exact
// value for every 16-bit z; measured on the H200 at 2f9688e: bias + GeLU 16-bit 0.60 -> 0.79 of
// copy, its backward 0.73 -> 0.93 (docs/notes/gelu.md). -DFLASHEXT_GELU_FAST_PHI=0 restores erff
// for A/B runs.
#ifndef FLASHEXT_GELU_FAST_PHI
#define FLASHEXT_GELU_FAST_PHI 1
#endif
template <typename T, bool kBackward, bool kTanh>
FX_DEVICE float gelu_epilogue(float z, float g) {
  constexpr bool kFastPhi = FLASHEXT_GELU_FAST_PHI && sizeof(T) == 2;
  if constexpr (kBackward) {
    return g * (kTanh ? gelu_tanh_grad(z) : kFastPhi ? gelu_erf_16_grad(z) : gelu_erf_grad(z));
  } else {
    return kTanh ? gelu_tanh(z) : kFastPhi ? gelu_erf_16<std::is_same_v<T, __nv_bfloat16>>(z) : gelu_erf(z);
  }
}

template <typename T, int kVec, bool kBackward, bool kTanh>
__global__ void __launch_bounds__(kFlatThreads, kFlatMinBlocks<kBackward>) add_gelu_kernel(const FlatArgs args) {
  using P = Pack<T, kVec>;
  const T* x = static_cast<const T*>(args.x);
  const T* y = static_cast<const T*>(args.y);
  const T* grad_out = static_cast<const T*>(args.grad_out);
  T* dst = static_cast<T*>(args.dst);
  const int64_t num_packs = args.n / kVec;
  const int64_t pack = int64_t(blockIdx.x) * kFlatThreads + threadIdx.x;

  if (pack < num_packs) {
    // All loads first, then the math: the 16-byte requests of x, y (and grad_out) overlap.
    const P x_pack = load_pack<T, kVec>(x, pack);
    const P y_pack = load_pack<T, kVec>(y, pack);
    P g_pack;
    if constexpr (kBackward) g_pack = load_pack<T, kVec>(grad_out, pack);
    float xs[kVec], ys[kVec], gs[kVec];
    unpack(x_pack, xs);
    unpack(y_pack, ys);
    if constexpr (kBackward) unpack(g_pack, gs);
    P out;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const float z = xs[i] + ys[i];  // z = x + y
      out.elem[i] = from_float<T>(gelu_epilogue<T, kBackward, kTanh>(z, kBackward ? gs[i] : 0.0f));
    }
    store_pack<T, kVec>(dst, pack, out);
  }

  // The n % kVec elements after the last full pack.
  if (kVec > 1 && blockIdx.x == 0) {
    const int64_t index = num_packs * kVec + threadIdx.x;
    if (index < args.n) {
      const float z = to_float(x[index]) + to_float(y[index]);
      const float g = kBackward ? to_float(grad_out[index]) : 0.0f;
      dst[index] = from_float<T>(gelu_epilogue<T, kBackward, kTanh>(z, g));
    }
  }
}

// Rows in flight per thread (RowColPlan): for the fp32 forward (memory-bound, one 16-byte load
// per row) 2, or 4 over many waves (bias_gelu_fwd_rows_fp32: 8192 × 16384 268 → 262 µs, 0.96 →
// 0.98 of a same-bytes copy; 256 × 16384, two waves, 14.0 → 14.4 µs, so 2 there); 4 for the
// 16-bit forward (with the erff-free Φ it is memory-bound too; A/B at 6aab2cc, 8192 × 16384: 1 row
// 0.78-0.79 of copy, 2 rows 0.87, 4 rows 0.93); 1 for the backward, where the math sets the pace.
// FLASHEXT_GELU_BIAS_ROWS_16 (1, 2 or 4) sets the 16-bit forward's.
#ifndef FLASHEXT_GELU_BIAS_ROWS_16
#define FLASHEXT_GELU_BIAS_ROWS_16 4
#endif
template <typename T, bool kBackward>
constexpr int kBiasRowUnroll = kBackward ? 1 : sizeof(T) == 4 ? 2 : FLASHEXT_GELU_BIAS_ROWS_16;
// Resident blocks per SM for the bias kernels (register cap, as for the flat kernel): 6 (42
// registers) for one row in flight and for the fp32 forward's 2 (40 registers); 16-bit rows in
// flight need more registers each: 2 rows fit 5 blocks (at 6 the bf16 kernel spills 14 bytes);
// 4 rows 4 blocks (the fp32 forward's 4 rows spill 56 bytes at 6 blocks, 12 at 5; A/B at 7145978:
// 2 rows at 8 blocks (8 bytes spilled) 1-5% slower, 3 rows at 5 blocks between 2 and 4).
template <typename T, bool kBackward, int kRowUnroll>
constexpr int kRowColMinBlocks = kBackward || kRowUnroll >= 4 ? 4 : sizeof(T) == 2 && kRowUnroll == 2 ? 5 : 6;

// kRing (16-bit forward, one-wave grids: bias_gelu_fwd_ring): each thread streams its rows through
// a private ring of kRowUnroll shared-memory slots filled by cp.async, one commit group per row, so
// row k is computed as soon as rows 0 … k have landed. Loaded into registers, a thread's four row
// loads share one scoreboard, and a warp waits for its last row before computing its first; in a
// one-wave grid the math then bunches up after the last bytes arrive. A/B at e9def82 (256 × 16384,
// of a same-bytes copy, two paired runs): fp16 0.89 → 0.98, bf16 0.89-0.90 → 1.00; 2 slots (rows
// streamed) 0.97 / 0.94. Over many waves the register path is faster (8192 × 16384 with the ring:
// 0.87 / 0.91 of the ceiling, against 0.94 / 0.94), and fp32 (two rows, memory-bound) measured the
// same either way.
template <typename T, int kVec, bool kBackward, bool kTanh, bool kRing = false,
          int kRowUnroll = kBiasRowUnroll<T, kBackward>>
__global__ void __launch_bounds__(RowColPlan::kColThreads* RowColPlan::kRowThreads,
                                  kRowColMinBlocks<T, kBackward, kRowUnroll>) bias_gelu_kernel(const RowColArgs args) {
  static_assert(!kRing || (!kBackward && kVec > 1), "the ring is the vectorized forward's");
  constexpr int kColThreads = RowColPlan::kColThreads;
  constexpr int kRowThreads = RowColPlan::kRowThreads;
  using P = Pack<T, kVec>;
  const T* x = static_cast<const T*>(args.x);
  const T* grad_out = static_cast<const T*>(args.grad_out);
  T* dst = static_cast<T*>(args.dst);

  const int64_t col_pack = int64_t(blockIdx.x) * kColThreads + threadIdx.x;
  const bool col_valid = col_pack * kVec < args.cols;  // cols % kVec == 0 when kVec > 1
  const int64_t row_begin = int64_t(blockIdx.y) * args.rows_per_block;
  const int64_t row_end =
      row_begin + args.rows_per_block < args.rows ? row_begin + args.rows_per_block : args.rows;
  const int64_t x_row_packs = args.x_row_stride / kVec;
  const int64_t dst_row_packs = args.cols / kVec;

  float bias[kVec];
  float bias_grad[kVec];  // Σ over this thread's rows of grad_x (backward)
  if (col_valid) {
    const P bias_pack = load_pack<T, kVec>(static_cast<const T*>(args.bias), col_pack);
    unpack(bias_pack, bias);
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) bias_grad[i] = 0.0f;

  if constexpr (kRing) {
    constexpr int kThreads = kColThreads * kRowThreads;
    __shared__ alignas(16) P ring[kRowUnroll][kThreads];
    const int tid = threadIdx.y * kColThreads + threadIdx.x;
    const int64_t block_rows = row_end - row_begin;
    const int64_t my_rows = block_rows > threadIdx.y ? (block_rows - threadIdx.y + kRowThreads - 1) / kRowThreads : 0;
    if (col_valid) {
      const auto issue = [&](int64_t k) {  // this thread's row k into slot k % kRowUnroll
        const int64_t row = row_begin + threadIdx.y + k * kRowThreads;
        ptx::cp_async_16(ptx::smem_addr(&ring[k % kRowUnroll][tid]), x + (row * x_row_packs + col_pack) * kVec, 16);
      };
      const auto compute = [&](int64_t, int slot) {
        float xs[kVec];
        unpack(ring[slot][tid], xs);
        P out;
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          out.elem[i] = from_float<T>(gelu_epilogue<T, /*kBackward=*/false, kTanh>(xs[i] + bias[i], 0.0f));
        }
        return out;
      };
      const auto store = [&](int64_t k, const P& out) {
        store_pack<T, kVec>(dst, (row_begin + threadIdx.y + k * kRowThreads) * dst_row_packs + col_pack, out);
      };
      ring_prologue<kRowUnroll>(my_rows, issue);
      ring_rows<kRowUnroll>(my_rows, issue, compute, store);
    }
  } else if (col_valid) {
    for (int64_t row0 = row_begin + threadIdx.y; row0 < row_end; row0 += kRowThreads * kRowUnroll) {
      P x_pack[kRowUnroll], g_pack[kRowUnroll];
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int64_t row = row0 + u * kRowThreads;
        if (row < row_end) {
          x_pack[u] = load_pack<T, kVec>(x, row * x_row_packs + col_pack);
          if constexpr (kBackward) g_pack[u] = load_pack<T, kVec>(grad_out, row * dst_row_packs + col_pack);
        }
      }
#pragma unroll
      for (int u = 0; u < kRowUnroll; ++u) {
        const int64_t row = row0 + u * kRowThreads;
        if (row < row_end) {
          float xs[kVec], gs[kVec];
          unpack(x_pack[u], xs);
          if constexpr (kBackward) unpack(g_pack[u], gs);
          P out;
#pragma unroll
          for (int i = 0; i < kVec; ++i) {
            const float z = xs[i] + bias[i];  // z = x + bias
            const float value = gelu_epilogue<T, kBackward, kTanh>(z, kBackward ? gs[i] : 0.0f);
            out.elem[i] = from_float<T>(value);
            if constexpr (kBackward) bias_grad[i] += value;  // fp32, before rounding to T
          }
          store_pack<T, kVec>(dst, row * dst_row_packs + col_pack, out);
        }
      }
    }
  }

  if constexpr (kBackward) {
    // partial[blockIdx.y, c] = Σ_{threadIdx.y} bias_grad — reduce the row threads in shared memory.
    __shared__ float smem[kRowThreads][kColThreads * kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) smem[threadIdx.y][threadIdx.x * kVec + i] = bias_grad[i];
    __syncthreads();  // every row thread's sums are in shared memory
    for (int e = threadIdx.y * kColThreads + threadIdx.x; e < kColThreads * kVec;
         e += kColThreads * kRowThreads) {
      float sum = 0.0f;
#pragma unroll
      for (int r = 0; r < kRowThreads; ++r) sum += smem[r][e];
      const int64_t col = int64_t(blockIdx.x) * kColThreads * kVec + e;
      if (col < args.cols) args.partial[int64_t(blockIdx.y) * args.cols + col] = sum;
    }
  }
}

// grad_bias[c] = Σ_{g < num_groups} partial[g, c]
constexpr int kReduceCols = 32;
constexpr int kReduceSlices = 8;

template <typename T>
__global__ void __launch_bounds__(kReduceCols* kReduceSlices)
    bias_grad_reduce_kernel(const float* partial, T* grad_bias, int64_t num_groups, int64_t cols) {
  __shared__ float smem[kReduceSlices][kReduceCols];
  const int64_t col = int64_t(blockIdx.x) * kReduceCols + threadIdx.x;
  float sum = 0.0f;
  if (col < cols) {
    for (int64_t g = threadIdx.y; g < num_groups; g += kReduceSlices) sum += partial[g * cols + col];
  }
  smem[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();  // all slices written
  if (threadIdx.y == 0 && col < cols) {
    float total = 0.0f;
#pragma unroll
    for (int s = 0; s < kReduceSlices; ++s) total += smem[s][threadIdx.x];
    grad_bias[col] = from_float<T>(total);
  }
}

// Few rows, one launch (BiasBwdOnePass): block b owns columns [b · kCols, (b + 1) · kCols),
// kCols = kColThreads · kVec; thread (tx, ty) = (t % kColThreads, t / kColThreads) walks the rows
// ty + kRowThreads · k. Each thread streams its rows through a private ring of kStages
// shared-memory slots (x and grad_out packs) filled by cp.async: rows k + 1 … k + kStages − 1 are
// in flight while row k is computed, and no registers hold them. Its fp32 bias-gradient sums are
// first added over the kWarpRows = 32 / kColThreads row threads of its warp by shuffles (lanes
// kColThreads apart hold the same columns), then go through shared memory ([warp][tx · kVec + e],
// rows padded by one float, after the ring); kSlices = block / kCols threads per column add every
// kSlices-th warp's sum, and a shuffle across those kSlices neighbouring lanes finishes the column
// (kSlices ≤ 32: vectorized layouts only).
//
// Measured at 256 × 16384, of a same-bytes copy (fp32 / fp16 / bf16; docs/notes/gelu.md):
// - block shape (BiasBwdOnePass), one row at a time through registers, A/B at 0063fc5: 4 column
//   threads (64-byte row segments, 256 threads, 4 blocks/SM) 0.76-0.79; 8 (a warp reads whole
//   128-byte lines of 4 rows; 512 threads, 2 blocks/SM) 0.81-0.85; 16 (256-byte segments)
//   0.81-0.84. An L2 prefetch of every row up front did not move the 4-thread layout (f5e6224).
// - rows in flight with 8 column threads, A/Bs at 3e06f99 and 5593c42: one row through registers
//   0.84 / 0.84 / 0.84 (three runs); two through registers (64 registers) 0.82-0.83 / 0.81 / 0.82;
//   a ring of 2 slots 0.86-0.87 / 0.86 / 0.86 (three runs), of 3 slots 0.83 / 0.81 / 0.82.
// - the ring's reads with an L2 evict-first policy (A/B at e9def82, two paired runs): 0.89 / 0.89-0.90
//   / 0.90 against 0.87 / 0.88 / 0.89-0.90 (0.90-0.93 of a same-mix torch.add against 0.89-0.91).
// - deeper rings (A/B at 115d3ae): 4 slots, every row requested up front, 0.83 / 0.83 / 0.83; with
//   the shared-memory carveout at 100% (a knob since removed) 4 slots 0.84, 3 slots 0.84-0.86; base 0.89-0.90.
//   FLASHEXT_GELU_ONE_PASS_STAGES (1-6) sets the slots for A/B runs.
// - row threads (timeline at 923e23c, of a same-bytes copy, bf16 / fp32): 256 rows: 64 0.856-0.866 /
//   0.848, 32 0.838-0.841 / 0.869-0.870, 16 0.73 / 0.875; 1024 rows: 64 0.850 / 0.821, 32 0.862 /
//   0.876, 16 0.706 / 0.848. fp32 takes 32 (one wave at 16384 columns), 16-bit types 64.
// - the sums in bytes of their own instead of the ring's (one barrier after the rows, not two;
//   timeline at fe1cd40, benchmarks/experiments/bias_bwd_timeline.cu): a block's last row done →
//   its bias gradient stored 512 → 416 ns, the launch 12.13 → 11.97-12.03 µs.
// - rows in 32 bits and pack pointers at the thread's column (A/B at 49cebed, two paired runs, and
//   the timeline): 0.91 / 0.91 / 0.91-0.92 against 0.91-0.92 / 0.90-0.91 / 0.91; timeline bf16
//   0.851-0.852 against 0.847-0.850, fp32 0.873-0.875 against 0.864-0.869.
// - each warp's row threads added by shuffles before shared memory (16 sums a column instead of 64
//   for 16-bit types; timeline and A/B at f15577f): a block's last row done → its bias gradient
//   stored 416 → 320 ns; bench_gelu 16-bit 12.16-12.26 → 12.08-12.10 µs (0.91 / 0.91-0.92 →
//   0.91 / 0.93 of a same-bytes copy), fp32 level (0.91).
#ifndef FLASHEXT_GELU_ONE_PASS_STAGES
#define FLASHEXT_GELU_ONE_PASS_STAGES 2
#endif

// Row threads of the one-pass kernel (BiasBwdOnePass); A/B knobs FLASHEXT_GELU_ONE_PASS_FP32_ROW_THREADS
// and FLASHEXT_GELU_ONE_PASS_16BIT_ROW_THREADS.
#ifndef FLASHEXT_GELU_ONE_PASS_FP32_ROW_THREADS
#define FLASHEXT_GELU_ONE_PASS_FP32_ROW_THREADS BiasBwdOnePass::kRowThreadsFp32
#endif
#ifndef FLASHEXT_GELU_ONE_PASS_16BIT_ROW_THREADS
#define FLASHEXT_GELU_ONE_PASS_16BIT_ROW_THREADS BiasBwdOnePass::kRowThreads
#endif
template <typename T>
constexpr int kOnePassRowThreads =
    sizeof(T) == 4 ? FLASHEXT_GELU_ONE_PASS_FP32_ROW_THREADS : FLASHEXT_GELU_ONE_PASS_16BIT_ROW_THREADS;
template <typename T>
constexpr int kOnePassThreads = BiasBwdOnePass::kColThreads * kOnePassRowThreads<T>;

// Row threads a warp holds, whose sums the one-pass kernel adds by shuffles.
constexpr int kOnePassWarpRows = 32 / BiasBwdOnePass::kColThreads;

// Dynamic shared memory of the one-pass kernel: the ring, then the reduction's sums, a row per warp.
template <typename T, int kVec>
constexpr size_t one_pass_smem_bytes() {
  constexpr size_t kRingBytes = sizeof(Pack<T, kVec>) * 2 * FLASHEXT_GELU_ONE_PASS_STAGES * kOnePassThreads<T>;
  constexpr size_t kSumBytes =
      sizeof(float) * (kOnePassRowThreads<T> / kOnePassWarpRows) * (BiasBwdOnePass::kColThreads * kVec + 1);
  return kRingBytes + kSumBytes;
}

template <typename T, int kVec, bool kTanh>
__global__ void __launch_bounds__(kOnePassThreads<T>, 1024 / kOnePassThreads<T>)
    bias_gelu_bwd_one_pass_kernel(const RowColArgs args) {
  constexpr int kColThreads = BiasBwdOnePass::kColThreads, kRowThreads = kOnePassRowThreads<T>;
  constexpr int kThreads = kColThreads * kRowThreads, kStages = FLASHEXT_GELU_ONE_PASS_STAGES;
  constexpr int kCols = kColThreads * kVec, kSlices = kThreads / kCols;
  constexpr int kWarpRows = kOnePassWarpRows, kWarps = kThreads / 32;
  static_assert(32 % kColThreads == 0 && kRowThreads % kWarpRows == 0, "a warp holds whole row threads");
  static_assert(kVec > 1 && kSlices <= 32 && kWarps % kSlices == 0, "one lane group per column");
  static_assert(kStages >= 1 && kStages <= 6, "a slot is 32 bytes a thread: 16 KiB for 512 threads");
  using P = Pack<T, kVec>;
  FLASHEXT_GELU_TRACE(0);  // entry
  const T* x = static_cast<const T*>(args.x);
  const T* grad_out = static_cast<const T*>(args.grad_out);
  T* dst = static_cast<T*>(args.dst);
  const int tx = threadIdx.x % kColThreads, ty = threadIdx.x / kColThreads;
  const int64_t col_pack = int64_t(blockIdx.x) * kColThreads + tx;
  const bool col_valid = col_pack * kVec < args.cols;  // cols % kVec == 0

  // ring[slot][0 = x, 1 = grad_out][thread], then the reduction's sums[warp][column]:
  // one_pass_smem_bytes<T, kVec>() of dynamic shared memory (36.1 KiB for 16-bit types, 17.0 for fp32).
  extern __shared__ __align__(16) unsigned char smem[];
  auto ring = reinterpret_cast<P(*)[2][kThreads]>(smem);

  float bias[kVec], bias_grad[kVec];
#pragma unroll
  for (int e = 0; e < kVec; ++e) bias_grad[e] = 0.0f;
  if (col_valid) {
    // rows ≤ BiasBwdOnePass::kMaxRows (bias_gelu_bwd_one_pass): row numbers and counts in 32 bits,
    // pack pointers at this thread's column, the strides (non-negative multiples of kVec) divided by
    // a shift — 8 fewer instructions a row and the first request 20 earlier than 64-bit row indexing
    // with signed divisions (A/B at 49cebed: level to +1%).
    const P* x_col = reinterpret_cast<const P*>(x) + col_pack;
    const P* grad_col = reinterpret_cast<const P*>(grad_out) + col_pack;
    P* dst_col = reinterpret_cast<P*>(dst) + col_pack;
    const int64_t x_stride = int64_t(uint64_t(args.x_row_stride) / kVec), stride = int64_t(uint64_t(args.cols) / kVec);
    const uint64_t policy = ptx::l2_evict_first_policy();  // x and grad_out are read once
    const auto issue = [&](int k) {  // row k of this thread into its slot
      const int row = ty + k * kRowThreads;
      const int slot = k % kStages;
      ptx::cp_async_16_policy(ptx::smem_addr(&ring[slot][0][threadIdx.x]), x_col + row * x_stride, policy);
      ptx::cp_async_16_policy(ptx::smem_addr(&ring[slot][1][threadIdx.x]), grad_col + row * stride, policy);
    };
    const unsigned rows = unsigned(args.rows);
    const int my_rows = rows > unsigned(ty) ? int((rows - unsigned(ty) + kRowThreads - 1) / kRowThreads) : 0;
    ring_prologue<kStages>(my_rows, issue);
    const P bias_pack = load_pack<T, kVec>(static_cast<const T*>(args.bias), col_pack);
    unpack(bias_pack, bias);
    FLASHEXT_GELU_TRACE(1);  // rows 0 … kStages − 1 requested
    const auto compute = [&](int, int slot) {
      float xs[kVec], gs[kVec];
      unpack(ring[slot][0][threadIdx.x], xs);
      unpack(ring[slot][1][threadIdx.x], gs);
      P out;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float value = gelu_epilogue<T, /*kBackward=*/true, kTanh>(xs[e] + bias[e], gs[e]);
        out.elem[e] = from_float<T>(value);
        bias_grad[e] += value;  // fp32, before rounding to T
      }
      return out;
    };
    const auto store = [&](int k, const P& out) { dst_col[(ty + k * kRowThreads) * stride] = out; };
    ring_rows<kStages>(my_rows, issue, compute, store);
    ptx::cp_async_wait<0>();  // the groups left are empty: nothing in flight past here
  }
  FLASHEXT_GELU_TRACE(6);  // rows done

  // The warp's row threads are added first, by shuffles: one row of sums per warp, a quarter of the
  // shared-memory traffic after the rows. The sums have their own bytes after the ring, so a warp
  // writes them as soon as its rows are done, and one barrier (not two) stands between the last
  // row and the reduction.
  auto sums = reinterpret_cast<float(*)[kCols + 1]>(smem + sizeof(P) * 2 * kStages * kThreads);
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
#pragma unroll
    for (int offset = kColThreads; offset < 32; offset *= 2)
      bias_grad[e] += __shfl_xor_sync(0xffffffffu, bias_grad[e], offset);
  }
  if (ty % kWarpRows == 0) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) sums[ty / kWarpRows][tx * kVec + e] = bias_grad[e];
  }
  __syncthreads();  // every warp's sums are in shared memory
  const int col = threadIdx.x / kSlices, slice = threadIdx.x % kSlices;
  float sum = 0.0f;
#pragma unroll
  for (int w = slice; w < kWarps; w += kSlices) sum += sums[w][col];
#pragma unroll
  for (int offset = kSlices / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const int64_t out_col = int64_t(blockIdx.x) * kCols + col;
  if (slice == 0 && out_col < args.cols) static_cast<T*>(args.grad_bias)[out_col] = from_float<T>(sum);
  FLASHEXT_GELU_TRACE(7);  // bias gradient stored
}

// ---- launch helpers -----------------------------------------------------------------------

template <typename T, bool kBackward>
cudaError_t launch_add_gelu(const FlatArgs& args, cudaStream_t stream) {
  constexpr int kVec = kVec16<T>;
  const bool vectorized = is_aligned16(args.x) && is_aligned16(args.y) && is_aligned16(args.dst) &&
                          (!kBackward || is_aligned16(args.grad_out));
  const int vec = vectorized ? kVec : 1;
  const dim3 grid(unsigned(std::max<int64_t>(1, ceil_div(args.n / vec, kFlatThreads))));
  if (vectorized) {
    if (args.tanh_form) add_gelu_kernel<T, kVec, kBackward, true><<<grid, kFlatThreads, 0, stream>>>(args);
    else add_gelu_kernel<T, kVec, kBackward, false><<<grid, kFlatThreads, 0, stream>>>(args);
  } else {
    if (args.tanh_form) add_gelu_kernel<T, 1, kBackward, true><<<grid, kFlatThreads, 0, stream>>>(args);
    else add_gelu_kernel<T, 1, kBackward, false><<<grid, kFlatThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

// The kernel's rows in flight are the plan's: kBiasRowUnroll, or for the vectorized fp32 forward
// bias_gelu_fwd_rows_fp32's choice.
template <typename T, bool kBackward>
cudaError_t launch_bias_gelu(const RowColArgs& args, const RowColPlan& plan, cudaStream_t stream) {
  constexpr int kVec = kVec16<T>;
  const dim3 grid(unsigned(plan.grid_x), unsigned(plan.grid_y));
  const dim3 block(RowColPlan::kColThreads, RowColPlan::kRowThreads);
  if constexpr (!kBackward && sizeof(T) == 2) {
    if (plan.vec == kVec && bias_gelu_fwd_ring(plan, current_device_sm_count())) {
      if (args.tanh_form) bias_gelu_kernel<T, kVec, false, true, true><<<grid, block, 0, stream>>>(args);
      else bias_gelu_kernel<T, kVec, false, false, true><<<grid, block, 0, stream>>>(args);
      return cudaGetLastError();
    }
  }
  if constexpr (!kBackward && sizeof(T) == 4) {
    if (plan.vec == kVec && plan.row_unroll == kBiasRowUnrollManyWaves) {
      constexpr int kRows = kBiasRowUnrollManyWaves;
      if (args.tanh_form) bias_gelu_kernel<T, kVec, false, true, false, kRows><<<grid, block, 0, stream>>>(args);
      else bias_gelu_kernel<T, kVec, false, false, false, kRows><<<grid, block, 0, stream>>>(args);
      return cudaGetLastError();
    }
  }
  if (plan.vec == kVec) {
    if (args.tanh_form) bias_gelu_kernel<T, kVec, kBackward, true><<<grid, block, 0, stream>>>(args);
    else bias_gelu_kernel<T, kVec, kBackward, false><<<grid, block, 0, stream>>>(args);
  } else {
    if (args.tanh_form) bias_gelu_kernel<T, 1, kBackward, true><<<grid, block, 0, stream>>>(args);
    else bias_gelu_kernel<T, 1, kBackward, false><<<grid, block, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

// Calls fn(T{}) with the storage type of dtype: the one dtype switch of the family.
template <typename Fn>
cudaError_t dispatch_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: return fn(float{});
    case DType::kFloat16: return fn(__half{});
    case DType::kBFloat16: return fn(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace gelu_detail
}  // namespace flashext
