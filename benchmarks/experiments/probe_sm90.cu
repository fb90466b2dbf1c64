// The Hopper forward's probe (probe_sm90.sh; a debugging tool, not built with the extension): one
// dense bf16 shape of pseudo-random inputs, 20 launches of run_flash_fwd_sm90, then "OK" with the
// time per launch and a hash of O and the lse (equal hashes: bitwise-equal outputs, to compare a
// patched kernel with the tested one), an error, or "HANG" when they have not finished after 8 s
// (exit status 0, 2 and 3). Built with -DFLASHEXT_PROBE_TIMELINE against sm90_fwd_timeline.patch
// (probe_sm90.sh, PROBE_TIMELINE=1), it then traces one more launch into $PROBE_TIMELINE_OUT.
#include <cstdio>
#include <cstdlib>

#include "attention/flash_fwd_sm90.h"
#include "flashext/attention.h"
#include "probe_common.h"

int main(int argc, char** argv) {
  const probe::Shape given = probe::parse_shape(argc, argv, "64, 128, 256");
  const int d = given.d, causal = given.causal, b = given.b, s = given.s, h = given.h;
  const char* shape = given.text;
  const size_t n = size_t(b) * s * h * d, lse_bytes = size_t(b) * h * s * 4;
  void *q, *k, *v, *o;
  float* lse;
  for (void** buffer : {&q, &k, &v, &o}) cudaMalloc(buffer, n * 2);
  cudaMalloc(&lse, lse_bytes);
  probe::fill_random_bf16({q, k, v}, n);
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
  const auto launch = [&] { return flashext::run_flash_fwd_sm90(p, nullptr); };
  const float ms = probe::timed_launches(shape, launch);
  const double flops = 4.0 * b * h * double(s) * s * d / (causal ? 2 : 1);
  std::printf("%s OK %.1f us %.0f TFLOP/s hash %016llx %016llx\n", shape, 1000.0 * ms, flops / (ms * 1e9),
              (unsigned long long)probe::hash(o, n * 2), (unsigned long long)probe::hash(lse, lse_bytes));
#ifdef FLASHEXT_PROBE_TIMELINE
  probe::dump_timeline(flashext::flash_fwd_sm90_set_timeline, launch);
#endif
  return 0;
}
