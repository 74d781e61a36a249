// The tensor-core decode attention (backend/cuda/attention_decode.cu, reached through attention() with a bf16
// cache and prefill false) against a float64 CPU reference of GQA softmax attention with the output gate, on
// the same bf16 k and v and the fp32 q the kernel is given: a batch of sequences at their own lengths in a
// paged cache whose pages are shuffled and whose unused positions hold NaN. Label `gpu`.
//
// Tolerance, as max |gpu - ref| / max(1, max |ref|): q and the softmax weights p are rounded to bf16 for the
// mma, as in the prefill kernel (cuda_attention_prefill_test.cpp), so kTol = 1e-2 as there. A one-key
// masking error at a tile's end, a wrong kv head, page or split, a lost warp in the merge or an unwritten
// element (NaN) is an O(0.1..1) error at these lengths.
//
// The fp8 cache (E4M3 codes + a scale per position and kv head, backend/kv_quant.hpp) is checked the same
// way against the reference on the values the codes read back as: the kernel widens the codes exactly and
// applies the scales to the scores and the weights, so the same kTol holds. Head size 32 (and groups over
// 16) stay on the fp32 SIMT kernel, which reads code * scale as the CPU does: kSimtTol = 1e-4 there.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "attention_reference.hpp"
#include "backend/cuda/attention.cuh"
#include "backend/cuda/attention_decode.cuh"
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
constexpr int kPage = 16;  // positions per page (page_shift 4)

class CudaAttentionDecode : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(gpu_test::have_gpu()) << "no GPU visible"; }
};

// Decode rows of sequences of lengths `lens` (row s sees positions 0..lens[s]-1); k and v per sequence
// [len, nkv, hd] (the values the cache reads back as), q [rows, nh, hd], the gate [rows, gate_ld] with head
// stride 2 hd. fp8: the cache's codes and per-row scales too.
struct Batch {
  int nh = 0, nkv = 0, hd = 0;
  std::vector<int> lens;
  std::vector<std::vector<float>> k, v;
  std::vector<float> q, gate;
  int64_t gate_ld = 0;
  bool fp8 = false;
  std::vector<std::vector<uint8_t>> k_codes, v_codes;
  std::vector<std::vector<float>> k_scales, v_scales;  // [len, nkv]
};

// One (position, kv head) row as the fp8 cache stores it (backend/kv_quant.cpp): scale = amax / 448, codes
// E4M3(x / scale); x becomes what it reads back as.
float fp8_row(float* x, uint8_t* codes, int n) {
  float amax = 0;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax > 0 ? amax / 448.0f : 1.0f;
  for (int i = 0; i < n; ++i) {
    codes[i] = amax > 0 ? model::quant::f32_to_e4m3(x[i] / scale) : 0;
    x[i] = core::f8e4m3_to_f32(codes[i]) * scale;
  }
  return scale;
}

Batch make_batch(std::mt19937& rng, int nh, int nkv, int hd, std::vector<int> lens, float q_scale,
                 bool fp8 = false) {
  Batch b;
  b.nh = nh;
  b.nkv = nkv;
  b.hd = hd;
  b.lens = std::move(lens);
  b.gate_ld = static_cast<int64_t>(nh) * 2 * hd + 8;
  b.fp8 = fp8;
  for (int len : b.lens) {
    auto k = randn(rng, static_cast<size_t>(len) * nkv * hd), v = randn(rng, k.size());
    if (fp8) {
      std::vector<uint8_t> kc(k.size()), vc(v.size());
      std::vector<float> ks(static_cast<size_t>(len) * nkv), vs(ks.size());
      for (size_t r = 0; r < ks.size(); ++r) {
        ks[r] = fp8_row(k.data() + r * hd, kc.data() + r * hd, hd);
        vs[r] = fp8_row(v.data() + r * hd, vc.data() + r * hd, hd);
      }
      b.k_codes.push_back(std::move(kc));
      b.v_codes.push_back(std::move(vc));
      b.k_scales.push_back(std::move(ks));
      b.v_scales.push_back(std::move(vs));
    } else {
      for (auto& x : k) x = core::round_bf16(x);
      for (auto& x : v) x = core::round_bf16(x);
    }
    b.k.push_back(std::move(k));
    b.v.push_back(std::move(v));
  }
  const size_t rows = b.lens.size();
  b.q = randn(rng, rows * nh * hd, q_scale);
  b.gate = randn(rng, rows * static_cast<size_t>(b.gate_ld), 2.0f);
  return b;
}

