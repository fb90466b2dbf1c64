// flashext: the online-softmax bookkeeping of FlashAttention, as __host__ __device__ functions so
// the C++ tests check the math on the CPU (tests/cpp/test_attention.cpp).
//
// Every exponential is exp2. A row keeps row_max m (max score seen, in the scores' own units) and
// row_sum l = Σ 2^((s − m) · c), c = scale_log2 (1 for scores already in log2 units).
// When a tile raises the max to m', everything accumulated under m is rescaled by 2^(m − m').
// A row that has seen only masked scores (−inf) keeps m = −inf; using 0 in place of −inf as the
// reference point avoids the NaN of (−inf) − (−inf) and leaves l = 0, which marks the row empty.
#pragma once

#include <cmath>

#include "macros.h"

namespace flashext {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The max to subtract before exp2: m itself, or 0 while the row is still empty (m = −inf).
FX_HOST_DEVICE float safe_row_max(float row_max) { return row_max == -INFINITY ? 0.0f : row_max; }

// Rescale factor for state accumulated under old_max once the max becomes new_max (≥ old_max),
// with the maxima in the scores' own units and the exponent's scale applied after the subtraction:
// 2^((m_old − m_new) · scale_log2), and 0 for a row that had seen nothing (m_old = −inf). Near the
// max, s − m is exact (Sterbenz), so the largest terms keep every digit; folding the scale in
// first, 2^(s · c − m · c), loses what fp32 cannot hold of s · c (for |s · c| ~ 1e4 about 1e-3 of
// the exponent: a one-element row would come out as 0.9995).
// The exponent is clamped to ≤ 0, which it is for every real pair: for an empty row the stand-in 0
// makes it −m_new · c, and once that passes 128 the power overflows to inf and inf · 0 is NaN (a
// first visible block of very negative scores, e.g. the first causal rows of large logits). The
// clamp kept the attention kernel's register allocation, where 2^(m_old − safe(m_new)) or a select
// spilled at D = 128.
FX_HOST_DEVICE float rescale_factor(float old_max, float new_max, float scale_log2 = 1.0f) {
  return exp2f(fminf((safe_row_max(old_max) - safe_row_max(new_max)) * scale_log2, 0.0f)) *
         (old_max == -INFINITY ? 0.0f : 1.0f);
}

// Merge two partial states (m_a, l_a) and (m_b, l_b) of the same row (e.g. two key splits):
// m = max(m_a, m_b), l = l_a · 2^((m_a − m) · c) + l_b · 2^((m_b − m) · c).
struct SoftmaxState {
  float row_max;
  float row_sum;
};

FX_HOST_DEVICE SoftmaxState merge_softmax_states(SoftmaxState a, SoftmaxState b, float scale_log2 = 1.0f) {
  const float m = fmaxf(a.row_max, b.row_max);
  return {m, a.row_sum * rescale_factor(a.row_max, m, scale_log2) + b.row_sum * rescale_factor(b.row_max, m, scale_log2)};
}

// Merging two normalised partial results by their natural-log lse (merge_attention_states):
// weights w_a, w_b (summing to 1) and the merged lse. Both −inf: weights 0 and lse −inf; NaN in
// either: NaN throughout (the comparison below does not hide it, as fmaxf would).
struct LseMerge {
  float weight_a, weight_b, lse;
};

FX_HOST_DEVICE LseMerge merge_lse(float lse_a, float lse_b) {
  const float m = lse_a > lse_b ? lse_a : lse_b;  // NaN in lse_b: m is NaN; in lse_a: e^(NaN) below
  if (m == -INFINITY) return {0.0f, 0.0f, -INFINITY};
  const float e_a = expf(lse_a - m), e_b = expf(lse_b - m);  // one of them is 1
  const float sum = e_a + e_b;
  return {e_a / sum, e_b / sum, m + logf(sum)};
}

// log2 as row_lse takes it by default
struct Log2f {
  FX_HOST_DEVICE float operator()(float x) const { return log2f(x); }
};

// Natural-log log-sum-exp of a finished row from its log2-unit state; −inf for an empty row.
// `log2` may be a cheaper one of the caller's (a kernel's lg2.approx: a row that saw a key has
// row_sum ≥ 1, where its absolute error is what the lse keeps).
template <typename Log2 = Log2f>
FX_HOST_DEVICE float row_lse(SoftmaxState s, Log2 log2 = {}) {
  return s.row_sum == 0.0f ? -INFINITY : (s.row_max + log2(s.row_sum)) * kLn2;
}

}  // namespace flashext
