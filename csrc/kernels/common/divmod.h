// flashext fast division by a run-time divisor (a page size, say) that stays fixed across many
// divisions: n / d and n % d for 0 <= n < 2^31 by one high multiply and a shift instead of the
// ~20-instruction integer division. d >= 1. The multiplier m = ceil(2^p / d) with p = 31 + ceil(log2 d)
// makes floor(n · m / 2^p) exact for every 31-bit n (the round-up method; tests/cpp checks it
// against / and % on the CPU).
#pragma once

#include <cstdint>

#include "macros.h"

namespace flashext {

struct FastDivmod {
  int divisor = 1;
  uint32_t multiplier = 0;  // 0 for divisor 1 (n / 1 = n)
  uint32_t shift = 0;       // p − 32

  FastDivmod() = default;
  FX_HOST_DEVICE explicit FastDivmod(int d) : divisor(d) {
    if (d <= 1) return;
    uint32_t log2_up = 0;
    while ((uint32_t(1) << log2_up) < uint32_t(d)) ++log2_up;
    const uint32_t p = 31 + log2_up;
    multiplier = uint32_t(((uint64_t(1) << p) + uint64_t(d) - 1) / uint64_t(d));
    shift = p - 32;
  }

  FX_HOST_DEVICE int div(int n) const {
    if (multiplier == 0) return n;
#if defined(__CUDA_ARCH__)
    return int(__umulhi(uint32_t(n), multiplier) >> shift);
#else
    return int(((uint64_t(uint32_t(n)) * multiplier) >> 32) >> shift);
#endif
  }

  // quotient and remainder
  FX_HOST_DEVICE void divmod(int n, int& q, int& r) const {
    q = div(n);
    r = n - q * divisor;
  }
};

}  // namespace flashext
