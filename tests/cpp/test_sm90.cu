// flashext Hopper primitives (csrc/kernels/common/sm90.cuh, tma.h) against the CPU: a TMA load of
// 128-byte-swizzled tiles completing on an mbarrier, then one warpgroup's wgmma
//   S = Q Kᵀ   (both operands K-major in shared memory: the attention forward's first GEMM)
//   O = P V    (P from registers in the m16n8k16 A layout, V MN-major as stored: its second)
// on 64 × 64 × 64 bf16 and fp16 tiles; and the bulk fp32 reduce-add from shared into global memory
// (the Hopper backward's dQ accumulation) from many blocks into one buffer; stmatrix's store of
// a 16 × 16 fragment tile, transposed and as is; and a TMA store of a swizzled tile that reaches
// past the tensor's rows (the Hopper backward's dK and dV). Skipped unless the GPU is sm_90 and this build
// holds sm_90a code (a compute_80-only build has none).
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
constexpr int kWide = 128;  // the n128 forms' N (S over 128 keys; O over two 64-column V slabs)

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

// The fp32 accumulator of one warpgroup's 64 × kN wgmma into row-major c of kN columns: thread t
// of warp w holds rows 16 w + t / 4 (+ 8), columns 8 i + 2 (t % 4) + {0, 1} of n8 tile i at
// d[4 i .. 4 i + 3], as mma.sync's C.
template <int kN>
__device__ void store_accumulator(const float (&d)[kN / 2], float* c) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < kN / 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int row = 16 * warp + lane / 4 + 8 * (j / 2), col = 8 * i + 2 * (lane % 4) + j % 2;
      c[row * kN + col] = d[4 * i + j];
    }
}

// The m64nNk16 forms the kernels use, N = 64 or 128.
template <typename T, int kN, int kTransB>
__device__ void wgmma_ss(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  if constexpr (kN == 64) {
    flashext::sm90::wgmma_m64n64k16_ss<T, kTransB>(d, desc_a, desc_b, scale_d);
  } else {
    flashext::sm90::wgmma_m64n128k16_ss<T, kTransB>(d, desc_a, desc_b, scale_d);
  }
}
template <typename T, int kN, int kTransB>
__device__ void wgmma_rs(float (&d)[kN / 2], const uint32_t (&a)[4], uint64_t desc_b, int scale_d) {
  if constexpr (kN == 64) {
    flashext::sm90::wgmma_m64n64k16_rs<T, kTransB>(d, a, desc_b, scale_d);
  } else {
    flashext::sm90::wgmma_m64n128k16_rs<T, kTransB>(d, a, desc_b, scale_d);
  }
}

// s = q kᵀ: q row-major 64 × 64 (rows × depth), k kN × 64 (keys × depth: one slab of kN rows), both
// loaded by TMA.
template <typename T, int kN>
__global__ void __launch_bounds__(128) qk_kernel(const __grid_constant__ CUtensorMap map_q,
                                                 const __grid_constant__ CUtensorMap map_k, float* s) {
  namespace sm90 = flashext::sm90;
  __shared__ __align__(1024) T q[kTile * kTile];
  __shared__ __align__(1024) T k[kN * kTile];
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(&bar, 1);
    sm90::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    sm90::mbarrier_arrive_expect_tx(&bar, (kTile + kN) * kTile * sizeof(T));
    sm90::tma_load_2d(q, &map_q, &bar, 0, 0);
    sm90::tma_load_2d(k, &map_k, &bar, 0, 0);
  }
  sm90::mbarrier_wait(&bar, 0);
  float d[kN / 2];
  // K-major, 128-byte swizzle: stride 1024 B between 8-row groups; a k16 step is 32 bytes further
  // along the row (+2 in the descriptor's address field).
  const uint64_t desc_q = sm90::smem_descriptor(q, 16, 1024), desc_k = sm90::smem_descriptor(k, 16, 1024);
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) wgmma_ss<T, kN, 0>(d, desc_q + 2 * kk, desc_k + 2 * kk, kk > 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::fence_operands(d);
  store_accumulator<kN>(d, s);
}

