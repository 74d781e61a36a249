// The fp8 KV cache on CUDA (KvCache::fp8: E4M3 codes + an fp32 scale per position and kv head): the store
// writes the codes and scales the CPU reference (backend/kv_quant.cpp) would for the same rows, and a
// prefill over the cache (the codes dequantized to bf16 for the tensor-core kernel, or read directly by the
// fp32 SIMT kernel) equals a float64 reference on the values the codes read back as. Decode over an fp8
// cache is in cuda_attention_decode_test.cpp. Label `gpu`.
//
// Tolerances (max |gpu - ref| / max(1, max |ref|)): the store is bit-exact; the tensor-core prefill rounds
// q, p and the dequantized keys to bf16 (kTol 1e-2, as cuda_attention_prefill_test.cpp); the SIMT kernel
// reads code * scale in fp32 (kSimtTol 1e-4).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "attention_reference.hpp"
#include "backend/backend.hpp"
#include "backend/cuda/attention.cuh"
#include "backend/kv_quant.hpp"
#include "core/dtype.hpp"
#include "gpu_test_util.hpp"
#include "model/quant/quantize.hpp"

namespace deltaflow {
namespace {

using gpu_test::DevBuf;
using gpu_test::randn;
using gpu_test::rel_err;
namespace cu = backend::cuda;

constexpr double kTol = 1e-2;
constexpr double kSimtTol = 1e-4;

class CudaKvFp8 : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(gpu_test::have_gpu()) << "no GPU visible"; }
};

// qk_norm_rope_store into an fp32 cache gives the exact rows; into an fp8 cache, codes and scales. The CPU's
// round_kv_row of each exact row must read back exactly as the GPU's code * scale.
TEST_F(CudaKvFp8, StoreWritesTheCodesTheCpuWould) {
  std::mt19937 rng(51);
  const int nh = 8, nkv = 2, hd = 128, rot = 32, T = 37, slots = 2;
  const int64_t max_ctx = 64, Q = nh * 2 * hd + 2 * nkv * hd;
  std::vector<float> inv_freq;
  for (int i = 0; i < rot / 2; ++i)
    inv_freq.push_back(static_cast<float>(1.0 / std::pow(1e7, 2.0 * i / rot)));
  auto qkv = randn(rng, static_cast<size_t>(T * Q), 1.0f);
  for (int i = 0; i < hd; ++i)
    qkv[static_cast<size_t>(5 * Q + nh * 2 * hd + nkv * hd + i)] = 0.0f;  // a zero v row
  DevBuf<float> dqkv(qkv), dqn(randn(rng, hd, 0.1f)), dkn(randn(rng, hd, 0.1f)), dfreq(inv_freq);
  std::vector<int> pos(T), slot(T, 1);
  std::iota(pos.begin(), pos.end(), 0);
  DevBuf<int> dpos(pos), dslot(slot);
  DevBuf<float> dq(static_cast<size_t>(T * nh * hd));
  const int64_t stride = nkv * max_ctx * hd;
  DevBuf<float> kf(static_cast<size_t>(slots * stride)), vf(kf.size());
  DevBuf<uint8_t> k8(static_cast<size_t>(slots * stride)), v8(k8.size());
  DevBuf<float> ks(static_cast<size_t>(slots * stride / hd)), vs(ks.size());
  cu::QkvArgs a;
  a.qkv = dqkv.get();
  a.ld = Q;
  a.n_tokens = T;
  a.nh = nh;
  a.nkv = nkv;
  a.hd = hd;
  a.rot = rot;
  a.q_norm = dqn.get();
  a.k_norm = dkn.get();
  a.inv_freq = dfreq.get();
  a.tok_pos = dpos.get();
  a.tok_slot = dslot.get();
  a.q_out = dq.get();
  a.cache = cu::KvCache{kf.get(), vf.get(), true, stride, max_ctx};
  ASSERT_EQ(cu::qk_norm_rope_store(a, nullptr), cudaSuccess);
  a.cache = cu::KvCache{k8.get(), v8.get(), false, stride, max_ctx};
  a.cache.fp8 = true;
  a.cache.k_scale = ks.get();
  a.cache.v_scale = vs.get();
  ASSERT_EQ(cu::qk_norm_rope_store(a, nullptr), cudaSuccess);
  const auto exact_k = kf.download(), exact_v = vf.download(), sk = ks.download(), sv = vs.download();
  const auto ck = k8.download(), cv = v8.download();
  int rows = 0, mismatches = 0;
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < nkv; ++h) {
      const int64_t row = (stride + (h * max_ctx + t) * hd) / hd;
      for (int kv = 0; kv < 2; ++kv) {
        const auto& exact = kv ? exact_v : exact_k;
        const auto& codes = kv ? cv : ck;
        const float gpu_scale = (kv ? sv : sk)[static_cast<size_t>(row)];
        std::vector<float> x(exact.begin() + row * hd, exact.begin() + (row + 1) * hd);
        const float scale = backend::round_kv_row(x.data(), hd, backend::KvCacheDtype::kFp8);
        ++rows;
        bool same = scale == gpu_scale;
        for (int i = 0; i < hd && same; ++i)
          same = core::f8e4m3_to_f32(codes[static_cast<size_t>(row * hd + i)]) * gpu_scale == x[i];
        if (!same) ++mismatches;
      }
    }
  EXPECT_EQ(mismatches, 0) << "of " << rows << " rows";
  EXPECT_EQ(sv[static_cast<size_t>((stride + 5 * hd) / hd)], 1.0f) << "a zero row keeps scale 1";
}

