// flashext: GeLU and its derivative in fp32, shared by the CUDA kernels (device) and the C++
// tests (host). The Triton twin (flashext/triton_ref/gelu.py) writes the same formulas.
//
//   exact:  gelu(z)  = z·Φ(z) = ½·z·(1 + erf(z/√2))
//           gelu'(z) = Φ(z) + z·φ(z),            φ(z) = exp(−z²/2)/√(2π)
//   tanh:   u = √(2/π)·(z + 0.044715·z³),   t = tanh(u)
//           gelu(z)  ≈ ½·z·(1 + t)
//           gelu'(z) ≈ ½·(1 + t) + ½·z·(1 − t²)·√(2/π)·(1 + 3·0.044715·z²)
#pragma once

#include <cmath>

#include "macros.h"
#if defined(__CUDACC__)
#include "ptx.cuh"
#endif

namespace flashext {

constexpr float kSqrt1_2 = 0.70710678118654752f;      // 1/√2
constexpr float kInvSqrt2Pi = 0.39894228040143268f;   // 1/√(2π)
constexpr float kSqrt2OverPi = 0.79788456080286536f;  // √(2/π)
constexpr float kGeluTanhCubic = 0.044715f;

FX_HOST_DEVICE float fast_exp(float v) {
#if defined(__CUDA_ARCH__)
  return __expf(v);  // ex2.approx: a few ulp, ample for GeLU's exp terms
#else
  return std::exp(v);  // host: the C++ tests' reference path
#endif
}

// 2^v: one MUFU.EX2 on the device (ptx.cuh; results below 2^-126 flush to zero).
FX_HOST_DEVICE float fast_exp2(float v) {
#if defined(__CUDA_ARCH__)
  return ptx::exp2_approx(v);
#else
  return std::exp2(v);
#endif
}

// 1/v: one MUFU.RCP on the device (~1 ulp; ptx.cuh). Every caller passes v >= 1, where
// __fdividef(1, v) gives the same bits after four more instructions of denormal handling.
FX_HOST_DEVICE float fast_rcp(float v) {
#if defined(__CUDA_ARCH__)
  return ptx::rcp_approx(v);
#else
  return 1.0f / v;
#endif
}

// tanh pieces from e = e^{2u} and r = 1/(e + 1):  1 + t = 2e·r,  1 − t² = sech²(u) = 4e·r².
// Written this way there is no cancellation as |t| → 1 (1 − t·t would round to 0 at |u| ≳ 8.3
// and lose the gradient's tail), and |u| ≤ 40 keeps e·r finite (tanh(40) is ±1 in fp32 anyway).
struct TanhParts {
  float one_plus_t;  // 1 + tanh(u)
  float sech2;  // 1 − tanh²(u)
};

FX_HOST_DEVICE TanhParts tanh_parts(float u) {
  const float e = fast_exp(2.0f * fminf(fmaxf(u, -40.0f), 40.0f));
  const float r = fast_rcp(e + 1.0f);
  return {2.0f * e * r, 4.0f * (e * r) * r};
}

FX_HOST_DEVICE float gelu_erf(float z) { return 0.5f * z * (1.0f + erff(z * kSqrt1_2)); }

// Φ(z) from one exponential and one reciprocal, for results rounded to 16 bits (erff costs about
// twice the instructions: with it the 16-bit bias kernels were issue-bound, docs/notes/gelu.md). With
// x = |z|, the upper tail Q(x) = 1 − Φ(x) = φ(x)·M(x), M the Mills ratio, fitted as
//   M(x) ≈ t·P(t),  t = 1 / (1 + p·x)
// (iteratively reweighted least squares in float64 on x ∈ [0, 13.5]), with a relative error in Q
// that holds deep in the left tail too, where Φ(z) = Q(|z|) is tiny:
// - fp16 results: P of degree 5, p = 0.31, ≤ 5e-6 (6.4e-6 evaluated in fp32), 75× below half an
//   ulp of fp16;
// - bf16 results: P of degree 4, p = 0.375, ≤ 2.9e-5, 60× below half an ulp of bf16 — one fused
//   multiply-add less per element (with degree 4, fp16 misses correct rounding 4× as often).
// The coefficients include φ's 1/√(2π). Past |z| ≈ 13.2 the device's ex2 flushes φ to zero:
// Φ(z) = 0 (true value < 1e-38) and 1.
constexpr float kMills5P = 0.31f;
constexpr float kMills5_0 = 0.123860545f, kMills5_1 = 0.120441549f, kMills5_2 = 0.133433104f;
constexpr float kMills5_3 = 0.0157319549f, kMills5_4 = 0.180466294f, kMills5_5 = -0.0739357993f;
constexpr float kMills4P = 0.375f;
constexpr float kMills4_0 = 0.149041101f, kMills4_1 = 0.157920405f, kMills4_2 = 0.0829729810f;
constexpr float kMills4_3 = 0.201044664f, kMills4_4 = -0.0909858420f;

// c0 + t·(c1 + t·(c2 + …)) as a chain of fused multiply-adds.
FX_HOST_DEVICE float horner(float, float c0) { return c0; }

template <typename... Rest>
FX_HOST_DEVICE float horner(float t, float c0, Rest... rest) {
  return fmaf(horner(t, rest...), t, c0);
}

constexpr float kNegHalfLog2e = -0.72134752044448170f;  // −½·log2 e

// e^{−z²/2} = √(2π)·φ(z): one MUFU.EX2 on the device (flushes to zero past |z| ≈ 13.2).
FX_HOST_DEVICE float gauss_exp(float z) { return fast_exp2(z * (z * kNegHalfLog2e)); }

// M(x)/√(2π) from the degree-5 fit (fp16 results) or the degree-4 fit (bf16), x ≥ 0:
// Q(x) = gauss_exp(x)·mills<…>(x).
template <bool kBf16>
FX_HOST_DEVICE float mills(float x) {
  if constexpr (kBf16) {
    const float t = fast_rcp(fmaf(kMills4P, x, 1.0f));
    return t * horner(t, kMills4_0, kMills4_1, kMills4_2, kMills4_3, kMills4_4);
  } else {
    const float t = fast_rcp(fmaf(kMills5P, x, 1.0f));
    return t * horner(t, kMills5_0, kMills5_1, kMills5_2, kMills5_3, kMills5_4, kMills5_5);
  }
}

// The same with P of degree 7 on t = 1/(1 + 0.3·x): relative error 1.3e-7 on the fit, so Φ's
// absolute error (≤ 2.2e-7 in fp32) stays below a 16-bit step of gelu'(z) = Φ(z) + z·φ(z) where
// the two terms cancel (near z = −0.75). For the backward.
constexpr float kMills7P = 0.3f;
constexpr float kMills7_0 = 0.119626351f, kMills7_1 = 0.120798968f, kMills7_2 = 0.0996338055f;
constexpr float kMills7_3 = 0.129480943f, kMills7_4 = -0.0554152019f, kMills7_5 = 0.208228856f;
constexpr float kMills7_6 = -0.158288345f, kMills7_7 = 0.0359345526f;

// M(x)/√(2π) from the degree-7 fit, x ≥ 0.
FX_HOST_DEVICE float mills_precise(float x) {
  const float t = fast_rcp(fmaf(kMills7P, x, 1.0f));
  return t * horner(t, kMills7_0, kMills7_1, kMills7_2, kMills7_3, kMills7_4, kMills7_5, kMills7_6, kMills7_7);
}

// Exact GeLU and its derivative without erff: for 16-bit results only. The derivative needs the
// degree-7 fit: Φ(z) + z·φ(z) cancels near z = −0.75, where the degree-5 fit's absolute error of
// ~1e-6 is a few fp16 steps of the result. One exponential serves Φ and φ.
//
// Φ(z) = |s − Q(|z|)| with s = 1 for z ≥ 0 and 0 below (Q ≤ ½): one FSET for s and one fused
// multiply-add, where 1 − Q or Q chosen by a compare and a select took four instructions with the
// product. gelu(+inf) = inf and gelu(−inf) = −inf·0 = NaN, as in PyTorch.
template <bool kBf16>
FX_HOST_DEVICE float gelu_erf_16(float z) {
  const float s = z >= 0.0f ? 1.0f : 0.0f;
  return z * fabsf(fmaf(-gauss_exp(z), mills<kBf16>(fabsf(z)), s));
}

// With x = |z| and e = e^{−z²/2}: Φ(z) + z·φ(z) = 1 − w for z ≥ 0 and w for z < 0, where
// w = Q(x) − x·φ(x) = e·(M(x) − x)/√(2π): one fused multiply-add and one product after the fit,
// where Φ and φ apart take three (docs/notes/gelu.md). ±inf give NaN, as in PyTorch.
FX_HOST_DEVICE float gelu_erf_16_grad(float z) {
  const float x = fabsf(z);
  const float w = gauss_exp(z) * fmaf(-x, kInvSqrt2Pi, mills_precise(x));
  return z >= 0.0f ? 1.0f - w : w;
}

FX_HOST_DEVICE float gelu_erf_grad(float z) {
  const float cdf = 0.5f * (1.0f + erff(z * kSqrt1_2));
  const float pdf = kInvSqrt2Pi * fast_exp(-0.5f * z * z);
  return cdf + z * pdf;
}

FX_HOST_DEVICE float gelu_tanh(float z) {
  const float u = kSqrt2OverPi * (z + kGeluTanhCubic * z * z * z);
  return 0.5f * z * tanh_parts(u).one_plus_t;
}

FX_HOST_DEVICE float gelu_tanh_grad(float z) {
  const float u = kSqrt2OverPi * (z + kGeluTanhCubic * z * z * z);
  const TanhParts t = tanh_parts(u);
  const float du_dz = kSqrt2OverPi * (1.0f + 3.0f * kGeluTanhCubic * z * z);
  return 0.5f * t.one_plus_t + 0.5f * z * t.sech2 * du_dz;
}

// The form chosen at run time, for host code and the C++ tests; the kernels choose it at compile
// time (gelu_epilogue in gelu/epilogue.cuh): a runtime branch there made the 16-bit kernels spill.
FX_HOST_DEVICE float gelu(float z, bool tanh_form) { return tanh_form ? gelu_tanh(z) : gelu_erf(z); }

FX_HOST_DEVICE float gelu_grad(float z, bool tanh_form) {
  return tanh_form ? gelu_tanh_grad(z) : gelu_erf_grad(z);
}

}  // namespace flashext