// o = p v: p row-major 64 × 64 (rows × keys) read into registers, v row-major 64 × kN (keys × dims)
// loaded by TMA as kN / 64 slabs of 64 columns and read MN-major (trans-b; the descriptor's
// leading offset is the distance between slabs).
template <typename T, int kN>
__global__ void __launch_bounds__(128) pv_kernel(const T* p, const __grid_constant__ CUtensorMap map_v, float* o) {
  namespace sm90 = flashext::sm90;
  __shared__ __align__(1024) T v[kTile * kN];  // slab h: dims 64 h + [0, 64) of the 64 keys
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(&bar, 1);
    sm90::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    sm90::mbarrier_arrive_expect_tx(&bar, kTile * kN * sizeof(T));
    for (int h = 0; h < kN / kTile; ++h) sm90::tma_load_2d(v + h * kTile * kTile, &map_v, &bar, kTile * h, 0);
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
  float d[kN / 2];
  // MN-major, 128-byte swizzle: leading offset = one slab's bytes (64 keys × 128 B), stride 1024 B
  // between 8-key groups; a k16 step is 16 keys = 2048 bytes (+128).
  const uint64_t desc_v = sm90::smem_descriptor(v, kTile * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) sm90::fence_operands(a[kk]);
  sm90::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) wgmma_rs<T, kN, 1>(d, a[kk], desc_v + 128 * kk, kk > 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::fence_operands(d);
  store_accumulator<kN>(d, o);
}

template <typename T>
class Sm90Primitives : public ::testing::Test {};
using Types = ::testing::Types<__half, __nv_bfloat16>;
TYPED_TEST_SUITE(Sm90Primitives, Types);

// A 2-D map of a row-major rows × cols matrix, boxes of box_rows × 64.
template <typename T>
CUtensorMap matrix_map(const DeviceBuffer& buffer, int rows, int cols, int box_rows) {
  CUtensorMap map;
  EXPECT_EQ(flashext::make_tma_2d_swizzle128(&map, buffer.get(), 2, rows, cols, cols * sizeof(T), box_rows, kTile),
            cudaSuccess);
  return map;
}