std::vector<float> cpu_decode(const Batch& b) {
  const int nh = b.nh, hd = b.hd, grp = nh / b.nkv;
  std::vector<float> out(b.lens.size() * nh * hd);
  for (size_t r = 0; r < b.lens.size(); ++r)
    for (int h = 0; h < nh; ++h)
      gpu_test::reference_attention_head(
          b.q.data() + (r * nh + h) * hd, b.k[r].data(), b.v[r].data(), b.lens[r], b.nkv, h / grp, hd,
          b.gate.data() + r * b.gate_ld + static_cast<int64_t>(h) * 2 * hd, out.data() + (r * nh + h) * hd);
  return out;
}

// The batch on the device: each sequence's pages drawn from a shuffled pool (two spare pages of NaN), table
// rows of max_pages entries, the sequences' rows in order `order` (a permutation of the batch).
struct DeviceBatch {
  std::vector<int> table;
  DevBuf<uint16_t> kc, vc;
  DevBuf<uint8_t> k8, v8;  // fp8 codes
  DevBuf<float> ks, vs;    // fp8 scales
  DevBuf<int> dtable, pos, slot;
  DevBuf<float> q, gate, out, pacc, pml;
  cu::AttnArgs args;

  DeviceBatch(const Batch& b, const std::vector<int>& order, int64_t max_ctx, std::mt19937& rng)
      : table(layout(b, max_ctx, rng)),
        kc(b.fp8 ? std::vector<uint16_t>{} : fill(b, table, max_ctx, b.k)),
        vc(b.fp8 ? std::vector<uint16_t>{} : fill(b, table, max_ctx, b.v)),
        k8(b.fp8 ? fill_codes(b, table, max_ctx, b.k_codes) : std::vector<uint8_t>{}),
        v8(b.fp8 ? fill_codes(b, table, max_ctx, b.v_codes) : std::vector<uint8_t>{}),
        ks(b.fp8 ? fill_scales(b, table, max_ctx, b.k_scales) : std::vector<float>{}),
        vs(b.fp8 ? fill_scales(b, table, max_ctx, b.v_scales) : std::vector<float>{}),
        dtable(table),
        pos(pick(order, [&](int s) { return b.lens[static_cast<size_t>(s)] - 1; })),
        slot(pick(order, [](int s) { return s; })),
        q(rows(order, b.q, static_cast<size_t>(b.nh) * b.hd)),
        gate(rows(order, b.gate, static_cast<size_t>(b.gate_ld))),
        out(order.size() * b.nh * b.hd),
        pacc(order.size() * b.nh * cu::attention_max_splits(max_ctx) * b.hd),
        pml(order.size() * b.nh * cu::attention_max_splits(max_ctx) * 2) {
    const int64_t page_elems = static_cast<int64_t>(b.nkv) * kPage * b.hd;
    args.q = q.get();
    args.cache =
        cu::KvCache{kc.get(), vc.get(), false, page_elems, max_ctx, dtable.get(), max_pages(max_ctx), 4};
    if (b.fp8) {
      args.cache.k = k8.get();
      args.cache.v = v8.get();
      args.cache.fp8 = true;
      args.cache.k_scale = ks.get();
      args.cache.v_scale = vs.get();
    }
    args.n_tokens = static_cast<int>(order.size());
    args.nh = b.nh;
    args.nkv = b.nkv;
    args.hd = b.hd;
    args.tok_pos = pos.get();
    args.tok_slot = slot.get();
    args.prefill = false;
    args.max_splits = cu::attention_max_splits(max_ctx);
    args.scale = 1.0f / std::sqrt(static_cast<float>(b.hd));
    args.part_acc = pacc.get();
    args.part_ml = pml.get();
    args.gate = gate.get();
    args.gate_ld = b.gate_ld;
    args.gate_head_stride = 2 * b.hd;
    args.out = out.get();
  }

