// The quantized matmuls (gemv_quant.cuh) against float64 on the CPU reference's dequantized weights
// (model/quant/dequant.hpp, the reference of record) and the activations as the kernels stage them (fp16
// with a power-of-two factor per row). Tolerance: 2e-3 of the largest |output| (fp32 accumulation of fp16
// products; measured errors are printed).
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda/gemv_quant.cuh"
#include "backend/quant_pack.hpp"
#include "gpu_test_util.hpp"
#include "model/quant/dequant.hpp"

namespace deltaflow::backend::cuda {
namespace {

using gpu_test::DevBuf;
using model::quant::WeightFormat;

constexpr double kTol = 2e-3;

// A random quantized matrix in the checkpoint's layout and its device form.
struct HostQuant {
  std::vector<uint8_t> codes, scales8;
  std::vector<float> scales32;
  model::Mat m;
};

HostQuant random_nvfp4(int64_t N, int64_t K, uint32_t seed) {
  HostQuant h;
  std::mt19937 rng(seed);
  h.codes.resize(static_cast<size_t>(N * K / 2));
  for (auto& b : h.codes) b = static_cast<uint8_t>(rng());
  h.scales8.resize(static_cast<size_t>(N * K / 16));
  for (auto& b : h.scales8) b = static_cast<uint8_t>(0x28 + rng() % 40);  // E4M3 0.125 .. 6.5
  h.m = model::Mat(h.codes.data(), core::DType::kU8, N, K);
  h.m.format = WeightFormat::kNvfp4;
  h.m.scale = {h.scales8.data(), core::DType::kF8E4M3, N, K / 16, 1, 16};
  h.m.global_scale = 0.01f;
  return h;
}

// block 0: one scale per row; else block x block.
HostQuant random_fp8(int64_t N, int64_t K, int64_t block, uint32_t seed) {
  HostQuant h;
  std::mt19937 rng(seed);
  h.codes.resize(static_cast<size_t>(N * K));
  for (auto& b : h.codes) {
    b = static_cast<uint8_t>(rng());
    if ((b & 0x7f) == 0x7f) b ^= 1;  // not NaN
  }
  const int64_t br = block ? block : 1, bc = block ? block : K;
  const int64_t gr = (N + br - 1) / br, gc = (K + bc - 1) / bc;
  std::uniform_real_distribution<float> u(0.5f, 2.0f);
  h.scales32.resize(static_cast<size_t>(gr * gc));
  for (auto& s : h.scales32) s = u(rng) / 448.0f;
  h.m = model::Mat(h.codes.data(), core::DType::kF8E4M3, N, K);
  h.m.format = WeightFormat::kFp8;
  h.m.scale = {h.scales32.data(), core::DType::kF32, gr, gc, br, bc};
  return h;
}

struct DevQuant {
  std::unique_ptr<DevBuf<uint8_t>> codes, scales;
  std::unique_ptr<DevBuf<float>> rows, grid;
  QuantWeight q;
};

DevQuant upload(const PackedQuant& p) {
  DevQuant d;
  d.codes = std::make_unique<DevBuf<uint8_t>>(p.codes);
  d.q.nvfp4 = p.format == WeightFormat::kNvfp4;
  d.q.codes = d.codes->get();
  d.q.N = p.rows;
  d.q.K = p.cols;
  d.q.interleave = p.interleave;
  if (d.q.nvfp4) {
    d.scales = std::make_unique<DevBuf<uint8_t>>(p.scales);
    d.rows = std::make_unique<DevBuf<float>>(p.row_scales);
    d.q.scales = d.scales->get();
    d.q.row_scales = d.rows->get();
  } else {
    d.grid = std::make_unique<DevBuf<float>>(p.grid);
    d.q.grid = d.grid->get();
    d.q.grid_cols = p.grid_cols;
    d.q.block_rows = p.block_rows;
    d.q.block_cols = p.block_cols;
  }
  return d;
}

std::vector<double> dequant(const model::Mat& m) {
  std::vector<double> w(static_cast<size_t>(m.rows * m.cols));
  std::vector<float> row(static_cast<size_t>(m.cols));
  for (int64_t n = 0; n < m.rows; ++n) {
    model::quant::dequantize_row(m, n, row.data());
    for (int64_t k = 0; k < m.cols; ++k) w[static_cast<size_t>(n * m.cols + k)] = row[static_cast<size_t>(k)];
  }
  return w;
}

// x as the kernels see it: fp16 after the row's power-of-two factor, times that factor.
std::vector<double> staged(const std::vector<float>& x, int T, int64_t K) {
  std::vector<double> v(x.size());
  for (int t = 0; t < T; ++t) {
    float amax = 0;
    for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(x[static_cast<size_t>(t * K + k)]));
    int e = 0;
    if (amax >= 32768.0f) {
      std::frexp(amax, &e);
      e -= 15;
    }
    for (int64_t k = 0; k < K; ++k) {
      const size_t i = static_cast<size_t>(t * K + k);
      v[i] = std::ldexp(static_cast<double>(__half2float(__float2half_rn(std::ldexp(x[i], -e)))), e);
    }
  }
  return v;
}

// y = x @ W^T (or SwiGLU of it) in float64.
std::vector<float> reference(const std::vector<double>& W, int64_t N, int64_t K, const std::vector<double>& x,
                             int T, bool swiglu) {
  const int64_t out = swiglu ? N / 2 : N;
  std::vector<float> y(static_cast<size_t>(T * out));
  for (int t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      auto dot = [&](int64_t n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k)
          s += W[static_cast<size_t>(n * K + k)] * x[static_cast<size_t>(t * K + k)];
        return s;
      };
      double v = dot(o);
      if (swiglu) v = v / (1 + std::exp(-v)) * dot(o + out);
      y[static_cast<size_t>(t * out + o)] = static_cast<float>(v);
    }
  return y;
}