// A 64 × 64 tile, one box.
template <typename T>
CUtensorMap tile_map(const DeviceBuffer& buffer) {
  return matrix_map<T>(buffer, kTile, kTile, kTile);
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


TYPED_TEST(Sm90Primitives, TmaAndWgmmaQKt) {
  FX_SKIP_WITHOUT_GPU();
  if (!sm90_available()) GTEST_SKIP() << "needs an sm_90 GPU and a build with sm_90a code";
  using T = TypeParam;
  check_tile_product<T>(90, true, "s", [](const DeviceBuffer& q, const DeviceBuffer& k, const DeviceBuffer& s) {
    qk_kernel<T, kTile><<<1, 128>>>(tile_map<T>(q), tile_map<T>(k), s.at<float>());
  });
}

TYPED_TEST(Sm90Primitives, WgmmaPVFromRegisters) {
  FX_SKIP_WITHOUT_GPU();
  if (!sm90_available()) GTEST_SKIP() << "needs an sm_90 GPU and a build with sm_90a code";
  using T = TypeParam;
  check_tile_product<T>(91, false, "o", [](const DeviceBuffer& p, const DeviceBuffer& v, const DeviceBuffer& o) {
    pv_kernel<T, kTile><<<1, 128>>>(p.at<T>(), tile_map<T>(v), o.at<float>());
  });
}

TYPED_TEST(Sm90Primitives, WgmmaN128QKt) {
  FX_SKIP_WITHOUT_GPU();
  if (!sm90_available()) GTEST_SKIP() << "needs an sm_90 GPU and a build with sm_90a code";
  using T = TypeParam;
  check_tile_product<T>(92, true, "s", [](const DeviceBuffer& q, const DeviceBuffer& k, const DeviceBuffer& s) {
    qk_kernel<T, kWide><<<1, 128>>>(tile_map<T>(q), matrix_map<T>(k, kWide, kTile, kWide), s.at<float>());
  }, kWide);
}

TYPED_TEST(Sm90Primitives, WgmmaN128PVAcrossTwoSlabs) {
  FX_SKIP_WITHOUT_GPU();
  if (!sm90_available()) GTEST_SKIP() << "needs an sm_90 GPU and a build with sm_90a code";
  using T = TypeParam;
  check_tile_product<T>(93, false, "o", [](const DeviceBuffer& p, const DeviceBuffer& v, const DeviceBuffer& o) {
    pv_kernel<T, kWide><<<1, 128>>>(p.at<T>(), matrix_map<T>(v, kTile, kWide, kTile), o.at<float>());
  }, kWide);
}

// Every block adds its own values, (block + 1) · (i % 7 + 1) at element i, into the same `sum`
// by one bulk reduce-add per 1 KiB chunk (small integers: exact in fp32 in any order).
__global__ void bulk_reduce_kernel(float* sum, int elements) {
  extern __shared__ __align__(128) float values[];
  for (int i = threadIdx.x; i < elements; i += blockDim.x) values[i] = float((blockIdx.x + 1) * (i % 7 + 1));
  flashext::sm90::fence_proxy_async();  // the generic stores before the bulk engine reads them
  __syncthreads();
  if (threadIdx.x == 0) {
    constexpr int kChunk = 256;  // floats
    for (int i = 0; i < elements; i += kChunk) {
      flashext::sm90::bulk_reduce_add_f32(sum + i, values + i, uint32_t(sizeof(float) * min(kChunk, elements - i)));
    }
    flashext::sm90::bulk_commit_group();
    flashext::sm90::bulk_wait_group_read<0>();  // (the block may exit once its sources are read)
    flashext::sm90::bulk_wait_group<0>();
  }
}

// One warp holds a 16 × 16 tile m in the m16n8k16 A-fragment layout (registers: rows 0-7 × columns
// 0-7, rows 8-15 × 0-7, rows 0-7 × 8-15, rows 8-15 × 8-15) and stores it with one stmatrix:
// transposed, matrix i (row block i % 2, column block i / 2) lands at rows 8 (i / 2) + j, columns
// 8 (i % 2); as is, at its place.
template <typename T, bool kTranspose>
__global__ void stmatrix_kernel(const T* m, T* out) {
  __shared__ __align__(16) T tile[16][16];
  const int lane = threadIdx.x, g = lane / 4, q = lane % 4;
  const auto pair = [&](int row, int col) { return *reinterpret_cast<const uint32_t*>(m + row * 16 + col); };
  const uint32_t r0 = pair(g, 2 * q), r1 = pair(g + 8, 2 * q), r2 = pair(g, 2 * q + 8), r3 = pair(g + 8, 2 * q + 8);
  const int i = lane / 8, j = lane % 8;
  if constexpr (kTranspose) {
    flashext::sm90::stmatrix_x4_trans(&tile[8 * (i / 2) + j][8 * (i % 2)], r0, r1, r2, r3);
  } else {
    flashext::sm90::stmatrix_x4(&tile[8 * (i % 2) + j][8 * (i / 2)], r0, r1, r2, r3);
  }
  __syncwarp();
  for (int e = lane; e < 256; e += 32) out[e] = tile[e / 16][e % 16];
}

// The 16 × 16 tile of values 0 … 255 (exact in 16 bits), row-major, through stmatrix_kernel.
template <typename T, bool kTranspose>
std::vector<T> stmatrix_of_iota() {
  std::vector<T> m(256);
  for (int e = 0; e < 256; ++e) m[e] = flashext_test::from_float<T>(float(e));
  DeviceBuffer dm(sizeof(T) * 256), dout(sizeof(T) * 256);
  flashext_test::upload(dm.get(), m);
  stmatrix_kernel<T, kTranspose><<<1, 32>>>(dm.at<T>(), dout.at<T>());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return flashext_test::download<T>(dout.get(), 256);
}

TYPED_TEST(Sm90Primitives, StmatrixStoresTheTranspose) {
  FX_SKIP_WITHOUT_GPU();
  if (!sm90_available()) GTEST_SKIP() << "needs an sm_90 GPU and a build with sm_90a code";
  const auto out = stmatrix_of_iota<TypeParam, true>();
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) ASSERT_EQ(to_float(out[r * 16 + c]), float(c * 16 + r)) << r << ", " << c;
}

