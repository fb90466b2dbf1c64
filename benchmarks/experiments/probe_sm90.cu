// The hang probe's launcher (probe_sm90.sh; a debugging tool, not built with the extension): one
// dense bf16 shape of pseudo-random inputs, 20 launches of run_flash_fwd_sm90, then "OK" with the
// time per launch and a hash of O and the lse (equal hashes: bitwise-equal outputs, to compare a
// patched kernel with the tested one), an error, or "HANG" when they have not finished after 8 s
// (exit status 0, 2 and 3). Built with -DFLASHEXT_PROBE_TIMELINE against the timeline patch
// (timeline_sm90.sh), it then traces one more launch and writes the trace to $PROBE_TIMELINE_OUT.
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <vector>
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
  {  // bf16 values in about [-2, 2): sign, exponent 126-127, random mantissa
    std::vector<uint16_t> host(n);
    uint32_t state = 12345u;
    for (void* buffer : {q, k, v}) {
      for (auto& h : host) {
        state = state * 1664525u + 1013904223u;
        h = uint16_t(((state >> 16) & 0x807f) | (((state >> 8) & 1) ? 0x3f80 : 0x3f00));
      }
      cudaMemcpy(buffer, host.data(), n * 2, cudaMemcpyHostToDevice);
    }
  }
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
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int rep = 0; rep < 20; ++rep) {
    if (rep == 5) cudaEventRecord(start);
    const cudaError_t e = flashext::run_flash_fwd_sm90(p, nullptr);
    if (e != cudaSuccess) {
      std::printf("D=%d causal=%d B=%d S=%d H=%d launch error: %s\n", d, causal, b, s, h, cudaGetErrorString(e));
      return 2;
    }
  }
  cudaEventRecord(stop);
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
  if (e != cudaSuccess) {
    std::printf("D=%d causal=%d B=%d S=%d H=%d %s\n", d, causal, b, s, h, cudaGetErrorString(e));
    return 2;
  }
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, start, stop);
  std::vector<unsigned char> out(n * 2 + size_t(b) * h * s * 4);
  cudaMemcpy(out.data(), o, n * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(out.data() + n * 2, lse, size_t(b) * h * s * 4, cudaMemcpyDeviceToHost);
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : out) hash = (hash ^ c) * 1099511628211ull;
  const double flops = 4.0 * b * h * double(s) * s * d / (causal ? 2 : 1);
  std::printf("D=%d causal=%d B=%d S=%d H=%d OK %.1f us %.0f TFLOP/s hash %016llx\n", d, causal, b, s, h,
              1000.0 * ms / 15, flops * 15 / (ms * 1e9), (unsigned long long)hash);
#ifdef FLASHEXT_PROBE_TIMELINE
  if (const char* path = std::getenv("PROBE_TIMELINE_OUT")) {
    // 8 CTAs × 4 warpgroups × 8192 slots of (clock64 << 8 | event), then the SM clock in kHz
    const size_t slots = size_t(8) * 4 * 8192;
    unsigned long long* trace;
    cudaMalloc(&trace, slots * 8);
    cudaMemset(trace, 0, slots * 8);
    flashext::flash_fwd_sm90_set_timeline(trace);
    flashext::run_flash_fwd_sm90(p, nullptr);
    cudaDeviceSynchronize();
    flashext::flash_fwd_sm90_set_timeline(nullptr);
    std::vector<unsigned long long> host(slots + 1);
    cudaMemcpy(host.data(), trace, slots * 8, cudaMemcpyDeviceToHost);
    int khz = 0;
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    host[slots] = (unsigned long long)khz;
    if (FILE* f = std::fopen(path, "wb")) {
      std::fwrite(host.data(), 8, host.size(), f);
      std::fclose(f);
    }
    std::printf("timeline: %s (%s)\n", path, cudaGetErrorString(cudaGetLastError()));
  }
#endif
  return 0;
}
