// flashext Hopper (sm_90a) primitives, as inline PTX: mbarriers, TMA tile loads and stores, bulk
// copies and reductions, the async proxy fence, warpgroup MMA (wgmma) with shared-memory matrix
// descriptors, stmatrix, named barriers, and register reallocation.
// The building blocks of the Hopper attention path (docs/notes/attention_sm90_fwd.md, "Pipeline
// and barriers"); tests/cpp/test_sm90.cu checks each against the CPU. Compiled for anything but
// sm_90a (whose `a` features these are) every function traps: callers dispatch on the device first.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "macros.h"
#include "ptx.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FX_SM90_ENABLED 1
#else
#define FX_SM90_ENABLED 0
#endif

namespace flashext {
namespace sm90 {

// Whether this compilation holds the sm_90a instructions (device code; false on the host pass).
FX_DEVICE constexpr bool enabled() { return FX_SM90_ENABLED != 0; }

FX_DEVICE uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// ---- mbarriers (PTX ISA §9.7.13.15) ---------------------------------------------------------
FX_DEVICE void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
#if FX_SM90_ENABLED
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
#else
  __trap();
#endif
}

// Makes mbarrier.init visible to the async proxy (TMA) and the other threads of the cluster.
FX_DEVICE void fence_barrier_init() {
#if FX_SM90_ENABLED
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
  __trap();
#endif
}

// One arrival that also announces `bytes` the async proxy will deliver (complete_tx) this phase.
FX_DEVICE void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if FX_SM90_ENABLED
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}

FX_DEVICE void mbarrier_arrive(uint64_t* bar) {
#if FX_SM90_ENABLED
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
#else
  __trap();
#endif
}

// Blocks until the phase with parity `phase` has completed.
FX_DEVICE void mbarrier_wait(uint64_t* bar, uint32_t phase) {
#if FX_SM90_ENABLED
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_loop:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_loop;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(phase)
      : "memory");
#else
  __trap();
#endif
}

// mbarrier_wait for a producer, which waits far ahead of its consumers for a stage's release: a
// thread that finds the phase open is suspended until the barrier completes it (at most
// kWaitSuspendNs, then it asks again) instead of polling, whose issued instructions are taken from
// the consumer warps of its SM sub-partition. The consumers keep mbarrier_wait: their data is
// mostly there, and polling wakes a late one soonest.
inline constexpr uint32_t kWaitSuspendNs = 10'000'000;
FX_DEVICE void mbarrier_wait_suspended(uint64_t* bar, uint32_t phase) {
#if FX_SM90_ENABLED
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_loop:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1, %2;\n"
      "@!done bra wait_loop;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(phase), "n"(kWaitSuspendNs)
      : "memory");
#else
  __trap();
#endif
}

// ---- TMA (PTX ISA §9.7.9.25 cp.async.bulk.tensor) -------------------------------------------
// A 2-D box of the tensor `map` describes (a CUtensorMap in global, constant or parameter memory)
// at (col, row) in elements, into shared memory at dst, completing on `bar` (which must expect the
// box's bytes).
FX_DEVICE void tma_load_2d(void* dst, const void* map, uint64_t* bar, int col, int row) {
#if FX_SM90_ENABLED
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::
          "r"(smem_addr(dst)),
      "l"(map), "r"(smem_addr(bar)), "r"(col), "r"(row)
      : "memory");
#else
  __trap();
#endif
}

// A 4-D box at coordinates c0 (innermost) … c3, as tma_load_2d.
FX_DEVICE void tma_load_4d(void* dst, const void* map, uint64_t* bar, int c0, int c1, int c2, int c3) {
#if FX_SM90_ENABLED
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];\n" ::"r"(smem_addr(dst)),
      "l"(map), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
#else
  __trap();
#endif
}

// A 4-D box of shared memory at src (laid out as the map's loads write it) to global memory at
// coordinates c0 (innermost) … c3, rows past the tensor's bounds left out, by the TMA; completes
// with the bulk async-group committed after it. The shared-memory writes it reads must be ordered
// before it by fence_proxy_async.
FX_DEVICE void tma_store_4d(const void* map, const void* src, int c0, int c1, int c2, int c3) {
#if FX_SM90_ENABLED
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(map),
               "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
#else
  (void)map, (void)src, (void)c0, (void)c1, (void)c2, (void)c3;
  __trap();
#endif
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) of global memory at src into shared
// memory at dst by the bulk copy engine, completing on `bar` (which must expect them).
FX_DEVICE void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if FX_SM90_ENABLED
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
#else
  (void)dst, (void)src, (void)bytes, (void)bar;
  __trap();
