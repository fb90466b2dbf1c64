// flashext FlashAttention forward from C++: the online-softmax bookkeeping on the host, and the
// kernel (flashext/attention.h) against a double-precision CPU reference on small shapes.
// GPU tests GTEST_SKIP() when no CUDA device is present.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <type_traits>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common.h"
#include "common/online_softmax.h"
#include "flashext/attention.h"
#include "flashext/merge_states.h"
#include "attention/flash_fwd_sm90.h"
#include "attention/sm90_tile_walk.h"

namespace {

using flashext::SoftmaxState;
using flashext_test::DeviceBuffer;
using flashext_test::from_float;
using flashext_test::to_float;

// ---- host: the online-softmax math -----------------------------------------------------------

SoftmaxState state_of(const std::vector<float>& scores, size_t begin, size_t end) {
  SoftmaxState s{-INFINITY, 0.0f};
  for (size_t i = begin; i < end; ++i) s.row_max = std::max(s.row_max, scores[i]);
  for (size_t i = begin; i < end; ++i) s.row_sum += std::exp2(scores[i] - flashext::safe_row_max(s.row_max));
  return s;
}

TEST(OnlineSoftmax, MergingSplitsEqualsTheWholeRow) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 8.0f);
  std::vector<float> scores(300);
  for (auto& s : scores) s = dist(rng);
  scores[5] = -INFINITY;  // a masked key
  const SoftmaxState whole = state_of(scores, 0, scores.size());
  for (size_t split : {size_t(1), size_t(64), size_t(150), size_t(299)}) {
    const SoftmaxState merged =
        flashext::merge_softmax_states(state_of(scores, 0, split), state_of(scores, split, scores.size()));
    EXPECT_EQ(merged.row_max, whole.row_max);
    EXPECT_NEAR(merged.row_sum, whole.row_sum, 1e-5 * whole.row_sum) << "split " << split;
  }
}

TEST(OnlineSoftmax, EmptyRowsStayEmptyAndNeverNaN) {
  const SoftmaxState empty{-INFINITY, 0.0f};
  EXPECT_EQ(flashext::rescale_factor(-INFINITY, -INFINITY), 0.0f);
  EXPECT_EQ(flashext::rescale_factor(-INFINITY, 3.0f), 0.0f);
  EXPECT_EQ(flashext::rescale_factor(3.0f, 3.0f), 1.0f);
  EXPECT_NEAR(flashext::rescale_factor(1.0f, 3.0f), 0.25f, 1e-7f);
  const SoftmaxState merged = flashext::merge_softmax_states(empty, empty);
  EXPECT_EQ(merged.row_sum, 0.0f);
  EXPECT_EQ(flashext::row_lse(merged), -INFINITY);
  const SoftmaxState one = flashext::merge_softmax_states(empty, {2.0f, 1.0f});
  EXPECT_EQ(one.row_max, 2.0f);
  EXPECT_EQ(one.row_sum, 1.0f);
  EXPECT_NEAR(flashext::row_lse(one), 2.0f * flashext::kLn2, 1e-6f);  // log2 units → natural log
}

// A row's first visible key block with a very negative max (large logits, few visible keys, as
// in the first causal rows): the empty state's rescale must be 0, not 2^(0 − m) · 0 = inf · 0 = NaN.
TEST(OnlineSoftmax, EmptyRowMeetingVeryNegativeScoresStaysFinite) {
  for (float m : {-127.0f, -129.0f, -1000.0f, -3.0e38f}) {
    EXPECT_EQ(flashext::rescale_factor(-INFINITY, m), 0.0f) << m;
    EXPECT_EQ(flashext::rescale_factor(-INFINITY, m, flashext::kLog2e), 0.0f) << m;
    const SoftmaxState merged = flashext::merge_softmax_states({-INFINITY, 0.0f}, {m, 1.0f});
    EXPECT_EQ(merged.row_max, m);
    EXPECT_EQ(merged.row_sum, 1.0f);
    EXPECT_TRUE(std::isfinite(flashext::row_lse(merged)));
  }
  EXPECT_EQ(flashext::rescale_factor(-500.0f, -400.0f), std::exp2(-100.0f));
}

// The scaled bookkeeping of online_softmax: max in the scores' units, scale applied after x − m.
TEST(OnlineSoftmax, ScaledStatesMergeLikeTheWholeRow) {
  const std::vector<float> x = {1.0e4f, 1.0e4f - 1.0f, -3.0f, 9999.5f};
  const float c = flashext::kLog2e;
  SoftmaxState a{std::max(x[0], x[1]), std::exp2((x[0] - 1.0e4f) * c) + std::exp2((x[1] - 1.0e4f) * c)};
  SoftmaxState b{std::max(x[2], x[3]), std::exp2((x[2] - x[3]) * c) + 1.0f};
  const SoftmaxState merged = flashext::merge_softmax_states(a, b, c);
  EXPECT_EQ(merged.row_max, 1.0e4f);
  const double want = 1.0 + std::exp(-1.0) + std::exp(-10003.0) + std::exp(-0.5);
  EXPECT_NEAR(merged.row_sum, want, 1e-6 * want);
}

