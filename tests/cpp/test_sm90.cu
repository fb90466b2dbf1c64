// flashext Hopper primitives (csrc/kernels/common/sm90.cuh, tma.h) against the CPU: a TMA load of
// 128-byte-swizzled tiles completing on an mbarrier, then one warpgroup's wgmma
//   S = Q Kᵀ   (both operands K-major in shared memory: the attention forward's first GEMM)
//   O = P V    (P from registers in the m16n8k16 A layout, V MN-major as stored: its second)
// on 64 × 64 × 64 bf16 and fp16 tiles. Skipped unless the GPU is sm_90 and this build holds sm_90a
// code (a compute_80-only build has none).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common.h"
#include "common/sm90.cuh"
#include "common/tma.h"

namespace {

using flashext_test::DeviceBuffer;
using flashext_test::to_float;

constexpr int kTile = 64;  // rows, columns and depth of every tile here

__global__ void probe_sm90(int* out) { *out = flashext::sm90::enabled() ? 1 : 0; }

bool sm90_available() {
  int major = 0, device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (major != 9) return false;
  DeviceBuffer flag(sizeof(int));
  probe_sm90<<<1, 1>>>(flag.at<int>());
  if (cudaDeviceSynchronize() != cudaSuccess) return false;
  return flashext_test::download<int>(flag.get(), 1)[0] == 1;
}

// The fp32 accumulator of one warpgroup's 64 × 64 wgmma into row-major c: thread t of warp w holds
// rows 16 w + t / 4 (+ 8), columns 8 i + 2 (t % 4) + {0, 1} of n8 tile i, as mma.sync's C.
__device__ void store_accumulator(const float (&d)[32], float* c) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int row = 16 * warp + lane / 4 + 8 * (j / 2), col = 8 * i + 2 * (lane % 4) + j % 2;
      c[row * kTile + col] = d[4 * i + j];
    }
}

// The same for a 64 × 128 accumulator (64 per thread, n8 tile i at d[4 i .. 4 i + 3]) into
// row-major c of 128 columns.
__device__ void store_accumulator_wide(const float (&d)[64], float* c) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < 16; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int row = 16 * warp + lane / 4 + 8 * (j / 2), col = 8 * i + 2 * (lane % 4) + j % 2;
      c[row * 128 + col] = d[4 * i + j];
    }
}

// s = q kᵀ: q and k row-major 64 × 64 (rows × depth), both loaded by TMA.
template <typename T>
__global__ void __launch_bounds__(128) qk_kernel(const __grid_constant__ CUtensorMap map_q,
                                                 const __grid_constant__ CUtensorMap map_k, float* s) {
  namespace sm90 = flashext::sm90;
  __shared__ __align__(1024) T q[kTile * kTile];
  __shared__ __align__(1024) T k[kTile * kTile];
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(&bar, 1);
    sm90::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    sm90::mbarrier_arrive_expect_tx(&bar, 2 * kTile * kTile * sizeof(T));
    sm90::tma_load_2d(q, &map_q, &bar, 0, 0);
    sm90::tma_load_2d(k, &map_k, &bar, 0, 0);
  }
  sm90::mbarrier_wait(&bar, 0);
  float d[32];
  // K-major, 128-byte swizzle: stride 1024 B between 8-row groups; a k16 step is 32 bytes further
  // along the row (+2 in the descriptor's address field).
  const uint64_t desc_q = sm90::smem_descriptor(q, 16, 1024), desc_k = sm90::smem_descriptor(k, 16, 1024);
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    sm90::wgmma_m64n64k16_ss<T, 0>(d, desc_q + 2 * kk, desc_k + 2 * kk, kk > 0);
  }
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::fence_operands(d);
  store_accumulator(d, s);
}