#endif
}

// Orders this thread's generic-proxy shared-memory writes before later async-proxy (TMA, wgmma)
// accesses of them.
FX_DEVICE void fence_proxy_async() {
#if FX_SM90_ENABLED
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
  __trap();
#endif
}

// Orders this thread's generic-proxy global-memory accesses against its async-proxy (bulk copy)
// accesses of global memory, either way (the Hopper backward's deterministic dQ: a counter read
// before a bulk reduce-add, a bulk reduce-add's completion before the counter's increment).
FX_DEVICE void fence_proxy_async_global() {
#if FX_SM90_ENABLED
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
#else
  __trap();
#endif
}

// Zeroes rows [first, rows) of a landed tile of `slabs` 64-column slabs (128-byte rows, slab_bytes
// apart; the 128-byte swizzle moves 16-byte chunks only within a row), thread `thread` of `threads`
// taking every threads-th chunk. The caller orders the stores before async-proxy reads
// (fence_proxy_async and a barrier of the threads).
FX_DEVICE void zero_tile_rows(unsigned char* tile, int slabs, int slab_bytes, int rows, int first, int thread,
                              int threads) {
  const int chunks = (rows - first) * 8;  // 16-byte chunks per slab
  for (int i = thread; i < chunks * slabs; i += threads) {
    const int slab = i / chunks, chunk = i % chunks;
    *reinterpret_cast<uint4*>(tile + slab * slab_bytes + first * 128 + chunk * 16) = make_uint4(0, 0, 0, 0);
  }
}

// ---- bulk reductions from shared memory (§9.7.9.24 cp.reduce.async.bulk, bulk async-groups) ----
// Adds `bytes` of fp32 (a multiple of 16; both addresses 16-byte aligned) from shared memory into
// global memory, element by element and atomically per element, by the bulk copy engine; the
// shared-memory writes it reads must be ordered before it by fence_proxy_async. Completes with the
// bulk async-group committed after it (the Hopper backward's dQ accumulation).
FX_DEVICE void bulk_reduce_add_f32(float* global_dst, const float* smem_src, uint32_t bytes) {
#if FX_SM90_ENABLED
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(global_dst),
               "r"(smem_addr(smem_src)), "r"(bytes)
               : "memory");
#else
  (void)global_dst, (void)smem_src, (void)bytes;
  __trap();
#endif
}

// Closes this thread's bulk operations issued since the last commit into one bulk async-group.
FX_DEVICE void bulk_commit_group() {
#if FX_SM90_ENABLED
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#else
  __trap();
#endif
}

// Waits until at most kPending of this thread's bulk async-groups have not finished reading their
// shared-memory sources (the buffers may then be rewritten; the global writes may still be in
// flight) ...
template <int kPending>
FX_DEVICE void bulk_wait_group_read() {
#if FX_SM90_ENABLED
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
#else
  __trap();
#endif
}

// ... or have not completed (their writes visible to this thread).
template <int kPending>
FX_DEVICE void bulk_wait_group() {
#if FX_SM90_ENABLED
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
#else
  __trap();
#endif
}

// ---- stmatrix (§9.7.14.5.16; warp-collective) ------------------------------------------------
// Stores four 8 × 8 16-bit matrices from registers to shared memory, each transposed: register i
// holds this thread's pair of matrix i in the mma fragment layout (row lane / 4, columns
// 2 (lane % 4) + {0, 1}); lane 8 i + j passes the shared address of the 16-byte row j of matrix
// i's destination, which receives column j of matrix i. (The Hopper backward's dSᵀ.)
FX_DEVICE void stmatrix_x4_trans(void* row, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
#if FX_SM90_ENABLED
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(row)),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
#else
  (void)row, (void)r0, (void)r1, (void)r2, (void)r3;
  __trap();
#endif
}

// ... and as they are: lane 8 i + j passes the address of the 16-byte row j of matrix i, which
// receives row j. (The Hopper backward's dK and dV on their way out.)
FX_DEVICE void stmatrix_x4(void* row, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
#if FX_SM90_ENABLED
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(row)), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
#else
  (void)row, (void)r0, (void)r1, (void)r2, (void)r3;
  __trap();