// One prefill of T tokens at positions P..P+T-1 of the sequence in slot 1 of a 3-slot contiguous fp8 cache
// (the other slots and the positions past the sequence hold NaN codes and scales).
struct Fp8Prefill {
  int nh, nkv, hd, T, P;
  int64_t max_ctx;
  std::vector<float> q, gate, k, v;  // k, v: [P + T, nkv, hd] as the codes read back
  std::vector<uint8_t> kc, vc;       // [3][nkv][max_ctx][hd]
  std::vector<float> ks, vs;         // [3][nkv][max_ctx]
  int64_t gate_ld;
};

Fp8Prefill make(std::mt19937& rng, int nh, int nkv, int hd, int T, int P) {
  Fp8Prefill p{nh, nkv, hd, T, P, P + T + 12, {}, {}, {}, {}, {}, {}, {}, {}, 0};
  p.gate_ld = static_cast<int64_t>(nh) * 2 * hd;
  p.q = randn(rng, static_cast<size_t>(T) * nh * hd);
  p.gate = randn(rng, static_cast<size_t>(T * p.gate_ld), 2.0f);
  const int64_t stride = nkv * p.max_ctx * hd;
  p.kc.assign(static_cast<size_t>(3 * stride), 0x7f);
  p.vc = p.kc;
  p.ks.assign(static_cast<size_t>(3 * stride / hd), NAN);
  p.vs = p.ks;
  p.k = randn(rng, static_cast<size_t>(P + T) * nkv * hd);
  p.v = randn(rng, p.k.size());
  for (int j = 0; j < P + T; ++j)
    for (int h = 0; h < nkv; ++h) {
      const int64_t row = (stride + (h * p.max_ctx + j) * hd) / hd;
      for (int kv = 0; kv < 2; ++kv) {
        float* x = (kv ? p.v : p.k).data() + (static_cast<size_t>(j) * nkv + h) * hd;
        const float scale = backend::round_kv_row(x, hd, backend::KvCacheDtype::kFp8);
        (kv ? p.vs : p.ks)[static_cast<size_t>(row)] = scale;
        for (int i = 0; i < hd; ++i)
          (kv ? p.vc : p.kc)[static_cast<size_t>(row * hd + i)] = model::quant::f32_to_e4m3(x[i] / scale);
      }
    }
  return p;
}