  static int max_pages(int64_t max_ctx) { return static_cast<int>((max_ctx + kPage - 1) / kPage); }
  static std::vector<int> layout(const Batch& b, int64_t max_ctx, std::mt19937& rng) {
    const int mp = max_pages(max_ctx);
    int total = 2;
    for (int len : b.lens) total += (len + kPage - 1) / kPage;
    std::vector<int> pages(static_cast<size_t>(total));
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), rng);
    std::vector<int> t(b.lens.size() * mp, pages.back());  // unused entries: a NaN page
    size_t next = 0;
    for (size_t s = 0; s < b.lens.size(); ++s)
      for (int p = 0; p < (b.lens[s] + kPage - 1) / kPage; ++p) t[s * mp + p] = pages[next++];
    return t;
  }
  static std::vector<uint16_t> fill(const Batch& b, const std::vector<int>& t, int64_t max_ctx,
                                    const std::vector<std::vector<float>>& x) {
    const int mp = max_pages(max_ctx);
    int total = 2;
    for (int len : b.lens) total += (len + kPage - 1) / kPage;
    std::vector<uint16_t> c(static_cast<size_t>(total) * b.nkv * kPage * b.hd, 0xffff);  // NaN
    for (size_t s = 0; s < b.lens.size(); ++s)
      for (int j = 0; j < b.lens[s]; ++j)
        for (int kh = 0; kh < b.nkv; ++kh)
          for (int i = 0; i < b.hd; ++i) {
            const int64_t page = t[s * mp + j / kPage];
            c[static_cast<size_t>(((page * b.nkv + kh) * kPage + j % kPage) * b.hd + i)] =
                core::f32_to_bf16(x[s][(static_cast<size_t>(j) * b.nkv + kh) * b.hd + i]);
          }
    return c;
  }
  static int total_pages(const Batch& b) {
    int total = 2;
    for (int len : b.lens) total += (len + kPage - 1) / kPage;
    return total;
  }
  // fp8: codes [pages][nkv][16][hd] (0x7f, NaN, where unused) and scales [pages][nkv][16] (NaN where unused).
  static std::vector<uint8_t> fill_codes(const Batch& b, const std::vector<int>& t, int64_t max_ctx,
                                         const std::vector<std::vector<uint8_t>>& x) {
    const int mp = max_pages(max_ctx);
    std::vector<uint8_t> c(static_cast<size_t>(total_pages(b)) * b.nkv * kPage * b.hd, 0x7f);
    for (size_t s = 0; s < b.lens.size(); ++s)
      for (int j = 0; j < b.lens[s]; ++j)
        for (int kh = 0; kh < b.nkv; ++kh) {
          const int64_t page = t[s * mp + j / kPage];
          std::copy_n(x[s].begin() + (static_cast<size_t>(j) * b.nkv + kh) * b.hd, b.hd,
                      c.begin() + ((page * b.nkv + kh) * kPage + j % kPage) * b.hd);
        }
    return c;
  }
  static std::vector<float> fill_scales(const Batch& b, const std::vector<int>& t, int64_t max_ctx,
                                        const std::vector<std::vector<float>>& x) {
    const int mp = max_pages(max_ctx);
    std::vector<float> c(static_cast<size_t>(total_pages(b)) * b.nkv * kPage, NAN);
    for (size_t s = 0; s < b.lens.size(); ++s)
      for (int j = 0; j < b.lens[s]; ++j)
        for (int kh = 0; kh < b.nkv; ++kh)
          c[static_cast<size_t>((t[s * mp + j / kPage] * b.nkv + kh) * kPage + j % kPage)] =
              x[s][static_cast<size_t>(j) * b.nkv + kh];
    return c;
  }
  template <class F>
  static std::vector<int> pick(const std::vector<int>& order, F f) {
    std::vector<int> v;
    for (int s : order) v.push_back(f(s));
    return v;
  }
  static std::vector<float> rows(const std::vector<int>& order, const std::vector<float>& x, size_t w) {
    std::vector<float> v;
    for (int s : order) v.insert(v.end(), x.begin() + s * w, x.begin() + (s + 1) * w);
    return v;
  }
};

std::vector<float> run(const Batch& b, const std::vector<int>& order, int64_t max_ctx, std::mt19937& rng,
                       bool tc = true) {
  DeviceBatch d(b, order, max_ctx, rng);
  EXPECT_EQ(cu::attention_decode_tc_supports(d.args), tc);
  EXPECT_EQ(cu::attention(d.args, nullptr), cudaSuccess);
  return d.out.download();
}

std::vector<int> iota(size_t n) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

