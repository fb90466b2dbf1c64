// Read-pattern probe for the decode kernel (a debugging tool, not part of the build or the tests):
// does the order in which blocks read a (B, S, Hkv, D) cache change the HBM's rate? Each variant
// reads the same K and V bytes (GQA 32/8 caches: Hkv = 8, D = 128, 2-byte elements) with the same
// number of blocks, bytes a block and pipeline (128 threads, three 16 KiB-a-tensor stages of
// cp.async, as flash_decode.cu at D = 128), and differs only in which bytes a block reads:
//   head  block (b, kv head): its head's 256-byte column of each token, 64 tokens a tile (the decode
//         kernel's pattern: a 2 KiB token row is read by 8 blocks, 256 bytes each);
//   row   block (b, eighth of the tokens): whole 2 KiB token rows, 8 tokens a tile (each tile one
//         contiguous 16 KiB run);
//   headb as head, the grid (batch, heads): a token row's 8 blocks launched a batch apart;
//   ldg   as head, through 16-byte ld.global.nc into registers instead of cp.async;
//   regN  as head, each warp on its own 16-token chunks (tokens 64 t + 16 w + [0, 16)) with no
//         block barrier, 16-byte ld.global.nc into a ring of N chunks of registers (64 a chunk),
//         each thread's bytes those of a register-fed decode kernel's MMA operands: K rows
//         lane / 4 + {0, 8}, 64 bytes apart a lane; V rows 2 (lane % 4) + {0, 1, 8, 9}, 32 bytes
//         (lane / 4);
//   flat  a grid-stride loop of 16-byte loads over each tensor, 4 blocks of 256 threads an SM (a
//         plain read with no pipeline; below head on an H100).
// Every call is timed after a 256 MB memset (as triton's do_bench flushes L2), median of 41 calls.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icsrc/kernels/common \
//     benchmarks/experiments/probe_read_layout.cu -o probe_read_layout
//   ./probe_read_layout 32 4096 64 8192 128 2048
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "ptx.cuh"

namespace {

constexpr int kThreads = 128, kStages = 3, kTile = 16384, kRowBytes = 256, kHeads = 8;

namespace ptx = flashext::ptx;

// kMode 0: the head pattern, grid (1, heads, batch); 1: the row pattern, grid (1, 8, batch); 2: the
// head pattern, grid (batch, heads): a batch's heads launched batch apart instead of together.
// Tiles: S / 64 a block in each.
template <int kMode>
__global__ void __launch_bounds__(kThreads) read_pipelined(const char* k, const char* v, int seqlen, int* sink) {
  extern __shared__ __align__(128) char smem[];
  const uint32_t base = ptx::smem_addr(smem);
  constexpr bool kRow = kMode == 1;
  const int b = kMode == 2 ? blockIdx.x : blockIdx.z, tid = threadIdx.x, tiles = seqlen / 64;
  const long long seq = (long long)b * seqlen * kHeads * kRowBytes;
  const auto issue = [&](int tile) {
    const uint32_t kd = base + (tile % kStages) * 2 * kTile, vd = kd + kTile;
    for (int i = 0; i < 8; ++i) {
      long long off;
      unsigned d;
      if (kRow) {  // token t0 + i of this block's eighth, bytes tid * 16 of its 2 KiB row
        const int t = blockIdx.y * (seqlen / 8) + tile * 8 + i;
        off = seq + (long long)t * kHeads * kRowBytes + tid * 16;
        d = i * 2048 + tid * 16;
      } else {  // token 64 tile + tid / 16 + 8 i, chunk tid % 16 of head blockIdx.y
        const int r = tid / 16 + 8 * i, t = tile * 64 + r;
        off = seq + ((long long)t * kHeads + blockIdx.y) * kRowBytes + (tid % 16) * 16;
        d = r * kRowBytes + (tid % 16) * 16;
      }
      ptx::cp_async_16(kd + d, k + off, 16);
      ptx::cp_async_16(vd + d, v + off, 16);
    }
  };
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < tiles) issue(s);
    ptx::cp_async_commit();
  }
  int acc = 0;
  for (int it = 0; it < tiles; ++it) {
    ptx::cp_async_wait<kStages - 2>();
    __syncthreads();
    if (it + kStages - 1 < tiles) issue(it + kStages - 1);
    ptx::cp_async_commit();
    acc += reinterpret_cast<const int*>(smem + (it % kStages) * 2 * kTile)[tid];
  }
  ptx::cp_async_wait<0>();
  if (acc == 0x7fffffff) *sink = acc;  // keeps the loads live
}

