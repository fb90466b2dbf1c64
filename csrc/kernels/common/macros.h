// flashext: small portability macros shared by host and device code.
#pragma once

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
