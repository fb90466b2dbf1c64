// flashext FlashAttention: the host check of varlen offsets (flashext/attention.h).
#include "flashext/attention.h"

namespace flashext {

CuSeqlensError check_cu_seqlens(const int32_t* cu, int64_t n, int64_t total, int64_t max_seqlen) {
  if (n < 1 || cu[0] != 0) return CuSeqlensError::kNotStartingAtZero;
  for (int64_t b = 1; b < n; ++b) {
    if (cu[b] < cu[b - 1]) return CuSeqlensError::kDecreasing;
  }
  if (cu[n - 1] > total) return CuSeqlensError::kPastTotal;  // non-decreasing: the last is the largest
  for (int64_t b = 1; b < n; ++b) {
    if (int64_t(cu[b]) - cu[b - 1] > max_seqlen) return CuSeqlensError::kLongerThanMax;
  }
  return CuSeqlensError::kOk;
}

}  // namespace flashext