std::vector<float> reference(const Fp8Prefill& p) {
  const int grp = p.nh / p.nkv;
  std::vector<float> out(static_cast<size_t>(p.T) * p.nh * p.hd);
  for (int t = 0; t < p.T; ++t)
    for (int h = 0; h < p.nh; ++h)
      gpu_test::reference_attention_head(p.q.data() + (static_cast<size_t>(t) * p.nh + h) * p.hd, p.k.data(),
                                         p.v.data(), p.P + t + 1, p.nkv, h / grp, p.hd,
                                         p.gate.data() + t * p.gate_ld + static_cast<int64_t>(h) * 2 * p.hd,
                                         out.data() + (static_cast<size_t>(t) * p.nh + h) * p.hd);
  return out;
}

// with_scratch: the dequantize step and the tensor-core kernel; without: the SIMT kernel on the codes.
std::vector<float> run(const Fp8Prefill& p, bool with_scratch) {
  DevBuf<uint8_t> kc(p.kc), vc(p.vc);
  DevBuf<float> ks(p.ks), vs(p.vs), q(p.q), gate(p.gate), out(static_cast<size_t>(p.T) * p.nh * p.hd);
  DevBuf<float> pacc(static_cast<size_t>(p.T) * p.nh * p.hd), pml(static_cast<size_t>(p.T) * p.nh * 2);
  const int64_t deq = cu::attention_dequant_elems(p.max_ctx, p.nkv, p.hd);
  DevBuf<uint16_t> scratch(static_cast<size_t>(deq));
  std::vector<int> pos(static_cast<size_t>(p.T)), slot(static_cast<size_t>(p.T), 1);
  std::iota(pos.begin(), pos.end(), p.P);
  DevBuf<int> dpos(pos), dslot(slot);
  cu::AttnArgs a;
  a.q = q.get();
  a.cache = cu::KvCache{kc.get(), vc.get(), false, p.nkv * p.max_ctx * p.hd, p.max_ctx};
  a.cache.fp8 = true;
  a.cache.k_scale = ks.get();
  a.cache.v_scale = vs.get();
  a.n_tokens = p.T;
  a.nh = p.nh;
  a.nkv = p.nkv;
  a.hd = p.hd;
  a.tok_pos = dpos.get();
  a.tok_slot = dslot.get();
  a.prefill = true;
  a.max_splits = cu::attention_max_splits(p.max_ctx);
  a.scale = 1.0f / std::sqrt(static_cast<float>(p.hd));
  a.part_acc = pacc.get();
  a.part_ml = pml.get();
  a.gate = gate.get();
  a.gate_ld = p.gate_ld;
  a.gate_head_stride = 2 * p.hd;
  a.out = out.get();
  if (with_scratch) {
    a.dequant = scratch.get();
    a.dequant_elems = deq;
  }
  EXPECT_EQ(cu::attention(a, nullptr), cudaSuccess);
  return out.download();
}

TEST_F(CudaKvFp8, PrefillOverTheCacheEqualsCpu) {
  std::mt19937 rng(52);
  struct Shape {
    int nh, nkv, hd, T, P;
  };
  // The 27B shape with a cached prefix and a ragged tail; hd 128 from position 0; hd 64 with 8 heads a group.
  for (const Shape& s : {Shape{24, 4, 256, 150, 77}, Shape{16, 2, 128, 64, 0}, Shape{8, 1, 64, 33, 200}}) {
    const Fp8Prefill p = make(rng, s.nh, s.nkv, s.hd, s.T, s.P);
    const auto ref = reference(p);
    const double tc = rel_err(run(p, true), ref), simt = rel_err(run(p, false), ref);
    std::printf("[ fp8 prefill ] nh=%d nkv=%d hd=%d T=%d P=%d: tensor cores %.3g, simt %.3g\n", s.nh, s.nkv,
                s.hd, s.T, s.P, tc, simt);
    EXPECT_LE(tc, kTol) << "hd " << s.hd;
    EXPECT_LE(simt, kSimtTol) << "hd " << s.hd;
  }
}

}  // namespace
}  // namespace deltaflow