std::vector<float> random_x(int T, int64_t K, uint32_t seed, float big = 0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(T * K));
  for (auto& v : x) v = nd(rng);
  if (big > 0) x[static_cast<size_t>(K / 3)] = big;  // row 0 past fp16's range
  return x;
}

double run_case(const HostQuant& h, bool swiglu, int T, float big = 0, int split = 0) {
  const int64_t N = h.m.rows, K = h.m.cols;
  const std::vector<const model::Mat*> parts = {&h.m};
  auto p = pack_quant(parts, swiglu && h.m.format == WeightFormat::kNvfp4);
  EXPECT_TRUE(p.is_ok()) << p.message();
  if (!p.is_ok()) return INFINITY;
  DevQuant d = upload(*p);
  const auto x = random_x(T, K, 7 + T, big);
  DevBuf<float> dx(x), factor(static_cast<size_t>(T));
  DevBuf<__half> xh(static_cast<size_t>(T * K));
  const int64_t out = swiglu ? N / 2 : N;
  DevBuf<float> y(static_cast<size_t>(T * out));
  EXPECT_EQ(stage_activations_f16(dx.get(), K, T, K, xh.get(), factor.get(), nullptr), cudaSuccess);
  EXPECT_EQ(gemv_quant(d.q, xh.get(), factor.get(), T, y.get(), out, swiglu, nullptr, split), cudaSuccess);
  return gpu_test::rel_err(y.download(), reference(dequant(h.m), N, K, staged(x, T, K), T, swiglu));
}

TEST(CudaGemvQuant, Nvfp4MatchesTheDequantizedReference) {
  for (int T : {1, 3, 8, 17, 32})
    for (bool sw : {false, true}) {
      const HostQuant h = random_nvfp4(sw ? 96 : 80, 512, 11 + T);  // 80: a half-padded last tile
      const double e = run_case(h, sw, T);
      std::printf("nvfp4 T=%d%s: %.3g\n", T, sw ? " swiglu" : "", e);
      EXPECT_LE(e, kTol) << "T " << T << (sw ? " swiglu" : "");
    }
}

TEST(CudaGemvQuant, Fp8PerRowAndBlockScales) {
  for (int64_t block : {int64_t{0}, int64_t{128}})
    for (int T : {1, 5, 16, 32})
      for (bool sw : {false, true}) {
        const HostQuant h = random_fp8(sw ? 256 : 200, 384, block, 21 + T);
        const double e = run_case(h, sw, T);
        std::printf("fp8 block %ld T=%d%s: %.3g\n", static_cast<long>(block), T, sw ? " swiglu" : "", e);
        EXPECT_LE(e, kTol) << "block " << block << " T " << T << (sw ? " swiglu" : "");
      }
}