TEST(MergeAttentionStates, WeightsFromTheLse) {
  // Two halves of one row: the merged lse is the whole row's, the weights its shares.
  const double la = 1.25, lb = -0.5;
  const flashext::LseMerge m = flashext::merge_lse(float(la), float(lb));
  const double want = std::log(std::exp(la) + std::exp(lb));
  EXPECT_NEAR(m.lse, want, 1e-6);
  EXPECT_NEAR(m.weight_a, std::exp(la - want), 1e-6);
  EXPECT_NEAR(m.weight_b, std::exp(lb - want), 1e-6);
  EXPECT_NEAR(m.weight_a + m.weight_b, 1.0, 1e-6);
  // Huge lse values keep their digits (the max is subtracted before exp).
  const flashext::LseMerge big = flashext::merge_lse(1.0e4f, 1.0e4f);
  EXPECT_EQ(big.weight_a, 0.5f);
  EXPECT_NEAR(big.lse, 1.0e4f + std::log(2.0f), 1e-3);
  // One side empty: the other as it is; both empty: 0 weights and −inf, never NaN.
  const flashext::LseMerge one = flashext::merge_lse(-INFINITY, 3.0f);
  EXPECT_EQ(one.weight_a, 0.0f);
  EXPECT_EQ(one.weight_b, 1.0f);
  EXPECT_EQ(one.lse, 3.0f);
  const flashext::LseMerge none = flashext::merge_lse(-INFINITY, -INFINITY);
  EXPECT_EQ(none.weight_a, 0.0f);
  EXPECT_EQ(none.weight_b, 0.0f);
  EXPECT_TRUE(std::isinf(none.lse) && none.lse < 0);
  // NaN on either side is not hidden.
  EXPECT_TRUE(std::isnan(flashext::merge_lse(NAN, 1.0f).lse));
  EXPECT_TRUE(std::isnan(flashext::merge_lse(1.0f, NAN).lse));
}

TEST(FlashDecode, SplitsFromShapesOnly) {
  // 32 query heads on 8 KV heads, decode: batch 1 x 32K keys fills 132 SMs only with splits; 16
  // splits are 128 blocks of 32 key tiles, one per SM at about two blocks' rate, as fast as 32
  // splits of 16 tiles in one wave of 256 blocks and with half the partials (15 would take 35
  // tiles a split).
  EXPECT_EQ(flashext::flash_decode_num_splits(1, 32, 8, 1, 32768, 128, 132), 16);
  // 48 x 8K: 384 blocks are two waves unsplit; two splits are 768 blocks in three waves of half the
  // keys each.
  EXPECT_EQ(flashext::flash_decode_num_splits(48, 32, 8, 1, 8192, 128, 132), 2);
  // 8 x 128K: 64 blocks; 2 splits put one block on 128 SMs, as fast as 4's 256 blocks (two per SM)
  // in one wave; 5 would leave a second wave of 56 blocks.
  EXPECT_EQ(flashext::flash_decode_num_splits(8, 32, 8, 1, 131072, 128, 132), 2);
  // 2 x 32K: 16 blocks; 8 splits, one block on 128 SMs (not 16 splits: 256 blocks, two per SM).
  EXPECT_EQ(flashext::flash_decode_num_splits(2, 32, 8, 1, 32768, 128, 132), 8);
  // Not measured at one block per SM, so counted at one block's rate: D = 256 (two stages) and
  // blocks of more than one m16 row tile (8 queries x GQA 4).
  EXPECT_EQ(flashext::flash_decode_num_splits(1, 32, 8, 1, 32768, 256, 132), 32);
  EXPECT_EQ(flashext::flash_decode_num_splits(1, 32, 8, 8, 32768, 128, 132), 32);
  // Nor paged caches, which read slower with one block per SM.
  EXPECT_EQ(flashext::flash_decode_num_splits(1, 32, 8, 1, 32768, 128, 132, /*paged=*/true), 32);
  EXPECT_EQ(flashext::flash_decode_num_splits(8, 32, 8, 1, 131072, 128, 132, /*paged=*/true), 4);
  // 128 sequences x 8 KV heads are 1024 blocks already: no split.
  EXPECT_EQ(flashext::flash_decode_num_splits(128, 32, 8, 1, 2048, 128, 132), 1);
  // Short caches are not split below 256 keys a split.
  EXPECT_EQ(flashext::flash_decode_num_splits(1, 8, 8, 1, 300, 128, 132), 1);
  EXPECT_LE(flashext::flash_decode_num_splits(1, 8, 8, 1, 1024, 128, 132), 4);
  // Degenerate shapes: one split.
  EXPECT_EQ(flashext::flash_decode_num_splits(0, 8, 8, 1, 1024, 128, 132), 1);
  EXPECT_EQ(flashext::flash_decode_num_splits(1, 8, 8, 1, 1024, 128, 0), 1);
  flashext::FlashDecodeParams p;
  p.batch = 2, p.seqlen_q = 1, p.heads = 8, p.head_dim = 128, p.num_splits = 1;
  EXPECT_EQ(flashext::flash_decode_workspace_bytes(p), 0u);  // one split writes the output itself
  p.num_splits = 4;
  EXPECT_EQ(flashext::flash_decode_workspace_bytes(p), size_t(4 * 2 * 8) * (128 + 1) * 4);
  p.heads_kv = 2;  // no cache_seqlens: refused before any launch
  EXPECT_EQ(flashext::run_flash_decode(p, nullptr, nullptr), cudaErrorInvalidValue);
}

