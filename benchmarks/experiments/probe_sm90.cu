// The hang probe's launcher (probe_sm90.sh; a debugging tool, not built with the extension): one shape, 20 launches of
// run_flash_fwd_sm90, then OK, or HANG after 8 s (and, with -DPROBE_TRACE, the stuck CTAs' last waits).
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include "attention/flash_fwd_sm90.h"
#include "flashext/attention.h"
#ifdef PROBE_TRACE
namespace flashext { void* flash_fwd_sm90_probe_trace(); }
// Pinned host memory and a stream of its own, made before the launches (allocations may wait for
// the device), so the copy of a hung launch's trace runs beside it.
static int* host = nullptr;
static cudaStream_t s2;
static void prepare_trace() {
  cudaMallocHost(&host, 1024 * 4 * 8 * sizeof(int));
  cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  cudaMemsetAsync(flashext::flash_fwd_sm90_probe_trace(), 0, 1024 * 4 * 8 * sizeof(int), s2);
  cudaStreamSynchronize(s2);
}
static void dump_trace() {
  cudaMemcpyAsync(host, flashext::flash_fwd_sm90_probe_trace(), 1024 * 4 * 8 * sizeof(int), cudaMemcpyDeviceToHost, s2);
  cudaStreamSynchronize(s2);
  int shown = 0;
  for (int b = 0; b < 132; ++b) {
    bool stuck = false;
    for (int r = 0; r < 4; ++r) stuck |= host[(b * 4 + r) * 8] != 99 && host[(b * 4 + r) * 8 + 5] > 0;
    if (!stuck || shown++ > 12) continue;
    for (int r = 0; r < 4; ++r) {
      const int* x = host + (b * 4 + r) * 8;
      printf("cta %3d role %d: site %2d t %6d use %5d bar %2d parity %d waits %d\n", b, r, x[0], x[1], x[2], x[3], x[4], x[5]);
    }
  }
  fflush(stdout);
}
#else
static void prepare_trace() {}
static void dump_trace() {}
#endif
int main(int argc, char** argv) {
  const int d = atoi(argv[1]), causal = atoi(argv[2]), b = atoi(argv[3]), s = atoi(argv[4]), h = atoi(argv[5]);
  const size_t n = size_t(b) * s * h * d;
  void *q, *k, *v, *o; float* lse;
  cudaMalloc(&q, n * 2); cudaMalloc(&k, n * 2); cudaMalloc(&v, n * 2); cudaMalloc(&o, n * 2);
  cudaMalloc(&lse, size_t(b) * h * s * 4);
  cudaMemset(q, 0x3a, n * 2); cudaMemset(k, 0x39, n * 2); cudaMemset(v, 0x3b, n * 2);
  flashext::FlashFwdParams p;
  p.q = q; p.k = k; p.v = v; p.o = o; p.lse = lse;
  p.q_row_stride = int64_t(h) * d; p.q_head_stride = d; p.q_batch_stride = int64_t(s) * p.q_row_stride;
  p.k_row_stride = p.q_row_stride; p.k_head_stride = d; p.k_batch_stride = p.q_batch_stride;
  p.v_row_stride = p.q_row_stride; p.v_head_stride = d; p.v_batch_stride = p.q_batch_stride;
  p.o_row_stride = p.q_row_stride; p.o_head_stride = d; p.o_batch_stride = p.q_batch_stride;
  p.lse_head_stride = s; p.lse_batch_stride = int64_t(h) * s;
  p.batch = b; p.heads = h; p.heads_kv = h; p.head_dim = d; p.seqlen_q = s; p.seqlen_k = s;
  p.softmax_scale = 0.125f; p.window_left = -1; p.window_right = causal ? 0 : -1;
  p.dtype = flashext::DType::kBFloat16;
  prepare_trace();
  for (int rep = 0; rep < 20; ++rep) {
    const cudaError_t e = flashext::run_flash_fwd_sm90(p, nullptr);
    if (e != cudaSuccess) { printf("launch error %s\n", cudaGetErrorString(e)); return 2; }
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (cudaStreamQuery(nullptr) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(8)) {
      printf("D=%d causal=%d B=%d S=%d H=%d HANG\n", d, causal, b, s, h); fflush(stdout);
      dump_trace();
      _Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  printf("D=%d causal=%d B=%d S=%d H=%d %s\n", d, causal, b, s, h, cudaGetErrorString(cudaGetLastError()));
  return 0;
}
