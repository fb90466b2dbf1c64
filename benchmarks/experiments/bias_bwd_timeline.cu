// Timeline of the one-pass bias + GeLU backward at rows × 16384: every warp records %globaltimer
// (ns, one clock for the whole GPU) when it enters, when its first rows are requested, when each
// of its rows has landed, when its rows are done and when the bias gradient is stored. Printed:
// each point's spread over the warps (from the first warp's entry), medians over the timed
// launches, with the kernel's event time, a same-bytes device-to-device copy's and a traced
// same-mix add's (two reads per write, no math) beside it. L2 is flushed (a 256 MB memset) before
// every launch, as bench_gelu does. Standalone: the CUDA runtime and flashext's kernel headers.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icsrc/kernels -Icsrc/include \
//        benchmarks/experiments/bias_bwd_timeline.cu -o /tmp/timeline && /tmp/timeline [rows] [dtype: bf16|fp16|fp32]
//
// The kernel timed is one_pass_traced below: bias_gelu_bwd_one_pass_kernel (exact form; see
// csrc/kernels/gelu/bias_gelu_bwd_one_pass.cuh) copied with trace points, from the same pieces
// (ring.cuh, epilogue.cuh). Its axes are nvcc -D flags, the shipped configuration by default:
// TIMELINE_STAGES (ring slots), TIMELINE_ROW_THREADS_16 and TIMELINE_ROW_THREADS_FP32 (row threads
// a block); timeline_ab.sh compares settings. With -DTIMELINE_NO_TRACE=1 the trace points compile
// out and, at the defaults, the copy's sm_90a SASS equals the shipped kernel's (cuobjdump -sass
// both, built with the same flags): check that whenever either changes.
// Diagnostics (environment): FLASHEXT_TIMELINE_PRECONFIG=1 takes the kernel's dynamic shared
// memory on every SM right before each launch; FLASHEXT_TIMELINE_CLEAN_FLUSH=1 flushes L2 by
// reading 256 MB instead of writing it (clean lines to evict).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/device.h"
#include "common/ptx.cuh"
#include "common/vec.cuh"
#include "gelu/epilogue.cuh"
#include "gelu/plan.h"
#include "gelu/ring.cuh"

constexpr int kEvents = 8;  // entry, requested, rows 0-3 landed, rows done, bias gradient stored
constexpr int kMaxBlocks = 1024, kMaxWarps = 32;
__device__ unsigned long long g_trace[kMaxBlocks][kMaxWarps][kEvents];
__device__ unsigned g_smid[kMaxBlocks];

__device__ __forceinline__ void trace_record(long long event) {
  if ((threadIdx.x & 31) == 0 && event < kEvents && blockIdx.x < kMaxBlocks && threadIdx.x < 32 * kMaxWarps) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    g_trace[blockIdx.x][threadIdx.x >> 5][event] = t;
    if (event == 0 && threadIdx.x == 0) {
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      g_smid[blockIdx.x] = sm;
    }
  }
}
#if TIMELINE_NO_TRACE
#define TRACE(event) ((void)0)
#else
#define TRACE(event) trace_record(event)
#endif

using namespace flashext;
using namespace flashext::gelu_detail;

#ifndef TIMELINE_STAGES
#define TIMELINE_STAGES BiasBwdOnePass::kStages
#endif
#ifndef TIMELINE_ROW_THREADS_16
#define TIMELINE_ROW_THREADS_16 BiasBwdOnePass::kRowThreads16
#endif
#ifndef TIMELINE_ROW_THREADS_FP32
#define TIMELINE_ROW_THREADS_FP32 BiasBwdOnePass::kRowThreadsFp32
#endif
constexpr int kStages = TIMELINE_STAGES;
static_assert(kStages >= 1 && kStages <= 6, "a slot is 32 bytes a thread: 16 KiB for 512 threads");
template <typename T>
constexpr int kRowThreads = sizeof(T) == 4 ? TIMELINE_ROW_THREADS_FP32 : TIMELINE_ROW_THREADS_16;
template <typename T>
constexpr int kThreads = BiasBwdOnePass::kColThreads * kRowThreads<T>;