// o = p v: p row-major 64 × 64 (rows × keys) read into registers, v row-major 64 × 64 (keys × dims)
// loaded by TMA and read MN-major (trans-b).
template <typename T>
__global__ void __launch_bounds__(128) pv_kernel(const T* p, const __grid_constant__ CUtensorMap map_v, float* o) {
  namespace sm90 = flashext::sm90;
  __shared__ __align__(1024) T v[kTile * kTile];
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(&bar, 1);
    sm90::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    sm90::mbarrier_arrive_expect_tx(&bar, kTile * kTile * sizeof(T));
    sm90::tma_load_2d(v, &map_v, &bar, 0, 0);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = 16 * warp + lane / 4, col = 2 * (lane % 4);
  const auto pair = [&](int r, int c) {  // two 16-bit values of p, the lower column in the low half
    const uint16_t lo = reinterpret_cast<const uint16_t*>(p)[r * kTile + c];
    const uint16_t hi = reinterpret_cast<const uint16_t*>(p)[r * kTile + c + 1];
    return uint32_t(lo) | (uint32_t(hi) << 16);
  };
  // Every A fragment in registers before the fence (no register writes between it and the wgmma).
  uint32_t a[kTile / 16][4];
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    a[kk][0] = pair(row, 16 * kk + col);
    a[kk][1] = pair(row + 8, 16 * kk + col);
    a[kk][2] = pair(row, 16 * kk + 8 + col);
    a[kk][3] = pair(row + 8, 16 * kk + 8 + col);
  }
  sm90::mbarrier_wait(&bar, 0);
  float d[32];
  // MN-major, 128-byte swizzle: leading offset (between 64-column slabs) unused with one slab,
  // stride 1024 B between 8-key groups; a k16 step is 16 keys = 2048 bytes (+128).
  const uint64_t desc_v = sm90::smem_descriptor(v, kTile * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) sm90::fence_operands(a[kk]);
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) sm90::wgmma_m64n64k16_rs<T, 1>(d, a[kk], desc_v + 128 * kk, kk > 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::fence_operands(d);
  store_accumulator(d, o);
}

// The n128 forms: s = q kᵀ with k 128 × 64 (keys × depth: one 128-row slab), and o = p v with v
// 64 × 128 (keys × dims) held as two 64-column slabs (the descriptor's leading offset between
// them), as the attention kernel holds its tiles.
constexpr int kWide = 128;

template <typename T>
__global__ void __launch_bounds__(128) qk_wide_kernel(const __grid_constant__ CUtensorMap map_q,
                                                      const __grid_constant__ CUtensorMap map_k, float* s) {
  namespace sm90 = flashext::sm90;
  __shared__ __align__(1024) T q[kTile * kTile];
  __shared__ __align__(1024) T k[kWide * kTile];
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(&bar, 1);
    sm90::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    sm90::mbarrier_arrive_expect_tx(&bar, (kTile + kWide) * kTile * sizeof(T));
    sm90::tma_load_2d(q, &map_q, &bar, 0, 0);
    sm90::tma_load_2d(k, &map_k, &bar, 0, 0);
  }
  sm90::mbarrier_wait(&bar, 0);
  float d[64];
  const uint64_t desc_q = sm90::smem_descriptor(q, 16, 1024), desc_k = sm90::smem_descriptor(k, 16, 1024);
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    sm90::wgmma_m64n128k16_ss<T, 0>(d, desc_q + 2 * kk, desc_k + 2 * kk, kk > 0);
  }
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::fence_operands(d);
  store_accumulator_wide(d, s);
}

template <typename T>
__global__ void __launch_bounds__(128) pv_wide_kernel(const T* p, const __grid_constant__ CUtensorMap map_v,
                                                      float* o) {
  namespace sm90 = flashext::sm90;
  __shared__ __align__(1024) T v[kTile * kWide];  // slab h: dims 64 h + [0, 64) of the 64 keys
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(&bar, 1);
    sm90::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    sm90::mbarrier_arrive_expect_tx(&bar, kTile * kWide * sizeof(T));
    sm90::tma_load_2d(v, &map_v, &bar, 0, 0);
    sm90::tma_load_2d(v + kTile * kTile, &map_v, &bar, kTile, 0);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = 16 * warp + lane / 4, col = 2 * (lane % 4);
  const auto pair = [&](int r, int c) {
    const uint16_t lo = reinterpret_cast<const uint16_t*>(p)[r * kTile + c];
    const uint16_t hi = reinterpret_cast<const uint16_t*>(p)[r * kTile + c + 1];
    return uint32_t(lo) | (uint32_t(hi) << 16);
  };
  uint32_t a[kTile / 16][4];
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    a[kk][0] = pair(row, 16 * kk + col);
    a[kk][1] = pair(row + 8, 16 * kk + col);
    a[kk][2] = pair(row, 16 * kk + 8 + col);
    a[kk][3] = pair(row + 8, 16 * kk + 8 + col);
  }
  sm90::mbarrier_wait(&bar, 0);
  float d[64];
  const uint64_t desc_v = sm90::smem_descriptor(v, kTile * 128, 1024);  // leading: one slab's bytes
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) sm90::fence_operands(a[kk]);
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) sm90::wgmma_m64n128k16_rs<T, 1>(d, a[kk], desc_v + 128 * kk, kk > 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::fence_operands(d);
  store_accumulator_wide(d, o);
}

template <typename T>
class Sm90Primitives : public ::testing::Test {};
using Types = ::testing::Types<__half, __nv_bfloat16>;
TYPED_TEST_SUITE(Sm90Primitives, Types);

template <typename T>
CUtensorMap tile_map(const DeviceBuffer& buffer) {
  CUtensorMap map;
  EXPECT_EQ(flashext::make_tma_2d_swizzle128(&map, buffer.get(), 2, kTile, kTile, kTile * sizeof(T), kTile, kTile),
            cudaSuccess);
  return map;
}

