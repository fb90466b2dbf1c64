// A probe for the decode kernel (a debugging tool, not part of the build or the tests; run by
// probe_decode.sh): flash_decode.cu compiled into this one file, launched without torch at GQA
// 32/8, D = 128 (or the fifth argument's head dim), every sequence at the full length, each launch
// after a 256 MB memset as do_bench's L2 flush. Built as is, it prints per shape the median time of
// 50 launches. Built with PROBE_TRACE (against the copy with per-block marks that decode_trace.py
// writes; the marks change the kernel's code, so that build is not timed), it prints, from one
// traced launch, when the blocks start, get their first tile, finish their keys and exit
// (globaltimer, ns from the first block's start), every block's times written to $PROBE_TRACE_CSV
// where that is set. A sixth argument above 0 pages the caches: pages of that many tokens, the
// table a shuffled permutation of them (as bench_decode's paged section).
//
//   probe_decode BATCH SEQLEN [SPLITS (0: the heuristic's)] [fp16|bf16] [64|128|256] [PAGE_SIZE]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#ifdef PROBE_TRACE
#include "flash_decode_traced.cu"
#else
#include "flash_decode.cu"
#endif
#include "probe_common.h"

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("%s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s BATCH SEQLEN [SPLITS] [fp16|bf16] [HEAD_DIM] [PAGE_SIZE]\n", argv[0]);
    return 1;
  }
  using namespace flashext;
  const int batch = atoi(argv[1]), seqlen = atoi(argv[2]);
  const int heads = 32, heads_kv = 8, d = argc > 5 ? atoi(argv[5]) : 128;
  int sm_count = 0;
  check(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0), "sm count");
  const int page_size = argc > 6 ? std::max(atoi(argv[6]), 0) : 0;
  const int pages_per_seq = page_size > 0 ? (seqlen + page_size - 1) / page_size : 0;
  int splits = argc > 3 ? atoi(argv[3]) : 0;
  if (splits <= 0) splits = flash_decode_num_splits(batch, heads, heads_kv, 1, seqlen, d, sm_count, page_size > 0);
  const bool fp16 = argc > 4 && std::strcmp(argv[4], "fp16") == 0;

  const size_t cache_elems = size_t(batch) * seqlen * heads_kv * d, q_elems = size_t(batch) * heads * d;
  const size_t alloc_elems = page_size > 0 ? size_t(batch) * pages_per_seq * page_size * heads_kv * d : cache_elems;
  void *k, *v, *q, *o, *flush, *workspace = nullptr;
  int32_t* lens;
  check(cudaMalloc(&k, alloc_elems * 2), "k");
  check(cudaMalloc(&v, alloc_elems * 2), "v");
  check(cudaMalloc(&q, q_elems * 2), "q");
  check(cudaMalloc(&o, q_elems * 2), "o");
  check(cudaMalloc(&lens, batch * 4), "lens");
  const size_t flush_bytes = size_t(256) << 20;
  check(cudaMalloc(&flush, flush_bytes), "flush");
  check(cudaMemset(k, 0x3c, alloc_elems * 2), "k");  // (every element 0x3c3c: fast at any size)
  check(cudaMemset(v, 0x3b, alloc_elems * 2), "v");
  probe::fill_random_bf16({q}, q_elems);  // (as fp16 too: finite values of moderate size)
  std::vector<int32_t> host_lens(batch, seqlen);
  check(cudaMemcpy(lens, host_lens.data(), batch * 4, cudaMemcpyHostToDevice), "lens");

  FlashDecodeParams p;
  p.q = q, p.o = o;
  p.q_batch_stride = p.o_batch_stride = int64_t(heads) * d;
  p.q_row_stride = p.o_row_stride = int64_t(heads) * d;
  p.q_head_stride = p.o_head_stride = d;
  p.k_cache = k, p.v_cache = v;
  p.k_page_stride = p.v_page_stride = int64_t(seqlen) * heads_kv * d;
  p.k_row_stride = p.v_row_stride = int64_t(heads_kv) * d;
  p.k_head_stride = p.v_head_stride = d;
  p.cache_seqlens = lens;
  int32_t* table = nullptr;
  if (page_size > 0) {
    std::vector<int32_t> host_table(size_t(batch) * pages_per_seq);
    std::iota(host_table.begin(), host_table.end(), 0);
    std::shuffle(host_table.begin(), host_table.end(), std::mt19937(0));
    check(cudaMalloc(&table, host_table.size() * 4), "table");
    check(cudaMemcpy(table, host_table.data(), host_table.size() * 4, cudaMemcpyHostToDevice), "table");
    p.block_table = table;
    p.block_table_stride = pages_per_seq;
    p.num_pages = int(host_table.size());
    p.page_size = page_size;
    p.k_page_stride = p.v_page_stride = int64_t(page_size) * heads_kv * d;
  }
  p.capacity = page_size > 0 ? pages_per_seq * page_size : seqlen;
  p.batch = batch, p.heads = heads, p.heads_kv = heads_kv, p.head_dim = d, p.seqlen_q = 1;
  p.softmax_scale = 1.0f / std::sqrt(float(d));
  p.num_splits = splits;
  p.dtype = fp16 ? DType::kFloat16 : DType::kBFloat16;
  const size_t ws = flash_decode_workspace_bytes(p);
  if (ws > 0) check(cudaMalloc(&workspace, ws), "workspace");

  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> times;
