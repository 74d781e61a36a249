// The CUDA backend's quantized layouts (backend/quant_pack.hpp), checked on the host: every code lands where
// the tile layout says, the GEMV kernel's shift-and-mask decode of a lane word (reproduced here bit for bit)
// gives each code's E2M1 value * 2^-14 as an fp16, and scale grids stack or widen as the parts require.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/quant_pack.hpp"
#include "model/quant/format.hpp"

namespace deltaflow::backend {
namespace {

using model::quant::WeightFormat;

struct Nvfp4 {
  std::vector<uint8_t> codes, scales;
  model::Mat m;
};

Nvfp4 random_nvfp4(int64_t rows, int64_t cols, uint32_t seed, float global) {
  Nvfp4 w;
  std::mt19937 rng(seed);
  w.codes.resize(static_cast<size_t>(rows * cols / 2));
  for (auto& b : w.codes) b = static_cast<uint8_t>(rng());
  w.scales.resize(static_cast<size_t>(rows * cols / 16));
  for (auto& b : w.scales) b = static_cast<uint8_t>(0x30 + rng() % 16);
  w.m = model::Mat(w.codes.data(), core::DType::kU8, rows, cols);
  w.m.format = WeightFormat::kNvfp4;
  w.m.scale = {w.scales.data(), core::DType::kF8E4M3, rows, cols / 16, 1, 16};
  w.m.global_scale = global;
  return w;
}

uint8_t code_of(const Nvfp4& w, int64_t n, int64_t k) {
  const uint8_t b = w.codes[static_cast<size_t>(n * (w.m.cols / 2) + k / 2)];
  return k & 1 ? b >> 4 : b & 0xf;
}

// The fp16 value of an IEEE half's bits (normal and subnormal).
double half_value(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return h & 0x8000 ? -v : v;
}

TEST(QuantPack, Nvfp4CodesLandWhereTheTilesSay) {
  for (bool interleave : {false, true}) {
    const int64_t rows = interleave ? 48 : 40, cols = 128;  // 40: the last tile half padding
    const Nvfp4 a = random_nvfp4(rows / 2, cols, 1, 0.5f), b = random_nvfp4(rows / 2, cols, 2, 0.25f);
    const std::vector<const model::Mat*> parts = {&a.m, &b.m};
    auto p = pack_quant(parts, interleave);
    ASSERT_TRUE(p.is_ok()) << p.message();
    EXPECT_EQ(p->codes.size(), static_cast<size_t>(nvfp4_padded_rows(rows) * cols / 2));
    EXPECT_EQ(p->codes_bytes, p->codes.size());
    for (int64_t n = 0; n < rows; ++n)
      for (int64_t k = 0; k < cols; ++k) {
        const Nvfp4& src = n < rows / 2 ? a : b;
        ASSERT_EQ(nvfp4_tile_code(p->codes.data(), rows, cols, interleave, n, k),
                  code_of(src, n % (rows / 2), k))
            << "row " << n << " column " << k << (interleave ? " interleaved" : "");
      }
    // The block scales follow the tiles: every element's scale where nvfp4_tile_scale reads it, ...
    EXPECT_EQ(p->scales.size(), static_cast<size_t>(nvfp4_padded_rows(rows) * cols / 16));
    for (int64_t n = 0; n < rows; ++n)
      for (int64_t k = 0; k < cols; ++k) {
        const Nvfp4& src = n < rows / 2 ? a : b;
        ASSERT_EQ(nvfp4_tile_scale(p->scales.data(), rows, cols, interleave, n, k),
                  src.scales[static_cast<size_t>((n % (rows / 2)) * (cols / 16) + k / 16)])
            << "row " << n << " column " << k << (interleave ? " interleaved" : "");
      }
    // ... which is, spelled out for one element and for the padding: tile t, column tile kt at 64 (t * 2 +
    // kt) (2 column tiles), tile row r's four group scales at 8 (r % 8) + 4 (r / 8).
    const int64_t n9 = interleave ? rows / 2 + 1 : 9;  // tile 0, tile row 9 either way
    EXPECT_EQ(p->scales[64 * 1 + 8 * 1 + 4 + 2],
              (n9 < rows / 2 ? a : b).scales[static_cast<size_t>((n9 % (rows / 2)) * (cols / 16) + 96 / 16)]);
    if (!interleave) {  // rows 40..47 of tile 2 are padding: their scales are zero
      for (int64_t kt = 0; kt < 2; ++kt)
        for (int gq = 0; gq < 8; ++gq)
          for (int c = 0; c < 4; ++c)
            EXPECT_EQ(p->scales[static_cast<size_t>(64 * (2 * 2 + kt) + 8 * gq + 4 + c)], 0);
    }
    // Each part's global scale on its rows.
    EXPECT_EQ(p->row_scales.front(), 0.5f);
    EXPECT_EQ(p->row_scales.back(), 0.25f);
    auto sized = pack_quant(parts, interleave, /*layout_only=*/true);
    ASSERT_TRUE(sized.is_ok());
    EXPECT_TRUE(sized->codes.empty());
    EXPECT_EQ(sized->codes_bytes, p->codes_bytes);
    EXPECT_EQ(sized->scales_bytes, p->scales.size());
  }
}

TEST(QuantPack, TheKernelsShiftDecodeGivesEachCodeTimes2ToTheMinus14) {
  const Nvfp4 a = random_nvfp4(32, 64, 3, 1.0f);
  const std::vector<const model::Mat*> parts = {&a.m};
  auto p = pack_quant(parts, false);
  ASSERT_TRUE(p.is_ok()) << p.message();
  // gemv_quant.cu, nvfp4_word_to_f16: the four fp16 pairs of lane word (tile t, lane 4g+q, group j).
  for (int64_t t = 0; t < 2; ++t)
    for (int lane = 0; lane < 32; ++lane)
      for (int j = 0; j < 4; ++j) {
        uint32_t w;
        std::memcpy(&w, p->codes.data() + t * kNvfp4TileBytes + lane * 16 + j * 4, 4);
        const uint32_t s3 = w << 3;
        const uint32_t av[4] = {((w << 9) & 0x0E000E00u) | (s3 & 0x80008000u),
                                ((w << 6) & 0x0E000E00u) | ((w << 2) & 0x80008000u),
                                (s3 & 0x0E000E00u) | ((w << 1) & 0x80008000u), w & 0x8E008E00u};
        const int g = lane / 4, q = lane % 4;
        for (int slot = 0; slot < 4; ++slot)
          for (int half = 0; half < 2; ++half) {
            const int64_t n = t * 16 + ((slot & 1) ? g + 8 : g);
            const int64_t k = 16 * j + 4 * q + (slot >= 2 ? 2 : 0) + half;
            const double got = half_value(static_cast<uint16_t>(av[slot] >> (16 * half)));
            const double want = model::quant::e2m1_to_f32(code_of(a, n, k)) / 16384.0;
            ASSERT_EQ(got, want) << "tile " << t << " lane " << lane << " group " << j << " slot " << slot;
          }
      }
}

TEST(QuantPack, Fp8GridsStackOrWiden) {
  const int64_t cols = 256;
  std::vector<uint8_t> codes(static_cast<size_t>(384 * cols), 0x38);
  // Two 128x128-block matrices of 256 and 128 rows stack into one grid of 3 x 2 blocks.
  std::vector<float> s1 = {1, 2, 3, 4}, s2 = {5, 6};
  model::Mat a(codes.data(), core::DType::kF8E4M3, 256, cols),
      b(codes.data(), core::DType::kF8E4M3, 128, cols);
  a.format = b.format = WeightFormat::kFp8;
  a.scale = {s1.data(), core::DType::kF32, 2, 2, 128, 128};
  b.scale = {s2.data(), core::DType::kF32, 1, 2, 128, 128};
  {
    const std::vector<const model::Mat*> parts = {&a, &b};
    auto p = pack_quant(parts, false);
    ASSERT_TRUE(p.is_ok()) << p.message();
    EXPECT_EQ(p->block_rows, 128);
    EXPECT_EQ(p->block_cols, 128);
    EXPECT_EQ(p->grid, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  }
  // Per-tensor scales of different matrices (ModelOpt or compressed-tensors q/k/v): one grid row per row.
  float t1 = 0.5f, t2 = 0.25f;
  model::Mat c(codes.data(), core::DType::kF8E4M3, 3, cols), d(codes.data(), core::DType::kF8E4M3, 2, cols);
  c.format = d.format = WeightFormat::kFp8;
  c.scale = {&t1, core::DType::kF32, 1, 1, 3, cols};
  d.scale = {&t2, core::DType::kF32, 1, 1, 2, cols};
  d.global_scale = 2.0f;
  d.global_op = model::quant::GlobalOp::kDivide;
  {
    const std::vector<const model::Mat*> parts = {&c, &d};
    auto p = pack_quant(parts, false);
    ASSERT_TRUE(p.is_ok()) << p.message();
    EXPECT_EQ(p->block_rows, 1);
    EXPECT_EQ(p->grid_cols, 1);
    EXPECT_EQ(p->grid, (std::vector<float>{0.5f, 0.5f, 0.5f, 0.125f, 0.125f}));
  }
}

// PackedQuant::input_scale: the static activation scale a group's FP8 GEMM quantizes with, set only where
// the grid is one value over each 128 x 128 block and every member shares the scale.
TEST(QuantPack, StaticInputScaleOnlyForPerTensorGroupsOnTheBlockGrid) {
  const int64_t cols = 256;
  std::vector<uint8_t> codes(static_cast<size_t>(512 * cols), 0x38);
  float sq = 0.5f, sk = 0.25f, sv = 0.125f;
  const auto fp8 = [&](int64_t rows, float* scale, float input_scale) {
    model::Mat m(codes.data(), core::DType::kF8E4M3, rows, cols);
    m.format = WeightFormat::kFp8;
    m.scale = {scale, core::DType::kF32, 1, 1, rows, cols};
    m.input_scale = input_scale;
    return m;
  };
  const auto scale_of = [](std::vector<const model::Mat*> parts) {
    auto p = pack_quant(parts, false);
    EXPECT_TRUE(p.is_ok()) << p.message();
    return p.is_ok() ? p->input_scale : -1.0f;
  };
  // q/k/v per tensor, 256 + 128 + 128 rows, one input scale: the group takes it.
  model::Mat q = fp8(256, &sq, 0.02f), k = fp8(128, &sk, 0.02f), v = fp8(128, &sv, 0.02f);
  EXPECT_EQ(scale_of({&q, &k, &v}), 0.02f);
  EXPECT_EQ(scale_of({&q}), 0.02f);
  // Members calibrated apart (different input scales), none stored, or a member whose rows end inside a
  // 128-row block: weight-only.
  model::Mat k2 = fp8(128, &sk, 0.03f), k0 = fp8(128, &sk, 0.0f), k3 = fp8(96, &sk, 0.02f);
  EXPECT_EQ(scale_of({&q, &k2, &v}), 0.0f);
  EXPECT_EQ(scale_of({&q, &k0, &v}), 0.0f);
  EXPECT_EQ(scale_of({&q, &k3, &v}), 0.0f);
  // Per-channel scales (one per row): not one value a block.
  std::vector<float> rows(256, 0.5f);
  model::Mat c(codes.data(), core::DType::kF8E4M3, 256, cols);
  c.format = WeightFormat::kFp8;
  c.scale = {rows.data(), core::DType::kF32, 256, 1, 1, cols};
  c.input_scale = 0.02f;
  EXPECT_EQ(scale_of({&c}), 0.0f);
}

TEST(QuantPack, ShapesTheKernelsDoNotTakeAreErrors) {
  const Nvfp4 a = random_nvfp4(16, 48, 4, 1.0f);  // 48 columns: not whole 64-column tiles
  const std::vector<const model::Mat*> parts = {&a.m};
  auto p = pack_quant(parts, false);
  ASSERT_FALSE(p.is_ok());
  EXPECT_NE(p.message().find("multiple of 64"), std::string::npos) << p.message();
  const Nvfp4 b = random_nvfp4(16, 64, 5, 1.0f);
  std::vector<uint8_t> f8(16 * 64);
  model::Mat c(f8.data(), core::DType::kF8E4M3, 16, 64);
  c.format = WeightFormat::kFp8;
  const std::vector<const model::Mat*> mixed = {&b.m, &c};
  EXPECT_FALSE(pack_quant(mixed, false).is_ok());
}

}  // namespace
}  // namespace deltaflow::backend