TEST(FlashFwd, CuSeqlensCheckNamesEachFault) {
  using flashext::CuSeqlensError;
  const auto check = [](std::vector<int32_t> cu, int64_t total, int64_t max_seqlen) {
    return flashext::check_cu_seqlens(cu.data(), int64_t(cu.size()), total, max_seqlen);
  };
  EXPECT_EQ(check({0, 4, 4, 10}, 10, 6), CuSeqlensError::kOk);  // a length-0 sequence is fine
  EXPECT_EQ(check({0}, 0, 0), CuSeqlensError::kOk);  // no sequences
  EXPECT_EQ(check({0, 4}, 10, 4), CuSeqlensError::kOk);  // rows past the last sequence: allowed
  EXPECT_EQ(check({1, 4, 10}, 10, 6), CuSeqlensError::kNotStartingAtZero);
  EXPECT_EQ(check({}, 0, 0), CuSeqlensError::kNotStartingAtZero);
  EXPECT_EQ(check({0, 6, 4}, 10, 6), CuSeqlensError::kDecreasing);
  EXPECT_EQ(check({0, 4, 11}, 10, 7), CuSeqlensError::kPastTotal);
  EXPECT_EQ(check({0, 4, 10}, 10, 5), CuSeqlensError::kLongerThanMax);
}

TEST(FlashFwd, HeadDimMapping) {
  EXPECT_EQ(flashext::flash_fwd_kernel_head_dim(64), 64);
  EXPECT_EQ(flashext::flash_fwd_kernel_head_dim(8), 64);
  EXPECT_EQ(flashext::flash_fwd_kernel_head_dim(80), 128);
  EXPECT_EQ(flashext::flash_fwd_kernel_head_dim(136), 256);
  EXPECT_EQ(flashext::flash_fwd_kernel_head_dim(256), 256);
  EXPECT_EQ(flashext::flash_fwd_kernel_head_dim(264), 0);
  EXPECT_EQ(flashext::flash_fwd_kernel_head_dim(60), 0);
  flashext::FlashFwdParams bad;
  bad.heads = 6;
  bad.heads_kv = 4;  // H % Hkv != 0
  bad.head_dim = 64;
  EXPECT_EQ(flashext::run_flash_fwd(bad, nullptr), cudaErrorInvalidValue);
}

// The Hopper forward's refusals and no-op calls, decided before any launch (no GPU needed); its
// dispatch (which calls reach it) is the torch glue's and tested from Python.
TEST(FlashFwd, Sm90RefusesWhatItHasNoKernelFor) {
  flashext::FlashFwdParams p;
  p.batch = 1, p.heads = 4, p.heads_kv = 2, p.head_dim = 100, p.seqlen_q = 10, p.seqlen_k = 10;
  EXPECT_EQ(flashext::run_flash_fwd_sm90(p, nullptr), cudaErrorInvalidValue);  // not a multiple of 8
  p.head_dim = 264;
  EXPECT_EQ(flashext::run_flash_fwd_sm90(p, nullptr), cudaErrorInvalidValue);
  p.head_dim = 128;
  p.heads_kv = 3;
  EXPECT_EQ(flashext::run_flash_fwd_sm90(p, nullptr), cudaErrorInvalidValue);  // H % Hkv != 0
  p.heads_kv = 2;
  static int32_t cu[2] = {0, 10};
  p.cu_seqlens_q = cu;  // varlen needs both offsets
  EXPECT_EQ(flashext::run_flash_fwd_sm90(p, nullptr), cudaErrorInvalidValue);
  p.cu_seqlens_q = nullptr;
  p.seqlen_k = 0;  // keys are needed (the glue sends key-less calls to the FA2-design kernel)
  EXPECT_EQ(flashext::run_flash_fwd_sm90(p, nullptr), cudaErrorInvalidValue);
  p.seqlen_q = 0;  // no query rows: nothing to do
  EXPECT_EQ(flashext::run_flash_fwd_sm90(p, nullptr), cudaSuccess);
  EXPECT_FALSE(flashext::flash_fwd_sm90_supported(8, 0));
  EXPECT_FALSE(flashext::flash_fwd_sm90_supported(10, 0));  // sm_90a code runs on exactly 9.0
}

