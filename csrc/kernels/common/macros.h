// flashext: small portability macros shared by host and device code.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FX_HOST_DEVICE __host__ __device__ __forceinline__
#define FX_DEVICE __device__ __forceinline__
#else
#define FX_HOST_DEVICE inline
#define FX_DEVICE inline
#endif

// Return the error of a CUDA runtime call from the enclosing function.
#define FX_RETURN_IF_ERROR(expr)          \
  do {                                    \
    const cudaError_t fx_err_ = (expr);   \
    if (fx_err_ != cudaSuccess) return fx_err_; \
  } while (0)

namespace flashext {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// 16-byte aligned: the address a 128-bit load, store or cp.async needs.
inline bool is_aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

}  // namespace flashext
