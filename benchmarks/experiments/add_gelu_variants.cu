// add + GeLU (bf16/fp32, exact erf form) kernel variants, timed against a D2D copy of the same
// bytes — the version ladder behind docs/notes/gelu.md. Standalone: CUDA runtime only.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icsrc/kernels \
//        benchmarks/experiments/add_gelu_variants.cu -o /tmp/variants && /tmp/variants
//
// Variant axes: kUnroll (16-byte packs per thread per input), kMinBlocks (__launch_bounds__
// occupancy hint), kMath (0 = erff, 1 = add only: the memory-bound ceiling of this loop shape).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "common/gelu_math.h"
#include "common/vec.cuh"

using namespace flashext;

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

template <typename T, int kUnroll, int kMinBlocks, int kMath>
__global__ void __launch_bounds__(256, kMinBlocks) variant(const T* x, const T* y, T* out, int64_t n) {
  constexpr int kVec = 16 / sizeof(T);
  using P = Pack<T, kVec>;
  const int64_t num_packs = n / kVec;
  const int64_t first = int64_t(blockIdx.x) * 256 + threadIdx.x;
  const int64_t stride = int64_t(gridDim.x) * 256;
  P xp[kUnroll], yp[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t p = first + u * stride;
    if (p < num_packs) { xp[u] = load_streaming<T, kVec>(x, p); yp[u] = load_streaming<T, kVec>(y, p); }
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t p = first + u * stride;
    if (p < num_packs) {
      P o;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        const float z = to_float(xp[u].elem[i]) + to_float(yp[u].elem[i]);
        o.elem[i] = from_float<T>(kMath == 0 ? gelu_erf(z) : z);
      }
      store_streaming<T, kVec>(out, p, o);
    }
  }
}

// Pseudo-random values in about [-4, 4] (a hash of the index): never time on constant data.
template <typename T>
__global__ void fill_random(T* ptr, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    ptr[i] = from_float<T>((float(h & 0xFFFFFF) / float(1 << 24) - 0.5f) * 8.0f);
  }
}

template <typename T, int kUnroll, int kMinBlocks, int kMath>
float time_variant(const T* x, const T* y, T* out, int64_t n, int sms) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t packs = n / kVec;
  const int64_t blocks = (packs + 256 * kUnroll - 1) / (256 * kUnroll);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) variant<T, kUnroll, kMinBlocks, kMath><<<blocks, 256>>>(x, y, out, n);
  cudaEventRecord(a);
  const int reps = 20;
  for (int i = 0; i < reps; ++i) variant<T, kUnroll, kMinBlocks, kMath><<<blocks, 256>>>(x, y, out, n);
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  return ms / reps;
}

template <typename T>
int run(const char* name, int64_t n, int sms) {
  T *x, *y, *out;
  CHECK(cudaMalloc(&x, n * sizeof(T)));
  CHECK(cudaMalloc(&y, n * sizeof(T)));
  CHECK(cudaMalloc(&out, n * sizeof(T)));
  fill_random<<<1024, 256>>>(x, n, 1u);
  fill_random<<<1024, 256>>>(y, n, 2u);
  char* src;
  char* dst;
  const size_t copy_bytes = 3 * n * sizeof(T) / 2;
  CHECK(cudaMalloc(&src, copy_bytes));
  CHECK(cudaMalloc(&dst, copy_bytes));
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < 3; ++i) cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(a);
  for (int i = 0; i < 20; ++i) cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(b);
  cudaEventSynchronize(b);
  float copy_ms = 0;
  cudaEventElapsedTime(&copy_ms, a, b);
  copy_ms /= 20;
  const double bytes = 3.0 * n * sizeof(T);
  printf("%s n=%lld copy %.0f GB/s\n", name, (long long)n, bytes / copy_ms / 1e6);
#define V(U, MB, M)                                                                         \
  {                                                                                         \
    const float ms = time_variant<T, U, MB, M>(x, y, out, n, sms);                          \
    printf("  unroll %d minblocks %d math %s: %.0f GB/s (%.3f of copy)\n", U, MB, M ? "add-only" : "erf", \
           bytes / ms / 1e6, copy_ms / ms);                                                 \
  }
  V(4, 1, 0) V(4, 3, 0) V(4, 4, 0) V(2, 1, 0) V(2, 6, 0) V(1, 8, 0) V(8, 2, 0) V(4, 1, 1) V(1, 8, 1)
  CHECK(cudaGetLastError());
  cudaFree(x); cudaFree(y); cudaFree(out); cudaFree(src); cudaFree(dst);
  return 0;
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  if (run<__nv_bfloat16>("bf16", int64_t(1) << 26, sms)) return 1;
  if (run<__nv_bfloat16>("bf16", int64_t(1) << 28, sms)) return 1;
  if (run<float>("fp32", int64_t(1) << 26, sms)) return 1;
  return 0;
}