// The Hopper forward's tile walk (sm90_tile_walk.h), as its CTAs run it: every CTA b strides
// t = b, b + grid, ... below loop_tiles. Every (query block, head, sequence) comes exactly once;
// without units the order is the index's definition (the query block counted from the last); with
// them a CTA takes a unit's two tiles of one head in turn, the longer first (or with kShortFirst the
// shorter), and every CTA as many units as the others or one fewer (a unit is num_m + 1 key blocks
// of causal work; the middle block of an odd num_m, a unit alone, about half that).
template <bool kShortFirst>
void check_sm90_tile_walk() {
  using flashext::attention_detail::make_sm90_tile_walk;
  using flashext::attention_detail::sm90_tile_coords;
  std::mt19937 rng(7);
  struct Shape {
    int num_m, heads, heads_kv, batch;
  };
  std::vector<Shape> shapes = {{1, 1, 1, 1}, {1, 32, 8, 132}, {2, 4, 4, 3}, {3, 6, 2, 5}, {8, 16, 16, 16},
                               {9, 32, 4, 2}, {86, 16, 16, 1}, {5, 64, 1, 7}, {11, 2, 2, 13}};
  for (int i = 0; i < 40; ++i) {
    const int heads_kv = 1 + int(rng() % 8), group = 1 + int(rng() % 8);
    shapes.push_back({1 + int(rng() % 40), heads_kv * group, heads_kv, 1 + int(rng() % 12)});
  }
  for (const Shape& sh : shapes) {
    const int tiles = sh.num_m * sh.heads * sh.batch, group = sh.heads / sh.heads_kv;
    const auto index = [&](int batch, int head, int m_block) { return (batch * sh.heads + head) * sh.num_m + m_block; };
    for (int grid : {1, 7, 132, tiles}) {
      if (grid > tiles) continue;
      for (bool units : {false, true}) {
        const auto walk = make_sm90_tile_walk(sh.num_m, sh.heads, sh.heads_kv, sh.batch, grid, units);
        ASSERT_EQ(walk.paired, units && grid < tiles);
        std::vector<int> seen(tiles, 0);
        int fewest_units = INT32_MAX, most_units = 0;
        for (int b = 0; b < grid; ++b) {
          int units_taken = 0;
          int previous = -1;  // the tile this CTA took last
          for (int t = b; t < walk.loop_tiles; t += walk.grid) {
            const auto at = sm90_tile_coords<kShortFirst>(walk, t);
            if (at.skip) continue;
            ASSERT_TRUE(at.m_block >= 0 && at.m_block < sh.num_m && at.head >= 0 && at.head < sh.heads &&
                        at.batch >= 0 && at.batch < sh.batch)
                << "t " << t;
            ASSERT_EQ(at.kv_head, at.head / group);
            const int tile = index(at.batch, at.head, at.m_block);
            ++seen[tile];
            // (a unit's longer tile, or the middle block alone: one per unit)
            const bool longer = 2 * at.m_block >= sh.num_m - 1;
            units_taken += longer;
            if (!walk.paired) {
              ASSERT_EQ(t, index(at.batch, at.head, sh.num_m - 1 - at.m_block));  // counted from the last
            } else if (2 * at.m_block != sh.num_m - 1 && longer == kShortFirst) {  // a unit's second tile
              ASSERT_EQ(previous, index(at.batch, at.head, sh.num_m - 1 - at.m_block)) << "t " << t;
            }
            previous = tile;
          }
          fewest_units = std::min(fewest_units, units_taken);
          most_units = std::max(most_units, units_taken);
        }
        for (int tile = 0; tile < tiles; ++tile) ASSERT_EQ(seen[tile], 1) << "tile " << tile << " of " << tiles;
        if (walk.paired) {
          const int rounds = (walk.num_units + grid - 1) / grid;
          EXPECT_EQ(most_units, rounds);
          EXPECT_GE(fewest_units, rounds - 1);
        }
      }
    }
  }
}

TEST(FlashFwd, Sm90TileWalkVisitsEveryTileOnce) {
  {
    SCOPED_TRACE("the longer tile of a unit first");
    check_sm90_tile_walk<false>();
  }
  {
    SCOPED_TRACE("the shorter tile of a unit first");
    check_sm90_tile_walk<true>();
  }
  // The largest call the launch walks stays in 31 bits, the stride's last step included.
  using flashext::attention_detail::kSm90MaxTiles;
  using flashext::attention_detail::make_sm90_tile_walk;
  const auto big = make_sm90_tile_walk(int((kSm90MaxTiles - 1) / 64), 64, 64, 1, 132, true);
  EXPECT_LT(int64_t(big.loop_tiles) + big.grid, int64_t(INT32_MAX));
}

// ---- GPU: the kernel against a CPU reference -------------------------------------------------

struct Case {
  int batch, seqlen_q, seqlen_k, heads, heads_kv, head_dim;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.0f;
  std::vector<int> varlen_q, varlen_k;  // non-empty: packed ragged batch with these lengths
  int block_rows = 0, block_cols = 0;  // > 0: block-sparse, a random mask of (R, C) blocks
  bool sm90 = false;  // the Hopper kernel (flash_fwd_sm90.h) instead of run_flash_fwd
};

