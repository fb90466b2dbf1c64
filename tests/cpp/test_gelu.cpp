// flashext GeLU epilogues from C++: the torch-free launch API (flashext/gelu.h) against a CPU
// reference in double. Host tests (GeLU math, launch planning, argument checks) always run; GPU
// tests GTEST_SKIP() when no CUDA device is present.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common.h"
#include "common/gelu_math.h"
#include "flashext/gelu.h"
#include "gelu/plan.h"

namespace {

using flashext::DType;
using flashext::GeluApprox;
using flashext_test::DeviceBuffer;
using flashext_test::dtype_of;
using flashext_test::from_float;
using flashext_test::random_values;
using flashext_test::to_float;

// ---- double-precision reference -------------------------------------------------------------

double ref_gelu(double z, bool tanh_form) {
  if (tanh_form) {
    const double u = std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z);
    return 0.5 * z * (1.0 + std::tanh(u));
  }
  return 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)));
}

double ref_gelu_grad(double z, bool tanh_form) {
  if (tanh_form) {
    const double k = std::sqrt(2.0 / M_PI);
    const double t = std::tanh(k * (z + 0.044715 * z * z * z));
    return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * z * z);
  }
  return 0.5 * (1.0 + std::erf(z / std::sqrt(2.0))) + z * std::exp(-0.5 * z * z) / std::sqrt(2.0 * M_PI);
}

// ---- host tests: the math the kernels share -------------------------------------------------

TEST(GeluMath, Fp32FormsMatchDoubleReference) {
  for (int tanh_form = 0; tanh_form < 2; ++tanh_form) {
    double worst = 0.0, worst_grad = 0.0;
    for (int i = -4000; i <= 4000; ++i) {
      const float z = float(i) / 400.0f;  // [-10, 10]
      worst = std::max(worst, std::abs(flashext::gelu(z, tanh_form) - ref_gelu(z, tanh_form)));
      worst_grad = std::max(worst_grad, std::abs(flashext::gelu_grad(z, tanh_form) - ref_gelu_grad(z, tanh_form)));
    }
    EXPECT_LT(worst, 2e-6) << "tanh_form=" << tanh_form;
    EXPECT_LT(worst_grad, 1e-6) << "tanh_form=" << tanh_form;
  }
}

// The Mills-ratio fits behind the 16-bit exact form (no erff): relative accuracy of the tail
// Q(x) = 1 − Φ(x) everywhere it is a normal float — deep in the left tail too, where
// gelu(z) = z·Φ(z) is tiny but representable in bf16 — and the 16-bit results they feed never more
// than one rounding step from the correctly rounded value. The references use erfc: 1 + erf(z/√2)
// cancels in double as well.
double ref_upper_tail(double x) { return 0.5 * std::erfc(x / std::sqrt(2.0)); }
double ref_gelu_erfc(double z) { return z * ref_upper_tail(-z); }
double ref_gelu_erfc_grad(double z) { return ref_upper_tail(-z) + z * std::exp(-0.5 * z * z) / std::sqrt(2.0 * M_PI); }

template <typename T>
double round_to(double v) { return to_float(from_float<T>(float(v))); }

// The distance between neighbouring values of T around |v| (subnormal steps below the normals).
template <typename T>
double rounding_step(double v) {
  constexpr int kMantissa = std::is_same_v<T, __half> ? 10 : 7;
  constexpr int kMinExponent = std::is_same_v<T, __half> ? -14 : -126;
  const int exponent = v == 0.0 ? kMinExponent : std::max(kMinExponent, int(std::floor(std::log2(std::abs(v)))));
  return std::ldexp(1.0, exponent - kMantissa);
}

// Worst relative error of Q(x) = gauss_exp(x)·mills<kBf16>(x) and of gelu_erf_16<kBf16> (fp32,
// before rounding) against the double references, wherever the reference is a normal float.
template <bool kBf16>
std::pair<double, double> worst_tail_and_gelu() {
  double worst_tail = 0.0, worst_gelu = 0.0;
  for (int i = 0; i <= 1320000; ++i) {  // x in [0, 13.2]: Q(x) down to 5e-40 (ex2 flushes below 2^-126)
    const float x = float(i) * 1e-5f;
    const double want = ref_upper_tail(x);
    if (want < 1.2e-38) break;  // past fp32's normal range
    worst_tail = std::max(worst_tail, std::abs(flashext::gauss_exp(x) * flashext::mills<kBf16>(x) - want) / want);
    for (const float z : {x, -x}) {
      const double want_gelu = ref_gelu_erfc(z);
      if (std::abs(want_gelu) >= 1.2e-38) {
        worst_gelu = std::max(worst_gelu, std::abs(flashext::gelu_erf_16<kBf16>(z) - want_gelu) / std::abs(want_gelu));
      }
    }
  }
  return {worst_tail, worst_gelu};
}

