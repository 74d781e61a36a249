// Dequantization of every quantized weight format against values computed by hand from the format's
// definition (quant-formats.md §0-3): E2M1 codes, E4M3 scales, the nibble order, per-tensor / per-channel /
// block-128 FP8 scales, ModelOpt's multiplying and compressed-tensors' dividing global scale.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/ops.hpp"
#include "model/quant/dequant.hpp"
#include "model/quant/format.hpp"

namespace deltaflow {
namespace {

using model::Mat;
using model::quant::GlobalOp;
using model::quant::ScaleView;
using model::quant::WeightFormat;

TEST(QuantFormats, E2M1CodesAreTheTable) {
  const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(model::quant::e2m1_to_f32(static_cast<uint8_t>(c)), want[c]) << c;
    EXPECT_EQ(std::signbit(model::quant::e2m1_to_f32(static_cast<uint8_t>(c))), c >= 8) << c;
  }
}

TEST(QuantFormats, E4M3ScalesDecodeByHand) {
  EXPECT_EQ(core::f8e4m3_to_f32(0x38), 1.0f);     // exp 7, man 0
  EXPECT_EQ(core::f8e4m3_to_f32(0x3C), 1.5f);     // exp 7, man 4/8
  EXPECT_EQ(core::f8e4m3_to_f32(0x7E), 448.0f);   // max
  EXPECT_EQ(core::f8e4m3_to_f32(0x01), 0x1p-9f);  // min subnormal
  EXPECT_EQ(core::f8e4m3_to_f32(0x08), 0x1p-6f);  // min normal
  EXPECT_EQ(core::f8e4m3_to_f32(0xB8), -1.0f);
  EXPECT_TRUE(std::isnan(core::f8e4m3_to_f32(0x7F)));
}

// Two rows of 32 NVFP4 elements: two 16-groups per row.
struct Nvfp4Fixture {
  std::vector<uint8_t> q = std::vector<uint8_t>(2 * 16);
  std::vector<uint8_t> s = {0x38, 0x3C, 0x40, 0x01};  // 1.0, 1.5, 2.0, 2^-9
  Mat mat(float global, GlobalOp op) const {
    Mat m;
    m.data = q.data();
    m.dtype = core::DType::kU8;
    m.rows = 2;
    m.cols = 32;
    m.format = WeightFormat::kNvfp4;
    m.scale = ScaleView{s.data(), core::DType::kF8E4M3, 2, 2, 1, 16};
    m.global_scale = global;
    m.global_op = op;
    return m;
  }
};

TEST(QuantDequant, Nvfp4NibbleOrderScalesAndModelOptGlobal) {
  Nvfp4Fixture f;
  f.q[0] = 0x21;   // k=0: code 1 (0.5), k=1: code 2 (1.0): low nibble first
  f.q[1] = 0xF7;   // k=2: 6, k=3: -6
  f.q[8] = 0x0B;   // k=16: code 0xB = -1.5 (second group, scale 1.5)
  f.q[16] = 0x75;  // row 1, k=0: 3 (scale 2.0), k=1: 6
  f.q[31] = 0x70;  // row 1, k=30: 0, k=31: 6 (scale 2^-9)
  const Mat m = f.mat(0.25f, GlobalOp::kMultiply);
  std::vector<float> r0(32), r1(32);
  model::quant::dequantize_row(m, 0, r0.data());
  model::quant::dequantize_row(m, 1, r1.data());
  // e2m1 * (block scale * global), the producers' order.
  EXPECT_EQ(r0[0], 0.5f * 1.0f * 0.25f);
  EXPECT_EQ(r0[1], 1.0f * 0.25f);
  EXPECT_EQ(r0[2], 6.0f * 0.25f);
  EXPECT_EQ(r0[3], -6.0f * 0.25f);
  EXPECT_EQ(r0[4], 0.0f);
  EXPECT_EQ(r0[16], -1.5f * (1.5f * 0.25f));  // -0.5625
  EXPECT_EQ(r0[17], 0.0f);
  EXPECT_EQ(r1[0], 3.0f * 2.0f * 0.25f);
  EXPECT_EQ(r1[1], 6.0f * 2.0f * 0.25f);
  EXPECT_EQ(r1[30], 0.0f);
  EXPECT_EQ(r1[31], 6.0f * (0x1p-9f * 0.25f));
}

TEST(QuantDequant, Nvfp4CompressedTensorsDividesByTheGlobalScale) {
  Nvfp4Fixture f;
  f.q[0] = 0x07;  // k=0: 6, k=1: 0
  f.q[8] = 0x05;  // k=16: 3 (scale 1.5)
  // CT weight_global_scale = 448*6/amax; here 2688 / 3 = 896. CT's dequantize: x_q * (scale / global).
  const Mat m = f.mat(896.0f, GlobalOp::kDivide);
  std::vector<float> r0(32);
  model::quant::dequantize_row(m, 0, r0.data());
  const volatile float g = 896.0f;  // no constant folding in a wider type
  const float c0 = 1.0f / g, c1 = 1.5f / g;
  EXPECT_EQ(r0[0], 6.0f * c0);
  EXPECT_EQ(r0[16], 3.0f * c1);
  // Not the multiply by a rounded reciprocal: 1.5 * (1/896) is another float.
  const float recip = 1.0f / g;
  EXPECT_NE(1.5f * recip, c1);
}

TEST(QuantDequant, Fp8PerTensorPerChannelAndBlock) {
  // Per tensor: one F32 scale.
  std::vector<uint8_t> w = {0x7E, 0x38, 0xB8, 0x01, 0x00, 0x3C};  // 448, 1, -1, 2^-9, 0, 1.5
  float st = 0.25f;
  Mat m;
  m.data = w.data();
  m.dtype = core::DType::kF8E4M3;
  m.rows = 2;
  m.cols = 3;
  m.format = WeightFormat::kFp8;
  m.scale = ScaleView{&st, core::DType::kF32, 1, 1, 2, 3};
  std::vector<float> r(3);
  model::quant::dequantize_row(m, 0, r.data());
  EXPECT_EQ(r, (std::vector<float>{112.0f, 0.25f, -0.25f}));
  model::quant::dequantize_row(m, 1, r.data());
  EXPECT_EQ(r, (std::vector<float>{0x1p-11f, 0.0f, 0.375f}));

  // Per channel: BF16 scales [2, 1].
  std::vector<uint16_t> sc = {core::f32_to_bf16(2.0f), core::f32_to_bf16(-0.5f)};
  m.scale = ScaleView{sc.data(), core::DType::kBF16, 2, 1, 1, 3};
  model::quant::dequantize_row(m, 1, r.data());
  EXPECT_EQ(r, (std::vector<float>{-0x1p-10f, -0.0f, -0.75f}));
}

TEST(QuantDequant, Fp8Block128ScalesCoverPartialEdgeBlocks) {
  // [130, 130] with 128x128 blocks: a [2, 2] grid, the last row/column of blocks 2 wide.
  const int64_t N = 130, K = 130;
  std::vector<uint8_t> w(static_cast<size_t>(N * K), 0x38);  // all 1.0
  std::vector<uint16_t> sc = {core::f32_to_bf16(1.0f), core::f32_to_bf16(2.0f), core::f32_to_bf16(4.0f),
                              core::f32_to_bf16(8.0f)};
  Mat m;
  m.data = w.data();
  m.dtype = core::DType::kF8E4M3;
  m.rows = N;
  m.cols = K;
  m.format = WeightFormat::kFp8;
  m.scale = ScaleView{sc.data(), core::DType::kBF16, 2, 2, 128, 128};
  std::vector<float> r(K);
  model::quant::dequantize_row(m, 127, r.data());
  EXPECT_EQ(r[127], 1.0f);
  EXPECT_EQ(r[128], 2.0f);
  model::quant::dequantize_row(m, 128, r.data());
  EXPECT_EQ(r[0], 4.0f);
  EXPECT_EQ(r[129], 8.0f);
}

TEST(QuantDequant, CpuLinearUsesTheDequantizedWeights) {
  // y = x @ W^T with W one NVFP4 row: the CPU reference's linear, load_row and load_all agree with the
  // hand-computed dequantization.
  Nvfp4Fixture f;
  for (size_t i = 0; i < f.q.size(); ++i) f.q[i] = static_cast<uint8_t>(0x11 * (i % 8));
  const Mat m = f.mat(0.5f, GlobalOp::kMultiply);
  std::vector<float> x(32);
  for (int k = 0; k < 32; ++k) x[k] = 0.25f * static_cast<float>(k % 5) - 0.5f;
  std::vector<float> y(2);
  backend::cpu::linear(x.data(), 1, m, y.data());
  const std::vector<float> all = backend::cpu::load_all(m);
  ASSERT_EQ(all.size(), 64u);
  for (int n = 0; n < 2; ++n) {
    double want = 0;
    for (int k = 0; k < 32; ++k) {
      const uint8_t byte = f.q[static_cast<size_t>(n * 16 + k / 2)];
      const float q = model::quant::e2m1_to_f32(k % 2 ? byte >> 4 : byte & 0xf);
      const float s = core::f8e4m3_to_f32(f.s[static_cast<size_t>(n * 2 + k / 16)]);
      const float wv = q * s * 0.5f;
      EXPECT_EQ(all[static_cast<size_t>(n * 32 + k)], wv);
      want += static_cast<double>(wv) * x[k];
    }
    EXPECT_NEAR(y[n], want, 1e-5 * std::max(1.0, std::fabs(want)));
  }
}

}  // namespace
}  // namespace deltaflow
