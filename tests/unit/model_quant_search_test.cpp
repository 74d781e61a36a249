// `deltaflow quantize --method mse|gptq` (model/quant/search.hpp, gptq.hpp) against the exact recipes on
// random weights: the scale search never has a higher error than ModelOpt's recipe, group by group (block by
// block, tensor by tensor), is lower in total, and stays in the published layout (E2M1 nibbles, positive
// finite E4M3 block scales, BF16 or fp32 scales, the same shapes); GPTQ moves a layer's output on its
// calibration inputs less than either.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.hpp"
#include "model/quant/format.hpp"
#include "model/quant/gptq.hpp"
#include "model/quant/quantize.hpp"
#include "model/quant/search.hpp"

namespace deltaflow {
namespace {

using namespace model::quant;

// Weights with the shapes quantizers meet: mostly normal, a heavy tail, some outliers and an all-zero group.
std::vector<float> random_weights(int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::student_t_distribution<float> heavy(3.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(N * K));
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = u(rng) < 0.3f ? 0.01f * heavy(rng) : normal(rng);
    if (u(rng) < 0.002f) w[i] *= 40.0f;
    w[i] = core::round_bf16(w[i]);  // checkpoints are BF16
  }
  std::fill_n(w.begin() + 16, 16, 0.0f);  // row 0, group 1
  return w;
}

std::vector<float> random_column_weights(int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::lognormal_distribution<float> ln(0.0f, 1.0f);
  std::vector<float> h(static_cast<size_t>(K));
  for (auto& x : h) x = ln(rng);
  return h;
}

bool valid_e4m3_scale(uint8_t c) {
  return c != 0 && c < 0x7F;  // positive (sign bit clear), not zero, not NaN
}

bool valid_e4m3(uint8_t c) {
  return (c & 0x7F) != 0x7F;  // not NaN
}

// NVFP4 element k of row n, dequantized as the loader does.
float nvfp4_value(const Nvfp4Weight& q, int64_t K, int64_t n, int64_t k) {
  const uint8_t byte = q.packed[static_cast<size_t>((n * K + k) / 2)];
  const uint8_t code = k & 1 ? byte >> 4 : byte & 0xF;
  return e2m1_to_f32(code) *
         (core::f8e4m3_to_f32(q.scale[static_cast<size_t>(n * (K / kNvfp4Group) + k / kNvfp4Group)]) *
          q.scale_2);
}

double nvfp4_group_err(const Nvfp4Weight& q, const float* w, const float* h, int64_t K, int64_t n,
                       int64_t g) {
  double e = 0;
  for (int64_t j = 0; j < kNvfp4Group; ++j) {
    const int64_t k = g * kNvfp4Group + j;
    const double d = w[n * K + k] - nvfp4_value(q, K, n, k);
    e += (h ? h[k] : 1.0) * d * d;
  }
  return e;
}

TEST(QuantSearch, Nvfp4NeverWorseThanExactPerGroupAndStaysInLayout) {
  const int64_t N = 48, K = 256;
  for (uint32_t seed : {1u, 2u, 3u}) {
    const auto w = random_weights(N, K, seed);
    const auto hv = random_column_weights(K, seed + 100);
    for (const float* h : {static_cast<const float*>(nullptr), hv.data()}) {
      const float amax = abs_max(w.data(), w.size());
      const Nvfp4Weight exact = quantize_nvfp4_modelopt(w.data(), N, K, amax);
      double reported = 0;
      const Nvfp4Weight mse = quantize_nvfp4_search(w.data(), N, K, amax / 2688.0f, h, &reported);
      ASSERT_EQ(mse.packed.size(), static_cast<size_t>(N * K / 2));
      ASSERT_EQ(mse.scale.size(), static_cast<size_t>(N * K / kNvfp4Group));
      EXPECT_EQ(mse.scale_2, exact.scale_2);
      double total_exact = 0, total_mse = 0;
      int better = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t g = 0; g < K / kNvfp4Group; ++g) {
          EXPECT_TRUE(valid_e4m3_scale(mse.scale[static_cast<size_t>(n * (K / kNvfp4Group) + g)]));
          const double e0 = nvfp4_group_err(exact, w.data(), h, K, n, g);
          const double e1 = nvfp4_group_err(mse, w.data(), h, K, n, g);
          EXPECT_LE(e1, e0) << "row " << n << " group " << g;
          better += e1 < e0;
          total_exact += e0;
          total_mse += e1;
        }
      EXPECT_NEAR(reported, total_mse, 1e-9 * total_mse);
      // The search does something: most groups and the total improve.
      EXPECT_GT(better, N * K / kNvfp4Group / 4);
      EXPECT_LT(total_mse, 0.95 * total_exact);
    }
  }
}

