// The KV cache's storage rounding (backend/kv_quant.hpp), the reference the CUDA kernels follow: FP8 E4M3
// with a scale per (position, KV head) = amax / 448, read back as code * scale.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/kv_quant.hpp"
#include "core/dtype.hpp"

namespace deltaflow::backend {
namespace {

TEST(KvQuant, Fp8RowIsWithinE4m3PrecisionAndKeepsItsMaximum) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 2.0f);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> x(128);
    for (auto& v : x) v = n(rng) * (trial % 5 == 0 ? 1e-3f : 1.0f);
    std::vector<float> q = x;
    const float scale = round_kv_row(q.data(), 128, KvCacheDtype::kFp8);
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    EXPECT_FLOAT_EQ(scale, amax / 448.0f);
    for (size_t i = 0; i < x.size(); ++i) {
      // E4M3 keeps 3 mantissa bits: a normal value is within 2^-4 of itself; below 2^-6 (subnormal, in units
      // of the scale) the step is 2^-9 of the scale.
      const float tol = std::max(std::fabs(x[i]) * 0x1p-4f, scale * 0x1p-10f);
      EXPECT_LE(std::fabs(q[i] - x[i]), tol) << i;
      if (std::fabs(x[i]) == amax) {
        EXPECT_FLOAT_EQ(std::fabs(q[i]), amax);  // 448 is exact in E4M3
      }
    }
  }
}

TEST(KvQuant, ZeroRowBf16AndAuto) {
  std::vector<float> z(8, 0.0f);
  EXPECT_EQ(round_kv_row(z.data(), 8, KvCacheDtype::kFp8), 1.0f);
  for (float v : z) EXPECT_EQ(v, 0.0f);
  std::vector<float> x = {1.0f + 0x1p-12f, -3.14159f, 1e-20f};
  std::vector<float> a = x;
  round_kv_row(a.data(), 3, KvCacheDtype::kAuto);
  EXPECT_EQ(a, x);
  round_kv_row(a.data(), 3, KvCacheDtype::kBf16);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(a[i], core::round_bf16(x[i]));
  EXPECT_STREQ(kv_cache_dtype_name(KvCacheDtype::kFp8), "fp8");
}

}  // namespace
}  // namespace deltaflow::backend
