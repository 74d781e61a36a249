// The decode GEMV's launch plans (SIMT with K split over warps; tensor cores over 16-bit activations) and
// its SwiGLU epilogue, each against a float64 reference on the same (rounded) inputs. Label `gpu`.
//
// Tolerances, as max |gpu - ref| / max(1, max |ref|): fp32 accumulation of exact products in another order,
// ~1e-6 at K = 5120; bounds 2e-5 (SIMT) and 5e-5 (tensor cores, whose fp32 adds inside the mma may truncate
// rather than round). The timing sweep at the end is DISABLED_ (run with --gtest_also_run_disabled_tests);
// it asserts nothing and prints the bandwidth of every plan on the Qwen3.6-27B decode shapes.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/conv1d.cuh"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/gemv.cuh"
#include "core/dtype.hpp"
#include "gpu_test_util.hpp"

namespace deltaflow {
namespace {

using gpu_test::DevBuf;
using gpu_test::randn;
using gpu_test::rel_err;
namespace cu = backend::cuda;

class CudaGemv : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(gpu_test::have_gpu()) << "no GPU visible"; }
};

float rounded(float v, core::DType dt) {
  return dt == core::DType::kBF16 ? core::round_bf16(v) : core::f16_to_f32(core::f32_to_f16(v));
}

// y = x @ W.T in float64 over the values as the GPU sees them; swiglu: silu(gate) * up of the halves.
std::vector<float> reference(const std::vector<float>& W, const std::vector<float>& x, int64_t N, int64_t K,
                             int T, bool swiglu) {
  std::vector<double> p(static_cast<size_t>(T * N));
  for (int t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += static_cast<double>(W[n * K + k]) * x[t * K + k];
      p[t * N + n] = s;
    }
  if (!swiglu) return std::vector<float>(p.begin(), p.end());
  const int64_t I = N / 2;
  std::vector<float> y(static_cast<size_t>(T * I));
  for (int t = 0; t < T; ++t)
    for (int64_t i = 0; i < I; ++i) {
      const double g = p[t * N + i];
      y[t * I + i] = static_cast<float>(g / (1.0 + std::exp(-g)) * p[t * N + I + i]);
    }
  return y;
}

struct Case {
  int64_t N, K;
};

void check_plans(bool mma, core::DType dt, std::mt19937& rng) {
  const Case cases[] = {{16, 32}, {37, 64}, {200, 512}, {1030, 2080}, {4100, 96}};
  const std::vector<int> Ts = mma ? std::vector<int>{5, 8, 13, 16, 27, 32} : std::vector<int>{1, 2, 3, 4};
  const int plans = mma ? cu::gemv_mma_plans() : cu::gemv_simt_plans();
  for (const auto& c : cases) {
    for (bool sw : {false, true}) {
      const int64_t N = sw ? 2 * c.N : c.N, K = c.K, n_out = sw ? c.N : c.N;
      auto Wf = randn(rng, static_cast<size_t>(N * K));
      for (auto& v : Wf) v = rounded(v, dt);
      DevBuf<uint8_t> dW(gpu_test::to_bytes(Wf, dt));
      for (int T : Ts) {
        auto x = randn(rng, static_cast<size_t>(T * K));
        std::vector<float> xr = x;
        if (mma)
          for (auto& v : xr) v = rounded(v, dt);
        const auto ref = reference(Wf, xr, N, K, T, sw);
        DevBuf<float> dx(x);
        DevBuf<uint8_t> dx16(static_cast<size_t>(T * K) * 2);
        ASSERT_EQ(cu::convert_rows(dx.get(), K, T, K, dx16.get(), dt, nullptr), cudaSuccess);
        for (int p = -1; p < plans; ++p) {
          DevBuf<float> dy(static_cast<size_t>(T * n_out));
          const cudaError_t e =
              cu::gemv_with_plan(dW.get(), dt, N, K, dx.get(), K, mma ? dx16.get() : nullptr, T,
                                 cu::GemvOut{dy.get(), n_out, sw, {}}, p, nullptr);
          ASSERT_EQ(e, cudaSuccess) << cu::gemv_plan_name(mma, p);
          EXPECT_LE(rel_err(dy.download(), ref), mma ? 5e-5 : 2e-5)
              << cu::gemv_plan_name(mma, p) << " " << core::dtype_name(dt) << " N=" << N << " K=" << K
              << " T=" << T << (sw ? " swiglu" : "");
        }
      }
    }
  }
}

TEST_F(CudaGemv, SimtPlansEqualReference) {
  std::mt19937 rng(41);
  for (auto dt : {core::DType::kBF16, core::DType::kF16}) check_plans(false, dt, rng);
}