// One 16-byte load through the read-only path (with kNoAllocate, not kept in L1), kept in flight by
// `volatile` where the compiler would otherwise sink it to its first use.
template <bool kNoAllocate = false>
__device__ __forceinline__ int4 ldg16(const void* p) {
  int4 x;
  if constexpr (kNoAllocate) {
    asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w)
                 : "l"(p));
  } else {
    asm volatile("ld.global.nc.v4.s32 {%0,%1,%2,%3}, [%4];" : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w) : "l"(p));
  }
  return x;
}

__global__ void __launch_bounds__(kThreads) read_ldg(const char* k, const char* v, int seqlen, int* sink) {
  const int b = blockIdx.z, tid = threadIdx.x, tiles = seqlen / 64;
  const long long seq = (long long)b * seqlen * kHeads * kRowBytes;
  int acc = 0;
  for (int tile = 0; tile < tiles; ++tile) {
    int4 x[16];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int t = tile * 64 + tid / 16 + 8 * i;
      const long long off = seq + ((long long)t * kHeads + blockIdx.y) * kRowBytes + (tid % 16) * 16;
      x[i] = ldg16(k + off);
      x[8 + i] = ldg16(v + off);
    }
#pragma unroll
    for (int i = 0; i < 16; ++i) acc ^= x[i].x ^ x[i].y ^ x[i].z ^ x[i].w;
  }
  if (acc == 0x7fffffff) *sink = acc;
}

template <int kNB>
__global__ void __launch_bounds__(kThreads) read_reg(const char* k, const char* v, int seqlen, int* sink) {
  constexpr int kTokenBytes = kHeads * kRowBytes;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n = seqlen / 64;
  const long long seq = (long long)blockIdx.z * seqlen * kTokenBytes + blockIdx.y * kRowBytes;
  const char* kb = k + seq + (long long)warp * 16 * kTokenBytes;
  const char* vb = v + seq + (long long)warp * 16 * kTokenBytes;
  int koff[8], voff[8];
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    koff[q] = (lane / 4 + 8 * (q / 4)) * kTokenBytes + 64 * (q % 4) + 16 * (lane % 4);
    const int r = q / 2;
    voff[q] = (2 * (lane % 4) + (r & 1) + 8 * (r >> 1)) * kTokenBytes + 32 * (lane / 4) + 16 * (q % 2);
  }
  int4 buf[kNB][16];
  const auto load = [&](int4* dst, int t) {
    const long long c = (long long)t * 64 * kTokenBytes;
#pragma unroll
    for (int q = 0; q < 8; ++q) dst[q] = ldg16<true>(kb + c + koff[q]);
#pragma unroll
    for (int q = 0; q < 8; ++q) dst[8 + q] = ldg16<true>(vb + c + voff[q]);
  };
#pragma unroll
  for (int s = 0; s < kNB - 1; ++s)
    if (s < n) load(buf[s], s);
  int acc = 0;
  for (int t0 = 0; t0 < n; t0 += kNB) {
#pragma unroll
    for (int s = 0; s < kNB; ++s) {
      const int t = t0 + s;
      if (t < n) {
        if (t + kNB - 1 < n) load(buf[(s + kNB - 1) % kNB], t + kNB - 1);
#pragma unroll
        for (int q = 0; q < 16; ++q) acc ^= buf[s][q].x ^ buf[s][q].y ^ buf[s][q].z ^ buf[s][q].w;
      }
    }
  }
  if (acc == 0x7fffffff) *sink = acc;
}

