// The fused MoE decode kernels (backend/cuda/moe_decode.cuh) against the CPU reference ops, on random shapes
// with ragged sizes (rows not a multiple of a block's, K not a multiple of the 16-byte vector: the
// element-wise path), T = 1, 3, 8, 32 tokens and K = 1..8 experts per token. Label `gpu`.
//
// Tolerance, as max |gpu - cpu| / max(1, max |cpu|): every kernel accumulates in fp32 like the reference, in
// a different order (and with FMA), so they agree to ~1e-6; 2e-5 leaves the margin of the other op tests. The
// whole block (logits, routing, gate/up, down) is held to the same bound: random logits put no two experts
// within fp32 rounding of each other, so the routing is the reference's.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.hpp"
#include "backend/cuda/moe.cuh"
#include "backend/cuda/moe_decode.cuh"
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
const int kTokens[] = {1, 3, 8, 32};

class CudaMoeDecode : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(gpu_test::have_gpu()) << "no GPU visible"; }
};

// Rows [e * rows, (e + 1) * rows) of an expert stack, as a matrix of its own.
model::Mat expert_view(const HostMat& stack, int64_t e, int64_t rows) {
  return model::Mat{
      static_cast<const uint8_t*>(stack.mat.data) + static_cast<size_t>(e * rows) * stack.mat.row_bytes(),
      stack.mat.dtype, rows, stack.mat.cols};
}

// silu(x . W[j]) * (x . W[I + j]) for j < I: the reference SwiGLU of one expert on one row.
std::vector<float> ref_swiglu(const model::Mat& W, const float* x, int64_t I) {
  std::vector<float> gu(static_cast<size_t>(2 * I)), out(static_cast<size_t>(I));
  cpu::linear(x, 1, W, gu.data());
  for (int64_t j = 0; j < I; ++j) out[j] = cpu::silu(gu[j]) * gu[I + j];
  return out;
}

std::string where(core::DType dt, int T, int64_t a, int64_t b, int64_t c) {
  return std::string(core::dtype_name(dt)) + " T=" + std::to_string(T) + " shape " + std::to_string(a) + "x" +
         std::to_string(b) + "x" + std::to_string(c);
}

TEST_F(CudaMoeDecode, RouterLogitsEqualCpuLinearSplitInTwo) {
  std::mt19937 rng(31);
  struct Shape {
    int64_t N, n_split, K;
  };
  // N = E + 1 (router + shared gate) at real and ragged sizes; K % 8 != 0 takes the element-wise path.
  const Shape shapes[] = {{257, 256, 2048}, {9, 8, 64},   {65, 64, 200},
                          {33, 32, 61},     {5, 5, 1003}, {130, 1, 40}};
  for (core::DType dt : {core::DType::kBF16, core::DType::kF16, core::DType::kF32}) {
    for (const auto& s : shapes) {
      HostMat W(randn(rng, static_cast<size_t>(s.N * s.K)), dt, s.N, s.K);
      DevBuf<uint8_t> dW(W.bytes);
      // T = 100: one launch over four tiles of 32 tokens, the last ragged (the MoE prefill's form).
      for (int T : {1, 3, 8, 32, 100}) {
        const auto x = randn(rng, static_cast<size_t>(T * s.K));
        std::vector<float> ref(static_cast<size_t>(T * s.N));
        cpu::linear(x.data(), T, W.mat, ref.data());
        const int64_t n1 = s.N - s.n_split;
        DevBuf<float> dx(x), d0(static_cast<size_t>(T * s.n_split)),
            d1(static_cast<size_t>(T * std::max<int64_t>(n1, 1)));
        ASSERT_EQ(cu::moe_router_logits(dW.get(), dt, s.N, s.n_split, s.K, dx.get(), s.K, T, d0.get(),
                                        s.n_split, d1.get(), n1, nullptr),
                  cudaSuccess);
        ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        std::vector<float> got(static_cast<size_t>(T * s.N));
        const auto o0 = d0.download(), o1 = d1.download();
        for (int t = 0; t < T; ++t)
          for (int64_t n = 0; n < s.N; ++n)
            got[t * s.N + n] = n < s.n_split ? o0[t * s.n_split + n] : o1[t * n1 + n - s.n_split];
        EXPECT_LE(rel_err(got, ref), kTol) << where(dt, T, s.N, s.n_split, s.K);
        if (T <= 32) continue;
        // Every row bit-equal to its own tile-sized launch: prefill routes on decode's logits.
        for (int t0 = 0; t0 < T; t0 += 32) {
          const int rows = std::min(32, T - t0);
          DevBuf<float> e0(static_cast<size_t>(rows * s.n_split)),
              e1(static_cast<size_t>(rows * std::max<int64_t>(n1, 1)));
          ASSERT_EQ(cu::moe_router_logits(dW.get(), dt, s.N, s.n_split, s.K, dx.get() + t0 * s.K, s.K, rows,
                                          e0.get(), s.n_split, e1.get(), n1, nullptr),
                    cudaSuccess);
          const auto p0 = e0.download(), p1 = e1.download();
          EXPECT_EQ(p0, std::vector<float>(o0.begin() + t0 * s.n_split, o0.begin() + (t0 + rows) * s.n_split))
              << "tile at " << t0 << ", " << where(dt, T, s.N, s.n_split, s.K);
          if (n1 > 0) {
            EXPECT_EQ(p1, std::vector<float>(o1.begin() + t0 * n1, o1.begin() + (t0 + rows) * n1))
                << "tile at " << t0 << ", " << where(dt, T, s.N, s.n_split, s.K);
          }
        }
      }
    }
  }
}