TYPED_TEST(Sm90Primitives, StmatrixStoresAsIs) {
  FX_SKIP_WITHOUT_GPU();
  if (!sm90_available()) GTEST_SKIP() << "needs an sm_90 GPU and a build with sm_90a code";
  const auto out = stmatrix_of_iota<TypeParam, false>();
  for (int e = 0; e < 256; ++e) ASSERT_EQ(to_float(out[e]), float(e)) << e;
}

// A 64-row × 64-column tile written into shared memory with the 128-byte swizzle (16-byte chunk
// c / 8 of row r at chunk (c / 8) ^ (r % 8)), value 64 (r % 4) + c (exact in 16 bits), then stored by
// one TMA store at row `row0` of head 1 of a (rows × 2 heads × 64) tensor.
template <typename T>
__global__ void __launch_bounds__(128) tma_store_kernel(const __grid_constant__ CUtensorMap map, int row0) {
  __shared__ __align__(1024) T tile[kTile * kTile];
  for (int e = threadIdx.x; e < kTile * kTile; e += blockDim.x) {
    const int r = e / kTile, c = e % kTile;
    tile[r * kTile + (((c / 8) ^ (r % 8)) * 8) + c % 8] = T(float(64 * (r % 4) + c));
  }
  flashext::sm90::fence_proxy_async();
  __syncthreads();
  if (threadIdx.x == 0) {
    flashext::sm90::tma_store_4d(&map, tile, 0, 1, row0, 0);
    flashext::sm90::bulk_commit_group();
    flashext::sm90::bulk_wait_group<0>();
  }
}

TYPED_TEST(Sm90Primitives, TmaStoreLeavesOutRowsPastTheTensor) {
  FX_SKIP_WITHOUT_GPU();
  if (!sm90_available()) GTEST_SKIP() << "needs an sm_90 GPU and a build with sm_90a code";
  using T = TypeParam;
  constexpr int kRows = 100, kHeads = 2, kRow0 = 64;  // the box's rows 64-99 land, 100-127 do not
  const float poison = -3.0f;
  std::vector<T> start(kRows * kHeads * kTile, flashext_test::from_float<T>(poison));
  DeviceBuffer buffer(sizeof(T) * start.size());
  flashext_test::upload(buffer.get(), start);
  CUtensorMap map;
  ASSERT_EQ(flashext::make_tma_attention_map(&map, buffer.get(), kTile, kHeads, kRows, 1, kHeads * kTile, kTile,
                                             kRows * kHeads * kTile, kTile),
            cudaSuccess);
  tma_store_kernel<T><<<1, 128>>>(map, kRow0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = flashext_test::download<T>(buffer.get(), start.size());
  for (int row = 0; row < kRows; ++row)
    for (int head = 0; head < kHeads; ++head)
      for (int c = 0; c < kTile; ++c) {
        const bool stored = head == 1 && row >= kRow0;
        const float want = stored ? float(64 * ((row - kRow0) % 4) + c) : poison;
        ASSERT_EQ(to_float(got[(row * kHeads + head) * kTile + c]), want) << row << ", " << head << ", " << c;
      }
}

TEST(Sm90Primitives, BulkReduceAddFromManyBlocks) {
  FX_SKIP_WITHOUT_GPU();
  if (!sm90_available()) GTEST_SKIP() << "needs an sm_90 GPU and a build with sm_90a code";
  constexpr int kElements = 4096 + 4 * 37, kBlocks = 96;  // the last chunk partial (a multiple of 4)
  std::vector<float> start(kElements);
  for (int i = 0; i < kElements; ++i) start[i] = float(i % 5);
  DeviceBuffer sum(sizeof(float) * kElements);
  flashext_test::upload(sum.get(), start);
  bulk_reduce_kernel<<<kBlocks, 256, sizeof(float) * kElements>>>(sum.at<float>(), kElements);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = flashext_test::download<float>(sum.get(), kElements);
  for (int i = 0; i < kElements; ++i) {
    const float want = start[i] + float(kBlocks * (kBlocks + 1) / 2 * (i % 7 + 1));
    ASSERT_EQ(got[i], want) << "element " << i;
  }
}

// Thread 32 (the producer) hands thread 0 one value a round through a shared slot and two
// mbarriers of one arrival each: it writes round r's value once `empty` has completed phase
// r − 1, waiting as the attention producers do (suspended), and thread 0 reads it once `full`
// has completed phase r. A wait that returned before its phase would overwrite a slot not yet
// read (thread 0 would see a value twice and miss one); one that never returned would hang.
__global__ void suspended_wait_kernel(int* out, int rounds) {
  namespace sm90 = flashext::sm90;
  __shared__ uint64_t full, empty;
  __shared__ int slot;
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(&full, 1);
    sm90::mbarrier_init(&empty, 1);
    sm90::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 32) {
    for (int r = 0; r < rounds; ++r) {
      if (r > 0) sm90::mbarrier_wait_suspended(&empty, (r - 1) & 1);
      slot = 3 * r + 1;
      sm90::mbarrier_arrive(&full);
    }
  } else if (threadIdx.x == 0) {
    for (int r = 0; r < rounds; ++r) {
      sm90::mbarrier_wait(&full, r & 1);
      out[r] = slot;
      if (r % 5 == 0) __nanosleep(2000);  // the producer finds the slot taken, and is suspended
      sm90::mbarrier_arrive(&empty);
    }
  }
}