__global__ void read_flat(const int4* k, const int4* v, long long n, int* sink) {
  int acc = 0;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const int4 a = ldg16(k + i), c = ldg16(v + i);
    acc ^= a.x ^ a.w ^ c.x ^ c.w;
  }
  if (acc == 0x7fffffff) *sink = acc;
}

#define CHECK(x)                                                                  \
  do {                                                                            \
    cudaError_t e = (x);                                                          \
    if (e != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e));                \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

template <typename F>
float time_ms(F launch, char* flush, size_t flush_bytes) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < 46; ++i) {
    CHECK(cudaMemsetAsync(flush, i, flush_bytes));
    CHECK(cudaEventRecord(a));
    launch();
    CHECK(cudaEventRecord(b));
    CHECK(cudaEventSynchronize(b));
    float t;
    CHECK(cudaEventElapsedTime(&t, a, b));
    if (i >= 5) ms.push_back(t);
  }
  CHECK(cudaGetLastError());
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t flush_bytes = size_t(256) << 20;
  char* flush;
  CHECK(cudaMalloc(&flush, flush_bytes));
  int* sink;
  CHECK(cudaMalloc(&sink, sizeof(int)));
  const int smem = kStages * 2 * kTile;
  CHECK(cudaFuncSetAttribute(read_pipelined<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute(read_pipelined<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  CHECK(cudaFuncSetAttribute(read_pipelined<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n", prop.name, sms);
  for (int a = 1; a + 1 < argc; a += 2) {
    const int batch = std::atoi(argv[a]), seqlen = std::atoi(argv[a + 1]);
    if (batch < 1 || seqlen < 64 || seqlen % 64 != 0) {  // (whole 64-token tiles, every block the same)
      std::fprintf(stderr, "usage: %s BATCH SEQLEN [BATCH SEQLEN ...], SEQLEN a multiple of 64\n", argv[0]);
      return 1;
    }
    const size_t bytes = size_t(batch) * seqlen * kHeads * kRowBytes;  // one tensor
    char *k, *v;
    CHECK(cudaMalloc(&k, bytes));
    CHECK(cudaMalloc(&v, bytes));
    CHECK(cudaMemset(k, 1, bytes));
    CHECK(cudaMemset(v, 2, bytes));
    const dim3 grid(1, kHeads, batch);
    const dim3 grid_b(batch, kHeads);
    const auto flat_launch = [&] {
      read_flat<<<4 * sms, 256>>>(reinterpret_cast<const int4*>(k), reinterpret_cast<const int4*>(v), bytes / 16, sink);
    };
    const std::pair<const char*, float> ms[] = {
        {"head", time_ms([&] { read_pipelined<0><<<grid, kThreads, smem>>>(k, v, seqlen, sink); }, flush, flush_bytes)},
        {"row", time_ms([&] { read_pipelined<1><<<grid, kThreads, smem>>>(k, v, seqlen, sink); }, flush, flush_bytes)},
        {"headb", time_ms([&] { read_pipelined<2><<<grid_b, kThreads, smem>>>(k, v, seqlen, sink); }, flush, flush_bytes)},
        {"ldg", time_ms([&] { read_ldg<<<grid, kThreads>>>(k, v, seqlen, sink); }, flush, flush_bytes)},
        {"reg2", time_ms([&] { read_reg<2><<<grid, kThreads>>>(k, v, seqlen, sink); }, flush, flush_bytes)},
        {"reg3", time_ms([&] { read_reg<3><<<grid, kThreads>>>(k, v, seqlen, sink); }, flush, flush_bytes)},
        {"flat", time_ms(flat_launch, flush, flush_bytes)},
    };
    const auto gbs = [&](float t) { return 2.0 * bytes / (t * 1e6); };
    std::printf("%4d x %6d  GB/s: head %.0f", batch, seqlen, gbs(ms[0].second));
    for (int i = 1; i < int(sizeof ms / sizeof ms[0]); ++i)
      std::printf("  %s %.0f (%.3fx%s)", ms[i].first, gbs(ms[i].second), ms[0].second / ms[i].second, i == 1 ? " head" : "");
    std::printf("\n");
    CHECK(cudaFree(k));
    CHECK(cudaFree(v));
  }
  return 0;
}