template <typename T, int kVec>
constexpr size_t traced_smem_bytes() {
  constexpr int kWarpRows = 32 / BiasBwdOnePass::kColThreads;
  return sizeof(Pack<T, kVec>) * 2 * kStages * kThreads<T> +
         sizeof(float) * (kRowThreads<T> / kWarpRows) * (BiasBwdOnePass::kColThreads * kVec + 1);
}

// bias_gelu_bwd_one_pass_kernel<T, kVec, /*kTanh=*/false> with trace points 0-7 (see kEvents).
template <typename T, int kVec>
__global__ void __launch_bounds__(kThreads<T>, 1024 / kThreads<T>) one_pass_traced(const RowColArgs args) {
  constexpr int kColThreads = BiasBwdOnePass::kColThreads, kRows = kRowThreads<T>;
  constexpr int kBlockThreads = kColThreads * kRows;
  constexpr int kCols = kColThreads * kVec, kSlices = kBlockThreads / kCols;
  constexpr int kWarpRows = 32 / kColThreads, kWarps = kBlockThreads / 32;
  static_assert(32 % kColThreads == 0 && kRows % kWarpRows == 0, "a warp holds whole row threads");
  static_assert(kVec > 1 && kSlices <= 32 && kWarps % kSlices == 0, "one lane group per column");
  using P = Pack<T, kVec>;
  TRACE(0);  // entry
  const T* x = static_cast<const T*>(args.x);
  const T* grad_out = static_cast<const T*>(args.grad_out);
  T* dst = static_cast<T*>(args.dst);
  const int tx = threadIdx.x % kColThreads, ty = threadIdx.x / kColThreads;
  const int64_t col_pack = int64_t(blockIdx.x) * kColThreads + tx;
  const bool col_valid = col_pack * kVec < args.cols;

  extern __shared__ __align__(16) unsigned char smem[];
  auto ring = reinterpret_cast<P(*)[2][kBlockThreads]>(smem);

  float bias[kVec], bias_grad[kVec];
#pragma unroll
  for (int e = 0; e < kVec; ++e) bias_grad[e] = 0.0f;
  if (col_valid) {
    const P* x_col = reinterpret_cast<const P*>(x) + col_pack;
    const P* grad_col = reinterpret_cast<const P*>(grad_out) + col_pack;
    P* dst_col = reinterpret_cast<P*>(dst) + col_pack;
    const int64_t x_stride = int64_t(uint64_t(args.x_row_stride) / kVec), stride = int64_t(uint64_t(args.cols) / kVec);
    const uint64_t policy = ptx::l2_evict_first_policy();
    const auto issue = [&](int k) {
      const int row = ty + k * kRows;
      const int slot = k % kStages;
      ptx::cp_async_16_policy(ptx::smem_addr(&ring[slot][0][threadIdx.x]), x_col + row * x_stride, policy);
      ptx::cp_async_16_policy(ptx::smem_addr(&ring[slot][1][threadIdx.x]), grad_col + row * stride, policy);
    };
    const unsigned rows = unsigned(args.rows);
    const int my_rows = rows > unsigned(ty) ? int((rows - unsigned(ty) + kRows - 1) / kRows) : 0;
    ring_prologue<kStages>(my_rows, issue);
    const P bias_pack = load_pack<T, kVec>(static_cast<const T*>(args.bias), col_pack);
    unpack(bias_pack, bias);
    TRACE(1);  // rows 0 … kStages − 1 requested
    const auto compute = [&](int k, int slot) {  // ring_rows calls it right after row k has landed
      TRACE(2 + k);  // row k landed
      float xs[kVec], gs[kVec];
      unpack(ring[slot][0][threadIdx.x], xs);
      unpack(ring[slot][1][threadIdx.x], gs);
      P out;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float value = gelu_epilogue<T, /*kBackward=*/true, /*kTanh=*/false>(xs[e] + bias[e], gs[e]);
        out.elem[e] = from_float<T>(value);
        bias_grad[e] += value;
      }
      return out;
    };
    const auto store = [&](int k, const P& out) { dst_col[(ty + k * kRows) * stride] = out; };
    ring_rows<kStages>(my_rows, issue, compute, store);
    ptx::cp_async_wait<0>();
  }
  TRACE(6);  // rows done

  auto sums = reinterpret_cast<float(*)[kCols + 1]>(smem + sizeof(P) * 2 * kStages * kBlockThreads);
