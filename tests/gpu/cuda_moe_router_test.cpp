// The MoE router's prefill kernel (backend/cuda/moe_router.cuh) against the CPU linear, on the real shape
// (Qwen3.5-35B-A3B: 256 experts + the shared gate over H = 2048) and ragged ones (rows, tokens and K not
// multiples of the 64 x 64 x 32 tiles), strided inputs and outputs. Label `gpu`.
//
// Tolerance, as max |gpu - cpu| / max(1, max |cpu|): both sum in fp32 (the kernel with FMA, in k order), so
// they agree to ~1e-6 at K = 2048; 2e-5 as the decode router's test.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.hpp"
#include "backend/cuda/gemm.hpp"
#include "backend/cuda/moe_router.cuh"
#include "gpu_test_util.hpp"

namespace deltaflow {
namespace {

using gpu_test::DevBuf;
using gpu_test::HostMat;
using gpu_test::randn;
using gpu_test::rel_err;
namespace cu = backend::cuda;
namespace cpu = backend::cpu;

constexpr double kTol = 2e-5;

class CudaMoeRouter : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(gpu_test::have_gpu()) << "no GPU visible"; }
};

TEST_F(CudaMoeRouter, TiledLogitsEqualCpuLinearSplitInTwo) {
  std::mt19937 rng(37);
  struct Case {
    int64_t N, n_split, K, T;
  };
  const Case cases[] = {{257, 256, 2048, 1000}, {257, 256, 2048, 64}, {9, 8, 64, 33},   {65, 64, 200, 129},
                        {33, 32, 61, 70},       {5, 5, 1003, 100},    {130, 1, 40, 65}, {513, 512, 96, 1}};
  for (core::DType dt : {core::DType::kBF16, core::DType::kF16, core::DType::kF32}) {
    for (const auto& c : cases) {
      HostMat W(randn(rng, static_cast<size_t>(c.N * c.K)), dt, c.N, c.K);
      DevBuf<uint8_t> dW(W.bytes);
      // x rows strided past K, outputs strided past their widths: the padding must stay as it was.
      const int64_t ldx = c.K + 3, n1 = c.N - c.n_split, ld0 = c.n_split + 2, ld1 = n1 + 1;
      const auto x = randn(rng, static_cast<size_t>(c.T * ldx));
      std::vector<float> packed(static_cast<size_t>(c.T * c.K));
      for (int64_t t = 0; t < c.T; ++t)
        for (int64_t k = 0; k < c.K; ++k) packed[t * c.K + k] = x[t * ldx + k];
      std::vector<float> ref(static_cast<size_t>(c.T * c.N));
      cpu::linear(packed.data(), c.T, W.mat, ref.data());
      const std::vector<float> fill0(static_cast<size_t>(c.T * ld0), -7.0f),
          fill1(static_cast<size_t>(c.T * ld1), -7.0f);
      DevBuf<float> dx(x), d0(fill0), d1(fill1);
      ASSERT_EQ(cu::moe_router_logits_tiled(dW.get(), dt, c.N, c.n_split, c.K, dx.get(), ldx, c.T, d0.get(),
                                            ld0, d1.get(), ld1, nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto o0 = d0.download(), o1 = d1.download();
      std::vector<float> got(static_cast<size_t>(c.T * c.N));
      bool pad_kept = true;
      for (int64_t t = 0; t < c.T; ++t) {
        for (int64_t n = 0; n < c.N; ++n)
          got[t * c.N + n] = n < c.n_split ? o0[t * ld0 + n] : o1[t * ld1 + n - c.n_split];
        for (int64_t n = c.n_split; n < ld0; ++n) pad_kept = pad_kept && o0[t * ld0 + n] == -7.0f;
        for (int64_t n = n1; n < ld1; ++n) pad_kept = pad_kept && o1[t * ld1 + n] == -7.0f;
      }
      const std::string where = std::string(core::dtype_name(dt)) + " N=" + std::to_string(c.N) +
                                " split=" + std::to_string(c.n_split) + " K=" + std::to_string(c.K) +
                                " T=" + std::to_string(c.T);
      EXPECT_LE(rel_err(got, ref), kTol) << where;
      EXPECT_TRUE(pad_kept) << "wrote past an output row, " << where;
    }
  }
}

// The tensor-core form (bf16 weights): activations split in three bf16 parts, one cuBLASLt GEMM over the
// 3T rows, the parts' sums added. Same tolerance as the fp32 kernel: the split is exact and each product
// exact in fp32, so only the fp32 sums' rounding differs. The split's parts must add back to x bit for bit.
TEST_F(CudaMoeRouter, SplitBf16GemmLogitsEqualCpuLinear) {
  std::mt19937 rng(41);
  cu::Gemm gemm;
  ASSERT_TRUE(gemm.init(size_t{32} << 20));
  struct Case {
    int64_t N, n_split, K, T;
  };
  const Case cases[] = {{257, 256, 2048, 1000}, {257, 256, 2048, 33}, {513, 512, 4096, 300}, {9, 8, 64, 40}};
  // As the backend runs it: the GEMM over the n_split router rows; the one row after them (the shared gate)
  // summed by the split's pass. Each case with rows of x that take 16-byte vectors and with rows that do not.
  for (const auto& c : cases) {
    ASSERT_EQ(c.N, c.n_split + 1);
    for (const int64_t pad : {int64_t{0}, int64_t{5}}) {
      HostMat W(randn(rng, static_cast<size_t>(c.N * c.K)), core::DType::kBF16, c.N, c.K);
      DevBuf<uint8_t> dW(W.bytes);
      const int64_t ldx = c.K + pad, ldy = (c.n_split + 7) / 8 * 8;
      auto x = randn(rng, static_cast<size_t>(c.T * ldx));
      for (size_t i = 0; i < x.size(); i += 7) x[i] *= 1e3f;  // values far apart in magnitude
      std::vector<float> packed(static_cast<size_t>(c.T * c.K));
      for (int64_t t = 0; t < c.T; ++t)
        for (int64_t k = 0; k < c.K; ++k) packed[t * c.K + k] = x[t * ldx + k];
      std::vector<float> ref(static_cast<size_t>(c.T * c.N));
      cpu::linear(packed.data(), c.T, W.mat, ref.data());
      DevBuf<float> dx(x), y3(std::vector<float>(static_cast<size_t>(3 * c.T * ldy), 0.0f)),
          d0(std::vector<float>(static_cast<size_t>(c.T * c.n_split), 0.0f)),
          d1(std::vector<float>(static_cast<size_t>(c.T), 0.0f));
      DevBuf<uint16_t> parts(std::vector<uint16_t>(static_cast<size_t>(3 * c.T * c.K), 0));
      const uint8_t* w_gate = dW.get() + static_cast<size_t>(c.n_split * c.K) * 2;
      ASSERT_EQ(cu::moe_router_split_activations(dx.get(), ldx, c.T, c.K, parts.get(), w_gate, d1.get(), 1,
                                                 nullptr),
                cudaSuccess);
      ASSERT_TRUE(gemm.run(dW.get(), core::DType::kBF16, c.n_split, c.K, parts.get(), 3 * c.T, y3.get(), ldy,
                           nullptr));
      ASSERT_EQ(cu::moe_router_sum_parts(y3.get(), ldy, c.T, c.n_split, c.n_split, d0.get(), c.n_split,
                                         nullptr, 0, nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto p = parts.download();
      const auto o0 = d0.download(), o1 = d1.download();
      const auto bf = core::bf16_to_f32;
      int64_t split_off = 0, hi_off = 0;
      const size_t tk = static_cast<size_t>(c.T * c.K);
      for (size_t i = 0; i < tk; ++i) {
        split_off += (bf(p[i]) + bf(p[tk + i])) + bf(p[2 * tk + i]) != packed[i];
        hi_off += p[i] != core::f32_to_bf16(packed[i]);  // the hi part is bf16(x), as convert_rows writes it
      }
      std::vector<float> got(static_cast<size_t>(c.T * c.N));
      for (int64_t t = 0; t < c.T; ++t)
        for (int64_t n = 0; n < c.N; ++n) got[t * c.N + n] = n < c.n_split ? o0[t * c.n_split + n] : o1[t];
      const std::string where = "N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                                " T=" + std::to_string(c.T) + " ldx=" + std::to_string(ldx);
      EXPECT_EQ(split_off, 0) << "activations whose three parts do not add back to them, " << where;
      EXPECT_EQ(hi_off, 0) << "hi parts that are not bf16(x), " << where;
      EXPECT_LE(rel_err(got, ref), kTol) << where;
    }
  }
}

TEST_F(CudaMoeRouter, TiledRejectsBadArguments) {
  DevBuf<float> buf(std::vector<float>(64, 0.0f));
  const float* x = buf.get();
  float* y = buf.get();
  // n_split < N needs out1; n_split past N; a short ldx; a short ld0; too many token tiles for the grid.
  EXPECT_EQ(cu::moe_router_logits_tiled(x, core::DType::kF32, 4, 2, 4, x, 4, 2, y, 2, nullptr, 2, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cu::moe_router_logits_tiled(x, core::DType::kF32, 4, 5, 4, x, 4, 2, y, 5, y, 1, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cu::moe_router_logits_tiled(x, core::DType::kF32, 4, 4, 4, x, 3, 2, y, 4, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cu::moe_router_logits_tiled(x, core::DType::kF32, 4, 4, 4, x, 4, 2, y, 3, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cu::moe_router_logits_tiled(x, core::DType::kF32, 4, 4, 4, x, 4, int64_t{65536} * 64, y, 4,
                                        nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cu::moe_router_logits_tiled(x, core::DType::kI32, 4, 4, 4, x, 4, 2, y, 4, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  // Nothing to do is not an error.
  EXPECT_EQ(cu::moe_router_logits_tiled(x, core::DType::kF32, 4, 4, 4, x, 4, 0, y, 4, nullptr, 0, nullptr),
            cudaSuccess);
  // The split: a short ldx; a dot row without its output; no parts.
  EXPECT_EQ(cu::moe_router_split_activations(x, 3, 2, 4, y, nullptr, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cu::moe_router_split_activations(x, 4, 2, 4, y, x, nullptr, 1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cu::moe_router_split_activations(x, 4, 2, 4, nullptr, nullptr, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace deltaflow
