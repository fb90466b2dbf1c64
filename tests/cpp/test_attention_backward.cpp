// flashext FlashAttention backward from C++ (flashext/attention.h): the kernels' dq, dk, dv against
// a double-precision CPU reference on small shapes (dense, GQA, causal, windows, softcap, varlen),
// the deterministic mode's bitwise repeatability, and the parameter checks. GPU tests GTEST_SKIP()
// when no CUDA device is present.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common.h"
#include "flashext/attention.h"
#include "attention/flash_bwd_sm90.h"

namespace {

using flashext_test::DeviceBuffer;
using flashext_test::to_float;

struct Case {
  int batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.0f;
  std::vector<int> varlen_q, varlen_k;  // non-empty: packed ragged batch with these lengths
  int max_smem = 0;  // the shared memory the kernels may use per block (0: the device's)
  bool sm90 = false;  // the Hopper backward (flash_bwd_sm90.h) instead of run_flash_bwd
};

// dq (sq, H, D), dk and dv (sk, Hkv, D) of one sequence, in double, from its probabilities.
void reference(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
               const std::vector<float>& dout, int sq, int sk, const Case& c, double scale, std::vector<double>& dq,
               std::vector<double>& dk, std::vector<double>& dv) {
  const int group = c.heads / c.heads_kv, d = c.head_dim, right = c.causal ? 0 : c.window_right;
  dq.assign(size_t(sq) * c.heads * d, 0.0);
  dk.assign(size_t(sk) * c.heads_kv * d, 0.0);
  dv.assign(size_t(sk) * c.heads_kv * d, 0.0);
  const auto at = [d](int row, int heads, int h, int e) { return (size_t(row) * heads + h) * d + e; };
  for (int h = 0; h < c.heads; ++h) {
    const int hk = h / group;
    for (int i = 0; i < sq; ++i) {
      std::vector<double> raw(sk, 0.0), s(sk, -INFINITY), p(sk, 0.0), dp(sk, 0.0);
      double m = -INFINITY;
      for (int j = 0; j < sk; ++j) {
        const int diag = i + sk - sq;
        if ((c.window_left >= 0 && j < diag - c.window_left) || (right >= 0 && j > diag + right)) continue;
        double dot = 0;
        for (int e = 0; e < d; ++e) dot += double(q[at(i, c.heads, h, e)]) * k[at(j, c.heads_kv, hk, e)];
        raw[j] = dot * scale;
        s[j] = c.softcap > 0 ? c.softcap * std::tanh(raw[j] / c.softcap) : raw[j];
        m = std::max(m, s[j]);
      }
      if (m == -INFINITY) continue;  // sees no key: every gradient of this row is 0
      double l = 0;
      for (int j = 0; j < sk; ++j) l += std::exp(s[j] - m);
      double rowsum = 0;  // Σ_j P_ij dP_ij = rowsum(dO ∘ O)
      for (int j = 0; j < sk; ++j) {
        p[j] = std::exp(s[j] - m) / l;
        for (int e = 0; e < d; ++e) dp[j] += double(dout[at(i, c.heads, h, e)]) * v[at(j, c.heads_kv, hk, e)];
        rowsum += p[j] * dp[j];
      }
      for (int j = 0; j < sk; ++j) {
        if (p[j] == 0) continue;
        double ds = p[j] * (dp[j] - rowsum) * scale;
        if (c.softcap > 0) ds *= 1 - std::pow(std::tanh(raw[j] / c.softcap), 2);
        for (int e = 0; e < d; ++e) {
          dq[at(i, c.heads, h, e)] += ds * k[at(j, c.heads_kv, hk, e)];
          dk[at(j, c.heads_kv, hk, e)] += ds * q[at(i, c.heads, h, e)];
          dv[at(j, c.heads_kv, hk, e)] += p[j] * dout[at(i, c.heads, h, e)];
        }
      }
    }
  }
}

// Device copies of one case's inputs, its forward and a backward into fresh (NaN-poisoned) buffers.
template <typename T>
struct Problem {
  Case c;
  std::vector<int> lq, lk, cu_q, cu_k;
  int total_q = 0, total_k = 0;
  std::vector<T> q, k, v, dout;
  std::unique_ptr<DeviceBuffer> dq_in, dk_in, dv_in, ddout, dout_o, dlse, dcu_q, dcu_k;
  flashext::FlashBwdParams p;