#pragma unroll
  for (int e = 0; e < kVec; ++e) {
#pragma unroll
    for (int offset = kColThreads; offset < 32; offset *= 2)
      bias_grad[e] += __shfl_xor_sync(0xffffffffu, bias_grad[e], offset);
  }
  if (ty % kWarpRows == 0) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) sums[ty / kWarpRows][tx * kVec + e] = bias_grad[e];
  }
  __syncthreads();
  const int col = threadIdx.x / kSlices, slice = threadIdx.x % kSlices;
  float sum = 0.0f;
#pragma unroll
  for (int w = slice; w < kWarps; w += kSlices) sum += sums[w][col];
#pragma unroll
  for (int offset = kSlices / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  const int64_t out_col = int64_t(blockIdx.x) * kCols + col;
  if (slice == 0 && out_col < args.cols) static_cast<T*>(args.grad_bias)[out_col] = from_float<T>(sum);
  TRACE(7);  // bias gradient stored
}

#define CHECK(x)                                                         \
  do {                                                                   \
    cudaError_t e = (x);                                                 \
    if (e != cudaSuccess) {                                              \
      printf("%s: %s\n", #x, cudaGetErrorString(e));                     \
      exit(1);                                                           \
    }                                                                    \
  } while (0)

template <typename T>
__global__ void fill(T* p, int64_t n, unsigned seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    unsigned h = unsigned(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    p[i] = T(float(h & 0xffff) / 16384.0f - 2.0f);
  }
}

// Diagnostic (FLASHEXT_TIMELINE_PRECONFIG=1): a kernel that takes the one-pass kernel's dynamic
// shared memory on every SM right before the timed launch, so the SMs' shared-memory carveout is
// already what the one-pass kernel needs.
__global__ void touch_smem() {
  extern __shared__ unsigned char scratch[];
  if (threadIdx.x == 0) reinterpret_cast<volatile unsigned*>(scratch)[0] = 0u;
}

// Diagnostic (FLASHEXT_TIMELINE_CLEAN_FLUSH=1): L2 flushed by reading the 256 MB buffer instead of
// writing it, so the lines the launch evicts are clean (a memset leaves them dirty, to be written
// back as the launch allocates its own).
__global__ void read_flush(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    acc ^= p[i].x ^ p[i].w;
  if (acc == 0x9e3779b9u) *sink = acc;
}

__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// The same-mix reference with the same trace points: out = a + b, one 16-byte pack of each per
// thread (256 threads a block, as torch's elementwise kernels): entry, loads issued, landed, stored.
template <typename T>
__global__ void __launch_bounds__(256) add_2r1w(const T* a, const T* b, T* out, int64_t packs) {
  using P = Pack<T, 16 / sizeof(T)>;
  trace_record(0);
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < packs) {
    const P va = reinterpret_cast<const P*>(a)[i];
    const P vb = reinterpret_cast<const P*>(b)[i];
    trace_record(1);
    constexpr int kN = 16 / sizeof(T);
    float fa[kN], fb[kN];
    unpack(va, fa);
    unpack(vb, fb);
    P r;
#pragma unroll
    for (int e = 0; e < kN; ++e) r.elem[e] = from_float<T>(fa[e] + fb[e]);
    trace_record(2);
    reinterpret_cast<P*>(out)[i] = r;
  }
  trace_record(7);
}

static float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0f : v[v.size() / 2];
}