TEST_F(CudaGemv, TensorCorePlansEqualReference) {
  std::mt19937 rng(42);
  for (auto dt : {core::DType::kBF16, core::DType::kF16}) check_plans(true, dt, rng);
}

// The public entry point: tensor cores only with 16-bit activations and more than kGemvSimtRows rows; the
// SIMT rows of a batch are bit-identical to the same row alone (the summation order ignores T).
TEST_F(CudaGemv, SimtRowsAreBatchInvariant) {
  std::mt19937 rng(43);
  for (const Case c : {Case{5120, 6144}, Case{300, 2048}, Case{34816, 512}}) {
    auto Wf = randn(rng, static_cast<size_t>(c.N * c.K));
    DevBuf<uint8_t> dW(gpu_test::to_bytes(Wf, core::DType::kBF16));
    constexpr int kRows = cu::kGemvSimtRows;
    auto x = randn(rng, static_cast<size_t>(kRows * c.K));
    DevBuf<float> dx(x), one(static_cast<size_t>(c.N)), many(static_cast<size_t>(kRows * c.N));
    ASSERT_EQ(cu::gemv(dW.get(), core::DType::kBF16, c.N, c.K, dx.get(), c.K, 1, one.get(), c.N, nullptr),
              cudaSuccess);
    ASSERT_EQ(
        cu::gemv(dW.get(), core::DType::kBF16, c.N, c.K, dx.get(), c.K, kRows, many.get(), c.N, nullptr),
        cudaSuccess);
    const auto a = one.download(), b = many.download();
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin())) << "N=" << c.N << " K=" << c.K;
  }
}

// The conv1d epilogue (GemvConv) on the SIMT kernel (T = 1..32 rows) and the scalar path of an unaligned K
// equals the plain GEMV followed by causal_conv1d_decode: y bit-equal, the shifted states bit-equal (they
// are copies), the conv output to 1e-6 (the same sum in the same order; only FMA contraction may differ).
TEST_F(CudaGemv, ConvEpilogueEqualsGemvThenConv1d) {
  std::mt19937 rng(44);
  const int64_t N = 300, C = 200;
  for (int64_t K : {512, 61}) {
    auto Wf = randn(rng, static_cast<size_t>(N * K));
    DevBuf<uint8_t> dW(gpu_test::to_bytes(Wf, core::DType::kBF16));
    for (int kc : {4, 2}) {
      for (int T : {1, 3, 8, 32}) {
        const int slots_n = T + 2;
        std::vector<int> slots(static_cast<size_t>(T));
        for (int t = 0; t < T; ++t) slots[t] = (t * 7 + 3) % slots_n;
        const int64_t stride = C * (kc - 1);
        const auto x = randn(rng, static_cast<size_t>(T * K)), w = randn(rng, static_cast<size_t>(C * kc)),
                   st = randn(rng, static_cast<size_t>(slots_n * stride));
        DevBuf<float> dx(x), dw(w), st_ref(st), st_got(st), y_ref(static_cast<size_t>(T * N)),
            y_got(static_cast<size_t>(T * N)), o_ref(static_cast<size_t>(T * C)),
            o_got(static_cast<size_t>(T * C));
        DevBuf<int> dslots(slots);
        DevBuf<uint8_t> dx16(static_cast<size_t>(T * K) * 2);
        ASSERT_EQ(cu::convert_rows(dx.get(), K, T, K, dx16.get(), core::DType::kBF16, nullptr), cudaSuccess);
        const void* x16 = K % 32 == 0 && T <= cu::kGemvSimtRows ? dx16.get() : nullptr;
        ASSERT_EQ(cu::gemv(dW.get(), core::DType::kBF16, N, K, dx.get(), K, x16, T,
                           cu::GemvOut{y_ref.get(), N, false, {}}, nullptr),
                  cudaSuccess);
        ASSERT_EQ(cu::causal_conv1d_decode(y_ref.get(), N, T, C, dw.get(), kc, st_ref.get(), stride,
                                           dslots.get(), o_ref.get(), C, nullptr),
                  cudaSuccess);
        cu::GemvOut out{y_got.get(), N, false, {}};
        out.conv = cu::GemvConv{dw.get(), kc, C, st_got.get(), stride, dslots.get(), o_got.get(), C};
        ASSERT_EQ(cu::gemv(dW.get(), core::DType::kBF16, N, K, dx.get(), K, x16, T, out, nullptr),
                  cudaSuccess);
        ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        const std::string at =
            "K=" + std::to_string(K) + " conv " + std::to_string(kc) + " T=" + std::to_string(T);
        EXPECT_EQ(y_got.download(), y_ref.download()) << at;
        EXPECT_EQ(st_got.download(), st_ref.download()) << at;
        EXPECT_LE(rel_err(o_got.download(), o_ref.download()), 1e-6) << at;
      }
    }
  }
  // Not on the tensor-core kernel, nor with SwiGLU (the columns would not be the conv's channels).
  {
    const int T = 8;
    const int64_t K = 64;
    DevBuf<uint8_t> dW(static_cast<size_t>(N * K) * 2), dx16(static_cast<size_t>(T * K) * 2);
    DevBuf<float> dx(static_cast<size_t>(T * K)), dy(static_cast<size_t>(T * N)),
        dw(static_cast<size_t>(C * 4)), st(static_cast<size_t>(C * 3)), o(static_cast<size_t>(T * C));
    DevBuf<int> slots(std::vector<int>(T, 0));
    cu::GemvOut out{dy.get(), N, false, {}};
    out.conv = cu::GemvConv{dw.get(), 4, C, st.get(), 0, slots.get(), o.get(), C};
    EXPECT_EQ(cu::gemv(dW.get(), core::DType::kBF16, N, K, dx.get(), K, dx16.get(), T, out, nullptr),
              cudaErrorInvalidValue);
  }
  cu::GemvOut bad{nullptr, N, true, {}};
  bad.conv.w = reinterpret_cast<const float*>(16);
  EXPECT_EQ(cu::gemv(nullptr, core::DType::kBF16, 2 * N, 64, nullptr, 64, nullptr, 1, bad, nullptr),
            cudaErrorInvalidValue);
}

