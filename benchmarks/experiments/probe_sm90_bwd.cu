// The Hopper backward's probe (timeline_sm90.sh with TIMELINE_BWD=1; a debugging tool, not built
// with the extension): one dense bf16 shape of pseudo-random inputs at D = 128, the Hopper forward
// for O and the lse, then 20 launches of run_flash_bwd_sm90, and "OK" with the time per launch and
// hashes of dK, dV and of dQ (equal hashes: bitwise-equal outputs; dQ's may differ run to run), an
// error, or "HANG" after 8 s
// (exit status 0, 2 and 3). Built with -DFLASHEXT_PROBE_TIMELINE against sm90_bwd_timeline.patch,
// it then traces one more launch and writes the trace to $PROBE_TIMELINE_OUT.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "attention/flash_bwd_sm90.h"
#include "attention/flash_fwd_sm90.h"
#include "flashext/attention.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s HEAD_DIM(128) CAUSAL BATCH SEQLEN HEADS\n", argv[0]);
    return 1;
  }
  const int d = atoi(argv[1]), causal = atoi(argv[2]), b = atoi(argv[3]), s = atoi(argv[4]), h = atoi(argv[5]);
  const size_t n = size_t(b) * s * h * d;
  void *q, *k, *v, *o, *dout, *dq, *dk, *dv, *workspace;
  float* lse;
  for (void** buffer : {&q, &k, &v, &o, &dout, &dq, &dk, &dv}) cudaMalloc(buffer, n * 2);
  cudaMalloc(&lse, size_t(b) * h * s * 4);
  // the workspace: dq_accum (fp32, every row padded to whole 64-row blocks), two stats rows per
  // (batch, head, row) and counters, with room to spare
  const size_t workspace_bytes = size_t(b) * h * (s + 64) * d * 4 + size_t(b) * h * (s + 64) * 8 + (size_t(64) << 20);
  cudaMalloc(&workspace, workspace_bytes);
  {  // bf16 values in about [-2, 2): sign, exponent 126-127, random mantissa
    std::vector<uint16_t> host(n);
    uint32_t state = 12345u;
    for (void* buffer : {q, k, v, dout}) {
      for (auto& x : host) {
        state = state * 1664525u + 1013904223u;
        x = uint16_t(((state >> 16) & 0x807f) | (((state >> 8) & 1) ? 0x3f80 : 0x3f00));
      }
      cudaMemcpy(buffer, host.data(), n * 2, cudaMemcpyHostToDevice);
    }
  }
  flashext::FlashBwdParams p;
  p.q = q; p.k = k; p.v = v; p.o = o; p.lse = lse; p.dout = dout; p.dq = dq; p.dk = dk; p.dv = dv;
  const int64_t row = int64_t(h) * d, batch = int64_t(s) * row;
  p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = row;
  p.do_row_stride = p.dq_row_stride = p.dk_row_stride = p.dv_row_stride = row;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = d;
  p.do_head_stride = p.dq_head_stride = p.dk_head_stride = p.dv_head_stride = d;
  p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = batch;
  p.do_batch_stride = p.dq_batch_stride = p.dk_batch_stride = p.dv_batch_stride = batch;
  p.lse_head_stride = s; p.lse_batch_stride = int64_t(h) * s;
  p.batch = b; p.heads = h; p.heads_kv = h; p.head_dim = d; p.seqlen_q = s; p.seqlen_k = s;
  p.softmax_scale = 0.088388f; p.window_left = -1; p.window_right = causal ? 0 : -1;
  p.dtype = flashext::DType::kBFloat16;
  cudaError_t e = flashext::run_flash_fwd_sm90(p, nullptr);
  if (e != cudaSuccess) {
    std::printf("D=%d causal=%d B=%d S=%d H=%d forward: %s\n", d, causal, b, s, h, cudaGetErrorString(e));
    return 2;
  }
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int rep = 0; rep < 20; ++rep) {
    if (rep == 5) cudaEventRecord(start);
    e = flashext::run_flash_bwd_sm90(p, workspace, nullptr);
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
  e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::printf("D=%d causal=%d B=%d S=%d H=%d %s\n", d, causal, b, s, h, cudaGetErrorString(e));
    return 2;
  }
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, start, stop);
  std::vector<unsigned char> out(3 * n * 2);
  cudaMemcpy(out.data(), dq, n * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(out.data() + n * 2, dk, n * 2, cudaMemcpyDeviceToHost);
  cudaMemcpy(out.data() + 2 * n * 2, dv, n * 2, cudaMemcpyDeviceToHost);
  // FNV-1a of dK and dV (bitwise the same run to run), and of dQ (added by fp32 reductions in
  // whatever order the CTAs reach them: it may differ between runs)
  uint64_t hash_kv = 1469598103934665603ull, hash_q = hash_kv;
  for (size_t i = 0; i < out.size(); ++i) {
    uint64_t& hash = i < n * 2 ? hash_q : hash_kv;
    hash = (hash ^ out[i]) * 1099511628211ull;
  }
  const double flops = 2.5 * 4.0 * b * h * double(s) * s * d / (causal ? 2 : 1);
  std::printf("D=%d causal=%d B=%d S=%d H=%d OK %.1f us %.0f TFLOP/s hash dK dV %016llx dQ %016llx\n", d, causal, b, s, h,
              1000.0 * ms / 15, flops * 15 / (ms * 1e9), (unsigned long long)hash_kv, (unsigned long long)hash_q);
#ifdef FLASHEXT_PROBE_TIMELINE
  if (const char* path = std::getenv("PROBE_TIMELINE_OUT")) {
    const size_t slots = size_t(8) * 4 * 8192;
    unsigned long long* trace;
    cudaMalloc(&trace, slots * 8);
    cudaMemset(trace, 0, slots * 8);
    flashext::flash_bwd_sm90_set_timeline(trace);
    flashext::run_flash_bwd_sm90(p, workspace, nullptr);
    cudaDeviceSynchronize();
    flashext::flash_bwd_sm90_set_timeline(nullptr);
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