// Every column split (warps of a block summing parts of one tile's columns): 1 to 8 warps over 16 column
// tiles, and over 4 (some warps with none).
TEST(CudaGemvQuant, EveryColumnSplitGivesTheSameProducts) {
  for (int split : {1, 2, 4, 8})
    for (int T : {1, 9, 32}) {
      const int64_t K = T == 9 ? 256 : 1024;
      const HostQuant n = random_nvfp4(96, K, 3 + T), f = random_fp8(96, K, 128, 4 + T);
      const double en = run_case(n, true, T, 0, split), ef = run_case(f, false, T, 0, split);
      std::printf("split %d T=%d: nvfp4 swiglu %.3g, fp8 %.3g\n", split, T, en, ef);
      EXPECT_LE(en, kTol) << "nvfp4 split " << split << " T " << T;
      EXPECT_LE(ef, kTol) << "fp8 split " << split << " T " << T;
    }
  const HostQuant h = random_nvfp4(32, 256, 9);
  const std::vector<const model::Mat*> parts = {&h.m};
  auto p = pack_quant(parts, false);
  ASSERT_TRUE(p.is_ok()) << p.message();
  DevQuant d = upload(*p);
  DevBuf<__half> xh(256);
  DevBuf<float> factor(1), y(32);
  EXPECT_EQ(gemv_quant(d.q, xh.get(), factor.get(), 1, y.get(), 32, false, nullptr, 16),
            cudaErrorInvalidValue);
}

TEST(CudaGemvQuant, ARowPastFp16sRangeIsScaledNotLost) {
  const HostQuant h = random_nvfp4(64, 256, 5);
  const double e = run_case(h, false, 4, 1.0e6f);
  std::printf("nvfp4 with |x| = 1e6: %.3g\n", e);
  EXPECT_LE(e, kTol);
}

TEST(CudaGemvQuant, DequantizedBf16EqualsTheReference) {
  // 100 NVFP4 rows: a padded last tile.
  for (int64_t nv_rows : {int64_t{96}, int64_t{100}})
    for (bool nv : {true, false})
      for (bool inter : {false, true}) {
        if ((!nv && inter) || (nv_rows % 16 != 0 && (inter || !nv))) continue;
        const HostQuant h = nv ? random_nvfp4(nv_rows, 192, 3) : random_fp8(130, 256, 128, 4);
        const std::vector<const model::Mat*> parts = {&h.m};
        auto p = pack_quant(parts, inter);
        ASSERT_TRUE(p.is_ok()) << p.message();
        DevQuant d = upload(*p);
        DevBuf<uint16_t> out(static_cast<size_t>(h.m.rows * h.m.cols));
        ASSERT_EQ(dequantize_bf16(d.q, out.get(), nullptr), cudaSuccess);
        const auto got = out.download();
        const auto want = dequant(h.m);
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(got[i], core::f32_to_bf16(static_cast<float>(want[i])))
              << (nv ? "nvfp4" : "fp8") << (inter ? " interleaved" : "") << " element " << i;
      }
}

// The grouped form: each expert of a stacked set widened at out + e * N * K, as dequantize_bf16 widens it
// alone.
TEST(CudaGemvQuant, GroupedDequantizationWidensEachExpert) {
  for (bool nv : {true, false}) {
    const int64_t N = 64, K = 128, E = 3;
    std::vector<HostQuant> hs;
    for (int64_t e = 0; e < E; ++e)
      hs.push_back(nv ? random_nvfp4(N, K, static_cast<uint32_t>(10 + e))
                      : random_fp8(N, K, 128, static_cast<uint32_t>(10 + e)));
    // The experts' device forms back to back, as the backend stacks them.
    std::vector<uint8_t> codes, scales;
    std::vector<float> rows, grid;
    for (const auto& h : hs) {
      const std::vector<const model::Mat*> parts = {&h.m};
      auto p = pack_quant(parts, nv);
      ASSERT_TRUE(p.is_ok()) << p.message();
      codes.insert(codes.end(), p->codes.begin(), p->codes.end());
      scales.insert(scales.end(), p->scales.begin(), p->scales.end());
      rows.insert(rows.end(), p->row_scales.begin(), p->row_scales.end());
      grid.insert(grid.end(), p->grid.begin(), p->grid.end());
    }
    const std::vector<const model::Mat*> first = {&hs[0].m};
    auto p0 = pack_quant(first, nv);
    ASSERT_TRUE(p0.is_ok());
    DevQuant d = upload(*p0);
    DevBuf<uint8_t> dc(codes);
    d.q.codes = dc.get();
    d.q.codes_stride = static_cast<int64_t>(p0->codes.size());
    std::unique_ptr<DevBuf<uint8_t>> ds;
    std::unique_ptr<DevBuf<float>> dr, dg;
    if (nv) {
      ds = std::make_unique<DevBuf<uint8_t>>(scales);
      dr = std::make_unique<DevBuf<float>>(rows);
      d.q.scales = ds->get();
      d.q.row_scales = dr->get();
      d.q.scales_stride = static_cast<int64_t>(p0->scales.size());
      d.q.row_stride = N;
    } else {
      dg = std::make_unique<DevBuf<float>>(grid);
      d.q.grid = dg->get();
      d.q.grid_stride = static_cast<int64_t>(p0->grid.size());
    }
    DevBuf<uint16_t> out(static_cast<size_t>(E * N * K));
    ASSERT_EQ(dequantize_bf16_grouped(d.q, static_cast<int>(E), out.get(), nullptr), cudaSuccess);
    const auto got = out.download();
    for (int64_t e = 0; e < E; ++e) {
      const auto want = dequant(hs[static_cast<size_t>(e)].m);
      for (int64_t i = 0; i < N * K; ++i)
        ASSERT_EQ(got[static_cast<size_t>(e * N * K + i)],
                  core::f32_to_bf16(static_cast<float>(want[static_cast<size_t>(i)])))
            << (nv ? "nvfp4" : "fp8") << " expert " << e << " element " << i;
    }
  }
}