struct MoeShape {
  int64_t E, H, Im, Is;
  int K;
};
// Real (Qwen3.5-35B-A3B H, Im = Is, K = 8), the tiny presets' Im != Is, ragged H and I.
const MoeShape kShapes[] = {{12, 2048, 512, 512, 8}, {8, 64, 32, 48, 2}, {16, 200, 96, 96, 1},
                            {12, 40, 24, 40, 5},     {10, 13, 7, 9, 3},  {32, 256, 128, 64, 7}};

std::vector<int> random_ids(std::mt19937& rng, int T, int K, int64_t E) {
  std::vector<int> ids(static_cast<size_t>(T * K));
  for (auto& e : ids) e = static_cast<int>(rng() % E);  // duplicates across and within tokens allowed
  return ids;
}

TEST_F(CudaMoeDecode, GateUpSwigluEqualsCpuPerExpert) {
  std::mt19937 rng(32);
  struct Types {
    core::DType routed, shared;
  };
  for (auto [rt, st] :
       {Types{core::DType::kBF16, core::DType::kBF16}, Types{core::DType::kF16, core::DType::kF16},
        Types{core::DType::kF32, core::DType::kF32}, Types{core::DType::kBF16, core::DType::kF16}}) {
    for (const auto& s : kShapes) {
      HostMat Wr(randn(rng, static_cast<size_t>(s.E * 2 * s.Im * s.H)), rt, s.E * 2 * s.Im, s.H);
      HostMat Ws(randn(rng, static_cast<size_t>(2 * s.Is * s.H)), st, 2 * s.Is, s.H);
      DevBuf<uint8_t> dWr(Wr.bytes), dWs(Ws.bytes);
      for (int T : kTokens) {
        const auto ids = random_ids(rng, T, s.K, s.E);
        const auto x = randn(rng, static_cast<size_t>(T * s.H));
        DevBuf<int> dids(ids);
        DevBuf<float> dx(x), dact(static_cast<size_t>(T * s.K * s.Im)), dsh(static_cast<size_t>(T * s.Is));
        const cu::MoeGateUpWeights r{dWr.get(), rt, s.Im, 2 * s.Im * s.H}, sh{dWs.get(), st, s.Is, 0};
        ASSERT_EQ(cu::moe_gate_up_swiglu(r, dids.get(), s.K, sh, s.H, dx.get(), s.H, T, dact.get(), s.Im,
                                         dsh.get(), s.Is, nullptr),
                  cudaSuccess);
        ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        std::vector<float> ref_r, ref_s;
        for (int t = 0; t < T; ++t) {
          for (int k = 0; k < s.K; ++k) {
            const auto v = ref_swiglu(expert_view(Wr, ids[t * s.K + k], 2 * s.Im), x.data() + t * s.H, s.Im);
            ref_r.insert(ref_r.end(), v.begin(), v.end());
          }
          const auto v = ref_swiglu(Ws.mat, x.data() + t * s.H, s.Is);
          ref_s.insert(ref_s.end(), v.begin(), v.end());
        }
        const std::string at = where(rt, T, s.H, s.Im, s.Is) + " K=" + std::to_string(s.K) + " shared " +
                               std::string(core::dtype_name(st));
        EXPECT_LE(rel_err(dact.download(), ref_r), kTol) << "routed " << at;
        EXPECT_LE(rel_err(dsh.download(), ref_s), kTol) << "shared " << at;
      }
    }
  }
}