TEST_F(CudaAttentionDecode, EqualsCpuOverShapes) {
  std::mt19937 rng(41);
  struct Shape {
    int nh, nkv, hd;
  };
  // Qwen3.6-27B (24/4/256), Qwen3.5-35B-A3B (16/2/256), a 16-head group, one head per kv head, hd 64.
  const Shape shapes[] = {{24, 4, 256}, {16, 2, 256}, {32, 2, 128}, {4, 4, 128}, {8, 2, 64}};
  // Lengths around the 16-key tiles, the 2-warp split of a 64-key split, and a split's end.
  const std::vector<int> lens = {1, 15, 16, 17, 31, 33, 64, 65, 100, 129, 700};
  double worst = 0;
  for (const auto& sh : shapes) {
    const Batch b = make_batch(rng, sh.nh, sh.nkv, sh.hd, lens, 1.0f);
    const double e = rel_err(run(b, iota(lens.size()), 720, rng), cpu_decode(b));
    worst = std::max(worst, e);
    EXPECT_LE(e, kTol) << "nh=" << sh.nh << " nkv=" << sh.nkv << " hd=" << sh.hd;
  }
  std::printf("[ decode tc ] worst error over shapes vs float64 cpu: %.3g (tolerance %.0e)\n", worst, kTol);
}

// Past 64 x kAttnMaxSplits positions each token's splits grow with its own position (80, 160 keys...): the
// warps then take several tiles each, through both cp.async stages.
TEST_F(CudaAttentionDecode, LongSequencesWithGrownSplits) {
  std::mt19937 rng(42);
  const std::vector<int> lens = {1, 8192, 8193, 12345, 20000};
  const Batch b = make_batch(rng, 24, 4, 256, lens, 1.0f);
  const double e = rel_err(run(b, iota(lens.size()), 20000, rng), cpu_decode(b));
  std::printf("[ decode tc ] 27B shape, lengths to 20000: %.3g\n", e);
  EXPECT_LE(e, kTol);
}

// Scores far apart (q scaled up): the softmax is dominated by a few keys, so a wrong running max or merge
// weight between warps and splits shows.
TEST_F(CudaAttentionDecode, EqualsCpuWithPeakedScores) {
  std::mt19937 rng(43);
  const std::vector<int> lens = {17, 200, 3000};
  const Batch b = make_batch(rng, 24, 4, 256, lens, 4.0f);
  const double e = rel_err(run(b, iota(lens.size()), 3000, rng), cpu_decode(b));
  std::printf("[ decode tc ] peaked scores: %.3g\n", e);
  EXPECT_LE(e, kTol);
}

// Up to kAttnInvariantRows rows a row's result does not depend on the batch around it: each sequence alone
// equals itself in a shuffled batch, bit for bit.
TEST_F(CudaAttentionDecode, RowsAloneEqualRowsInABatch) {
  static_assert(cu::kAttnInvariantRows == 4, "the batch below is that many rows");
  std::mt19937 rng(44);
  const std::vector<int> lens = {64, 300, 1000, 9000};
  const Batch b = make_batch(rng, 24, 4, 256, lens, 1.0f);
  const std::vector<int> order = {3, 0, 2, 1};
  const auto batch = run(b, order, 9000, rng);
  const size_t w = static_cast<size_t>(b.nh) * b.hd;
  for (size_t i = 0; i < order.size(); ++i) {
    const auto alone = run(b, {order[i]}, 9000, rng);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), batch.begin() + i * w))
        << "sequence of length " << lens[static_cast<size_t>(order[i])];
  }
}

// The splits a launch chooses: every token's own up to kAttnInvariantRows rows, then fewer as the rows grow
// (never more than max_splits, never none).
TEST_F(CudaAttentionDecode, SplitsShrinkAsTheBatchGrows) {
  EXPECT_EQ(cu::attention_decode_splits(1, 4, 128), 128);
  EXPECT_EQ(cu::attention_decode_splits(cu::kAttnInvariantRows, 4, 128), 128);
  int last = 128;
  for (int n : {5, 8, 16, 32, 64, 128, 256, 4096}) {
    const int s = cu::attention_decode_splits(n, 4, 128);
    EXPECT_GE(s, 1) << n;
    EXPECT_LE(s, last) << n;
    last = s;
  }
  EXPECT_EQ(cu::attention_decode_splits(4096, 4, 128), 1);
  EXPECT_EQ(cu::attention_decode_splits(64, 4, 3), 3);
}