TEST(QuantSearch, Nvfp4GroupSharesOneSearchedGlobalScale) {
  const int64_t K = 128;
  const auto a = random_weights(32, K, 7), b = random_weights(16, K, 8);
  const float amax = std::max(abs_max(a.data(), a.size()), abs_max(b.data(), b.size()));
  const auto q = quantize_nvfp4_search_group({a.data(), b.data()}, {32, 16}, K, amax, nullptr);
  ASSERT_EQ(q.size(), 2u);
  EXPECT_EQ(q[0].scale_2, q[1].scale_2);
  EXPECT_GE(q[0].scale_2, amax / 2688.0f);  // never below the amax's: no block scale past 448
  EXPECT_TRUE(std::isfinite(q[0].scale_2));
  double e_exact = 0, e_mse = 0;
  const Nvfp4Weight xa = quantize_nvfp4_modelopt(a.data(), 32, K, amax),
                    xb = quantize_nvfp4_modelopt(b.data(), 16, K, amax);
  for (int64_t g = 0; g < K / kNvfp4Group; ++g) {
    for (int64_t n = 0; n < 32; ++n) {
      e_exact += nvfp4_group_err(xa, a.data(), nullptr, K, n, g);
      e_mse += nvfp4_group_err(q[0], a.data(), nullptr, K, n, g);
    }
    for (int64_t n = 0; n < 16; ++n) {
      e_exact += nvfp4_group_err(xb, b.data(), nullptr, K, n, g);
      e_mse += nvfp4_group_err(q[1], b.data(), nullptr, K, n, g);
    }
  }
  EXPECT_LT(e_mse, e_exact);
}

TEST(QuantSearch, Fp8BlockNeverWorseThanExactPerBlockAndStaysInLayout) {
  const int64_t N = 200, K = 300;  // partial blocks at both edges
  const auto w = random_weights(N, K, 11);
  const auto h = random_column_weights(K, 12);
  const Fp8BlockWeight exact = quantize_fp8_block(w.data(), N, K);
  const Fp8BlockWeight mse = quantize_fp8_block_search(w.data(), N, K, h.data());
  const int64_t bn = 2, bk = 3;
  ASSERT_EQ(mse.w.size(), static_cast<size_t>(N * K));
  ASSERT_EQ(mse.scale.size(), static_cast<size_t>(bn * bk));
  int better = 0;
  for (int64_t i = 0; i < bn; ++i)
    for (int64_t j = 0; j < bk; ++j) {
      const float s0 = core::bf16_to_f32(exact.scale[static_cast<size_t>(i * bk + j)]);
      const float s1 = core::bf16_to_f32(mse.scale[static_cast<size_t>(i * bk + j)]);
      EXPECT_TRUE(std::isfinite(s1) && s1 > 0);
      double e0 = 0, e1 = 0;
      for (int64_t n = i * 128; n < std::min(N, (i + 1) * 128); ++n)
        for (int64_t k = j * 128; k < std::min(K, (j + 1) * 128); ++k) {
          const size_t at = static_cast<size_t>(n * K + k);
          EXPECT_TRUE(valid_e4m3(mse.w[at]));
          const double d0 = w[at] - core::f8e4m3_to_f32(exact.w[at]) * s0;
          const double d1 = w[at] - core::f8e4m3_to_f32(mse.w[at]) * s1;
          e0 += h[static_cast<size_t>(k)] * d0 * d0;
          e1 += h[static_cast<size_t>(k)] * d1 * d1;
        }
      EXPECT_LE(e1, e0) << "block " << i << "," << j;
      better += e1 < e0;
    }
  EXPECT_GT(better, 0);
}