// NVFP4 experts of one shape stacked as QuantWeight's grouped form (expert e at the strides).
DevQuant upload_stacked(const std::vector<HostQuant>& ex) {
  std::vector<const model::Mat*> parts;
  for (const auto& h : ex) parts.push_back(&h.m);
  auto p = pack_quant(parts, false);
  EXPECT_TRUE(p.is_ok()) << p.message();
  if (!p.is_ok()) return {};
  DevQuant d = upload(*p);
  const int64_t N = ex[0].m.rows, K = ex[0].m.cols;
  d.q.N = N;
  d.q.codes_stride = N * K / 2;
  d.q.scales_stride = nvfp4_scales_bytes(N, K);
  d.q.row_stride = N;
  return d;
}

TEST(CudaGemvQuant, GroupedRowsUseTheirExperts) {
  // Three experts of [64, 128] NVFP4 stacked; slots (2, 0, 2, 1) over two activation rows (x_div 2).
  const int64_t N = 64, K = 128, E = 3;
  std::vector<HostQuant> ex;
  for (int e = 0; e < E; ++e) ex.push_back(random_nvfp4(N, K, 40 + e));
  DevQuant d = upload_stacked(ex);
  ASSERT_TRUE(d.codes);
  const std::vector<int> experts = {2, 0, 2, 1};
  DevBuf<int> de(experts);
  const auto x = random_x(2, K, 9);
  DevBuf<float> dx(x), factor(2), y(4 * N);
  DevBuf<__half> xh(2 * K);
  ASSERT_EQ(stage_activations_f16(dx.get(), K, 2, K, xh.get(), factor.get(), nullptr), cudaSuccess);
  ASSERT_EQ(gemv_quant_grouped(d.q, de.get(), 4, xh.get(), factor.get(), 2, y.get(), N, false, nullptr),
            cudaSuccess);
  const auto got = y.download();
  const auto xs = staged(x, 2, K);
  for (int g = 0; g < 4; ++g) {
    const std::vector<double> xg(xs.begin() + (g / 2) * K, xs.begin() + (g / 2 + 1) * K);
    const auto want =
        reference(dequant(ex[static_cast<size_t>(experts[static_cast<size_t>(g)])].m), N, K, xg, 1, false);
    const std::vector<float> row(got.begin() + g * N, got.begin() + (g + 1) * N);
    EXPECT_LE(gpu_test::rel_err(row, want), kTol) << "slot " << g;
  }
}