TEST(Sm90Primitives, SuspendedWaitReturnsOncePerPhase) {
  FX_SKIP_WITHOUT_GPU();
  if (!sm90_available()) GTEST_SKIP() << "needs an sm_90 GPU and a build with sm_90a code";
  constexpr int kRounds = 257;
  DeviceBuffer out(sizeof(int) * kRounds);
  ASSERT_EQ(cudaMemset(out.get(), 0xff, sizeof(int) * kRounds), cudaSuccess);  // poisoned
  suspended_wait_kernel<<<1, 64>>>(out.at<int>(), kRounds);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = flashext_test::download<int>(out.get(), kRounds);
  for (int r = 0; r < kRounds; ++r) ASSERT_EQ(got[r], 3 * r + 1) << "round " << r;
}

// The attention maps' host side (no GPU needed): strides pass in bytes as the tensor has them,
// except a dim of size 1, whose stride addresses nothing and may be any value (torch leaves it so),
// which takes the dense stride of the dims inside it, so that every stride stays a multiple of 16
// bytes.
TEST(Sm90Host, AttentionMapLayout) {
  const auto expect = [](const flashext::TmaAttentionLayout& got, std::vector<uint64_t> dims,
                         std::vector<uint64_t> strides) {
    EXPECT_EQ(std::vector<uint64_t>(got.dims, got.dims + 4), dims);
    EXPECT_EQ(std::vector<uint64_t>(got.strides_bytes, got.strides_bytes + 3), strides);
  };
  using flashext::tma_attention_layout;
  // (B, S, H, D) = (2, 5, 3, 64), contiguous: head, row, batch strides 64, 192, 960 elements
  expect(tma_attention_layout(64, 3, 5, 2, 192, 64, 960), {64, 3, 5, 2}, {128, 384, 1920});
  // a (B, H, S, D) tensor transposed to (B, S, H, D): rows 128 apart, heads 7 · 128
  expect(tma_attention_layout(128, 4, 7, 3, 128, 896, 3584), {128, 4, 7, 3}, {1792, 256, 7168});
  // packed qkv (B, S, 3, H, D) = (2, 9, 3, 2, 64) viewed as q: rows 3 · 2 · 64 apart
  expect(tma_attention_layout(64, 2, 9, 2, 384, 64, 3456), {64, 2, 9, 2}, {128, 768, 6912});
  // every dim of size 1, with odd strides: each the dense one
  expect(tma_attention_layout(64, 1, 1, 1, 3, 5, 7), {64, 1, 1, 1}, {128, 128, 128});
  // one row per sequence (decode-shaped q): the row stride is the heads' extent
  expect(tma_attention_layout(64, 2, 1, 3, 1, 64, 1000), {64, 2, 1, 3}, {128, 256, 2000});
  // one head (MQA's k and v), one sequence: head stride D, batch stride rows · row stride
  expect(tma_attention_layout(128, 1, 9, 1, 128, 5, 77), {128, 1, 9, 1}, {256, 256, 2304});
}

}  // namespace
