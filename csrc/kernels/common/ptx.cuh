// flashext: the hardware instructions C++ does not expose, wrapped once each (sm_80+).
// Every tensor-core kernel uses these; each names its section of the PTX ISA (CUDA 13.0).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "macros.h"

namespace flashext {
namespace ptx {

// Shared-memory address of a generic pointer, as the 32-bit operand the instructions below take.
FX_DEVICE uint32_t smem_addr(const void* ptr) { return static_cast<uint32_t>(__cvta_generic_to_shared(ptr)); }

// PTX ISA §9.7.9.25.3.1 cp.async: 16-byte global → shared copy that bypasses registers (and L1:
// .cg). `src_bytes` < 16 zero-fills the rest (0 = pure zero fill, for rows past the sequence end).
FX_DEVICE void cp_async_16(uint32_t dst_smem, const void* src_global, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst_smem), "l"(src_global), "r"(src_bytes));
}

// The same with an L2 cache policy (.L2::cache_hint), e.g. l2_evict_first_policy's.
FX_DEVICE void cp_async_16_policy(uint32_t dst_smem, const void* src_global, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst_smem), "l"(src_global),
               "l"(policy));
}

// PTX ISA createpolicy (fractional, 1.0): an L2 policy that evicts the lines it brings in first, for data
// read once (their lines, clean, go before the dirty lines of whatever ran before).
FX_DEVICE uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// PTX ISA §9.7.9.25.3.2 cp.async.commit_group / §9.7.9.25.3.3 cp.async.wait_group.
FX_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// The "memory" clobber keeps the compiler from moving shared-memory reads of the landed data
// above the wait.
template <int kPending>
FX_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// PTX ISA §9.7.9.15 ldmatrix: four 8×8 b16 matrices from shared memory; lane l supplies the row
// address of matrix l / 8, row l % 8. .trans transposes each 8×8 matrix on the way.
FX_DEVICE void ldmatrix_x4(uint32_t (&frag)[4], uint32_t row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(frag[0]), "=r"(frag[1]), "=r"(frag[2]), "=r"(frag[3])
               : "r"(row_addr));
}

FX_DEVICE void ldmatrix_x4_trans(uint32_t (&frag)[4], uint32_t row_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(frag[0]), "=r"(frag[1]), "=r"(frag[2]), "=r"(frag[3])
               : "r"(row_addr));
}

// PTX ISA §9.7.14.5.8 mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: D = A·B + C with A 16×16
// (4 regs of 2 elements), B 16×8 (2 regs), C/D 16×8 fp32 (4 regs). Fragment layouts: §9.7.14.5.8,
// "Matrix Fragments for mma.m16n8k16 with floating point type" — lane = 4·group + quad:
//   C/D: c0,c1 = row group, cols 2·quad, 2·quad + 1;  c2,c3 = row group + 8, same cols.
//   A:   a0 = (row group, k 2q..2q+1), a1 = (row group + 8, k 2q..), a2 = (group, k 2q+8..), a3 = (group + 8, k 2q+8..)
//   B:   b0 = (k 2q..2q+1, col group), b1 = (k 2q+8.., col group)
template <typename T>
FX_DEVICE void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
FX_DEVICE void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
FX_DEVICE void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 values as one register of two 16-bit values (low half = first), round to nearest.
template <typename T>
FX_DEVICE uint32_t pack2(float lo, float hi);

template <>
FX_DEVICE uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <>
FX_DEVICE uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// PTX ISA §9.7.9.8 ld.acquire.gpu: a load that later loads of this thread cannot pass (a counter
// another block releases with a fence and an atomic add).
FX_DEVICE int ld_acquire(const int* ptr) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(ptr) : "memory");
  return v;
}

// PTX ISA §9.7.13.6 red.global.add.v4.f32 (sm_90+): dst[0..3] += a, b, c, d in one reduction (16-byte aligned dst);
// four scalar reductions before sm_90.
FX_DEVICE void red_add_f32x4(float* dst, float a, float b, float c, float d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
#else
  atomicAdd(dst, a);
  atomicAdd(dst + 1, b);
  atomicAdd(dst + 2, c);
  atomicAdd(dst + 3, d);
#endif
}

// Two 16-bit ones in one register (an mma operand that sums the other's rows).
template <typename T>
FX_DEVICE constexpr uint32_t ones2();
template <>
FX_DEVICE constexpr uint32_t ones2<__half>() { return 0x3C003C00u; }
template <>
FX_DEVICE constexpr uint32_t ones2<__nv_bfloat16>() { return 0x3F803F80u; }

// PTX ISA §9.7.3.22 ex2.approx.ftz.f32: 2^x in one MUFU op (−inf → +0).
FX_DEVICE float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// PTX ISA §9.7.3.17 rcp.approx.ftz.f32: 1/x in one MUFU op, no range fix-ups (unlike __fdividef).
FX_DEVICE float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// PTX ISA §9.7.3.21 lg2.approx.ftz.f32: log2(x) in one MUFU op (an absolute error of about 2^-22,
// not a relative one: near x = 1 that is many ulps of the result).
FX_DEVICE float log2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace ptx
}  // namespace flashext