TEST(CudaGemvQuant, ExtraProblemsUseTheFixedExpert) {
  // The shared expert's form: slots (2, 0, 1, 1) over two activation rows (x_div 2), then 3 extra problems
  // of expert 3 over activation rows 1, 2, 3 (x0 1), written to y rows 4, 5, 6. Rows 4 ..: past the routed
  // problems' own rows, as the MoE decode step lays them out.
  const int64_t N = 64, K = 128, E = 4;
  std::vector<HostQuant> ex;
  for (int e = 0; e < E; ++e) ex.push_back(random_nvfp4(N, K, 80 + e));
  DevQuant d = upload_stacked(ex);
  ASSERT_TRUE(d.codes);
  const std::vector<int> experts = {2, 0, 1, 1};
  DevBuf<int> de(experts);
  const auto x = random_x(4, K, 17);
  DevBuf<float> dx(x), factor(4), y(7 * N);
  DevBuf<__half> xh(4 * K);
  ASSERT_EQ(stage_activations_f16(dx.get(), K, 4, K, xh.get(), factor.get(), nullptr), cudaSuccess);
  ASSERT_EQ(gemv_quant_grouped(d.q, de.get(), 4, xh.get(), factor.get(), 2, y.get(), N, false, nullptr, 0,
                               GroupedExtra{3, 3, 1}),
            cudaSuccess);
  const auto got = y.download();
  const auto xs = staged(x, 4, K);
  for (int g = 0; g < 7; ++g) {
    const int64_t xr = g < 4 ? g / 2 : 1 + (g - 4);
    const int e = g < 4 ? experts[static_cast<size_t>(g)] : 3;
    const std::vector<double> xg(xs.begin() + xr * K, xs.begin() + (xr + 1) * K);
    const auto want = reference(dequant(ex[static_cast<size_t>(e)].m), N, K, xg, 1, false);
    const std::vector<float> row(got.begin() + g * N, got.begin() + (g + 1) * N);
    EXPECT_LE(gpu_test::rel_err(row, want), kTol) << "problem " << g;
  }
}

TEST(CudaGemvQuant, TileRowsUseTheirExperts) {
  // Three experts of [64, 128] NVFP4 stacked; 102 slot rows gathered from 51 token rows, in tiles of 64
  // (both halves), 5 and 33 rows; a fourth tile in the room past n_tiles must be left alone. Each input row
  // r is written to output row 101 - r.
  const int64_t N = 64, K = 128, E = 3, S = 102, X = 51;
  std::vector<HostQuant> ex;
  for (int e = 0; e < E; ++e) ex.push_back(random_nvfp4(N, K, 60 + e));
  DevQuant d = upload_stacked(ex);
  ASSERT_TRUE(d.codes);
  const std::vector<GroupedTile> tiles = {{2, 0, 64}, {0, 64, 5}, {1, 69, 33}, {0, 0, 64}};
  std::vector<int> src(S), dst(S), expert_of(S);
  for (int64_t r = 0; r < S; ++r) {
    src[static_cast<size_t>(r)] = static_cast<int>((r * 7) % X);
    dst[static_cast<size_t>(r)] = static_cast<int>(S - 1 - r);
  }
  for (size_t t = 0; t < 3; ++t)
    for (int r = tiles[t].row0; r < tiles[t].row0 + tiles[t].rows; ++r)
      expert_of[static_cast<size_t>(r)] = tiles[t].expert;
  DevBuf<GroupedTile> dt(tiles);
  DevBuf<int> dsrc(src), ddst(dst), n_tiles(std::vector<int>{3});
  const auto x = random_x(static_cast<int>(X), K, 13);
  DevBuf<float> dx(x), factor(S), y(static_cast<size_t>(S * N));
  DevBuf<__half> xh(static_cast<size_t>(S * K));
  ASSERT_EQ(stage_activations_f16_rows(dx.get(), K, dsrc.get(), static_cast<int>(S), K, xh.get(),
                                       factor.get(), nullptr),
            cudaSuccess);
  ASSERT_EQ(gemv_quant_tiles(d.q, dt.get(), 4, n_tiles.get(), xh.get(), factor.get(), y.get(), N, ddst.get(),
                             false, nullptr),
            cudaSuccess);
  const auto got = y.download();
  const auto xs = staged(x, static_cast<int>(X), K);
  for (int64_t r = 0; r < S; ++r) {
    const int64_t xr = src[static_cast<size_t>(r)];
    const std::vector<double> xg(xs.begin() + xr * K, xs.begin() + (xr + 1) * K);
    const auto want =
        reference(dequant(ex[static_cast<size_t>(expert_of[static_cast<size_t>(r)])].m), N, K, xg, 1, false);
    const int64_t o = dst[static_cast<size_t>(r)];
    const std::vector<float> row(got.begin() + o * N, got.begin() + (o + 1) * N);
    EXPECT_LE(gpu_test::rel_err(row, want), kTol) << "slot row " << r;
  }
}

}  // namespace
}  // namespace deltaflow::backend::cuda