TEST(GeluMath, MillsFitsAreRelativelyAccurate) {
  const auto [tail5, gelu5] = worst_tail_and_gelu<false>();  // degree 5, fp16 results
  EXPECT_LT(tail5, 2e-5);  // the fit: 5e-6; evaluated in fp32: 1.1e-5
  EXPECT_LT(gelu5, 2e-5);
  const auto [tail4, gelu4] = worst_tail_and_gelu<true>();  // degree 4, bf16 results
  EXPECT_LT(tail4, 4e-5);  // the fit: 2.9e-5
  EXPECT_LT(gelu4, 4e-5);
  double worst_precise = 0.0;
  for (int i = 0; i <= 300000; ++i) {  // where Φ is large and gelu' cancels: absolute error
    const float x = float(i) * 1e-5f;
    worst_precise = std::max(worst_precise, std::abs(flashext::gauss_exp(x) * flashext::mills_precise(x) - ref_upper_tail(x)));
  }
  EXPECT_LT(worst_precise, 3e-7);
}

TEST(GeluMath, ErffFreeFormMapsInfinitiesLikePyTorch) {
  // gelu(+inf) = inf, gelu(−inf) = −inf · 0 = NaN, gelu(NaN) = NaN, as in PyTorch.
  for (const float inf_result : {flashext::gelu_erf_16<false>(INFINITY), flashext::gelu_erf_16<true>(INFINITY)}) {
    EXPECT_EQ(inf_result, INFINITY);
  }
  EXPECT_TRUE(std::isnan(flashext::gelu_erf_16<false>(-INFINITY)));
  EXPECT_TRUE(std::isnan(flashext::gelu_erf_16<true>(-INFINITY)));
  EXPECT_TRUE(std::isnan(flashext::gelu_erf_16<true>(NAN)));
}

template <typename T>
void expect_16bit_gelu_within_one_rounding() {
  // Every bf16/fp16 value of z in [-16, 16]: the rounded gelu_erf_16 and gelu_erf_16_grad against
  // the correctly rounded double reference, in units of the result's rounding step.
  int off_by_one = 0, total = 0;
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const uint16_t b16 = uint16_t(bits);
    T zt;
    std::memcpy(&zt, &b16, 2);
    const float z = to_float(zt);
    if (!std::isfinite(z) || std::abs(z) > 16.0f) continue;
    for (int grad = 0; grad < 2; ++grad) {
      const double want = grad ? ref_gelu_erfc_grad(z) : ref_gelu_erfc(z);
      const double got = round_to<T>(grad ? flashext::gelu_erf_16_grad(z) : flashext::gelu_erf_16<std::is_same_v<T, __nv_bfloat16>>(z));
      ++total;
      if (got != round_to<T>(want)) {
        ++off_by_one;
        EXPECT_LE(std::abs(got - want), rounding_step<T>(want)) << "z=" << z << " grad=" << grad << ": " << got
                                                                << " against " << want;
      }
    }
  }
  EXPECT_LT(off_by_one, total / 100) << off_by_one << " of " << total << " results off the correctly rounded value";
}

TEST(GeluMath, ErffFreeFormWithinOneRoundingStepBf16) { expect_16bit_gelu_within_one_rounding<__nv_bfloat16>(); }
TEST(GeluMath, ErffFreeFormWithinOneRoundingStepFp16) { expect_16bit_gelu_within_one_rounding<__half>(); }

TEST(GeluMath, LargeArgumentsKeepExactLimitsAndNoNaN) {
  EXPECT_EQ(flashext::tanh_parts(1e4f).one_plus_t, 2.0f);
  EXPECT_LT(flashext::tanh_parts(-1e4f).one_plus_t, 1e-30f);  // u clamped to −40: e^{−80}
  EXPECT_LT(flashext::tanh_parts(1e4f).sech2, 1e-30f);
  EXPECT_GT(flashext::tanh_parts(-9.0f).sech2, 0.0f);  // 1 − t·t would round to 0 here
  EXPECT_LT(std::abs(flashext::gelu_tanh(-1e4f)), 1e-20f);
  EXPECT_FALSE(std::isnan(flashext::gelu_tanh_grad(1e4f)));
  EXPECT_FALSE(std::isnan(flashext::gelu_erf_grad(-1e4f)));
}