#endif
}

// A warpgroup's 64 × kCols fp32 wgmma accumulator (element 4 i + 2 r + e: row 16 warp + lane / 4
// + 8 r, column 8 i + 2 (lane % 4) + e), each row half r times scale[r], as 16-bit T into slabs of
// 64 rows × 128 bytes (64 columns; slab_bytes apart) in the 128-byte swizzle a TMA store reads:
// stmatrix x4 of n8 tiles 2 k and 2 k + 1, lane 8 m + j addressing row j of matrix m, which is row
// 16 warp + 8 (m % 2) + j of n8 tile 2 k + m / 2: slab n8 / 8, 16-byte chunk (n8 % 8) ^ j. (The
// Hopper forward's O and backward's dK and dV on their way out.)
template <typename T, int kCols>
FX_DEVICE void stmatrix_accumulator(unsigned char* slabs, int slab_bytes, const float (&acc)[kCols / 2],
                                    float scale_top, float scale_bottom) {
  const int lane = threadIdx.x % 32, m = lane / 8, j = lane % 8;
  unsigned char* row = slabs + (16 * ((threadIdx.x / 32) % 4) + 8 * (m % 2) + j) * 128;
#pragma unroll
  for (int k = 0; k < kCols / 16; ++k) {
    const int n8 = 2 * k + m / 2;
    stmatrix_x4(row + (n8 / 8) * slab_bytes + (((n8 % 8) ^ j) << 4),
                ptx::pack2<T>(acc[8 * k] * scale_top, acc[8 * k + 1] * scale_top),
                ptx::pack2<T>(acc[8 * k + 2] * scale_bottom, acc[8 * k + 3] * scale_bottom),
                ptx::pack2<T>(acc[8 * k + 4] * scale_top, acc[8 * k + 5] * scale_top),
                ptx::pack2<T>(acc[8 * k + 6] * scale_bottom, acc[8 * k + 7] * scale_bottom));
  }
}

// ---- register reallocation (§9.7.17.2 setmaxnreg; every warp of the warpgroup executes it) ----
template <int kRegisters>
FX_DEVICE void setmaxnreg_inc() {
#if FX_SM90_ENABLED
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
#else
  __trap();
#endif
}

template <int kRegisters>
FX_DEVICE void setmaxnreg_dec() {
#if FX_SM90_ENABLED
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
#else
  __trap();
#endif
}

// ---- named barriers (§9.7.13.1 bar / barrier): ids 1-15 (0 is __syncthreads'), a thread count
// that is a multiple of 32. sync waits until `count` threads have arrived (itself included);
// arrive counts this thread and goes on.
FX_DEVICE void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
FX_DEVICE void named_barrier_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// ---- wgmma (§9.7.15) -----------------------------------------------------------------------
// Shared-memory matrix descriptor (§9.7.15.5.1) of a tile with the 128-byte swizzle: start address
// >> 4 in bits 0-13, leading byte offset >> 4 in 16-29, stride byte offset >> 4 in 32-45, swizzle
// mode in 62-63 (1: 128 B). K-major tiles (rows of 64 16-bit elements, 128 B, 8-row swizzle
// atoms): leading offset unused (1), stride 1024 B between 8-row groups. MN-major tiles (the B of
// P V read from V as stored): leading offset = bytes between 64-element slabs, stride 1024 B.
// Tiles start 1024-byte aligned (the swizzle atom), so the base-offset field stays 0.
FX_DEVICE uint64_t smem_descriptor(const void* tile, uint32_t leading_bytes, uint32_t stride_bytes) {
  const uint64_t address = smem_addr(tile);
  return ((address & 0x3FFFF) >> 4) | (uint64_t((leading_bytes & 0x3FFFF) >> 4) << 16) |
         (uint64_t((stride_bytes & 0x3FFFF) >> 4) << 32) | (uint64_t(1) << 62);
}

