// The block-scaled FP8 prefill GEMM (gemm.hpp with fp8_activations.cuh): activations quantized per 128
// columns as vLLM's per-token-group quantization does (codes and scales bit for bit against the host
// quantizer), then cuBLASLt's FP8 GEMM against float64 on the dequantized weights and the quantized
// activations (tolerance 1e-3 of the largest |output|: fp32 accumulation of exact FP8 products) and against
// the unquantized activations (weight-only semantics, the CPU reference's; 4e-2: E4M3's 3 mantissa bits).
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda/fp8_activations.cuh"
#include "backend/cuda/gemm.hpp"
#include "core/dtype.hpp"
#include "gpu_test_util.hpp"
#include "model/quant/quantize.hpp"

namespace deltaflow::backend::cuda {
namespace {

using gpu_test::DevBuf;

struct Problem {
  int64_t N, K, T;
};

// Host form of quantize_fp8_1x128 on bf16 inputs.
void quantize_host(const std::vector<float>& x, int64_t T, int64_t T8, int64_t K, std::vector<uint8_t>& codes,
                   std::vector<float>& scales) {
  codes.assign(static_cast<size_t>(T8 * K), 0);
  scales.assign(static_cast<size_t>(K / 128 * T8), 1.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K / 128; ++j) {
      float amax = 0;
      for (int64_t k = 0; k < 128; ++k)
        amax = std::max(amax, std::fabs(x[static_cast<size_t>(t * K + j * 128 + k)]));
      const float s = std::max(amax, 1e-10f) / 448.0f;
      scales[static_cast<size_t>(j * T8 + t)] = s;
      for (int64_t k = 0; k < 128; ++k) {
        const size_t i = static_cast<size_t>(t * K + j * 128 + k);
        codes[i] = model::quant::f32_to_e4m3(std::clamp(x[i] / s, -448.0f, 448.0f));
      }
    }
}

void run_problem(const Problem& p, uint32_t seed) {
  const auto [N, K, T] = p;
  const int64_t T8 = fp8_gemm_rows(T);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // Activations in bf16 with an outlier column (what per-group scales are for).
  std::vector<__nv_bfloat16> x16(static_cast<size_t>(T * K));
  std::vector<float> x(static_cast<size_t>(T * K));
  for (size_t i = 0; i < x.size(); ++i) {
    const float v = nd(rng) * ((i % static_cast<size_t>(K)) == 7 ? 40.0f : 1.0f);
    x16[i] = __float2bfloat16_rn(v);
    x[i] = __bfloat162float(x16[i]);
  }
  std::vector<uint8_t> w8(static_cast<size_t>(N * K));
  for (auto& b : w8) {
    b = static_cast<uint8_t>(rng());
    if ((b & 0x7f) == 0x7f) b ^= 1;
  }
  const int64_t gr = (N + 127) / 128, gc = K / 128;
  std::vector<float> grid(static_cast<size_t>(gr * gc));
  std::uniform_real_distribution<float> u(0.5f, 2.0f);
  for (auto& s : grid) s = u(rng) / 448.0f;

  DevBuf<__nv_bfloat16> dx(x16);
  DevBuf<uint8_t> dx8(static_cast<size_t>(T8 * K)), dw8(w8);
  DevBuf<float> dxs(static_cast<size_t>(K / 128 * T8)), dgrid(grid), dy(static_cast<size_t>(T8 * N));
  ASSERT_EQ(quantize_fp8_1x128(dx.get(), K, T, T8, K, dx8.get(), dxs.get(), nullptr), cudaSuccess);
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  quantize_host(x, T, T8, K, codes, scales);
  const auto got_codes = dx8.download();
  const auto got_scales = dxs.download();
  int64_t code_diff = 0, scale_diff = 0;
  for (size_t i = 0; i < codes.size(); ++i) code_diff += got_codes[i] != codes[i];
  for (size_t i = 0; i < scales.size(); ++i) scale_diff += got_scales[i] != scales[i];
  EXPECT_EQ(code_diff, 0) << "codes that differ from the host quantizer";
  EXPECT_EQ(scale_diff, 0) << "scales that differ from the host quantizer";

  Gemm gemm;
  ASSERT_TRUE(gemm.init(32 << 20).is_ok());
  GemmCall c{dw8.get(), core::DType::kF8E4M3, N, K,           dx8.get(), T8,
             dy.get(),  core::DType::kF32,    N, dgrid.get(), dxs.get()};
  ASSERT_TRUE(gemm.supports(c)) << "cuBLASLt has no block-scaled FP8 GEMM for N=" << N << " K=" << K;
  const auto st = gemm.run(c, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.message();
  const auto y = dy.download();

  std::vector<float> ref_q(static_cast<size_t>(T * N)), ref_x(ref_q.size()), got(ref_q.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double sq = 0, sx = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double w = core::f8e4m3_to_f32(w8[static_cast<size_t>(n * K + k)]) *
                         grid[static_cast<size_t>((n / 128) * gc + k / 128)];
        const size_t i = static_cast<size_t>(t * K + k);
        sq += w * core::f8e4m3_to_f32(codes[i]) * scales[static_cast<size_t>((k / 128) * T8 + t)];
        sx += w * x[i];
      }
      const size_t o = static_cast<size_t>(t * N + n);
      ref_q[o] = static_cast<float>(sq);
      ref_x[o] = static_cast<float>(sx);
      got[o] = y[o];
    }
  for (int64_t t = T; t < T8; ++t)
    for (int64_t n = 0; n < N; ++n) EXPECT_EQ(y[static_cast<size_t>(t * N + n)], 0.0f) << "padding row " << t;
  const double eq = gpu_test::rel_err(got, ref_q), ex = gpu_test::rel_err(got, ref_x);
  std::printf("fp8 gemm N=%lld K=%lld T=%lld: vs quantized activations %.2e, vs bf16 activations %.2e\n",
              static_cast<long long>(N), static_cast<long long>(K), static_cast<long long>(T), eq, ex);
  EXPECT_LT(eq, 1e-3);
  EXPECT_LT(ex, 4e-2);
}

TEST(CudaFp8Gemm, BlockScaledMatchesTheReference) {
  run_problem({256, 1024, 40}, 1);
  run_problem({392, 2048, 37}, 2);  // a partial 128-row block of W, T padded to 40
}

// Static activations (a checkpoint's per-tensor input_scale): three per-tensor FP8 members stacked as the
// loader packs q/k/v (one grid value per row), their grid expanded to 128 x 128 block scales, the activations
// quantized by the input scale. The codes times their scale equal the CPU's ModelOpt emulation
// (quant::fake_quant_fp8_static) bit for bit, clipped values included; the GEMM matches float64 over those
// activations to 1e-3 of the largest |output| (as above).
TEST(CudaFp8Gemm, StaticActivationsMatchTheCpuEmulation) {
  const int64_t K = 1024, T = 37, T8 = fp8_gemm_rows(T);
  const int64_t member_rows[] = {256, 128, 128};
  const float member_scale[] = {1.5f / 448.0f, 0.75f / 448.0f, 2.0f / 448.0f};
  const int64_t N = 512;
  const float input_scale = 5.0f / 448.0f;  // amax 5: the outlier column's values clip at +-448
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<__nv_bfloat16> x16(static_cast<size_t>(T * K));
  std::vector<float> x(x16.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x16[i] = __float2bfloat16_rn(nd(rng) * ((i % static_cast<size_t>(K)) == 7 ? 40.0f : 1.0f));
    x[i] = __bfloat162float(x16[i]);
  }
  std::vector<uint8_t> w8(static_cast<size_t>(N * K));
  for (auto& b : w8) {
    b = static_cast<uint8_t>(rng());
    if ((b & 0x7f) == 0x7f) b ^= 1;
  }
  std::vector<float> row_grid(static_cast<size_t>(N));  // [N, 1]: block_rows 1, block_cols K
  for (int64_t m = 0, r0 = 0; m < 3; r0 += member_rows[m], ++m)
    std::fill(row_grid.begin() + r0, row_grid.begin() + r0 + member_rows[m], member_scale[m]);

  DevBuf<__nv_bfloat16> dx(x16);
  DevBuf<uint8_t> dx8(static_cast<size_t>(T8 * K)), dw8(w8);
  DevBuf<float> dxs(static_cast<size_t>(K / 128 * T8)), drow(row_grid),
      dblock(static_cast<size_t>(N / 128 * (K / 128))), dy(static_cast<size_t>(T8 * N));
  ASSERT_EQ(fp8_block_grid(drow.get(), 1, 1, K, N, K, dblock.get(), nullptr), cudaSuccess);
  ASSERT_EQ(quantize_fp8_static(dx.get(), K, T, T8, K, input_scale, dx8.get(), dxs.get(), nullptr),
            cudaSuccess);
  const auto block = dblock.download();
  int64_t grid_diff = 0;
  for (int64_t i = 0; i < N / 128; ++i)
    for (int64_t j = 0; j < K / 128; ++j)
      grid_diff += block[static_cast<size_t>(i * (K / 128) + j)] != row_grid[static_cast<size_t>(i * 128)];
  EXPECT_EQ(grid_diff, 0) << "block scales that are not their rows' scale";

  std::vector<float> xq(x.size());
  model::quant::fake_quant_fp8_static(x.data(), x.size(), input_scale, xq.data());
  const auto codes = dx8.download();
  const auto scales = dxs.download();
  int64_t value_diff = 0, clipped = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      const size_t i = static_cast<size_t>(t * K + k);
      const float v = core::f8e4m3_to_f32(codes[i]) * scales[static_cast<size_t>((k / 128) * T8 + t)];
      value_diff += v != xq[i];
      clipped += std::fabs(x[i]) > 5.0f;
    }
  for (size_t i = static_cast<size_t>(T * K); i < codes.size(); ++i) value_diff += codes[i] != 0;
  EXPECT_EQ(value_diff, 0) << "activations that differ from the CPU's emulation";
  EXPECT_GT(clipped, 0) << "the test's activations should reach the clamp";