template <typename T>
int run(int64_t rows, int64_t cols, const char* dtype_name) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kBlockThreads = kThreads<T>;
  const int64_t n = rows * cols;
  T *x, *g, *bias, *dx, *db;
  CHECK(cudaMalloc(&x, n * sizeof(T)));
  CHECK(cudaMalloc(&g, n * sizeof(T)));
  CHECK(cudaMalloc(&dx, n * sizeof(T)));
  CHECK(cudaMalloc(&bias, cols * sizeof(T)));
  CHECK(cudaMalloc(&db, cols * sizeof(T)));
  fill<<<1024, 256>>>(x, n, 1u);
  fill<<<1024, 256>>>(g, n, 2u);
  fill<<<64, 256>>>(bias, cols, 3u);
  const size_t copy_bytes = size_t(n) * sizeof(T) * 3 / 2;  // copy moves 2 × this: the pass's 3 tensors
  char *src, *dst, *flush;
  CHECK(cudaMalloc(&src, copy_bytes));
  CHECK(cudaMalloc(&dst, copy_bytes));
  CHECK(cudaMalloc(&flush, size_t(256) << 20));
  CHECK(cudaMemset(src, 1, copy_bytes));

  const RowColArgs args{g, x, bias, dx, nullptr, rows, cols, cols, rows, false, db};
  const auto kernel = one_pass_traced<T, kVec>;
  constexpr size_t kSmem = traced_smem_bytes<T, kVec>();
  CHECK(allow_dynamic_smem(kernel, kSmem));
  CHECK(allow_dynamic_smem(touch_smem, kSmem));
  const bool preconfig = getenv("FLASHEXT_TIMELINE_PRECONFIG") && atoi(getenv("FLASHEXT_TIMELINE_PRECONFIG")) != 0;
  const bool clean_flush = getenv("FLASHEXT_TIMELINE_CLEAN_FLUSH") && atoi(getenv("FLASHEXT_TIMELINE_CLEAN_FLUSH")) != 0;
  if (clean_flush) printf("clean flush: L2 flushed by reading 256 MB (clean lines), not by a memset\n");
  if (preconfig) printf("preconfig: %zu B of dynamic shared memory taken on every SM before each launch\n", kSmem);
  void* trace_ptr;
  CHECK(cudaGetSymbolAddress(&trace_ptr, g_trace));

  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  const int iters = 60, warmup = 5;
  const float qs[] = {0.0f, 0.1f, 0.5f, 0.9f, 1.0f};
  std::vector<unsigned long long> host(size_t(kMaxBlocks) * kMaxWarps * kEvents);
  std::vector<unsigned> smid(kMaxBlocks);
  const double moved = double(n) * sizeof(T) * 3;
  // Times `launch` (L2 flushed before each call); with trace_blocks > 0 also the spread of each
  // trace point over the warps of trace_blocks blocks × trace_warps warps. Returns the median ms.
  auto measure = [&](const char* name, auto&& launch, int trace_blocks, int trace_warps) {
    std::vector<float> ms_all;
    std::vector<std::vector<float>> pct(kEvents * 5), tails(4);
    for (int it = 0; it < iters; ++it) {
      spin<<<1, 1>>>(100000);
      if (clean_flush) read_flush<<<1056, 512>>>(reinterpret_cast<const uint4*>(flush), (size_t(256) << 20) / 16,
                                                 reinterpret_cast<unsigned*>(flush));
      else CHECK(cudaMemsetAsync(flush, it & 0xff, size_t(256) << 20));
      if (preconfig) touch_smem<<<264, 32, kSmem>>>();
      if (trace_blocks > 0) CHECK(cudaMemsetAsync(trace_ptr, 0, host.size() * sizeof(unsigned long long)));
      CHECK(cudaEventRecord(start));
      launch();
      CHECK(cudaEventRecord(stop));
      CHECK(cudaEventSynchronize(stop));
      float ms;
      CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (it < warmup) continue;
      ms_all.push_back(ms);
      if (trace_blocks == 0) continue;
      CHECK(cudaMemcpyFromSymbol(host.data(), g_trace, host.size() * sizeof(unsigned long long)));
      CHECK(cudaMemcpyFromSymbol(smid.data(), g_smid, smid.size() * sizeof(unsigned)));
      unsigned long long t0 = ~0ull;
      for (int b = 0; b < trace_blocks; ++b)
        for (int w = 0; w < trace_warps; ++w) {
          const unsigned long long t = host[(size_t(b) * kMaxWarps + w) * kEvents];
          if (t != 0) t0 = std::min(t0, t);
        }
      {  // per block: last landed → last rows done → last stored (the block's slowest warps)
        std::vector<float> compute, reduce;
        for (int b = 0; b < trace_blocks; ++b) {
          unsigned long long landed = 0, done = 0, stored = 0;
          for (int w = 0; w < trace_warps; ++w) {
            const unsigned long long* t = &host[(size_t(b) * kMaxWarps + w) * kEvents];
            for (int e = 2; e <= 5; ++e) landed = std::max(landed, t[e]);
            done = std::max(done, t[6]);
            stored = std::max(stored, t[7]);
          }
          if (done > 0 && landed > 0) compute.push_back(float(done - landed));
          if (done > 0 && stored > 0) reduce.push_back(float(stored - done));
        }
        std::sort(compute.begin(), compute.end());
        std::sort(reduce.begin(), reduce.end());
        if (!compute.empty()) {
          tails[0].push_back(compute[compute.size() / 2]);
          tails[1].push_back(compute.back());
          tails[2].push_back(reduce[reduce.size() / 2]);
          tails[3].push_back(reduce.back());
        }
      }
      for (int e = 0; e < kEvents; ++e) {
        std::vector<float> v;
        for (int b = 0; b < trace_blocks; ++b)
          for (int w = 0; w < trace_warps; ++w) {
            const unsigned long long t = host[(size_t(b) * kMaxWarps + w) * kEvents + e];
            if (t >= t0) v.push_back(float(t - t0));
          }
        std::sort(v.begin(), v.end());
        for (int q = 0; q < 5; ++q)
          pct[e * 5 + q].push_back(v.empty() ? -1.0f : v[std::min(v.size() - 1, size_t(qs[q] * v.size()))]);
      }
    }
    const float ms = median(ms_all);
    printf("%s: event time (median of %d) %.2f us, %.0f GB/s\n", name, int(ms_all.size()), 1e3 * ms, moved / ms / 1e6);
    if (trace_blocks > 0) {
      const char* names[kEvents] = {"entry", "requested", "row 0 landed", "row 1 landed",
                                    "row 2 landed", "row 3 landed", "rows done", "stored"};
      printf("  ns after the first warp's entry (min / p10 / median / p90 / max over warps; medians over launches)\n");
      for (int e = 0; e < kEvents; ++e) {
        if (median(pct[e * 5 + 4]) < 0) continue;
        printf("  %-14s", names[e]);
        for (int q = 0; q < 5; ++q) printf(" %7.0f", median(pct[e * 5 + q]));
        printf("\n");
      }
      if (!tails[0].empty())
        printf("  per block (median / max over blocks): its last row landed → its rows done %.0f / %.0f ns, "
               "rows done → bias gradient stored %.0f / %.0f ns\n",
               median(tails[0]), median(tails[1]), median(tails[2]), median(tails[3]));
    }
    return ms;
  };

  const int blocks = int((cols + kVec * BiasBwdOnePass::kColThreads - 1) / (kVec * BiasBwdOnePass::kColThreads));
  printf("%s %lld x %lld: one-pass backward %d blocks x %d threads, %d ring slots, %zu B shared memory\n",
         dtype_name, (long long)rows, (long long)cols, blocks, kBlockThreads, kStages, kSmem);
  const float copy_ms = measure("same-bytes copy", [&] { CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice)); }, 0, 0);
  const int64_t packs = n / kVec;
  const int add_blocks = int((packs + 255) / 256);
  const float add_ms = measure("add 2r1w (traced)", [&] { add_2r1w<T><<<add_blocks, 256>>>(x, g, dx, packs); },
                               std::min(add_blocks, kMaxBlocks), 8);
  const float ours_ms = measure("one-pass backward (traced)", [&] { kernel<<<blocks, kBlockThreads, kSmem>>>(args); },
                                blocks, kBlockThreads / 32);
  printf("one-pass backward: %.3f of the copy, %.3f of the add (the add: %.3f of the copy; first %d of its %d blocks traced)\n",
         copy_ms / ours_ms, add_ms / ours_ms, copy_ms / add_ms, std::min(add_blocks, kMaxBlocks), add_blocks);
  std::vector<int> per_sm(1024, 0);
  int max_sm = 0;
  for (int b = 0; b < blocks; ++b) {
    per_sm[smid[b]]++;
    max_sm = std::max(max_sm, int(smid[b]));
  }
  int hist[8] = {};
  for (int sm = 0; sm <= max_sm; ++sm) hist[std::min(per_sm[sm], 7)]++;
  printf("one-pass blocks per SM (last launch): ");
  for (int k = 0; k < 8; ++k)
    if (hist[k]) printf("%d SMs with %d  ", hist[k], k);
  printf("\n");
  return 0;
}

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? atoll(argv[1]) : 256;
  const char* dtype = argc > 2 ? argv[2] : "bf16";
  if (strcmp(dtype, "fp32") == 0) return run<float>(rows, 16384, dtype);
  if (strcmp(dtype, "fp16") == 0) return run<__half>(rows, 16384, dtype);
  return run<__nv_bfloat16>(rows, 16384, "bf16");
}
