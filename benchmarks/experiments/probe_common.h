// What probe_sm90.cu and probe_sm90_bwd.cu share (debugging tools, not built with the extension):
// pseudo-random bf16 inputs, the timed launches under a watchdog, a hash of the outputs, and the
// trace dump of a build against a timeline patch (probe_sm90.sh, PROBE_TIMELINE=1).
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <thread>
#include <vector>

#include "flashext/attention.h"

namespace probe {

// The shape both probes take, "HEAD_DIM CAUSAL BATCH SEQLEN HEADS" on the command line (the usage
// printed and exit status 1 otherwise), and its text, the start of every line a probe prints.
struct Shape {
  int d, causal, b, s, h;
  char text[96];
};
inline Shape parse_shape(int argc, char** argv, const char* head_dims) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s HEAD_DIM(%s) CAUSAL BATCH SEQLEN HEADS\n", argv[0], head_dims);
    std::exit(1);
  }
  Shape shape{atoi(argv[1]), atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), {}};
  std::snprintf(shape.text, sizeof shape.text, "D=%d causal=%d B=%d S=%d H=%d", shape.d, shape.causal, shape.b,
                shape.s, shape.h);
  return shape;
}

// bf16 values in about [-2, 2) (sign, exponent 126-127, random mantissa), n per buffer, one stream
// of a fixed seed over the buffers in turn
inline void fill_random_bf16(std::initializer_list<void*> buffers, size_t n) {
  std::vector<uint16_t> host(n);
  uint32_t state = 12345u;
  for (void* buffer : buffers) {
    for (auto& x : host) {
      state = state * 1664525u + 1013904223u;
      x = uint16_t(((state >> 16) & 0x807f) | (((state >> 8) & 1) ? 0x3f80 : 0x3f00));
    }
    cudaMemcpy(buffer, host.data(), n * 2, cudaMemcpyHostToDevice);
  }
}

// 20 launches (the last 15 timed), then the milliseconds per launch; on a launch error or a
// stream still busy after 8 s, prints it after `shape` and exits (status 2, 3: HANG).
template <typename Launch>
float timed_launches(const char* shape, Launch launch) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int rep = 0; rep < 20; ++rep) {
    if (rep == 5) cudaEventRecord(start);
    const cudaError_t e = launch();
    if (e != cudaSuccess) {
      std::printf("%s launch error: %s\n", shape, cudaGetErrorString(e));
      std::exit(2);
    }
  }
  cudaEventRecord(stop);
  const auto t0 = std::chrono::steady_clock::now();
  while (cudaStreamQuery(nullptr) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(8)) {
      std::printf("%s HANG\n", shape);
      std::fflush(stdout);
      std::_Exit(3);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::printf("%s %s\n", shape, cudaGetErrorString(e));
    std::exit(2);
  }
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, start, stop);
  return ms / 15;
}

// FNV-1a of `bytes` bytes of device memory
inline uint64_t hash(const void* device, size_t bytes) {
  std::vector<unsigned char> host(bytes);
  cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost);
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : host) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Where $PROBE_TIMELINE_OUT is set: one more launch traced into a zeroed buffer of 8 CTAs × 4
// warpgroups × 8192 slots (set_timeline hands it to the kernel, then nullptr), written there
// with the SM clock in kHz after it (plot_sm90_timeline.py reads it).
template <typename SetTimeline, typename Launch>
void dump_timeline(SetTimeline set_timeline, Launch launch) {
  const char* path = std::getenv("PROBE_TIMELINE_OUT");
  if (path == nullptr) return;
  const size_t slots = size_t(8) * 4 * 8192;
  unsigned long long* trace;
  cudaMalloc(&trace, slots * 8);
  cudaMemset(trace, 0, slots * 8);
  set_timeline(trace);
  launch();
  cudaDeviceSynchronize();
  set_timeline(nullptr);
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

}  // namespace probe

// flash_fwd_sm90.cu hands a call of 2^28 tiles or more to the portable kernel (run_flash_fwd, in
// flash_fwd.cu with the FA2 kernels), which the probes do not build: no probe shape comes near
// that, so here it only reports that it is not there. (Each probe binary includes this header
// from its one .cu file.)
cudaError_t flashext::run_flash_fwd(const FlashFwdParams&, cudaStream_t) { return cudaErrorNotSupported; }