// ---- host tests: launch planning ------------------------------------------------------------

TEST(BiasGeluPlan, CoversEveryRowAndColumnOnce) {
  using flashext::RowColPlan;
  const int64_t cases[][2] = {{1, 1}, {7, 3}, {256, 16384}, {8192, 16384}, {1, 1 << 30},
                              {int64_t(1) << 31, 1}, {100003, 24}, {33, 4096}};
  for (const auto& c : cases) {
    for (int vec : {1, 4, 8}) {
      for (int64_t max_groups : {int64_t(1), int64_t(66), int64_t(INT64_MAX)}) {
        for (int row_unroll : {1, 2, 4}) {
          const int64_t rows = c[0], cols = c[1];
          const RowColPlan plan = flashext::plan_bias_gelu(rows, cols, vec, max_groups, row_unroll);
          SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + " vec " + std::to_string(vec) +
                       " unroll " + std::to_string(row_unroll));
          EXPECT_GE(plan.grid_x * RowColPlan::kColThreads * vec, cols);
          EXPECT_LT((plan.grid_x - 1) * RowColPlan::kColThreads * vec, cols);
          EXPECT_GE(plan.grid_y * plan.rows_per_block, rows);  // every row has a group
          EXPECT_LT((plan.grid_y - 1) * plan.rows_per_block, rows);  // no empty group
          EXPECT_LE(plan.grid_y, std::min<int64_t>(max_groups, 65535));
          EXPECT_GE(plan.grid_y, 1);
          EXPECT_EQ(plan.row_unroll, row_unroll);  // what launch_bias_gelu instantiates for
        }
      }
    }
  }
}

TEST(BiasGeluPlan, OneWaveForwardsTakeTheRing) {
  // 256 x 16384 16-bit (bench_gelu's small shape): 64 x 8 = 512 blocks, one wave at 4 per SM
  const flashext::RowColPlan few = flashext::plan_bias_gelu(256, 16384, 8, INT64_MAX, 4);
  EXPECT_EQ(few.grid_x * few.grid_y, 512);
  EXPECT_TRUE(flashext::bias_gelu_fwd_ring(few, 132));
  EXPECT_FALSE(flashext::bias_gelu_fwd_ring(few, 100));  // two waves on a smaller GPU
  const flashext::RowColPlan many = flashext::plan_bias_gelu(8192, 16384, 8, INT64_MAX, 4);
  EXPECT_FALSE(flashext::bias_gelu_fwd_ring(many, 132));
  const flashext::RowColPlan scalar = flashext::plan_bias_gelu(256, 16383, 1, INT64_MAX, 4);  // unaligned: no 16-byte packs
  EXPECT_FALSE(flashext::bias_gelu_fwd_ring(scalar, 132));
}

TEST(BiasGeluPlan, Fp32ForwardTakesFourRowsOverManyWaves) {
  // 8192 x 16384 (bench_gelu's large shape): 128 x 256 = 32768 blocks at 4 rows, 62 waves of 4 per SM
  EXPECT_EQ(flashext::bias_gelu_fwd_rows_fp32(8192, 16384, 4, 132), flashext::kBiasRowUnrollManyWaves);
  EXPECT_EQ(flashext::bias_gelu_fwd_rows_fp32(256, 16384, 4, 132), 2);  // 1024 blocks: two waves
  EXPECT_EQ(flashext::bias_gelu_fwd_rows_fp32(8192, 16384, 1, 132), 2);  // unaligned: the scalar kernel
  EXPECT_EQ(flashext::bias_gelu_fwd_rows_fp32(1024, 16384, 4, 132), flashext::kBiasRowUnrollManyWaves);  // 4096 blocks
  // the line: 4 waves of 4 blocks on 132 SMs = 2112 blocks = 33 column segments x 64 row groups
  EXPECT_EQ(flashext::bias_gelu_fwd_rows_fp32(2048, 33 * 128, 4, 132), flashext::kBiasRowUnrollManyWaves);
  EXPECT_EQ(flashext::bias_gelu_fwd_rows_fp32(2016, 33 * 128, 4, 132), 2);  // 63 row groups
  EXPECT_EQ(flashext::bias_gelu_fwd_rows_fp32(2016, 33 * 128, 4, 100), flashext::kBiasRowUnrollManyWaves);
}

