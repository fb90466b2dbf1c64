// The hang probe's launcher (probe_sm90.sh; a debugging tool, not built with the extension): one
// dense bf16 shape, 20 launches of run_flash_fwd_sm90, then "OK", an error, or "HANG" when they
// have not finished after 8 s (exit status 0, 2 and 3).
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include "attention/flash_fwd_sm90.h"
#include "flashext/attention.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s HEAD_DIM CAUSAL BATCH SEQLEN HEADS\n", argv[0]);
    return 1;
  }
  const int d = atoi(argv[1]), causal = atoi(argv[2]), b = atoi(argv[3]), s = atoi(argv[4]), h = atoi(argv[5]);
  const size_t n = size_t(b) * s * h * d;
  void *q, *k, *v, *o;
  float* lse;
  cudaMalloc(&q, n * 2);
  cudaMalloc(&k, n * 2);
  cudaMalloc(&v, n * 2);
  cudaMalloc(&o, n * 2);
  cudaMalloc(&lse, size_t(b) * h * s * 4);
  cudaMemset(q, 0x3a, n * 2);
  cudaMemset(k, 0x39, n * 2);
  cudaMemset(v, 0x3b, n * 2);
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
  for (int rep = 0; rep < 20; ++rep) {
    const cudaError_t e = flashext::run_flash_fwd_sm90(p, nullptr);
    if (e != cudaSuccess) {
      std::printf("D=%d causal=%d B=%d S=%d H=%d launch error: %s\n", d, causal, b, s, h, cudaGetErrorString(e));
      return 2;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (cudaStreamQuery(nullptr) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(8)) {
      std::printf("D=%d causal=%d B=%d S=%d H=%d HANG\n", d, causal, b, s, h);
      std::fflush(stdout);
      std::_Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const cudaError_t e = cudaGetLastError();
  std::printf("D=%d causal=%d B=%d S=%d H=%d %s\n", d, causal, b, s, h, e == cudaSuccess ? "OK" : cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 2;
}