// Qwen3.6-27B decode shapes (N, K): FFN gate/up and down, DeltaNet in/out, attention qkv/o, lm_head.
TEST_F(CudaGemv, DISABLED_TimingSweep27B) {
  const Case shapes[] = {{34816, 5120}, {5120, 17408},  {16480, 5120}, {5120, 6144},
                         {14336, 5120}, {248320, 5120}, {1280, 2048},  {2048, 512}};
  const int64_t max_elems = 248320LL * 5120;
  // Several copies of the weights so consecutive timings do not run from L2.
  constexpr int kCopies = 3;
  void* W[kCopies];
  for (auto& w : W) {
    ASSERT_EQ(cudaMalloc(&w, static_cast<size_t>(max_elems) * 2), cudaSuccess);
    ASSERT_EQ(cu::fill_random(w, core::DType::kBF16, max_elems, 7, 0.02f, 0.0f, nullptr), cudaSuccess);
  }
  DevBuf<float> x(static_cast<size_t>(32 * 17408)), y(static_cast<size_t>(32 * 248320));
  ASSERT_EQ(cu::fill_random(x.get(), core::DType::kF32, 32 * 17408, 8, 1.0f, 0.0f, nullptr), cudaSuccess);
  DevBuf<uint8_t> x16(static_cast<size_t>(32 * 17408) * 2);
  ASSERT_EQ(cu::convert_rows(x.get(), 17408, 32, 17408, x16.get(), core::DType::kBF16, nullptr), cudaSuccess);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int T : {1, 4, 8, 16, 32}) {
    const bool mma = T > cu::kGemvSimtRows;
    const int plans = mma ? cu::gemv_mma_plans() : cu::gemv_simt_plans();
    for (const auto& s : shapes) {
      std::printf("T=%2d N=%6lld K=%6lld:", T, static_cast<long long>(s.N), static_cast<long long>(s.K));
      for (int p = -1; p < plans; ++p) {
        std::vector<float> ms;
        for (int it = 0; it < 12; ++it) {
          cudaEventRecord(e0);
          const cudaError_t err = cu::gemv_with_plan(W[it % kCopies], core::DType::kBF16, s.N, s.K, x.get(),
                                                     s.K, mma ? x16.get() : nullptr, T,
                                                     cu::GemvOut{y.get(), s.N, false, {}}, p, nullptr);
          cudaEventRecord(e1);
          ASSERT_EQ(err, cudaSuccess);
          cudaEventSynchronize(e1);
          float t = 0;
          cudaEventElapsedTime(&t, e0, e1);
          if (it >= 2) ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        const double sec = ms[ms.size() / 2] * 1e-3;
        std::printf("  [%d] %.2f", p, static_cast<double>(s.N * s.K * 2) / sec / 1e12);
      }
      std::printf("  TB/s\n");
    }
  }
  for (auto w : W) cudaFree(w);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace
}  // namespace deltaflow