// out (rows, H, D) and lse (H, rows) for one sequence, in double.
// Block-sparse: mask (H, ⌈sq/R⌉, ⌈sk/C⌉) of this sequence, or null.
void reference(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v, int sq, int sk,
               const Case& c, float scale, std::vector<double>& out, std::vector<double>& lse,
               const uint8_t* mask = nullptr) {
  const int group = c.heads / c.heads_kv, d = c.head_dim, right = c.causal ? 0 : c.window_right;
  out.assign(size_t(sq) * c.heads * d, 0.0);
  lse.assign(size_t(c.heads) * sq, -INFINITY);
  for (int h = 0; h < c.heads; ++h) {
    const int hk = h / group;
    for (int i = 0; i < sq; ++i) {
      std::vector<double> s(sk, -INFINITY);
      double m = -INFINITY;
      for (int j = 0; j < sk; ++j) {
        const int diag = i + sk - sq;
        if ((c.window_left >= 0 && j < diag - c.window_left) || (right >= 0 && j > diag + right)) continue;
        if (mask != nullptr) {
          const int rows = (sq + c.block_rows - 1) / c.block_rows, cols = (sk + c.block_cols - 1) / c.block_cols;
          if (!mask[(size_t(h) * rows + i / c.block_rows) * cols + j / c.block_cols]) continue;
        }
        double dot = 0;
        for (int e = 0; e < d; ++e) dot += double(q[(size_t(i) * c.heads + h) * d + e]) * k[(size_t(j) * c.heads_kv + hk) * d + e];
        dot *= scale;
        if (c.softcap > 0) dot = c.softcap * std::tanh(dot / c.softcap);
        s[j] = dot;
        m = std::max(m, dot);
      }
      if (m == -INFINITY) continue;  // sees no key: O = 0, lse = −inf
      double l = 0;
      for (int j = 0; j < sk; ++j) l += std::exp(s[j] - m);
      lse[size_t(h) * sq + i] = m + std::log(l);
      for (int j = 0; j < sk; ++j) {
        const double pr = std::exp(s[j] - m) / l;
        if (pr == 0) continue;
        for (int e = 0; e < d; ++e) out[(size_t(i) * c.heads + h) * d + e] += pr * v[(size_t(j) * c.heads_kv + hk) * d + e];
      }
    }
  }
}