// Many rows: the launch takes few splits, each of hundreds of keys (many tiles per warp through both
// cp.async stages), the combine few partials; bf16 and fp8 caches against the CPU. Then explicit split
// counts on one batch (1: a block takes all of a token's keys; 3; max_splits) agree with the CPU too.
TEST_F(CudaAttentionDecode, ManyRowsTakeFewLongSplits) {
  std::mt19937 rng(47);
  std::vector<int> lens;
  for (int i = 0; i < 40; ++i) lens.push_back(1 + static_cast<int>(rng() % 9000));
  lens[0] = 1;
  lens[1] = 9000;
  for (bool fp8 : {false, true}) {
    const Batch b = make_batch(rng, 24, 4, 256, lens, 1.0f, fp8);
    const int splits =
        cu::attention_decode_splits(static_cast<int>(lens.size()), 4, cu::attention_max_splits(9000));
    EXPECT_LT(splits, cu::attention_max_splits(9000));
    const double e = rel_err(run(b, iota(lens.size()), 9000, rng), cpu_decode(b));
    std::printf("[ decode tc ] %zu rows to 9000 (%d splits), %s cache: %.3g\n", lens.size(), splits,
                fp8 ? "fp8" : "bf16", e);
    EXPECT_LE(e, kTol);
  }
  const Batch b = make_batch(rng, 24, 4, 256, {1, 17, 700, 3000, 5000, 8193}, 1.0f);
  const auto ref = cpu_decode(b);
  for (int splits : {1, 3, cu::attention_max_splits(8200)}) {
    DeviceBatch d(b, iota(b.lens.size()), 8200, rng);
    d.args.splits = splits;
    ASSERT_EQ(cu::attention(d.args, nullptr), cudaSuccess);
    const double e = rel_err(d.out.download(), ref);
    EXPECT_LE(e, kTol) << splits << " splits";
  }
  DeviceBatch d(b, iota(b.lens.size()), 8200, rng);
  d.args.splits = cu::attention_max_splits(8200) + 1;
  EXPECT_EQ(cu::attention(d.args, nullptr), cudaErrorInvalidValue);
}

TEST_F(CudaAttentionDecode, Fp8CacheEqualsCpuOverShapes) {
  std::mt19937 rng(45);
  struct Shape {
    int nh, nkv, hd;
  };
  const Shape shapes[] = {{24, 4, 256}, {16, 2, 256}, {32, 2, 128}, {8, 2, 64}};
  const std::vector<int> lens = {1, 15, 16, 17, 33, 64, 65, 129, 700};
  double worst = 0;
  for (const auto& sh : shapes) {
    const Batch b = make_batch(rng, sh.nh, sh.nkv, sh.hd, lens, 1.0f, true);
    const double e = rel_err(run(b, iota(lens.size()), 720, rng), cpu_decode(b));
    worst = std::max(worst, e);
    EXPECT_LE(e, kTol) << "fp8 nh=" << sh.nh << " nkv=" << sh.nkv << " hd=" << sh.hd;
  }
  std::printf("[ decode tc ] fp8 cache: worst error over shapes vs float64 cpu: %.3g (tolerance %.0e)\n",
              worst, kTol);
  // The long and peaked cases on the 27B shape.
  const Batch lb = make_batch(rng, 24, 4, 256, {1, 8193, 20000}, 1.0f, true);
  const double el = rel_err(run(lb, iota(3), 20000, rng), cpu_decode(lb));
  const Batch pb = make_batch(rng, 24, 4, 256, {17, 3000}, 4.0f, true);
  const double ep = rel_err(run(pb, iota(2), 3000, rng), cpu_decode(pb));
  std::printf("[ decode tc ] fp8 cache: lengths to 20000 %.3g, peaked scores %.3g\n", el, ep);
  EXPECT_LE(el, kTol);
  EXPECT_LE(ep, kTol);
  // Batch invariance holds for fp8 rows as for bf16.
  const auto batch = run(lb, {2, 0, 1}, 20000, rng);
  const auto alone = run(lb, {1}, 20000, rng);
  const size_t w = static_cast<size_t>(lb.nh) * lb.hd;
  EXPECT_TRUE(std::equal(alone.begin(), alone.end(), batch.begin() + 2 * w));
}

// hd 32 is not a tensor-core shape: the SIMT kernel reads the fp8 cache as code * scale in fp32.
TEST_F(CudaAttentionDecode, Fp8CacheOnTheSimtKernel) {
  std::mt19937 rng(46);
  const std::vector<int> lens = {1, 16, 17, 300};
  const Batch b = make_batch(rng, 8, 2, 32, lens, 1.0f, true);
  const double e = rel_err(run(b, iota(lens.size()), 320, rng, false), cpu_decode(b));
  std::printf("[ decode simt ] fp8 cache, hd 32: %.3g (tolerance %.0e)\n", e, kSimtTol);
  EXPECT_LE(e, kSimtTol);
}

}  // namespace
}  // namespace deltaflow