TEST(BiasGeluPlan, FewRowsOfWideColumnsTakeOnePass) {
  // 256 x 16384 (bench_gelu's small shape): 256 strips of 64 columns (16-bit), 512 of 32 (fp32)
  EXPECT_TRUE(flashext::bias_gelu_bwd_one_pass(256, 16384, 8, 132));
  EXPECT_TRUE(flashext::bias_gelu_bwd_one_pass(256, 16384, 4, 132));
  EXPECT_TRUE(flashext::bias_gelu_bwd_one_pass(1, 8448, 8, 132));  // exactly one strip per SM
  EXPECT_TRUE(flashext::bias_gelu_bwd_one_pass(1, 8392, 8, 132));  // 131 full strips and a part one
  EXPECT_FALSE(flashext::bias_gelu_bwd_one_pass(1, 8384, 8, 132));  // 131 strips
  EXPECT_TRUE(flashext::bias_gelu_bwd_one_pass(flashext::BiasBwdOnePass::kMaxRows, 16384, 8, 132));
  EXPECT_FALSE(flashext::bias_gelu_bwd_one_pass(flashext::BiasBwdOnePass::kMaxRows + 1, 16384, 8, 132));
  EXPECT_FALSE(flashext::bias_gelu_bwd_one_pass(8192, 16384, 8, 132));  // many rows: two kernels
  EXPECT_FALSE(flashext::bias_gelu_bwd_one_pass(256, 16384, 1, 132));  // unaligned: scalar path
  EXPECT_FALSE(flashext::bias_gelu_bwd_one_pass(256, 4096, 8, 132));  // 128 strips for 132 SMs
}

TEST(BiasGeluPlan, VectorWidthFollowsAlignment) {
  alignas(16) static char buffer[256];
  const void* aligned[] = {buffer, buffer + 32};
  const void* shifted[] = {buffer, buffer + 2};
  EXPECT_EQ(flashext::bias_gelu_vec_width(aligned, 2, 64, 64, DType::kBFloat16), 8);
  EXPECT_EQ(flashext::bias_gelu_vec_width(aligned, 2, 64, 64, DType::kFloat32), 4);
  EXPECT_EQ(flashext::bias_gelu_vec_width(shifted, 2, 64, 64, DType::kBFloat16), 1);
  EXPECT_EQ(flashext::bias_gelu_vec_width(aligned, 2, 60, 64, DType::kBFloat16), 1);  // cols % 8
  EXPECT_EQ(flashext::bias_gelu_vec_width(aligned, 2, 64, 68, DType::kBFloat16), 1);  // stride % 8
}

TEST(GeluLaunch, RefusesBadSizesBeforeLaunching) {
  flashext::AddGeluParams add;
  add.n = -1;
  EXPECT_EQ(flashext::run_add_gelu_fwd(add, nullptr), cudaErrorInvalidValue);
  flashext::BiasGeluParams bias;
  bias.rows = 4;
  bias.cols = 8;
  bias.x_row_stride = 4;  // rows would overlap
  EXPECT_EQ(flashext::run_bias_gelu_fwd(bias, nullptr), cudaErrorInvalidValue);
  add.n = 0;  // empty: nothing to launch
  EXPECT_EQ(flashext::run_add_gelu_fwd(add, nullptr), cudaSuccess);
}

// ---- GPU tests ------------------------------------------------------------------------------

// One rounding of the exact value: a relative ulp of the storage type, plus fp32 math slack.
template <typename T> double tolerance(double ref) {
  const double ulp = sizeof(T) == 4 ? 2e-6 : (std::is_same_v<T, __half> ? 1.0 / 1024 : 1.0 / 128);
  return ulp * std::max(1.0, std::abs(ref));
}