FX_DEVICE void wgmma_fence() {
#if FX_SM90_ENABLED
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

FX_DEVICE void wgmma_commit() {
#if FX_SM90_ENABLED
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

template <int kPending>
FX_DEVICE void wgmma_wait() {
#if FX_SM90_ENABLED
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#else
  __trap();
#endif
}

// Keeps the compiler from moving accesses of wgmma operands (accumulators, RS A fragments) across
// wgmma_fence, issue and wait.
template <int kN>
FX_DEVICE void fence_operands(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int kN>
FX_DEVICE void fence_operands(uint32_t (&a)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+r"(a[i])::"memory");
}

// d (64 × 64 fp32 per warpgroup: 32 per thread, the mma.sync m16n8 C layout per warp's 16 rows,
// repeated over 8 n8 tiles) += A (64 × 16, descriptor, K-major) · B (16 × 64, descriptor; K-major
// for trans_b = 0, MN-major for 1). scale_d = 0 ignores d's old values.
template <typename T, int kTransB>
FX_DEVICE void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d);

// The same with A from registers: a[4] the m16n8k16 A fragment of this warp's 16 rows.
template <typename T, int kTransB>
FX_DEVICE void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int scale_d);

// The same at n128 (d: 64 per thread, n8 tile i at d[4 i .. 4 i + 3]): half the instructions of
// two n64 halves, and for SS A is read from shared memory once per 128 columns instead of twice.
template <typename T, int kTransB>
FX_DEVICE void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d);
template <typename T, int kTransB>
FX_DEVICE void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int scale_d);

// The same at n80 (S of D = 256's wider key blocks; d: N / 2 per thread, n8 tile i at
// d[4 i .. 4 i + 3]), B K-major only.
template <typename T, int kN>
FX_DEVICE void wgmma_m64nNk16_ss(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, int scale_d);

#define FX_WGMMA_D32                                                                                   \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FX_WGMMA_D32_OPERANDS                                                                               \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),  \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

#define FX_WGMMA_D64 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FX_WGMMA_D64_OPERANDS \
      "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

#define FX_DEFINE_WGMMA_64(T, TYPE)                                                                          \
  template <>                                                                                                \
  FX_DEVICE void wgmma_m64n64k16_ss<T, 0>(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {   \
    FX_WGMMA_SS(TYPE, 0)                                                                                     \
  }                                                                                                          \
  template <>                                                                                                \
  FX_DEVICE void wgmma_m64n64k16_ss<T, 1>(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {   \
    FX_WGMMA_SS(TYPE, 1)                                                                                     \
  }                                                                                                          \
  template <>                                                                                                \
  FX_DEVICE void wgmma_m64n64k16_rs<T, 0>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,           \
                                          int scale_d) {                                                    \
    FX_WGMMA_RS(TYPE, 0)                                                                                     \
  }                                                                                                          \
  template <>                                                                                                \
  FX_DEVICE void wgmma_m64n64k16_rs<T, 1>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,           \
                                          int scale_d) {                                                    \
    FX_WGMMA_RS(TYPE, 1)                                                                                     \
  }

#define FX_DEFINE_WGMMA_128(T, TYPE)                                                                          \
  template <>                                                                                                 \
  FX_DEVICE void wgmma_m64n128k16_ss<T, 0>(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {   \
    FX_WGMMA_SS128(TYPE, 0)                                                                                   \
  }                                                                                                           \
  template <>                                                                                                 \
  FX_DEVICE void wgmma_m64n128k16_ss<T, 1>(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {   \
    FX_WGMMA_SS128(TYPE, 1)                                                                                   \
  }                                                                                                           \
  template <>                                                                                                 \
  FX_DEVICE void wgmma_m64n128k16_rs<T, 0>(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b,           \
                                           int scale_d) {                                                    \
    FX_WGMMA_RS128(TYPE, 0)                                                                                   \
  }                                                                                                           \
  template <>                                                                                                 \
  FX_DEVICE void wgmma_m64n128k16_rs<T, 1>(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b,           \
                                           int scale_d) {                                                    \
    FX_WGMMA_RS128(TYPE, 1)                                                                                   \
  }

#if FX_SM90_ENABLED
#define FX_WGMMA_SS128(TYPE, TRANS_B)                                                                           \
  asm volatile(                                                                                                 \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                                             \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " FX_WGMMA_D64 ", %64, %65, p, 1, 1, 0, " \
      #TRANS_B ";\n}\n"                                                                                         \
      : FX_WGMMA_D64_OPERANDS                                                                                   \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#define FX_WGMMA_RS128(TYPE, TRANS_B)                                                                          \
  asm volatile(                                                                                                \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                            \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " " FX_WGMMA_D64                             \
      ", {%64, %65, %66, %67}, %68, p, 1, 1, " #TRANS_B ";\n}\n"                                                \
      : FX_WGMMA_D64_OPERANDS                                                                                  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
#define FX_WGMMA_SS(TYPE, TRANS_B)                                                                              \
  asm volatile(                                                                                                 \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                             \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " FX_WGMMA_D32 ", %32, %33, p, 1, 1, 0, " \
      #TRANS_B ";\n}\n"                                                                                         \
      : FX_WGMMA_D32_OPERANDS                                                                                   \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#define FX_WGMMA_RS(TYPE, TRANS_B)                                                                             \
  asm volatile(                                                                                                \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                            \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " " FX_WGMMA_D32                             \
      ", {%32, %33, %34, %35}, %36, p, 1, 1, " #TRANS_B ";\n}\n"                                                \
      : FX_WGMMA_D32_OPERANDS                                                                                  \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
