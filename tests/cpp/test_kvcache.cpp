// flashext attention over KV caches from C++ (flashext/attention.h): the append and the decode
// kernels against a double-precision CPU reference, dense and paged caches (shuffled pages of 1,
// 16 and 17 tokens), GQA, causal, split counts; and the guard that no length or page id reaches
// outside the caches. GPU tests GTEST_SKIP() when no CUDA device is present.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/divmod.h"
#include "common.h"
#include "flashext/attention.h"

namespace {

using flashext_test::DeviceBuffer;
using flashext_test::to_float;

struct Case {
  int batch, seqlen_q, heads, heads_kv, head_dim, capacity, seqlen_new;
  std::vector<int> lengths;  // cached tokens per sequence, before the new ones
  int page_size = 0;         // 0: dense caches
  int num_splits = 1;
  bool causal = false;
  int max_smem_per_sm = 0;  // > 0: plan for that much shared memory per SM (the two-stage pipeline)
};

template <typename T>
void run_case(const Case& c) {
  SCOPED_TRACE("B=" + std::to_string(c.batch) + " Sq=" + std::to_string(c.seqlen_q) + " H=" + std::to_string(c.heads) +
               "/" + std::to_string(c.heads_kv) + " D=" + std::to_string(c.head_dim) + " page=" +
               std::to_string(c.page_size) + " splits=" + std::to_string(c.num_splits));
  const int d = c.head_dim, group = c.heads / c.heads_kv;
  std::mt19937 rng(uint32_t(c.capacity * 7 + c.page_size * 131 + c.num_splits));
  const bool paged = c.page_size > 0;
  const int pages_per_seq = paged ? (c.capacity + c.page_size - 1) / c.page_size : 0;
  const int num_pages = paged ? c.batch * pages_per_seq + 2 : 0;
  const int rows_per_block = paged ? c.page_size : c.capacity;  // tokens per cache "page" (dense: a sequence)
  const int blocks = paged ? num_pages : c.batch;
  const size_t cache_elems = size_t(blocks) * rows_per_block * c.heads_kv * d;
  auto k_cache = flashext_test::random_values<T>(cache_elems, rng, 1.0f);
  auto v_cache = flashext_test::random_values<T>(cache_elems, rng, 1.0f);
  const auto q = flashext_test::random_values<T>(size_t(c.batch) * c.seqlen_q * c.heads * d, rng, 1.0f);
  const auto k_new = flashext_test::random_values<T>(size_t(c.batch) * std::max(c.seqlen_new, 1) * c.heads_kv * d, rng, 1.0f);
  const auto v_new = flashext_test::random_values<T>(k_new.size(), rng, 1.0f);
  std::vector<int> table(size_t(c.batch) * std::max(pages_per_seq, 1));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  // The cache row of token t of sequence b, in elements, for the host copies.
  const auto row_of = [&](int b, int t) -> size_t {
    const int block = paged ? table[size_t(b) * pages_per_seq + t / c.page_size] : b;
    const int slot = paged ? t % c.page_size : t;
    return (size_t(block) * rows_per_block + slot) * c.heads_kv * d;
  };

  DeviceBuffer dk(cache_elems * sizeof(T)), dv(cache_elems * sizeof(T)), dq(q.size() * sizeof(T)),
      dkn(k_new.size() * sizeof(T)), dvn(v_new.size() * sizeof(T)), dout(q.size() * sizeof(T)),
      dlse(size_t(c.batch) * c.heads * c.seqlen_q * sizeof(float)), dlens(c.lengths.size() * sizeof(int)),
      dtable(table.size() * sizeof(int));
  flashext_test::upload(dk.get(), k_cache);
  flashext_test::upload(dv.get(), v_cache);
  flashext_test::upload(dq.get(), q);
  flashext_test::upload(dkn.get(), k_new);
  flashext_test::upload(dvn.get(), v_new);
  flashext_test::upload(dlens.get(), c.lengths);
  flashext_test::upload(dtable.get(), table);

  flashext::FlashDecodeParams p;
  p.q = dq.get(), p.o = dout.get(), p.lse = dlse.at<float>();
  p.q_row_stride = p.o_row_stride = int64_t(c.heads) * d;
  p.q_head_stride = p.o_head_stride = d;
  p.q_batch_stride = p.o_batch_stride = int64_t(c.seqlen_q) * c.heads * d;
  p.lse_head_stride = c.seqlen_q, p.lse_batch_stride = int64_t(c.heads) * c.seqlen_q;
  p.k_cache = dk.get(), p.v_cache = dv.get();
  p.k_row_stride = p.v_row_stride = int64_t(c.heads_kv) * d;
  p.k_head_stride = p.v_head_stride = d;
  p.k_page_stride = p.v_page_stride = int64_t(rows_per_block) * c.heads_kv * d;
  p.cache_seqlens = dlens.at<int>();
  if (paged) {
    p.block_table = dtable.at<int>();
    p.block_table_stride = pages_per_seq;
    p.num_pages = num_pages;
  }
  p.page_size = c.page_size;
  p.capacity = paged ? pages_per_seq * c.page_size : c.capacity;
  p.seqlen_new = c.seqlen_new;
  p.batch = c.batch, p.heads = c.heads, p.heads_kv = c.heads_kv, p.head_dim = d, p.seqlen_q = c.seqlen_q;
  p.softmax_scale = 1.0f / std::sqrt(float(d));
  p.window_right = c.causal ? 0 : -1;
  p.num_splits = c.num_splits;
  p.max_smem_per_sm = c.max_smem_per_sm;
  p.dtype = flashext_test::dtype_of<T>();
  if (c.seqlen_new > 0) {
    flashext::KvAppendParams a;
    a.k = dkn.get(), a.v = dvn.get();
    a.k_row_stride = a.v_row_stride = int64_t(c.heads_kv) * d;
    a.k_head_stride = a.v_head_stride = d;
    a.k_batch_stride = a.v_batch_stride = int64_t(c.seqlen_new) * c.heads_kv * d;
    FX_ASSERT_CUDA(flashext::run_kvcache_append(p, a, nullptr));
  }
  DeviceBuffer workspace(std::max<size_t>(flashext::flash_decode_workspace_bytes(p), 16));
  FX_ASSERT_CUDA(flashext::run_flash_decode(p, workspace.get(), nullptr));
  FX_ASSERT_CUDA(cudaDeviceSynchronize());

  // The host's copy of the append, then the reference: the caches must match exactly.
  for (int b = 0; b < c.batch; ++b) {
    for (int t = 0; t < c.seqlen_new && c.lengths[b] + t < p.capacity; ++t) {
      for (int e = 0; e < c.heads_kv * d; ++e) {
        k_cache[row_of(b, c.lengths[b] + t) + e] = k_new[(size_t(b) * c.seqlen_new + t) * c.heads_kv * d + e];
        v_cache[row_of(b, c.lengths[b] + t) + e] = v_new[(size_t(b) * c.seqlen_new + t) * c.heads_kv * d + e];
      }
    }
  }
  const auto k_after = flashext_test::download<T>(dk.get(), cache_elems);
  for (size_t i = 0; i < cache_elems; ++i) {
    ASSERT_EQ(to_float(k_after[i]), to_float(k_cache[i])) << "k_cache element " << i << " after the append";
  }
  const auto out = flashext_test::download<T>(dout.get(), q.size());
  const auto lse = flashext_test::download<float>(dlse.get(), size_t(c.batch) * c.heads * c.seqlen_q);
  const double tol = flashext_test::out_tolerance<T>(), lse_tol = flashext_test::lse_tolerance<T>();
  for (int b = 0; b < c.batch; ++b) {
    const int total = std::min(c.lengths[b] + c.seqlen_new, p.capacity);
    for (int h = 0; h < c.heads; ++h) {
      const int hk = h / group;
      for (int i = 0; i < c.seqlen_q; ++i) {
        const int last = c.causal ? i + total - c.seqlen_q : total - 1;  // bottom-right
        std::vector<double> s;
        double m = -INFINITY;
        for (int t = 0; t <= last && t < total; ++t) {
          double dot = 0;
          for (int e = 0; e < d; ++e) {
            dot += double(to_float(q[((size_t(b) * c.seqlen_q + i) * c.heads + h) * d + e])) *
                   to_float(k_cache[row_of(b, t) + size_t(hk) * d + e]);
          }
          s.push_back(dot * p.softmax_scale);
          m = std::max(m, s.back());
        }
        const size_t o_row = ((size_t(b) * c.seqlen_q + i) * c.heads + h) * d;
        const float got_lse = lse[(size_t(b) * c.heads + h) * c.seqlen_q + i];
        if (s.empty()) {
          for (int e = 0; e < d; ++e) ASSERT_EQ(to_float(out[o_row + e]), 0.0f) << "a row that sees no key";
          ASSERT_TRUE(std::isinf(got_lse) && got_lse < 0);
          continue;
        }
        double l = 0;
        for (double x : s) l += std::exp(x - m);
        ASSERT_NEAR(got_lse, m + std::log(l), lse_tol * std::max(1.0, std::abs(m))) << "b " << b << " h " << h;
        for (int e = 0; e < d; ++e) {
          double want = 0;
          for (size_t t = 0; t < s.size(); ++t) {
            want += std::exp(s[t] - m) / l * to_float(v_cache[row_of(b, int(t)) + size_t(hk) * d + e]);
          }
          ASSERT_NEAR(to_float(out[o_row + e]), want, tol) << "b " << b << " h " << h << " i " << i << " d " << e;
        }
      }
    }
  }
}

template <typename T>
class FlashDecodeKernel : public ::testing::Test {};
using Types = ::testing::Types<__half, __nv_bfloat16>;
TYPED_TEST_SUITE(FlashDecodeKernel, Types);

TYPED_TEST(FlashDecodeKernel, AgainstCpuReference) {
  FX_SKIP_WITHOUT_GPU();
  run_case<TypeParam>({3, 1, 8, 2, 128, 300, 0, {0, 1, 299}});                      // dense decode, GQA 4
  run_case<TypeParam>({3, 1, 8, 2, 128, 300, 1, {0, 64, 298}, 0, 4, true});          // append, 4 splits
  run_case<TypeParam>({2, 3, 4, 1, 64, 200, 2, {15, 17}, 16, 1, true});              // paged 16, Sq 3
  run_case<TypeParam>({2, 1, 4, 4, 256, 100, 1, {0, 98}, 1, 3});                     // page size 1, D 256
  run_case<TypeParam>({2, 5, 8, 2, 64, 150, 3, {16, 140}, 17, 7, true});             // page size 17
  run_case<TypeParam>({1, 1, 32, 1, 128, 1000, 1, {999}, 64, 5});                    // MQA 32, full cache
}

// GPUs with less shared memory per SM than sm_90 (A100, sm_86/89) run two K/V stages, not three.
TYPED_TEST(FlashDecodeKernel, TwoStagesForLessSharedMemory) {
  FX_SKIP_WITHOUT_GPU();
  for (const int head_dim : {64, 128}) {
    Case dense{3, 1, 8, 2, head_dim, 300, 1, {0, 64, 298}, 0, 4, true};
    dense.max_smem_per_sm = 100 * 1024;  // sm_86/89
    run_case<TypeParam>(dense);
    Case paged{2, 3, 4, 1, head_dim, 200, 2, {15, 17}, 16, 1, true};
    paged.max_smem_per_sm = 100 * 1024;
    run_case<TypeParam>(paged);
  }
}

// The decode kernel's page arithmetic and the Hopper forward's tile walk: FastDivmod against / and
// % on the CPU, for divisors 1 to 2^30 (powers of two, their neighbours, odd and random ones) and
// dividends from 0 to 2^31 − 1.
TEST(FastDivmod, MatchesIntegerDivision) {
  std::mt19937 rng(2026);
  std::vector<int> divisors;
  for (int k = 0; k <= 30; ++k) {
    for (int d : {(1 << k) - 1, 1 << k, (1 << k) + 1}) {
      if (d >= 1) divisors.push_back(d);
    }
  }
  for (int i = 0; i < 200; ++i) divisors.push_back(1 + int(rng() % 100000));
  for (int i = 0; i < 200; ++i) divisors.push_back(1 + int(rng() % (1u << 30)));
  for (int d : {3, 7, 17, 257, 1000, 65535}) divisors.push_back(d);
  std::vector<int> dividends = {0, 1, 2, 15, 16, 17, 255, 256, 257, 65535, 65536, 1 << 29, (1 << 30) - 1, INT32_MAX,
                                INT32_MAX - 1};
  for (int i = 0; i < 2000; ++i) dividends.push_back(int(rng() & 0x7fffffffu));
  for (int d : divisors) {
    const flashext::FastDivmod fast(d);
    for (int n : dividends) {
      int q = -1, r = -1;
      fast.divmod(n, q, r);
      ASSERT_EQ(q, n / d) << n << " / " << d;
      ASSERT_EQ(r, n % d) << n << " % " << d;
    }
    for (int n = 0; n < 3 * d && n < 100000; ++n) ASSERT_EQ(fast.div(n), n / d) << n << " / " << d;
  }
}

}  // namespace