  Gemm gemm;
  ASSERT_TRUE(gemm.init(32 << 20).is_ok());
  GemmCall c{dw8.get(), core::DType::kF8E4M3, N,        K, dx8.get(), T8, dy.get(), core::DType::kF32,
             N,         dblock.get(),         dxs.get()};
  ASSERT_TRUE(gemm.supports(c));
  const auto st = gemm.run(c, nullptr);
  ASSERT_TRUE(st.is_ok()) << st.message();
  const auto y = dy.download();
  std::vector<float> ref(static_cast<size_t>(T * N)), got(ref.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += static_cast<double>(core::f8e4m3_to_f32(w8[static_cast<size_t>(n * K + k)])) *
               row_grid[static_cast<size_t>(n)] * xq[static_cast<size_t>(t * K + k)];
      ref[static_cast<size_t>(t * N + n)] = static_cast<float>(acc);
      got[static_cast<size_t>(t * N + n)] = y[static_cast<size_t>(t * N + n)];
    }
  const double e = gpu_test::rel_err(got, ref);
  std::printf("fp8 static gemm N=%lld K=%lld T=%lld: vs the CPU emulation %.2e\n", static_cast<long long>(N),
              static_cast<long long>(K), static_cast<long long>(T), e);
  EXPECT_LT(e, 1e-3);
  EXPECT_EQ(quantize_fp8_static(dx.get(), K, T, T8, K, 0.0f, dx8.get(), dxs.get(), nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace deltaflow::backend::cuda
