// flashext C++ tests: what every test file shares — skipping without a GPU, checked CUDA calls,
// host fp16/bf16 conversions, seeded random inputs and NaN-poisoned device buffers. Header only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <random>
#include <type_traits>
#include <vector>

#include "attention/flash_fwd_sm90.h"
#include "flashext/common.h"

namespace flashext_test {

inline bool has_device() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// Whether the library's Hopper (sm_90a) kernels run here: its own rule (an sm_90 GPU and a build
// holding sm_90a code), asked of the current device.
inline bool has_sm90() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return flashext::flash_fwd_sm90_supported(major, minor);
}

}  // namespace flashext_test

// First statement of a GPU test: skips it, with the reason, when no CUDA device is present.
#define FX_SKIP_WITHOUT_GPU() \
  if (!::flashext_test::has_device()) GTEST_SKIP() << "no CUDA device"

// After FX_SKIP_WITHOUT_GPU, in a test of the Hopper kernels: skips it elsewhere, with the reason.
#define FX_SKIP_WITHOUT_SM90() \
  if (!::flashext_test::has_sm90()) GTEST_SKIP() << "needs an sm_90 GPU and a build with sm_90a code"

// A CUDA runtime call that must succeed; on failure the test fails with the call and the error's
// name (ASSERT_: and returns from the enclosing void function).
#define FX_ASSERT_CUDA(expr)                                                         \
  do {                                                                               \
    const cudaError_t fx_status_ = (expr);                                           \
    ASSERT_EQ(fx_status_, cudaSuccess) << #expr << ": " << cudaGetErrorName(fx_status_); \
  } while (0)
#define FX_EXPECT_CUDA(expr)                                                         \
  do {                                                                               \
    const cudaError_t fx_status_ = (expr);                                           \
    EXPECT_EQ(fx_status_, cudaSuccess) << #expr << ": " << cudaGetErrorName(fx_status_); \
  } while (0)

namespace flashext_test {

// Storage types on the host: fp32 values to and from float, __half and __nv_bfloat16 (round to
// nearest even).
template <typename T> float to_float(T v);
template <> inline float to_float(float v) { return v; }
template <> inline float to_float(__half v) { return __half2float(v); }
template <> inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> T from_float(float v);
template <> inline float from_float(float v) { return v; }
template <> inline __half from_float(float v) { return __float2half_rn(v); }
template <> inline __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }

template <typename T> constexpr flashext::DType dtype_of();
template <> constexpr flashext::DType dtype_of<float>() { return flashext::DType::kFloat32; }
template <> constexpr flashext::DType dtype_of<__half>() { return flashext::DType::kFloat16; }
template <> constexpr flashext::DType dtype_of<__nv_bfloat16>() { return flashext::DType::kBFloat16; }

// The forward's tolerances against a double-precision CPU reference, for 16-bit T. O: absolute,
// from P and O rounded to T. lse: relative to max(1, |lse|); the kernels sum P as rounded to T (so
// O's weights add up to 1), so lse may be off by log(1 + half an ulp of T), about 2^-11 (fp16) or
// 2^-8 (bf16), where one key dominates a short row.
template <typename T> constexpr double out_tolerance() { return std::is_same_v<T, __half> ? 4e-3 : 3e-2; }
template <typename T> constexpr double lse_tolerance() { return std::is_same_v<T, __half> ? 1e-3 : 4e-3; }

// n draws of N(0, stddev²) from rng, rounded to T. Seed rng from the case's shape, so every case
// has inputs of its own and a failure reproduces.
template <typename T>
std::vector<T> random_values(size_t n, std::mt19937& rng, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<T> values(n);
  for (auto& v : values) v = from_float<T>(dist(rng));
  return values;
}

// bytes of device memory (at least 16), every byte 0xFF — NaN in fp32, fp16 and bf16 — so an
// output element a kernel forgets to write fails the comparison. Freed on scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(std::max<size_t>(bytes, 16)) {
    FX_EXPECT_CUDA(cudaMalloc(&ptr_, bytes_));
    if (ptr_ != nullptr) FX_EXPECT_CUDA(cudaMemset(ptr_, 0xFF, bytes_));
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  // Element offset_elems of the buffer viewed as T (offsets that break 16-byte alignment test the
  // kernels' scalar paths).
  template <typename T>
  T* at(size_t offset_elems = 0) const { return static_cast<T*>(ptr_) + offset_elems; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Host → device and device → host copies, checked.
template <typename T>
void upload(void* dst, const std::vector<T>& src) {
  FX_EXPECT_CUDA(cudaMemcpy(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice));
}

template <typename T>
std::vector<T> download(const void* src, size_t n) {
  std::vector<T> dst(n);
  FX_EXPECT_CUDA(cudaMemcpy(dst.data(), src, n * sizeof(T), cudaMemcpyDeviceToHost));
  return dst;
}

}  // namespace flashext_test
