// The grouped expert GEMM of the MoE prefill (backend/cuda/moe_grouped.cuh) against cpu::linear per expert on
// the same 16-bit inputs. Label `gpu`.
//
// Segments of 0, 1, 63, 64, 65 and 200 rows (tiles that end inside, at and past kGroupedTileRows), N below,
// at and past one block's kGroupedTileCols (and not a multiple of it), BF16 and F16, output in fp32 and in
// the weights' type, rows read and written through row maps. Tolerance, as max |gpu - cpu| / max(1, max
// |cpu|): fp32 accumulation in another order, 1e-4 as the cuBLASLt test; a 16-bit output adds one rounding
// (half an ulp of the largest value: 4e-3 bf16, 5e-4 f16).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "backend/cpu/ops.hpp"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/moe_grouped.cuh"
#include "gpu_test_util.hpp"

namespace deltaflow {
namespace {

using gpu_test::DevBuf;
using gpu_test::from_bytes;
using gpu_test::HostMat;
using gpu_test::randn;
using gpu_test::rel_err;
using gpu_test::round_to;
using gpu_test::to_bytes;
namespace cu = backend::cuda;
namespace cpu = backend::cpu;

class CudaMoeGrouped : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(gpu_test::have_gpu()) << "no GPU visible"; }
};

TEST_F(CudaMoeGrouped, EqualsCpuLinearPerExpert) {
  std::mt19937 rng(31);
  const std::vector<int64_t> counts = {63, 0, 1, 200, 64, 65};
  const int E = static_cast<int>(counts.size());
  int64_t rows = 0;
  for (int64_t c : counts) rows += c;
  for (core::DType wt : {core::DType::kBF16, core::DType::kF16}) {
    for (auto [N, K] : {std::pair{64, 64}, std::pair{128, 32}, std::pair{200, 96}, std::pair{384, 160},
                        std::pair{600, 64}}) {
      HostMat W(randn(rng, static_cast<size_t>(E) * N * K, 0.2f), wt, static_cast<int64_t>(E) * N, K);
      DevBuf<uint8_t> dW(W.bytes);
      auto x = randn(rng, static_cast<size_t>(rows * K));
      for (auto& v : x) v = round_to(v, wt);
      DevBuf<uint8_t> dx(to_bytes(x, wt));
      std::vector<cu::GroupedTile> tiles(static_cast<size_t>(rows / cu::kGroupedTileRows + E + 1));
      const int n_tiles = cu::grouped_tiles(counts.data(), E, tiles.data(), static_cast<int>(tiles.size()));
      ASSERT_GT(n_tiles, 0);
      DevBuf<uint8_t> dtiles(static_cast<size_t>(n_tiles) * sizeof(cu::GroupedTile));
      ASSERT_EQ(cudaMemcpy(dtiles.get(), tiles.data(), dtiles.size(), cudaMemcpyHostToDevice), cudaSuccess);
      const auto* dt = reinterpret_cast<const cu::GroupedTile*>(dtiles.get());
      // Reference: each expert's rows through its own [N, K] slice.
      std::vector<float> ref(static_cast<size_t>(rows * N));
      int64_t off = 0;
      for (int e = 0; e < E; ++e) {
        const model::Mat We{W.bytes.data() + static_cast<size_t>(e) * N * K * 2, wt, N, K};
        if (counts[static_cast<size_t>(e)] > 0)
          cpu::linear(x.data() + off * K, counts[static_cast<size_t>(e)], We, ref.data() + off * N);
        off += counts[static_cast<size_t>(e)];
      }
      const auto where = ::testing::Message() << core::dtype_name(wt) << " N=" << N << " K=" << K;
      // fp32 out, with a row stride past N (a column range of a wider buffer).
      const int64_t ldy = N + 6;
      DevBuf<float> dy(std::vector<float>(static_cast<size_t>(rows * ldy), -7.0f));
      ASSERT_EQ(cu::moe_grouped_gemm(dW.get(), wt, int64_t{N} * K, N, K, dx.get(), dt, n_tiles, dy.get(),
                                     core::DType::kF32, ldy, nullptr),
                cudaSuccess);
      const auto y = dy.download();
      std::vector<float> got(static_cast<size_t>(rows * N)), pad;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = 0; n < ldy; ++n) {
          if (n < N)
            got[r * N + n] = y[r * ldy + n];
          else
            pad.push_back(y[r * ldy + n]);
        }
      EXPECT_LE(rel_err(got, ref), 1e-4) << where;
      EXPECT_EQ(pad, std::vector<float>(pad.size(), -7.0f)) << "wrote past N, " << where;
      // 16-bit out.
      DevBuf<uint8_t> dy16(static_cast<size_t>(rows * N) * 2);
      ASSERT_EQ(cu::moe_grouped_gemm(dW.get(), wt, int64_t{N} * K, N, K, dx.get(), dt, n_tiles, dy16.get(),
                                     wt, N, nullptr),
                cudaSuccess);
      EXPECT_LE(rel_err(from_bytes(dy16.download(), wt), ref), wt == core::DType::kBF16 ? 4e-3 : 5e-4)
          << "16-bit out, " << where;
      // Through row maps (the backend's gather of token rows and scatter to slots): x row r read from
      // x_rows[r] of a permuted copy, its output written to row y_rows[r]; bit-equal to the plain run.
      std::vector<int> x_rows(static_cast<size_t>(rows)), y_rows(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) x_rows[r] = y_rows[r] = static_cast<int>(r);
      std::shuffle(x_rows.begin(), x_rows.end(), rng);
      std::shuffle(y_rows.begin(), y_rows.end(), rng);
      std::vector<float> xp(x.size());
      for (int64_t r = 0; r < rows; ++r)
        std::copy_n(x.begin() + r * K, K, xp.begin() + static_cast<int64_t>(x_rows[r]) * K);
      DevBuf<uint8_t> dxp(to_bytes(xp, wt));
      DevBuf<int> dxr(x_rows), dyr(y_rows);
      DevBuf<float> dym(std::vector<float>(static_cast<size_t>(rows * ldy), -7.0f));
      ASSERT_EQ(cu::moe_grouped_gemm(dW.get(), wt, int64_t{N} * K, N, K, dxp.get(), dt, n_tiles, dym.get(),
                                     core::DType::kF32, ldy, nullptr, dxr.get(), dyr.get()),
                cudaSuccess);
      const auto ym = dym.download();
      std::vector<float> unmapped(static_cast<size_t>(rows * ldy));
      for (int64_t r = 0; r < rows; ++r)
        std::copy_n(ym.begin() + static_cast<int64_t>(y_rows[r]) * ldy, ldy, unmapped.begin() + r * ldy);
      EXPECT_EQ(unmapped, y) << "row maps, " << where;
    }
  }
}