#ifdef PROBE_TRACE
  const int reps = 10;  // (warm-up only: this build is not timed)
#else
  const int reps = 60;
#endif
  for (int rep = 0; rep < reps; ++rep) {
    check(cudaMemsetAsync(flush, rep & 0xff, flush_bytes), "memset");
    cudaEventRecord(start);
    check(run_flash_decode(p, workspace, nullptr), "launch");
    cudaEventRecord(stop);
    check(cudaEventSynchronize(stop), "sync");
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    if (rep >= 10) times.push_back(1000.0 * ms);
  }
#ifndef PROBE_TRACE
  const double bytes = 2.0 * double(cache_elems) * 2.0;
  const double us = percentile(times, 0.5);
  const std::string kind = std::string(fp16 ? "fp16" : "bf16") + (page_size > 0 ? "/page" + std::to_string(page_size) : "");
  std::printf("B=%d S=%d D=%d splits=%d %s: %.2f us (p10 %.2f, p90 %.2f), %.0f GB/s\n", batch, seqlen, d,
              splits, kind.c_str(), us, percentile(times, 0.1), percentile(times, 0.9), bytes / us / 1e3);

#else
  // One traced launch: per block (start, first tile in, keys done, exit, smid).
  const int row_blocks = 1;
  const size_t blocks = size_t(row_blocks) * splits * heads_kv * batch;
  unsigned long long* trace;
  check(cudaMalloc(&trace, blocks * 5 * 8), "trace");
  check(cudaMemset(trace, 0, blocks * 5 * 8), "trace");
  check(cudaMemcpyToSymbol(attention_detail::g_decode_trace, &trace, sizeof(trace)), "trace symbol");
  check(cudaMemsetAsync(flush, 1, flush_bytes), "memset");
  cudaEventRecord(start);
  check(run_flash_decode(p, workspace, nullptr), "traced launch");
  cudaEventRecord(stop);
  check(cudaDeviceSynchronize(), "traced sync");
  float traced_ms = 0.0f;
  cudaEventElapsedTime(&traced_ms, start, stop);
  std::vector<unsigned long long> host(blocks * 5);
  check(cudaMemcpy(host.data(), trace, blocks * 5 * 8, cudaMemcpyDeviceToHost), "trace copy");
  unsigned long long t0 = ~0ull, t_end = 0;
  for (size_t i = 0; i < blocks; ++i) t0 = std::min(t0, host[i * 5]), t_end = std::max(t_end, host[i * 5 + 3]);
  std::vector<double> begin, first, done, exit_t, ramp, per_sm(sm_count, 0.0);
  std::vector<int> on_sm(sm_count, 0);
  for (size_t i = 0; i < blocks; ++i) {
    const unsigned long long* b = &host[i * 5];
    begin.push_back(double(b[0] - t0));
    if (b[1] != 0) first.push_back(double(b[1] - t0)), ramp.push_back(double(b[1] - b[0]));  // (0: no keys)
    done.push_back(double(b[2] - t0));
    exit_t.push_back(double(b[3] - t0));
    if (b[4] < unsigned(sm_count)) on_sm[b[4]]++;
  }
  if (const char* path = std::getenv("PROBE_TRACE_CSV")) {  // every block, ns from the first start
    if (FILE* f = std::fopen(path, "w"); f == nullptr) {
      std::printf("cannot write %s\n", path);
    } else {
      std::fprintf(f, "block,start,first,done,exit,smid\n");
      for (size_t i = 0; i < blocks; ++i) {
        const unsigned long long* b = &host[i * 5];
        std::fprintf(f, "%zu,%llu,%llu,%llu,%llu,%llu\n", i, b[0] - t0, b[1] - t0, b[2] - t0, b[3] - t0, b[4]);
      }
      std::fclose(f);
    }
  }
  int sm_hist[8] = {};
  for (int c : on_sm) sm_hist[std::min(c, 7)]++;
  std::printf("  traced launch %.2f us (event), blocks span %.2f us; %zu blocks; SMs with 0/1/2/3/4+ blocks: %d/%d/%d/%d/%d\n",
              1000.0 * traced_ms, double(t_end - t0) / 1e3, blocks, sm_hist[0], sm_hist[1], sm_hist[2], sm_hist[3],
              sm_hist[4] + sm_hist[5] + sm_hist[6] + sm_hist[7]);
  const auto row = [&](const char* name, const std::vector<double>& x) {
    std::printf("  %-22s p0 %8.2f  p10 %8.2f  p50 %8.2f  p90 %8.2f  p100 %8.2f us\n", name, percentile(x, 0.0) / 1e3,
                percentile(x, 0.1) / 1e3, percentile(x, 0.5) / 1e3, percentile(x, 0.9) / 1e3,
                percentile(x, 1.0) / 1e3);
  };
  row("block start", begin);
  row("first tile in", first);
  row("start -> first tile", ramp);
  row("keys done", done);
  row("exit", exit_t);
#endif
  return 0;
}