  explicit Problem(const Case& cs)
      : c(cs),
        lq(cs.varlen_q.empty() ? std::vector<int>(cs.batch, cs.seqlen_q) : cs.varlen_q),
        lk(cs.varlen_k.empty() ? std::vector<int>(cs.batch, cs.seqlen_k) : cs.varlen_k),
        cu_q(1, 0),
        cu_k(1, 0) {
    for (size_t b = 0; b < lq.size(); ++b) {
      cu_q.push_back(cu_q.back() + lq[b]);
      cu_k.push_back(cu_k.back() + lk[b]);
    }
    total_q = cu_q.back(), total_k = cu_k.back();
    const int d = c.head_dim;
    std::mt19937 rng(uint32_t(total_q * 131 + total_k * 7 + d + c.heads));
    q = flashext_test::random_values<T>(size_t(total_q) * c.heads * d, rng, 1.0f);
    k = flashext_test::random_values<T>(size_t(total_k) * c.heads_kv * d, rng, 1.0f);
    v = flashext_test::random_values<T>(size_t(total_k) * c.heads_kv * d, rng, 1.0f);
    dout = flashext_test::random_values<T>(q.size(), rng, 1.0f);
    const auto buffer = [](size_t bytes) { return std::make_unique<DeviceBuffer>(bytes); };
    dq_in = buffer(q.size() * sizeof(T) + 16);
    dk_in = buffer(k.size() * sizeof(T) + 16);
    dv_in = buffer(v.size() * sizeof(T) + 16);
    ddout = buffer(q.size() * sizeof(T) + 16);
    dout_o = buffer(q.size() * sizeof(T) + 16);
    dlse = buffer(size_t(c.heads) * total_q * sizeof(float) + 16);
    dcu_q = buffer(cu_q.size() * sizeof(int));
    dcu_k = buffer(cu_k.size() * sizeof(int));
    flashext_test::upload(dq_in->get(), q);
    flashext_test::upload(dk_in->get(), k);
    flashext_test::upload(dv_in->get(), v);
    flashext_test::upload(ddout->get(), dout);
    flashext_test::upload(dcu_q->get(), cu_q);
    flashext_test::upload(dcu_k->get(), cu_k);
    const bool varlen = !c.varlen_q.empty();
    p.q = dq_in->get(); p.k = dk_in->get(); p.v = dv_in->get(); p.o = dout_o->get(); p.lse = dlse->at<float>();
    p.dout = ddout->get();
    p.q_row_stride = int64_t(c.heads) * d; p.q_head_stride = d; p.q_batch_stride = int64_t(c.seqlen_q) * p.q_row_stride;
    p.k_row_stride = int64_t(c.heads_kv) * d; p.k_head_stride = d; p.k_batch_stride = int64_t(c.seqlen_k) * p.k_row_stride;
    p.v_row_stride = p.k_row_stride; p.v_head_stride = d; p.v_batch_stride = p.k_batch_stride;
    p.o_row_stride = p.do_row_stride = p.dq_row_stride = p.q_row_stride;
    p.o_head_stride = p.do_head_stride = p.dq_head_stride = d;
    p.o_batch_stride = p.do_batch_stride = p.dq_batch_stride = p.q_batch_stride;
    p.dk_row_stride = p.dv_row_stride = p.k_row_stride;
    p.dk_head_stride = p.dv_head_stride = d;
    p.dk_batch_stride = p.dv_batch_stride = p.k_batch_stride;
    p.lse_head_stride = varlen ? total_q : c.seqlen_q;
    p.lse_batch_stride = int64_t(c.heads) * c.seqlen_q;
    if (varlen) {
      p.cu_seqlens_q = dcu_q->at<int>();
      p.cu_seqlens_k = dcu_k->at<int>();
      p.total_q = total_q;
      p.total_k = total_k;
    }
    p.batch = int(lq.size()); p.heads = c.heads; p.heads_kv = c.heads_kv; p.head_dim = d;
    p.seqlen_q = varlen ? *std::max_element(lq.begin(), lq.end()) : c.seqlen_q;
    p.seqlen_k = varlen ? *std::max_element(lk.begin(), lk.end()) : c.seqlen_k;
    p.softmax_scale = 1.0f / std::sqrt(float(d));
    p.softcap = c.softcap;
    p.window_left = c.window_left;
    p.window_right = c.causal ? 0 : c.window_right;
    p.dtype = flashext_test::dtype_of<T>();
    p.max_smem_per_block = c.max_smem;
  }