template <typename T>
void run_add_gelu_case(int64_t n, int offset, GeluApprox approx) {
  SCOPED_TRACE("n=" + std::to_string(n) + " offset=" + std::to_string(offset) + " dtype=" +
               flashext::dtype_name(dtype_of<T>()) + " tanh=" + std::to_string(int(approx)));
  std::mt19937 rng(uint32_t(n * 31 + offset));
  const auto x = random_values<T>(n, rng, 2.0f), y = random_values<T>(n, rng, 2.0f), g = random_values<T>(n, rng, 1.0f);
  const size_t bytes = (n + offset) * sizeof(T);
  DeviceBuffer dx(bytes), dy(bytes), dg(bytes), dout(bytes), dgrad(bytes);
  // `offset` elements in: pointers that are not 16-byte aligned take the scalar path.
  flashext_test::upload(dx.at<T>(offset), x);
  flashext_test::upload(dy.at<T>(offset), y);
  flashext_test::upload(dg.at<T>(offset), g);

  flashext::AddGeluParams fwd;
  fwd.x = dx.at<T>(offset);
  fwd.y = dy.at<T>(offset);
  fwd.out = dout.at<T>(0);
  fwd.n = n;
  fwd.dtype = dtype_of<T>();
  fwd.approximate = approx;
  FX_ASSERT_CUDA(flashext::run_add_gelu_fwd(fwd, nullptr));
  flashext::AddGeluBwdParams bwd;
  bwd.grad_out = dg.at<T>(offset);
  bwd.x = fwd.x;
  bwd.y = fwd.y;
  bwd.grad_in = dgrad.at<T>(0);
  bwd.n = n;
  bwd.dtype = fwd.dtype;
  bwd.approximate = approx;
  FX_ASSERT_CUDA(flashext::run_add_gelu_bwd(bwd, nullptr));
  FX_ASSERT_CUDA(cudaDeviceSynchronize());

  const auto out = flashext_test::download<T>(fwd.out, n), grad = flashext_test::download<T>(bwd.grad_in, n);
  const bool tanh_form = approx == GeluApprox::kTanh;
  for (int64_t i = 0; i < n; ++i) {
    const double z = double(to_float(x[i])) + double(to_float(y[i]));
    const double want = ref_gelu(z, tanh_form), want_grad = to_float(g[i]) * ref_gelu_grad(z, tanh_form);
    ASSERT_NEAR(to_float(out[i]), want, tolerance<T>(want)) << "out[" << i << "]";
    ASSERT_NEAR(to_float(grad[i]), want_grad, tolerance<T>(want_grad)) << "grad[" << i << "]";
  }
}

template <typename T>
void run_bias_gelu_case(int64_t rows, int64_t cols, int64_t row_stride, GeluApprox approx) {
  SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + " stride " + std::to_string(row_stride) +
               " dtype=" + flashext::dtype_name(dtype_of<T>()));
  std::mt19937 rng(uint32_t(rows * 131 + cols));
  const auto x = random_values<T>(rows * row_stride, rng, 2.0f), bias = random_values<T>(cols, rng, 2.0f),
             g = random_values<T>(rows * cols, rng, 1.0f);
  DeviceBuffer dx(x.size() * sizeof(T)), db(cols * sizeof(T)), dg(g.size() * sizeof(T)),
      dout(g.size() * sizeof(T)), dgx(g.size() * sizeof(T)), dgb(cols * sizeof(T));
  flashext_test::upload(dx.get(), x);
  flashext_test::upload(db.get(), bias);
  flashext_test::upload(dg.get(), g);

  flashext::BiasGeluParams fwd;
  fwd.x = dx.get();
  fwd.bias = db.get();
  fwd.out = dout.get();
  fwd.rows = rows;
  fwd.cols = cols;
  fwd.x_row_stride = row_stride;
  fwd.dtype = dtype_of<T>();
  fwd.approximate = approx;
  FX_ASSERT_CUDA(flashext::run_bias_gelu_fwd(fwd, nullptr));

  flashext::BiasGeluBwdParams bwd;
  bwd.grad_out = dg.get();
  bwd.x = dx.get();
  bwd.bias = db.get();
  bwd.grad_x = dgx.get();
  bwd.grad_bias = dgb.get();
  bwd.rows = rows;
  bwd.cols = cols;
  bwd.x_row_stride = row_stride;
  bwd.dtype = fwd.dtype;
  bwd.approximate = approx;
  const size_t workspace_bytes = flashext::bias_gelu_bwd_workspace_bytes(bwd);
  const void* ptrs[] = {dg.get(), dx.get(), db.get(), dgx.get()};
  const int vec = flashext::bias_gelu_vec_width(ptrs, 4, cols, row_stride, dtype_of<T>());
  int sm_count = 0;
  FX_ASSERT_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0));
  const bool one_pass = flashext::bias_gelu_bwd_one_pass(rows, cols, vec, sm_count);
  EXPECT_EQ(workspace_bytes == 0, one_pass);  // one pass: no partial sums
  if (!one_pass) {  // the two-kernel path refuses to run without its workspace
    EXPECT_EQ(flashext::run_bias_gelu_bwd(bwd, nullptr), cudaErrorInvalidValue);
  }
  DeviceBuffer workspace(workspace_bytes);
  bwd.workspace = static_cast<float*>(workspace.get());
  FX_ASSERT_CUDA(flashext::run_bias_gelu_bwd(bwd, nullptr));
  FX_ASSERT_CUDA(cudaDeviceSynchronize());

  const auto out = flashext_test::download<T>(dout.get(), g.size()), gx = flashext_test::download<T>(dgx.get(), g.size()),
             gb = flashext_test::download<T>(dgb.get(), cols);
  const bool tanh_form = approx == GeluApprox::kTanh;
  std::vector<double> bias_sum(cols, 0.0), bias_abs(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double z = double(to_float(x[r * row_stride + c])) + double(to_float(bias[c]));
      const double want = ref_gelu(z, tanh_form);
      const double want_grad = to_float(g[r * cols + c]) * ref_gelu_grad(z, tanh_form);
      bias_sum[c] += want_grad;
      bias_abs[c] += std::abs(want_grad);
      ASSERT_NEAR(to_float(out[r * cols + c]), want, tolerance<T>(want)) << "out[" << r << "," << c << "]";
      ASSERT_NEAR(to_float(gx[r * cols + c]), want_grad, tolerance<T>(want_grad)) << "grad_x[" << r << "," << c << "]";
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    // fp32 accumulation: error grows with the sum of magnitudes, then one rounding to T
    ASSERT_NEAR(to_float(gb[c]), bias_sum[c], 1e-6 * bias_abs[c] + tolerance<T>(bias_sum[c])) << "grad_bias[" << c << "]";
  }
}