// out (64 × n) = x · yᵀ (y_transposed: y is n columns × 64 depth) or x · y (y 64 × n), in double.
template <typename T>
std::vector<double> matmul(const std::vector<T>& x, const std::vector<T>& y, bool y_transposed, int n) {
  std::vector<double> out(kTile * n, 0.0);
  for (int i = 0; i < kTile; ++i)
    for (int j = 0; j < n; ++j)
      for (int e = 0; e < kTile; ++e)
        out[i * n + j] += double(to_float(x[i * kTile + e])) * to_float(y_transposed ? y[j * kTile + e] : y[e * n + j]);
  return out;
}

// Random 64 × 64 x and y of 64 · n elements uploaded, launch(x, y, out) run, out (64 × n) checked
// against x · yᵀ (y_transposed) or x · y.
template <typename T, typename Launch>
void check_tile_product(uint32_t seed, bool y_transposed, const char* name, Launch launch, int n = kTile) {
  std::mt19937 rng(seed);
  const auto x = flashext_test::random_values<T>(kTile * kTile, rng, 1.0f);
  const auto y = flashext_test::random_values<T>(kTile * n, rng, 1.0f);
  DeviceBuffer dx(x.size() * sizeof(T)), dy(y.size() * sizeof(T)), dout(kTile * n * sizeof(float));
  flashext_test::upload(dx.get(), x);
  flashext_test::upload(dy.get(), y);
  launch(dx, dy, dout);
  FX_ASSERT_CUDA(cudaDeviceSynchronize());
  const auto got = flashext_test::download<float>(dout.get(), kTile * n);
  const auto want = matmul(x, y, y_transposed, n);
  for (int i = 0; i < kTile * n; ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-3 * (1.0 + std::abs(want[i]))) << name << "[" << i / n << "][" << i % n << "]";
  }
}

// A 2-D map of a row-major rows × cols matrix, boxes of box_rows × 64.
template <typename T>
CUtensorMap matrix_map(const DeviceBuffer& buffer, int rows, int cols, int box_rows) {
  CUtensorMap map;
  EXPECT_EQ(flashext::make_tma_2d_swizzle128(&map, buffer.get(), 2, rows, cols, cols * sizeof(T), box_rows, kTile),
            cudaSuccess);
  return map;
}

TYPED_TEST(Sm90Primitives, TmaAndWgmmaQKt) {
  FX_SKIP_WITHOUT_GPU();
  if (!sm90_available()) GTEST_SKIP() << "needs an sm_90 GPU and a build with sm_90a code";
  using T = TypeParam;
  check_tile_product<T>(90, true, "s", [](const DeviceBuffer& q, const DeviceBuffer& k, const DeviceBuffer& s) {
    qk_kernel<T><<<1, 128>>>(tile_map<T>(q), tile_map<T>(k), s.at<float>());
  });
}

TYPED_TEST(Sm90Primitives, WgmmaPVFromRegisters) {
  FX_SKIP_WITHOUT_GPU();
  if (!sm90_available()) GTEST_SKIP() << "needs an sm_90 GPU and a build with sm_90a code";
  using T = TypeParam;
  check_tile_product<T>(91, false, "o", [](const DeviceBuffer& p, const DeviceBuffer& v, const DeviceBuffer& o) {
    pv_kernel<T><<<1, 128>>>(p.at<T>(), tile_map<T>(v), o.at<float>());
  });
}

TYPED_TEST(Sm90Primitives, WgmmaN128QKt) {
  FX_SKIP_WITHOUT_GPU();
  if (!sm90_available()) GTEST_SKIP() << "needs an sm_90 GPU and a build with sm_90a code";
  using T = TypeParam;
  check_tile_product<T>(92, true, "s", [](const DeviceBuffer& q, const DeviceBuffer& k, const DeviceBuffer& s) {
    qk_wide_kernel<T><<<1, 128>>>(tile_map<T>(q), matrix_map<T>(k, kWide, kTile, kWide), s.at<float>());
  }, kWide);
}

TYPED_TEST(Sm90Primitives, WgmmaN128PVAcrossTwoSlabs) {
  FX_SKIP_WITHOUT_GPU();
  if (!sm90_available()) GTEST_SKIP() << "needs an sm_90 GPU and a build with sm_90a code";
  using T = TypeParam;
  check_tile_product<T>(93, false, "o", [](const DeviceBuffer& p, const DeviceBuffer& v, const DeviceBuffer& o) {
    pv_wide_kernel<T><<<1, 128>>>(p.at<T>(), matrix_map<T>(v, kTile, kWide, kTile), o.at<float>());
  }, kWide);
}

}  // namespace