  // Runs the forward then the backward; returns dq, dk, dv as downloaded (zeroed first, since rows
  // no varlen sequence covers are the caller's).
  void run(bool deterministic, std::vector<T>& dq, std::vector<T>& dk, std::vector<T>& dv) {
    FX_ASSERT_CUDA(flashext::run_flash_fwd(p, nullptr));
    DeviceBuffer gq(q.size() * sizeof(T) + 16), gk(k.size() * sizeof(T) + 16), gv(v.size() * sizeof(T) + 16);
    FX_ASSERT_CUDA(cudaMemset(gq.get(), 0, q.size() * sizeof(T)));
    FX_ASSERT_CUDA(cudaMemset(gk.get(), 0, k.size() * sizeof(T)));
    FX_ASSERT_CUDA(cudaMemset(gv.get(), 0, v.size() * sizeof(T)));
    flashext::FlashBwdParams b = p;
    b.dq = gq.get(); b.dk = gk.get(); b.dv = gv.get();
    b.deterministic = deterministic;
    const size_t bytes = flashext::flash_bwd_workspace_bytes(b);
    DeviceBuffer workspace(bytes);  // poisoned: the backward must not rely on its contents
    if (c.sm90) {
      ASSERT_TRUE(flashext::flash_bwd_sm90_takes(b));
      FX_ASSERT_CUDA(flashext::run_flash_bwd_sm90(b, workspace.get(), nullptr));
    } else {
      FX_ASSERT_CUDA(flashext::run_flash_bwd(b, workspace.get(), nullptr));
    }
    FX_ASSERT_CUDA(cudaDeviceSynchronize());
    dq = flashext_test::download<T>(gq.get(), q.size());
    dk = flashext_test::download<T>(gk.get(), k.size());
    dv = flashext_test::download<T>(gv.get(), v.size());
  }
};

// max |got − want| / max(1, max |want|) over want.size() values of got from `offset` on.
template <typename T>
double relative_error(const std::vector<T>& got, const std::vector<double>& want, size_t offset) {
  double err = 0, scale = 1;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = to_float(got[offset + i]);
    if (!std::isfinite(g)) return INFINITY;
    err = std::max(err, std::abs(g - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

template <typename T>
void run_case(const Case& c, bool deterministic = false) {
  SCOPED_TRACE("B=" + std::to_string(c.batch) + " Sq=" + std::to_string(c.seqlen_q) + " Sk=" + std::to_string(c.seqlen_k) +
               " H=" + std::to_string(c.heads) + "/" + std::to_string(c.heads_kv) + " D=" + std::to_string(c.head_dim) +
               " causal=" + std::to_string(c.causal) + " varlen=" + std::to_string(!c.varlen_q.empty()) +
               " smem=" + std::to_string(c.max_smem) + " deterministic=" + std::to_string(deterministic));
  Problem<T> prob(c);
  std::vector<T> dq, dk, dv;
  prob.run(deterministic, dq, dk, dv);
  const int d = c.head_dim;
  // 16-bit P, dS and inputs: a few units of the dtype's precision against sums of O(1) terms.
  const double tol = std::is_same_v<T, __half> ? 1e-2 : 5e-2;
  for (size_t b = 0; b < prob.lq.size(); ++b) {
    const size_t q0 = size_t(prob.cu_q[b]) * c.heads * d, q1 = size_t(prob.cu_q[b + 1]) * c.heads * d;
    const size_t k0 = size_t(prob.cu_k[b]) * c.heads_kv * d, k1 = size_t(prob.cu_k[b + 1]) * c.heads_kv * d;
    std::vector<float> qf, kf, vf, df;
    for (size_t i = q0; i < q1; ++i) {
      qf.push_back(to_float(prob.q[i]));
      df.push_back(to_float(prob.dout[i]));
    }
    for (size_t i = k0; i < k1; ++i) {
      kf.push_back(to_float(prob.k[i]));
      vf.push_back(to_float(prob.v[i]));
    }
    std::vector<double> want_dq, want_dk, want_dv;
    reference(qf, kf, vf, df, prob.lq[b], prob.lk[b], c, prob.p.softmax_scale, want_dq, want_dk, want_dv);
    EXPECT_LE(relative_error(dq, want_dq, q0), tol) << "dq, sequence " << b;
    EXPECT_LE(relative_error(dk, want_dk, k0), tol) << "dk, sequence " << b;
    EXPECT_LE(relative_error(dv, want_dv, k0), tol) << "dv, sequence " << b;
  }
}

template <typename T>
class FlashBwdKernel : public ::testing::Test {};
using Types = ::testing::Types<__half, __nv_bfloat16>;
TYPED_TEST_SUITE(FlashBwdKernel, Types);

TYPED_TEST(FlashBwdKernel, AgainstCpuReference) {
  FX_SKIP_WITHOUT_GPU();
  run_case<TypeParam>({2, 37, 53, 4, 2, 64});
  run_case<TypeParam>({1, 150, 217, 2, 1, 128, /*causal=*/true});
  run_case<TypeParam>({2, 65, 65, 2, 2, 80, false, 8, 0});  // head dim 80 served by 128; window
  run_case<TypeParam>({1, 40, 33, 2, 2, 256, true, -1, -1, /*softcap=*/3.0f});
  run_case<TypeParam>({1, 70, 20, 2, 1, 64, true});  // causal, Sq > Sk: rows 0..49 see no key
  run_case<TypeParam>({1, 1, 300, 4, 2, 128});  // decode-shaped
  run_case<TypeParam>({1, 200, 130, 4, 4, 256, false, 20, 30});
  Case varlen{0, 0, 0, 4, 2, 64, true};
  varlen.varlen_q = {0, 1, 7, 70};
  varlen.varlen_k = {3, 0, 7, 90};
  run_case<TypeParam>(varlen);
}

// The Hopper backward (D = 128 on 64-query steps, D = 64 on 128-query steps; dense or packed varlen,
// any window, soft-cap): only on an sm_90 GPU with a build holding sm_90a code.
TYPED_TEST(FlashBwdKernel, Sm90AgainstCpuReference) {
  FX_SKIP_WITHOUT_GPU();
  FX_SKIP_WITHOUT_SM90();
  for (const int d : {128, 64}) {
    const auto hopper = [](Case c) {
      c.sm90 = true;
      return c;
    };
    const int block_m = d == 64 ? 128 : 64;  // the query rows of a step
    run_case<TypeParam>(hopper({1, block_m, 128, 2, 2, d}));              // one query block, one key block
    run_case<TypeParam>(hopper({2, 300, 257, 4, 2, d}));                  // tails, GQA, several blocks
    run_case<TypeParam>(hopper({1, 257, 513, 4, 1, d, /*causal=*/true}));  // MQA, causal Sq != Sk
    run_case<TypeParam>(hopper({1, 150, 70, 2, 1, d, /*causal=*/true}));   // causal Sq > Sk: rows that see no key
    run_case<TypeParam>(hopper({1, 1, 300, 4, 2, d}));                    // one query row
    run_case<TypeParam>(hopper({1, 200, 600, 2, 2, d, false, 100, 50}));  // windows: key blocks some rows skip
    run_case<TypeParam>(hopper({1, 200, 600, 2, 2, d, false, -1, 50}));   // a right edge alone (the full / causal kernel)
    run_case<TypeParam>(hopper({2, 130, 140, 2, 1, d, true, 7, -1}));     // causal with a left window
    run_case<TypeParam>(hopper({1, 130, 140, 2, 2, d, true, -1, -1, /*softcap=*/5.0f}));
    // Packed varlen: empty and one-row sequences, blocks that reach into the next sequence's rows
    // (odd starts: statistics not 16-byte aligned), causal, full and windowed.
    Case varlen{0, 0, 0, 4, 2, d, /*causal=*/true};
    varlen.varlen_q = {0, 1, 6, 130, 65, 3};  // (starts 0, 0, 1, 7, 137, 202: every shift; 130 rows: a
    varlen.varlen_k = {3, 0, 7, 200, 129, 1};  // whole block then a partial one at either step size)
    run_case<TypeParam>(hopper(varlen));
    varlen.causal = false;
    run_case<TypeParam>(hopper(varlen));
    varlen.window_left = 40, varlen.window_right = 3;
    run_case<TypeParam>(hopper(varlen));
    varlen.window_left = varlen.window_right = -1, varlen.softcap = 5.0f;
    run_case<TypeParam>(hopper(varlen));
    // Key lengths of whole 64-key boxes followed by another sequence: the boxes that end exactly at
    // a sequence's end leave by the TMA store, those reaching past it by the warpgroup's stores.
    Case boxes{0, 0, 0, 2, 1, d, /*causal=*/false};
    boxes.varlen_q = {70, 64, 129, 5};
    boxes.varlen_k = {64, 128, 192, 100};
    run_case<TypeParam>(hopper(boxes));
  }
}

// The tiles other GPUs get, on this one: A100's 163 KiB per block (D = 256 compact) and sm_86/89's
// 99 (D = 64 and 128 compact).
TYPED_TEST(FlashBwdKernel, CompactTilesForLessSharedMemory) {
  FX_SKIP_WITHOUT_GPU();
  Case d64{2, 150, 217, 4, 2, 64, /*causal=*/true};
  d64.max_smem = 99 * 1024;
  run_case<TypeParam>(d64);
  for (int kib : {163, 99}) {
    Case dense{2, 150, 217, 4, 2, 128, /*causal=*/true};
    dense.max_smem = kib * 1024;
    run_case<TypeParam>(dense);
    Case window{1, 200, 130, 4, 4, 128, false, 20, 30};
    window.max_smem = kib * 1024;
    run_case<TypeParam>(window);
  }
  Case d256{1, 140, 170, 2, 1, 256, /*causal=*/true};
  d256.max_smem = 163 * 1024;
  run_case<TypeParam>(d256);
}

// A deterministic backward of case c: right against the CPU reference, and bitwise the same in
// five more runs.
template <typename T = __nv_bfloat16>
void expect_deterministic(const Case& c) {
  SCOPED_TRACE("D=" + std::to_string(c.head_dim) + " Sq=" + std::to_string(c.seqlen_q) + " causal=" +
               std::to_string(c.causal) + " varlen=" + std::to_string(!c.varlen_q.empty()) +
               " smem=" + std::to_string(c.max_smem) + " sm90=" + std::to_string(c.sm90));
  run_case<T>(c, /*deterministic=*/true);
  Problem<T> prob(c);
  std::vector<T> dq0, dk0, dv0, dq, dk, dv;
  prob.run(true, dq0, dk0, dv0);
  for (int i = 0; i < 5; ++i) {
    prob.run(true, dq, dk, dv);
    ASSERT_EQ(std::memcmp(dq.data(), dq0.data(), dq.size() * sizeof(dq[0])), 0) << "run " << i;
    ASSERT_EQ(std::memcmp(dk.data(), dk0.data(), dk.size() * sizeof(dk[0])), 0) << "run " << i;
    ASSERT_EQ(std::memcmp(dv.data(), dv0.data(), dv.size() * sizeof(dv[0])), 0) << "run " << i;
  }
}

// Every query-block size the kernels step by: 64 rows (D = 128, compact D = 64 and 256) and 128
// (D = 64 and 256 on Hopper), whose counters share the workspace's 64-row layout: right against the
// CPU reference, and bitwise the same run after run.
// With a right edge (causal among them) the adds go from the last key block down, the grid started
// in that order: bottom-right causal with Sq > Sk (rows that see no key), a right edge alone, and
// the compact tiles with a right edge.
TEST(FlashBwd, DeterministicIsBitwiseRepeatable) {
  FX_SKIP_WITHOUT_GPU();
  Case compact64{2, 300, 300, 4, 2, 64, /*causal=*/true};
  compact64.max_smem = 99 * 1024;
  Case compact128{1, 300, 420, 2, 1, 128, /*causal=*/true};
  compact128.max_smem = 99 * 1024;
  Case compact256{1, 200, 260, 2, 1, 256};
  compact256.max_smem = 163 * 1024;
  Case compact256_causal{1, 260, 200, 2, 1, 256, /*causal=*/true};
  compact256_causal.max_smem = 163 * 1024;
  for (const Case& c : {Case{2, 300, 300, 4, 2, 128, /*causal=*/true}, Case{2, 300, 300, 4, 2, 64, /*causal=*/true},
                        Case{1, 500, 230, 2, 1, 128, /*causal=*/true}, Case{1, 330, 390, 2, 2, 64, false, -1, 40},
                        compact64, compact128, Case{1, 200, 260, 2, 1, 256}, compact256, compact256_causal}) {
    expect_deterministic(c);
  }
}

// The Hopper backward's deterministic dQ (the tiles added in key block order): right against the
// CPU reference, and bitwise the same run after run, in fp16 (three more mantissa bits of the fp32
// sums survive than in bf16) and bf16; key blocks enough (up to 8) that their order matters, both
// orders (descending with a right edge, ascending without, from the first key block a left window
// lets see the query block), query blocks no key block sees, soft-cap, GQA, varlen.
TEST(FlashBwd, Sm90DeterministicIsBitwiseRepeatable) {
  FX_SKIP_WITHOUT_GPU();
  FX_SKIP_WITHOUT_SM90();
  std::vector<Case> cases;
  for (const int d : {128, 64}) {
    cases.push_back({2, 300, 1000, 4, 2, d});
    cases.push_back({1, 1000, 1000, 2, 1, d, /*causal=*/true});
    cases.push_back({1, 700, 900, 2, 2, d, false, 150, 40});
    cases.push_back({1, 700, 900, 2, 2, d, false, 150, -1});              // a left edge alone
    cases.push_back({1, 900, 300, 2, 1, d, /*causal=*/true});             // Sq > Sk: 600 rows see no key
    cases.push_back({1, 500, 600, 2, 2, d, true, -1, -1, /*softcap=*/5.0f});
    Case varlen{0, 0, 0, 4, 2, d, /*causal=*/true};
    varlen.varlen_q = {5, 600, 130};
    varlen.varlen_k = {9, 700, 200};
    cases.push_back(varlen);
  }
  for (Case& c : cases) {
    c.sm90 = true;
    expect_deterministic<__half>(c);
    expect_deterministic<__nv_bfloat16>(c);
  }
}

TEST(FlashBwd, ParamsAreChecked) {
  flashext::FlashBwdParams p;
  p.heads = 4, p.heads_kv = 2, p.head_dim = 64, p.batch = 1, p.seqlen_q = p.seqlen_k = 10;
  EXPECT_EQ(flashext::run_flash_bwd(p, nullptr, nullptr), cudaErrorInvalidValue);  // no lse, no workspace
  p.head_dim = 60;
  EXPECT_EQ(flashext::flash_bwd_workspace_bytes(p), 0u);
  p.head_dim = 64;
  const size_t plain = flashext::flash_bwd_workspace_bytes(p);
  EXPECT_GE(plain, size_t(10) * 4 * 64 * 4);  // at least the fp32 dq buffer
  p.deterministic = true;
  EXPECT_GT(flashext::flash_bwd_workspace_bytes(p), plain);  // plus the counters
  // The tiles per shared-memory budget: Hopper's 227 KiB, A100's 163, sm_86/89's 99.
  EXPECT_EQ(flashext::flash_bwd_smem_bytes(256, 99 * 1024), 0);  // D = 256 does not fit 99 KiB
  EXPECT_GT(flashext::flash_bwd_smem_bytes(256, 163 * 1024), 0);
  EXPECT_GT(flashext::flash_bwd_smem_bytes(64, 99 * 1024), 0);
  EXPECT_LT(flashext::flash_bwd_smem_bytes(64, 99 * 1024), flashext::flash_bwd_smem_bytes(64, 163 * 1024));
  EXPECT_EQ(flashext::flash_bwd_smem_bytes(64, 163 * 1024), flashext::flash_bwd_smem_bytes(64, 227 * 1024));
  EXPECT_GT(flashext::flash_bwd_smem_bytes(128, 99 * 1024), 0);
  EXPECT_EQ(flashext::flash_bwd_smem_bytes(128, 163 * 1024), flashext::flash_bwd_smem_bytes(128, 227 * 1024));
  EXPECT_LT(flashext::flash_bwd_smem_bytes(128, 99 * 1024), flashext::flash_bwd_smem_bytes(128, 163 * 1024));
  EXPECT_LT(flashext::flash_bwd_smem_bytes(256, 163 * 1024), flashext::flash_bwd_smem_bytes(256, 227 * 1024));
  EXPECT_EQ(flashext::flash_bwd_smem_bytes(60, 227 * 1024), 0);  // no kernel for head dim 60
}

// Which calls the Hopper backward takes (host side, no GPU needed: the pointers are never read):
// head dims up to 128 (on its D = 64 and 128 kernels), 16-byte aligned tensors with strides in multiples of 8 elements (its TMA maps),
// the forward's lse, no block mask, keys and queries present.
TEST(FlashBwd, Sm90TakesWhatItsMapsCanRead) {
  alignas(16) static char memory[7][64];
  flashext::FlashBwdParams p;
  p.batch = 2, p.heads = 4, p.heads_kv = 2, p.head_dim = 128, p.seqlen_q = 100, p.seqlen_k = 60;
  p.q = memory[0], p.k = memory[1], p.v = memory[2], p.dout = memory[3], p.dk = memory[4], p.dv = memory[5];
  p.lse = reinterpret_cast<float*>(memory[6]);
  for (int64_t* s : {&p.q_head_stride, &p.k_head_stride, &p.v_head_stride, &p.do_head_stride, &p.dk_head_stride,
                     &p.dv_head_stride}) {
    *s = 128;
  }
  p.q_row_stride = p.do_row_stride = 4 * 128, p.q_batch_stride = p.do_batch_stride = 100 * 4 * 128;
  p.k_row_stride = p.v_row_stride = p.dk_row_stride = p.dv_row_stride = 2 * 128;
  p.k_batch_stride = p.v_batch_stride = p.dk_batch_stride = p.dv_batch_stride = 60 * 2 * 128;
  EXPECT_TRUE(flashext::flash_bwd_sm90_takes(p));
  const auto refused = [&](auto change) {
    flashext::FlashBwdParams c = p;
    change(c);
    return !flashext::flash_bwd_sm90_takes(c);
  };
  EXPECT_FALSE(refused([](auto& c) { c.head_dim = 64; }));
  EXPECT_FALSE(refused([](auto& c) { c.head_dim = 96; }));  // on the D = 128 kernel
  EXPECT_FALSE(refused([](auto& c) { c.head_dim = 8; }));   // on the D = 64 kernel
  EXPECT_TRUE(refused([](auto& c) { c.head_dim = 136; }));  // the FA2-design backward's
  EXPECT_TRUE(refused([](auto& c) { c.head_dim = 256; }));
  EXPECT_TRUE(refused([](auto& c) { c.head_dim = 100; }));
  EXPECT_TRUE(refused([&](auto& c) { c.k = memory[1] + 8; }));  // 8-byte aligned
  EXPECT_TRUE(refused([&](auto& c) { c.dv = memory[5] + 2; }));
  EXPECT_TRUE(refused([](auto& c) { c.q_row_stride = 4 * 128 + 4; }));  // 8-byte strides
  EXPECT_TRUE(refused([](auto& c) { c.dk_batch_stride += 1; }));
  EXPECT_TRUE(refused([](auto& c) { c.lse = nullptr; }));
  EXPECT_TRUE(refused([](auto& c) { c.heads_kv = 3; }));  // H % Hkv != 0
  EXPECT_TRUE(refused([](auto& c) { c.seqlen_k = 0; }));
  EXPECT_TRUE(refused([](auto& c) { c.seqlen_q = 0; }));
  EXPECT_TRUE(refused([](auto& c) { c.softcap = -1.0f; }));
  EXPECT_TRUE(refused([](auto& c) { c.block_mask = reinterpret_cast<const uint8_t*>(memory[0]); }));
  // varlen: both offsets, and rows on both sides
  static int32_t cu[3] = {0, 40, 100};
  EXPECT_TRUE(refused([&](auto& c) { c.cu_seqlens_q = cu; }));  // without cu_seqlens_k
  EXPECT_FALSE(refused([&](auto& c) { c.cu_seqlens_q = c.cu_seqlens_k = cu, c.total_q = c.total_k = 100; }));
  EXPECT_TRUE(refused([&](auto& c) { c.cu_seqlens_q = c.cu_seqlens_k = cu, c.total_q = 0, c.total_k = 100; }));
  EXPECT_FALSE(refused([](auto& c) { c.dq_row_stride = 3; }));  // dq goes through the fp32 workspace, no map
}

}  // namespace