TEST(QuantSearch, Fp8TensorNeverWorseThanModelOpts) {
  const int64_t N = 64, K = 96;
  const auto w = random_weights(N, K, 21);
  const auto h = random_column_weights(K, 22);
  const Fp8TensorWeight exact = quantize_fp8_tensor_modelopt(w.data(), w.size());
  const Fp8TensorWeight mse = quantize_fp8_tensor_search(w.data(), N, K, h.data());
  ASSERT_EQ(mse.w.size(), w.size());
  EXPECT_TRUE(std::isfinite(mse.scale) && mse.scale > 0);
  for (uint8_t c : mse.w) EXPECT_TRUE(valid_e4m3(c));
  EXPECT_LE(fp8_tensor_error(w.data(), mse.w.data(), N, K, mse.scale, h.data()),
            fp8_tensor_error(w.data(), exact.w.data(), N, K, exact.scale, h.data()));
}

// ||X (W - Q)^T||^2 over the calibration rows X [T, K].
double output_error(const std::vector<float>& x, int64_t T, const std::vector<float>& w,
                    const std::vector<float>& q, int64_t N, int64_t K) {
  double e = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += x[t * K + k] * (w[n * K + k] - q[n * K + k]);
      e += s * s;
    }
  return e;
}

TEST(QuantGptq, LowersTheOutputErrorOnCorrelatedInputs) {
  const int64_t N = 32, K = 128, T = 512;
  const auto w = random_weights(N, K, 31);
  // Inputs with correlated channels of unequal scale (a few shared factors plus noise), as activations are.
  std::mt19937 rng(32);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> mix(static_cast<size_t>(8 * K)), x(static_cast<size_t>(T * K));
  for (auto& m : mix) m = nd(rng);
  const auto scale = random_column_weights(K, 33);
  for (int64_t t = 0; t < T; ++t) {
    float f[8];
    for (float& v : f) v = nd(rng);
    for (int64_t k = 0; k < K; ++k) {
      float v = 0.3f * nd(rng);
      for (int j = 0; j < 8; ++j) v += f[j] * mix[static_cast<size_t>(j * K + k)];
      x[static_cast<size_t>(t * K + k)] = v * scale[static_cast<size_t>(k)];
    }
  }
  std::vector<double> gram(static_cast<size_t>(K * K), 0.0);
  std::vector<float> h(static_cast<size_t>(K), 0.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < K; ++j) gram[i * K + j] += double(x[t * K + i]) * x[t * K + j];
  for (int64_t k = 0; k < K; ++k) h[k] = static_cast<float>(gram[k * K + k] / T);
  const auto U = gptq_factor(gram, K);
  ASSERT_EQ(U.size(), static_cast<size_t>(K * K));

  const float amax = abs_max(w.data(), w.size());
  auto dequant = [&](const Nvfp4Weight& q) {
    std::vector<float> d(w.size());
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) d[n * K + k] = nvfp4_value(q, K, n, k);
    return d;
  };
  const Nvfp4Weight exact = quantize_nvfp4_modelopt(w.data(), N, K, amax);
  const Nvfp4Weight mse = quantize_nvfp4_search(w.data(), N, K, amax / 2688.0f, h.data());
  const Nvfp4Weight gq = gptq_nvfp4(w.data(), N, K, amax / 2688.0f, U, h.data());
  for (uint8_t c : gq.scale) EXPECT_TRUE(valid_e4m3_scale(c));
  const double e_exact = output_error(x, T, w, dequant(exact), N, K);
  const double e_mse = output_error(x, T, w, dequant(mse), N, K);
  const double e_gptq = output_error(x, T, w, dequant(gq), N, K);
  EXPECT_LT(e_mse, e_exact);
  EXPECT_LT(e_gptq, 0.8 * e_mse);

  // FP8 with a fixed per-tensor scale: the codes move, the scale does not.
  const Fp8TensorWeight f8 = quantize_fp8_tensor_modelopt(w.data(), w.size());
  const auto g8 = gptq_fp8(w.data(), N, K, {f8.scale}, N, K, U);
  std::vector<float> d8(w.size()), dg(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    EXPECT_TRUE(valid_e4m3(g8[i]));
    d8[i] = core::f8e4m3_to_f32(f8.w[i]) * f8.scale;
    dg[i] = core::f8e4m3_to_f32(g8[i]) * f8.scale;
  }
  EXPECT_LT(output_error(x, T, w, dg, N, K), output_error(x, T, w, d8, N, K));
}

}  // namespace
}  // namespace deltaflow