TEST_F(CudaMoeGrouped, TilesCoverEverySegmentAndRefuseOverflow) {
  const std::vector<int64_t> counts = {130, 0, 64, 1};
  std::vector<cu::GroupedTile> t(8);
  ASSERT_EQ(cu::grouped_tiles(counts.data(), 4, t.data(), 8), 5);
  const int want[5][3] = {{0, 0, 64}, {0, 64, 64}, {0, 128, 2}, {2, 130, 64}, {3, 194, 1}};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(t[static_cast<size_t>(i)].expert, want[i][0]) << i;
    EXPECT_EQ(t[static_cast<size_t>(i)].row0, want[i][1]) << i;
    EXPECT_EQ(t[static_cast<size_t>(i)].rows, want[i][2]) << i;
  }
  EXPECT_EQ(cu::grouped_tiles(counts.data(), 4, t.data(), 4), -1);
  // Shapes it does not take.
  DevBuf<uint8_t> buf(4096);
  const auto* dt = reinterpret_cast<const cu::GroupedTile*>(buf.get());
  EXPECT_EQ(cu::moe_grouped_gemm(buf.get(), core::DType::kBF16, 64, 64, 48, buf.get(), dt, 1, buf.get(),
                                 core::DType::kF32, 64, nullptr),
            cudaErrorInvalidValue);  // K % 32
  EXPECT_EQ(cu::moe_grouped_gemm(buf.get(), core::DType::kF32, 64, 64, 64, buf.get(), dt, 1, buf.get(),
                                 core::DType::kF32, 64, nullptr),
            cudaErrorInvalidValue);  // fp32 weights
  EXPECT_EQ(cu::moe_grouped_gemm(buf.get(), core::DType::kBF16, 64, 64, 64, buf.get(), dt, 1, buf.get(),
                                 core::DType::kF16, 64, nullptr),
            cudaErrorInvalidValue);  // output neither fp32 nor the weights' type
}

}  // namespace
}  // namespace deltaflow