#else
#define FX_WGMMA_SS128(TYPE, TRANS_B) \
  (void)d, (void)desc_a, (void)desc_b, (void)scale_d; \
  __trap();
#define FX_WGMMA_RS128(TYPE, TRANS_B) \
  (void)d, (void)a, (void)desc_b, (void)scale_d; \
  __trap();
#define FX_WGMMA_SS(TYPE, TRANS_B) \
  (void)d, (void)desc_a, (void)desc_b, (void)scale_d; \
  __trap();
#define FX_WGMMA_RS(TYPE, TRANS_B) \
  (void)d, (void)a, (void)desc_b, (void)scale_d; \
  __trap();
#endif

FX_DEFINE_WGMMA_64(__half, "f16")
FX_DEFINE_WGMMA_64(__nv_bfloat16, "bf16")
FX_DEFINE_WGMMA_128(__half, "f16")
FX_DEFINE_WGMMA_128(__nv_bfloat16, "bf16")

#define FX_WGMMA_D40 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39}"
#define FX_WGMMA_D40_OPERANDS \
      "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
// wgmma_m64nNk16_ss<T, N> with B K-major: R = N / 2 accumulators, then desc_a, desc_b, scale_d as
// operands R, R + 1 and R + 2 (spelled out: the preprocessor cannot add); the body as the
// other shapes' (FX_WGMMA_SSN under the same switch as FX_WGMMA_SS).
#if FX_SM90_ENABLED
#define FX_WGMMA_SSN(TYPE, N, R, A, B, S)                                                       \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #S ", 0;\n"                                 \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " " FX_WGMMA_D##R \
               ", %" #A ", %" #B ", p, 1, 1, 0, 0;\n}\n"                                          \
               : FX_WGMMA_D##R##_OPERANDS                                                       \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#else
#define FX_WGMMA_SSN(TYPE, N, R, A, B, S)                \
  (void)d, (void)desc_a, (void)desc_b, (void)scale_d; \
  __trap();
#endif
#define FX_DEFINE_WGMMA_SSN(T, TYPE, N, R, A, B, S)                                                       \
  template <>                                                                                            \
  FX_DEVICE void wgmma_m64nNk16_ss<T, N>(float (&d)[R], uint64_t desc_a, uint64_t desc_b, int scale_d) { \
    FX_WGMMA_SSN(TYPE, N, R, A, B, S)                                                                    \
  }
FX_DEFINE_WGMMA_SSN(__half, "f16", 80, 40, 40, 41, 42)
FX_DEFINE_WGMMA_SSN(__nv_bfloat16, "bf16", 80, 40, 40, 41, 42)
#undef FX_DEFINE_WGMMA_SSN
#undef FX_WGMMA_SSN
#undef FX_WGMMA_D40
#undef FX_WGMMA_D40_OPERANDS

#undef FX_DEFINE_WGMMA_64
#undef FX_DEFINE_WGMMA_128
#undef FX_WGMMA_SS
#undef FX_WGMMA_RS
#undef FX_WGMMA_SS128
#undef FX_WGMMA_RS128
#undef FX_WGMMA_D32
#undef FX_WGMMA_D32_OPERANDS
#undef FX_WGMMA_D64
#undef FX_WGMMA_D64_OPERANDS

}  // namespace sm90
}  // namespace flashext
