// The Hopper backward's probe (probe_sm90.sh with PROBE_BWD=1; a debugging tool, not built with the
// extension): one dense bf16 shape of pseudo-random inputs at D = 128, the Hopper forward for O and
// the lse, then 20 launches of run_flash_bwd_sm90, and "OK" with the time per launch and hashes of
// dK, dV and of dQ (equal hashes: bitwise-equal outputs; dQ's, added by fp32 reductions in
// whatever order the CTAs reach them, may differ run to run), an error, or "HANG" after 8 s (exit
// status 0, 2 and 3). Built with -DFLASHEXT_PROBE_TIMELINE against sm90_bwd_timeline.patch
// (PROBE_TIMELINE=1), it then traces one more launch into $PROBE_TIMELINE_OUT.
#include <cstdio>
#include <cstdlib>

#include "attention/flash_bwd_sm90.h"
#include "attention/flash_fwd_sm90.h"
#include "flashext/attention.h"
#include "probe_common.h"

int main(int argc, char** argv) {
  const probe::Shape given = probe::parse_shape(argc, argv, "128");
  const int d = given.d, causal = given.causal, b = given.b, s = given.s, h = given.h;
  const char* shape = given.text;
  const size_t n = size_t(b) * s * h * d;
  void *q, *k, *v, *o, *dout, *dq, *dk, *dv, *workspace;
  float* lse;
  for (void** buffer : {&q, &k, &v, &o, &dout, &dq, &dk, &dv}) cudaMalloc(buffer, n * 2);
  cudaMalloc(&lse, size_t(b) * h * s * 4);
  // the workspace: dq_accum (fp32, every row padded to whole 64-row blocks), two stats rows per
  // (batch, head, row) and counters, with room to spare
  cudaMalloc(&workspace, size_t(b) * h * (s + 64) * (d * 4 + 8) + (size_t(64) << 20));
  probe::fill_random_bf16({q, k, v, dout}, n);
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
  const cudaError_t e = flashext::run_flash_fwd_sm90(p, nullptr);
  if (e != cudaSuccess) {
    std::printf("%s forward: %s\n", shape, cudaGetErrorString(e));
    return 2;
  }
  const auto launch = [&] { return flashext::run_flash_bwd_sm90(p, workspace, nullptr); };
  const float ms = probe::timed_launches(shape, launch);
  const double flops = 2.5 * 4.0 * b * h * double(s) * s * d / (causal ? 2 : 1);
  std::printf("%s OK %.1f us %.0f TFLOP/s hash dK dV %016llx %016llx dQ %016llx\n", shape, 1000.0 * ms,
              flops / (ms * 1e9), (unsigned long long)probe::hash(dk, n * 2), (unsigned long long)probe::hash(dv, n * 2),
              (unsigned long long)probe::hash(dq, n * 2));
#ifdef FLASHEXT_PROBE_TIMELINE
  probe::dump_timeline(flashext::flash_bwd_sm90_set_timeline, launch);
#endif
  return 0;
}