// y[t] = sum_k w[t, k] down_{ids[t, k]}(act[t*K + k]) + sigmoid(g[t]) down_shared(act_shared[t]).
std::vector<float> ref_down(const HostMat& Wr, const HostMat& Ws, const std::vector<int>& ids,
                            const std::vector<float>& w, const std::vector<float>& g,
                            const std::vector<float>& act, const std::vector<float>& act_s, int T,
                            const MoeShape& s) {
  std::vector<float> y(static_cast<size_t>(T * s.H), 0.0f), tmp(static_cast<size_t>(s.H));
  for (int t = 0; t < T; ++t) {
    for (int k = 0; k < s.K; ++k) {
      cpu::linear(act.data() + (t * s.K + k) * s.Im, 1, expert_view(Wr, ids[t * s.K + k], s.H), tmp.data());
      for (int64_t n = 0; n < s.H; ++n) y[t * s.H + n] += w[t * s.K + k] * tmp[n];
    }
    cpu::linear(act_s.data() + t * s.Is, 1, Ws.mat, tmp.data());
    for (int64_t n = 0; n < s.H; ++n) y[t * s.H + n] += cpu::sigmoid(g[t]) * tmp[n];
  }
  return y;
}

TEST_F(CudaMoeDecode, DownCombineEqualsCpuWeightedSum) {
  std::mt19937 rng(33);
  struct Types {
    core::DType routed, shared;
  };
  for (auto [rt, st] :
       {Types{core::DType::kBF16, core::DType::kBF16}, Types{core::DType::kF16, core::DType::kF16},
        Types{core::DType::kF32, core::DType::kF32}, Types{core::DType::kF16, core::DType::kBF16}}) {
    for (const auto& s : kShapes) {
      HostMat Wr(randn(rng, static_cast<size_t>(s.E * s.H * s.Im)), rt, s.E * s.H, s.Im);
      HostMat Ws(randn(rng, static_cast<size_t>(s.H * s.Is)), st, s.H, s.Is);
      DevBuf<uint8_t> dWr(Wr.bytes), dWs(Ws.bytes);
      for (int T : kTokens) {
        const auto ids = random_ids(rng, T, s.K, s.E);
        const auto w = randn(rng, static_cast<size_t>(T * s.K), 0.5f);
        const auto g = randn(rng, static_cast<size_t>(T), 2.0f);
        const auto act = randn(rng, static_cast<size_t>(T * s.K * s.Im));
        const auto act_s = randn(rng, static_cast<size_t>(T * s.Is));
        DevBuf<int> dids(ids);
        DevBuf<float> dw(w), dg(g), dact(act), dact_s(act_s), dy(static_cast<size_t>(T * s.H));
        const cu::MoeDownWeights r{dWr.get(), rt, s.Im, s.H * s.Im}, sh{dWs.get(), st, s.Is, 0};
        ASSERT_EQ(cu::moe_down_combine(r, dids.get(), dw.get(), s.K, sh, dg.get(), s.H, dact.get(), s.Im,
                                       dact_s.get(), s.Is, T, dy.get(), s.H, nullptr),
                  cudaSuccess);
        ASSERT_EQ(cudaGetLastError(), cudaSuccess);
        const auto ref = ref_down(Wr, Ws, ids, w, g, act, act_s, T, s);
        EXPECT_LE(rel_err(dy.download(), ref), kTol)
            << where(rt, T, s.H, s.Im, s.Is) << " K=" << s.K << " shared " << core::dtype_name(st);
      }
    }
  }
}