template <typename T>
class GeluKernels : public ::testing::Test {};
using StorageTypes = ::testing::Types<float, __half, __nv_bfloat16>;
TYPED_TEST_SUITE(GeluKernels, StorageTypes);

TYPED_TEST(GeluKernels, AddGeluMatchesCpuReference) {
  FX_SKIP_WITHOUT_GPU();
  for (int64_t n : {1, 7, 1023, 100003}) {
    for (int offset : {0, 1}) {
      for (GeluApprox approx : {GeluApprox::kNone, GeluApprox::kTanh}) run_add_gelu_case<TypeParam>(n, offset, approx);
    }
  }
}

TYPED_TEST(GeluKernels, BiasGeluMatchesCpuReference) {
  FX_SKIP_WITHOUT_GPU();
  run_bias_gelu_case<TypeParam>(1, 1, 1, GeluApprox::kNone);
  run_bias_gelu_case<TypeParam>(7, 13, 13, GeluApprox::kTanh);  // scalar path (cols % vec)
  run_bias_gelu_case<TypeParam>(113, 256, 256, GeluApprox::kNone);
  run_bias_gelu_case<TypeParam>(300, 264, 1000, GeluApprox::kTanh);  // strided rows
  run_bias_gelu_case<TypeParam>(2049, 64, 64, GeluApprox::kNone);  // several row groups
  // 4 × 257 = 1028 blocks: more than one wave on GPUs with < 257 SMs, so the 16-bit forward takes
  // its register path (every smaller case above fits in one wave: the cp.async ring,
  // bias_gelu_fwd_ring); 8195 rows leave a part-filled last row group.
  run_bias_gelu_case<TypeParam>(8195, 1024, 1024, GeluApprox::kNone);
  // 33 x 257 blocks at 4 rows: over 4 waves on GPUs with up to 530 SMs, so the vectorized fp32
  // forward keeps 4 rows in flight (bias_gelu_fwd_rows_fp32); a part-filled last column segment
  // (4100 = 32 x 128 + 4) and row group (8195 = 256 x 32 + 3), strided rows.
  run_bias_gelu_case<TypeParam>(8195, 4100, 4104, GeluApprox::kTanh);
  // Few rows of wide aligned columns: the backward in one launch (BiasBwdOnePass) on GPUs with up
  // to 251 SMs; 16008 columns leave a part-filled last strip, 67 rows a part-filled row batch.
  run_bias_gelu_case<TypeParam>(67, 16008, 16008, GeluApprox::kNone);
  run_bias_gelu_case<TypeParam>(67, 16008, 16040, GeluApprox::kTanh);  // strided rows
  run_bias_gelu_case<TypeParam>(5, 16008, 16008, GeluApprox::kNone);  // most row threads without a row
}

}  // namespace