template <typename T>
void run_case(const Case& c) {
  SCOPED_TRACE("B=" + std::to_string(c.batch) + " Sq=" + std::to_string(c.seqlen_q) + " Sk=" + std::to_string(c.seqlen_k) +
               " H=" + std::to_string(c.heads) + "/" + std::to_string(c.heads_kv) + " D=" + std::to_string(c.head_dim) +
               " causal=" + std::to_string(c.causal) + " varlen=" + std::to_string(!c.varlen_q.empty()) +
               " blocks=" + std::to_string(c.block_rows) + "x" + std::to_string(c.block_cols));
  const bool varlen = !c.varlen_q.empty();
  std::vector<int> lq = varlen ? c.varlen_q : std::vector<int>(c.batch, c.seqlen_q);
  std::vector<int> lk = varlen ? c.varlen_k : std::vector<int>(c.batch, c.seqlen_k);
  std::vector<int> cu_q(1, 0), cu_k(1, 0);
  for (size_t b = 0; b < lq.size(); ++b) {
    cu_q.push_back(cu_q.back() + lq[b]);
    cu_k.push_back(cu_k.back() + lk[b]);
  }
  const int total_q = cu_q.back(), total_k = cu_k.back(), d = c.head_dim;
  std::mt19937 rng(uint32_t(total_q * 131 + total_k * 7 + d));
  const auto q = flashext_test::random_values<T>(size_t(total_q) * c.heads * d, rng, 1.0f),
             k = flashext_test::random_values<T>(size_t(total_k) * c.heads_kv * d, rng, 1.0f),
             v = flashext_test::random_values<T>(size_t(total_k) * c.heads_kv * d, rng, 1.0f);
  const size_t o_bytes = q.size() * sizeof(T), lse_count = size_t(c.heads) * total_q;
  // Outputs start as NaN (DeviceBuffer's poison); 16 bytes of slack past every tensor.
  DeviceBuffer dq(q.size() * sizeof(T) + 16), dk(k.size() * sizeof(T) + 16), dv(v.size() * sizeof(T) + 16),
      dout(o_bytes + 16), dlse(lse_count * sizeof(float) + 16), dcu_q(cu_q.size() * sizeof(int)),
      dcu_k(cu_k.size() * sizeof(int));
  flashext_test::upload(dq.get(), q);
  flashext_test::upload(dk.get(), k);
  flashext_test::upload(dv.get(), v);
  flashext_test::upload(dcu_q.get(), cu_q);
  flashext_test::upload(dcu_k.get(), cu_k);

  flashext::FlashFwdParams p;
  p.q = dq.get(); p.k = dk.get(); p.v = dv.get(); p.o = dout.get(); p.lse = dlse.at<float>();
  p.q_row_stride = int64_t(c.heads) * d; p.q_head_stride = d; p.q_batch_stride = int64_t(c.seqlen_q) * p.q_row_stride;
  p.k_row_stride = int64_t(c.heads_kv) * d; p.k_head_stride = d; p.k_batch_stride = int64_t(c.seqlen_k) * p.k_row_stride;
  p.v_row_stride = p.k_row_stride; p.v_head_stride = d; p.v_batch_stride = p.k_batch_stride;
  p.o_row_stride = p.q_row_stride; p.o_head_stride = d; p.o_batch_stride = p.q_batch_stride;
  // dense lse (B, H, Sq); varlen lse (H, total_q)
  p.lse_head_stride = varlen ? total_q : c.seqlen_q;
  p.lse_batch_stride = int64_t(c.heads) * c.seqlen_q;
  if (varlen) {
    p.cu_seqlens_q = dcu_q.at<int>();
    p.cu_seqlens_k = dcu_k.at<int>();
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
  const bool sparse = c.block_rows > 0;
  const int mask_rows = sparse ? (c.seqlen_q + c.block_rows - 1) / c.block_rows : 0;
  const int mask_cols = sparse ? (c.seqlen_k + c.block_cols - 1) / c.block_cols : 0;
  std::vector<uint8_t> mask(size_t(c.batch) * c.heads * mask_rows * mask_cols);
  for (auto& m : mask) m = uint8_t(rng() % 3 == 0);  // a third of the blocks set
  DeviceBuffer dmask(mask.size() + 16);
  if (sparse) {
    flashext_test::upload(dmask.get(), mask);
    p.block_mask = dmask.at<uint8_t>();
    p.mask_row_stride = mask_cols;
    p.mask_head_stride = int64_t(mask_rows) * mask_cols;
    p.mask_batch_stride = int64_t(c.heads) * p.mask_head_stride;
    p.block_rows = c.block_rows;
    p.block_cols = c.block_cols;
  }
  DeviceBuffer dworkspace(sparse ? flashext::flash_block_sparse_workspace_bytes(p) : 0);
  if (sparse) {
    FX_ASSERT_CUDA(flashext::run_flash_block_sparse_fwd(p, dworkspace.get(), nullptr));
  } else if (c.sm90) {
    FX_ASSERT_CUDA(flashext::run_flash_fwd_sm90(p, nullptr));
  } else {
    FX_ASSERT_CUDA(flashext::run_flash_fwd(p, nullptr));
  }
  FX_ASSERT_CUDA(cudaDeviceSynchronize());

  const auto out = flashext_test::download<T>(dout.get(), q.size());
  const auto lse = flashext_test::download<float>(dlse.get(), lse_count);
  const double tol = flashext_test::out_tolerance<T>(), lse_tol = flashext_test::lse_tolerance<T>();
  for (size_t b = 0; b < lq.size(); ++b) {
    std::vector<float> qf, kf, vf;
    for (size_t i = size_t(cu_q[b]) * c.heads * d; i < size_t(cu_q[b + 1]) * c.heads * d; ++i) qf.push_back(to_float(q[i]));
    for (size_t i = size_t(cu_k[b]) * c.heads_kv * d; i < size_t(cu_k[b + 1]) * c.heads_kv * d; ++i) {
      kf.push_back(to_float(k[i]));
      vf.push_back(to_float(v[i]));
    }
    std::vector<double> want, want_lse;
    reference(qf, kf, vf, lq[b], lk[b], c, p.softmax_scale, want, want_lse,
              sparse ? mask.data() + b * size_t(c.heads) * mask_rows * mask_cols : nullptr);
    for (int i = 0; i < lq[b]; ++i) {
      for (int h = 0; h < c.heads; ++h) {
        for (int e = 0; e < d; ++e) {
          const float got = to_float(out[(size_t(cu_q[b] + i) * c.heads + h) * d + e]);
          ASSERT_NEAR(got, want[(size_t(i) * c.heads + h) * d + e], tol) << "b " << b << " row " << i << " head " << h << " d " << e;
        }
        const float got_lse = varlen ? lse[size_t(h) * total_q + cu_q[b] + i] : lse[(size_t(b) * c.heads + h) * c.seqlen_q + i];
        const double want_l = want_lse[size_t(h) * lq[b] + i];
        if (std::isinf(want_l)) {
          ASSERT_TRUE(std::isinf(got_lse) && got_lse < 0) << "lse of an empty row, b " << b << " row " << i;
        } else {
          ASSERT_NEAR(got_lse, want_l, lse_tol * std::max(1.0, std::abs(want_l))) << "lse b " << b << " row " << i << " head " << h;
        }
      }
    }
  }
}

template <typename T>
class FlashFwdKernel : public ::testing::Test {};
using Types = ::testing::Types<__half, __nv_bfloat16>;
TYPED_TEST_SUITE(FlashFwdKernel, Types);

TYPED_TEST(FlashFwdKernel, AgainstCpuReference) {
  FX_SKIP_WITHOUT_GPU();
  run_case<TypeParam>({2, 37, 53, 4, 2, 64});
  run_case<TypeParam>({1, 128, 217, 2, 1, 128, /*causal=*/true});
  run_case<TypeParam>({2, 65, 65, 2, 2, 80, false, 8, 0});  // head dim 80 served by 128; window
  run_case<TypeParam>({1, 40, 33, 2, 2, 256, true, -1, -1, /*softcap=*/3.0f});
  run_case<TypeParam>({1, 70, 20, 2, 1, 64, true});  // causal, Sq > Sk: rows 0..49 see no key
  run_case<TypeParam>({1, 1, 300, 2, 2, 128});  // decode-shaped
  // Uniform work at D = 256 with more query blocks than fit at once on a 132-SM GPU (2 blocks per
  // SM): persistent blocks, each requesting its next tile's Q and K early; GQA, partial tiles, and
  // a head dim served by 256.
  run_case<TypeParam>({1, 2200, 70, 8, 2, 256});
  run_case<TypeParam>({2, 1100, 33, 8, 8, 200});
  Case varlen{0, 0, 0, 4, 2, 64, true};
  varlen.varlen_q = {0, 1, 7, 70};
  varlen.varlen_k = {3, 0, 7, 90};
  run_case<TypeParam>(varlen);
}

// The Hopper kernel (D = 128, dense): only on an sm_90 GPU with a build holding sm_90a code.
TYPED_TEST(FlashFwdKernel, Sm90AgainstCpuReference) {
  FX_SKIP_WITHOUT_GPU();
  FX_SKIP_WITHOUT_SM90();
  const auto hopper = [](Case c) {
    c.sm90 = true;
    return c;
  };
  run_case<TypeParam>(hopper({1, 128, 128, 2, 2, 128}));                  // one tile
  run_case<TypeParam>(hopper({2, 300, 257, 4, 2, 128}));                  // tails, GQA, several key blocks
  run_case<TypeParam>(hopper({1, 257, 513, 4, 1, 128, /*causal=*/true}));  // MQA, causal Sq != Sk
  run_case<TypeParam>(hopper({1, 200, 600, 2, 2, 128, false, 100, 50}));  // windows
  run_case<TypeParam>(hopper({1, 130, 140, 2, 2, 128, true, -1, -1, /*softcap=*/5.0f}));
  run_case<TypeParam>(hopper({3, 1, 300, 8, 8, 128}));                    // one query row
  // The other tile shapes: at D = 64 192 × 128 (128 × 128 under a mask that leaves a row fewer
  // than 4K keys), at 256 128 × 80 (128 × 64 under a mask)
  for (const int head_dim : {64, 256}) {
    run_case<TypeParam>(hopper({2, 300, 257, 4, 2, head_dim}));
    run_case<TypeParam>(hopper({1, 257, 513, 4, 1, head_dim, /*causal=*/true}));
    run_case<TypeParam>(hopper({1, 200, 600, 2, 2, head_dim, false, 100, 50}));
    run_case<TypeParam>(hopper({1, 130, 140, 2, 2, head_dim, true, -1, -1, /*softcap=*/5.0f}));
  }
  run_case<TypeParam>(hopper({1, 200, 4200, 2, 1, 64, /*causal=*/true}));       // masked, 192-row blocks
  run_case<TypeParam>(hopper({1, 300, 4500, 2, 2, 64, false, 4000, 200}));     // a window 4201 keys wide
  for (const int head_dim : {64, 128, 256}) {  // 144 (D = 64) or 198 equal tiles, more than 132 SMs:
    // persistent CTAs taking a second tile, whose Q and first K / V load during the first's end
    run_case<TypeParam>(hopper({3, 1400, 130, 6, 2, head_dim}));
    // causal: 132 units of query blocks (2, 0) and (1) (3 blocks of 128 rows, 66 heads ·
    // sequences): one round on the H200's SMs; the first 100 rows see no key
    run_case<TypeParam>(hopper({6, 300, 200, 11, 1, head_dim, /*causal=*/true}));
  }
  for (const int head_dim : {64, 128, 256}) {  // packed varlen: tiles that reach into the next sequence
    Case varlen{0, 0, 0, 4, 2, head_dim, /*causal=*/true};
    varlen.varlen_q = {0, 1, 7, 300, 129};
    varlen.varlen_k = {3, 0, 7, 250, 400};
    run_case<TypeParam>(hopper(varlen));
    varlen.causal = false, varlen.window_left = 40, varlen.window_right = 3;
    run_case<TypeParam>(hopper(varlen));
  }
  Case long_varlen{0, 0, 0, 4, 2, 64, /*causal=*/true};  // D = 64 causal varlen past 4K keys: 192-row blocks
  long_varlen.varlen_q = {0, 300, 129};
  long_varlen.varlen_k = {3, 4500, 400};
  run_case<TypeParam>(hopper(long_varlen));
}

TYPED_TEST(FlashFwdKernel, BlockSparseAgainstCpuReference) {
  FX_SKIP_WITHOUT_GPU();
  Case aligned{2, 256, 320, 4, 2, 64};  // blocks of the kernel's tiles: whole or skipped
  aligned.block_rows = 128, aligned.block_cols = 128;
  run_case<TypeParam>(aligned);
  Case odd{1, 150, 170, 2, 1, 128, /*causal=*/true};  // partial tiles: per-element lookups
  odd.block_rows = 7, odd.block_cols = 33;
  run_case<TypeParam>(odd);
  Case wide{1, 90, 200, 2, 2, 256, false, 30, 10};  // windows; one block row taller than Sq
  wide.block_rows = 100, wide.block_cols = 16;
  run_case<TypeParam>(wide);
}

// ---- GPU: the merge kernel against a CPU merge ----------------------------------------------

// run_merge_attention_states on (B, S, H, D) halves against the merge in double precision: o_b a
// strided view (every other head of a wider tensor), rows where one side or both are empty (lse
// −inf, their o NaN: a weight of 0 must not read it), the output poisoned first.
template <typename T>
class MergeStatesKernel : public ::testing::Test {};
using MergeTypes = ::testing::Types<float, __half, __nv_bfloat16>;
TYPED_TEST_SUITE(MergeStatesKernel, MergeTypes);

TYPED_TEST(MergeStatesKernel, AgainstCpuMerge) {
  FX_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const int batch = 2, seqlen = 37, heads = 3, head_dim = 72;
  const size_t rows = size_t(batch) * seqlen * heads;
  std::mt19937 rng(uint32_t(17 + sizeof(T)));
  std::vector<T> o_a = flashext_test::random_values<T>(rows * head_dim, rng, 1.0f);
  std::vector<T> o_b_wide = flashext_test::random_values<T>(2 * rows * head_dim, rng, 1.0f);  // heads 2 apart
  std::vector<float> lse_a = flashext_test::random_values<float>(rows, rng, 3.0f);
  std::vector<float> lse_b = flashext_test::random_values<float>(rows, rng, 3.0f);
  // lse layout (B, H, S); row r = (b, h, s): one side empty on some rows, both on others
  for (size_t r = 0; r < rows; r += 7) lse_a[r] = -INFINITY;
  for (size_t r = 0; r < rows; r += 5) lse_b[r] = -INFINITY;
  const auto o_index = [&](int b, int s, int h, int d) {
    return ((size_t(b) * seqlen + s) * heads + h) * head_dim + d;
  };
  const auto o_b_index = [&](int b, int s, int h, int d) {
    return ((size_t(b) * seqlen + s) * 2 * heads + 2 * h) * head_dim + d;
  };
  const auto lse_index = [&](int b, int h, int s) { return (size_t(b) * heads + h) * seqlen + s; };
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int s = 0; s < seqlen; ++s) {
        const size_t r = lse_index(b, h, s);
        for (int d = 0; d < head_dim; ++d) {
          if (std::isinf(lse_a[r])) o_a[o_index(b, s, h, d)] = flashext_test::from_float<T>(NAN);
          if (std::isinf(lse_b[r])) o_b_wide[o_b_index(b, s, h, d)] = flashext_test::from_float<T>(NAN);
        }
      }
  DeviceBuffer d_oa(o_a.size() * sizeof(T)), d_ob(o_b_wide.size() * sizeof(T)), d_o(o_a.size() * sizeof(T));
  DeviceBuffer d_la(rows * 4), d_lb(rows * 4), d_l(rows * 4);
  flashext_test::upload(d_oa.get(), o_a);
  flashext_test::upload(d_ob.get(), o_b_wide);
  flashext_test::upload(d_la.get(), lse_a);
  flashext_test::upload(d_lb.get(), lse_b);
  flashext::MergeStatesParams p;
  p.o_a = d_oa.get(), p.o_b = d_ob.get(), p.o = d_o.get();
  p.lse_a = d_la.at<float>(), p.lse_b = d_lb.at<float>(), p.lse = d_l.at<float>();
  p.batch = batch, p.seqlen = seqlen, p.heads = heads, p.head_dim = head_dim;
  const int64_t dense[3] = {int64_t(seqlen) * heads * head_dim, int64_t(heads) * head_dim, head_dim};
  const int64_t wide[3] = {int64_t(seqlen) * 2 * heads * head_dim, int64_t(2) * heads * head_dim, 2 * head_dim};
  const int64_t lse_strides[3] = {int64_t(heads) * seqlen, seqlen, 1};
  std::copy(dense, dense + 3, p.o_a_strides);
  std::copy(wide, wide + 3, p.o_b_strides);
  std::copy(dense, dense + 3, p.o_strides);
  for (int64_t* st : {p.lse_a_strides, p.lse_b_strides, p.lse_strides}) std::copy(lse_strides, lse_strides + 3, st);
  p.dtype = flashext_test::dtype_of<T>();
  FX_ASSERT_CUDA(flashext::run_merge_attention_states(p, nullptr));
  FX_ASSERT_CUDA(cudaDeviceSynchronize());
  const std::vector<T> o = flashext_test::download<T>(d_o.get(), o_a.size());
  const std::vector<float> lse = flashext_test::download<float>(d_l.get(), rows);
  // a 16-bit result rounds once (half an ulp: 2^-11 relative in fp16, 2^-8 in bf16), over fp32
  // weights and sums (a few fp32 roundings: 1e-6)
  const double rel = sizeof(T) == 4 ? 1e-6 : (std::is_same_v<T, __half> ? 1e-3 : 8e-3);
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h)
      for (int s = 0; s < seqlen; ++s) {
        const size_t r = lse_index(b, h, s);
        const double la = lse_a[r], lb = lse_b[r];
        const double m = std::max(la, lb);
        if (std::isinf(m)) {
          EXPECT_TRUE(std::isinf(lse[r]) && lse[r] < 0) << "row " << r << ": both sides empty";
        } else {
          const double want_lse = m + std::log(std::exp(la - m) + std::exp(lb - m));
          EXPECT_NEAR(lse[r], want_lse, 1e-5 * std::max(1.0, std::abs(want_lse))) << "row " << r;
        }
        const double total = std::isinf(m) ? 1.0 : std::exp(la - m) + std::exp(lb - m);
        const double wa = std::isinf(la) ? 0.0 : std::exp(la - m) / total;
        const double wb = std::isinf(lb) ? 0.0 : std::exp(lb - m) / total;
        for (int d = 0; d < head_dim; ++d) {
          const double va = wa == 0.0 ? 0.0 : wa * to_float(o_a[o_index(b, s, h, d)]);
          const double vb = wb == 0.0 ? 0.0 : wb * to_float(o_b_wide[o_b_index(b, s, h, d)]);
          const double want = std::isinf(m) ? 0.0 : va + vb;
          const double got = to_float(o[o_index(b, s, h, d)]);
          // (relative to the terms, which may cancel)
          ASSERT_NEAR(got, want, rel * (std::abs(va) + std::abs(vb)) + 1e-6) << "row " << r << ", column " << d;
        }
      }
}

}  // namespace