// Every K from 1 to 8 through the whole block, as CudaBackend::moe runs it at decode, against the reference
// MoE block composed of the CPU ops (as CpuBackend::ffn).
TEST_F(CudaMoeDecode, WholeBlockEqualsCpuForEveryTopK) {
  std::mt19937 rng(34);
  const int64_t E = 48, H = 256, I = 64;
  const core::DType dt = core::DType::kBF16;
  const float hs = 1.0f / 16.0f;
  HostMat Wrg(randn(rng, static_cast<size_t>((E + 1) * H), 4.0f * hs), dt, E + 1, H);  // [router | gate]
  HostMat Wgu(randn(rng, static_cast<size_t>(E * 2 * I * H), hs), dt, E * 2 * I, H);
  HostMat Wdn(randn(rng, static_cast<size_t>(E * H * I), 0.125f), dt, E * H, I);
  HostMat Wsgu(randn(rng, static_cast<size_t>(2 * I * H), hs), dt, 2 * I, H);
  HostMat Wsdn(randn(rng, static_cast<size_t>(H * I), 0.125f), dt, H, I);
  DevBuf<uint8_t> dWrg(Wrg.bytes), dWgu(Wgu.bytes), dWdn(Wdn.bytes), dWsgu(Wsgu.bytes), dWsdn(Wsdn.bytes);
  for (int K = 1; K <= 8; ++K) {
    for (int T : kTokens) {
      const auto x = randn(rng, static_cast<size_t>(T * H));
      DevBuf<float> dx(x), dlog(static_cast<size_t>(T * E)), dgate(static_cast<size_t>(T)),
          dw(static_cast<size_t>(T * K)), dact(static_cast<size_t>(T * K * I)),
          dact_s(static_cast<size_t>(T * I)), dy(static_cast<size_t>(T * H));
      DevBuf<int> dids(static_cast<size_t>(T * K));
      ASSERT_EQ(cu::moe_router_logits(dWrg.get(), dt, E + 1, E, H, dx.get(), H, T, dlog.get(), E, dgate.get(),
                                      1, nullptr),
                cudaSuccess);
      ASSERT_EQ(cu::moe_route(dlog.get(), E, T, E, K, true, dids.get(), dw.get(), nullptr), cudaSuccess);
      const cu::MoeGateUpWeights gu{dWgu.get(), dt, I, 2 * I * H}, sgu{dWsgu.get(), dt, I, 0};
      ASSERT_EQ(cu::moe_gate_up_swiglu(gu, dids.get(), K, sgu, H, dx.get(), H, T, dact.get(), I, dact_s.get(),
                                       I, nullptr),
                cudaSuccess);
      const cu::MoeDownWeights dn{dWdn.get(), dt, I, H * I}, sdn{dWsdn.get(), dt, I, 0};
      ASSERT_EQ(cu::moe_down_combine(dn, dids.get(), dw.get(), K, sdn, dgate.get(), H, dact.get(), I,
                                     dact_s.get(), I, T, dy.get(), H, nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess);

      std::vector<float> ref(static_cast<size_t>(T * H), 0.0f), logits(static_cast<size_t>(E + 1)),
          tmp(static_cast<size_t>(H));
      for (int t = 0; t < T; ++t) {
        const float* xt = x.data() + t * H;
        cpu::linear(xt, 1, Wrg.mat, logits.data());
        std::vector<float> p(logits.begin(), logits.begin() + E);
        cpu::softmax(p.data(), E);
        std::vector<int> idx(static_cast<size_t>(E));
        std::iota(idx.begin(), idx.end(), 0);
        std::partial_sort(idx.begin(), idx.begin() + K, idx.end(),
                          [&](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
        float sum = 0;
        for (int j = 0; j < K; ++j) sum += p[idx[j]];
        for (int j = 0; j < K; ++j) {
          const auto a = ref_swiglu(expert_view(Wgu, idx[j], 2 * I), xt, I);
          cpu::linear(a.data(), 1, expert_view(Wdn, idx[j], H), tmp.data());
          for (int64_t n = 0; n < H; ++n) ref[t * H + n] += p[idx[j]] / sum * tmp[n];
        }
        const auto a = ref_swiglu(Wsgu.mat, xt, I);
        cpu::linear(a.data(), 1, Wsdn.mat, tmp.data());
        for (int64_t n = 0; n < H; ++n) ref[t * H + n] += cpu::sigmoid(logits[E]) * tmp[n];
      }
      EXPECT_LE(rel_err(dy.download(), ref), kTol) << "K=" << K << " T=" << T;
    }
  }
}

TEST_F(CudaMoeDecode, RejectsMoreRowsThanOneLaunchTakes) {
  const cu::MoeGateUpWeights none{};
  const cu::MoeDownWeights dnone{};
  // The router kernel tiles any T up to its grid's limit.
  EXPECT_EQ(cu::moe_router_logits(nullptr, core::DType::kBF16, 4, 4, 8, nullptr, 8, 65535 * 32 + 1, nullptr,
                                  4, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(
      cu::moe_gate_up_swiglu(none, nullptr, 1, none, 8, nullptr, 8, 33, nullptr, 1, nullptr, 1, nullptr),
      cudaErrorInvalidValue);
  EXPECT_EQ(cu::moe_down_combine(dnone, nullptr, nullptr, 1, dnone, nullptr, 8, nullptr, 1, nullptr, 1, 33,
                                 nullptr, 8, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace deltaflow
