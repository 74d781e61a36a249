// GPU sampling (backend/cuda/sampling.cu) against the host Sampler's formulas (engine/sampler.cpp, the
// reference). Label `gpu`.
//
// Tolerances:
//   greedy, top_k = 1, ties: exact ids (argmax, ties to the lowest id).
//   distributions: 65536 draws of one fixed row; every frequency within 0.01 of the filtered softmax the host
//     formulas give (one draw's frequency has sigma <= 0.5 / sqrt(65536) = 0.002: 0.01 is 5 sigma), and a
//     token the filters drop is never drawn (frequency exactly 0).
//   penalties: the penalised logits equal the host formulas bit for bit (the same fp32 operations).
//   same seed and step: the same ids, run after run (exact).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>
#include <set>

#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/sampling.cuh"
#include "backend/cuda/sampling_batch.hpp"
#include "backend/memory_plan.hpp"
#include "engine/sampler.hpp"
#include "gpu_test_util.hpp"
#include "io/safetensors.hpp"
#include "model/tiny_checkpoint.hpp"
#include "model/weights.hpp"

namespace deltaflow {
namespace {

using backend::SamplingSpec;
using backend::cuda::SamplingBatch;
using gpu_test::DevBuf;

constexpr double kFreqTol = 0.01;
constexpr int kDraws = 65536;

// The host Sampler's filtered distribution (top-k, temperature, min-p, top-p) over the ids, in double.
std::vector<double> filtered_softmax(const std::vector<float>& x, const SamplingSpec& s) {
  const size_t V = x.size();
  std::vector<int32_t> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
  size_t n = (s.top_k > 0 && static_cast<size_t>(s.top_k) < V) ? static_cast<size_t>(s.top_k) : V;
  std::vector<double> p(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += p[i] = std::exp((x[idx[i]] - x[idx[0]]) / s.temperature);
  for (auto& v : p) v /= sum;
  if (s.min_p > 0) {
    size_t keep = 1;
    while (keep < n && p[keep] >= s.min_p * p[0]) ++keep;
    n = keep;
  }
  double tot = 0;
  for (size_t i = 0; i < n; ++i) tot += p[i];
  if (s.top_p < 1.0f) {
    double c = 0;
    size_t keep = 0;
    while (keep < n) {
      c += p[keep++] / tot;
      if (c >= s.top_p) break;
    }
    n = keep;
  }
  tot = 0;
  for (size_t i = 0; i < n; ++i) tot += p[i];
  std::vector<double> out(V, 0.0);
  for (size_t i = 0; i < n; ++i) out[static_cast<size_t>(idx[i])] = p[i] / tot;
  return out;
}

// Draws `rows` ids from `rows` copies of `row` (spec with steps first_step..), one launch.
std::vector<int32_t> draw_rows(const std::vector<float>& row, SamplingSpec spec, int rows,
                               uint64_t first_step) {
  const size_t V = row.size();
  std::vector<float> all(V * static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r)
    std::copy(row.begin(), row.end(), all.begin() + static_cast<ptrdiff_t>(r * V));
  DevBuf<float> d(all);
  std::vector<SamplingSpec> specs(static_cast<size_t>(rows), spec);
  for (int r = 0; r < rows; ++r) specs[static_cast<size_t>(r)].step = first_step + static_cast<uint64_t>(r);
  SamplingBatch batch;
  std::vector<int32_t> ids;
  const auto st = batch.run(d.get(), static_cast<int64_t>(V), specs, nullptr, ids);
  EXPECT_TRUE(st.is_ok()) << st.message();
  return ids;
}

std::vector<double> frequencies(const std::vector<float>& row, const SamplingSpec& spec, int draws) {
  std::vector<double> f(row.size(), 0.0);
  const int chunk = 1024;
  for (int d0 = 0; d0 < draws; d0 += chunk) {
    const auto ids = draw_rows(row, spec, chunk, static_cast<uint64_t>(d0));
    for (int32_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(static_cast<size_t>(id), row.size());
      if (id >= 0 && static_cast<size_t>(id) < row.size()) f[static_cast<size_t>(id)] += 1.0 / draws;
    }
  }
  return f;
}

SamplingSpec spec_of(float t, int k, float p, float min_p, uint64_t seed = 1234) {
  SamplingSpec s;
  s.temperature = t;
  s.top_k = k;
  s.top_p = p;
  s.min_p = min_p;
  s.seed = seed;
  return s;
}

TEST(CudaSampling, GreedyAndTopK1AreArgmax) {
  ASSERT_TRUE(gpu_test::have_gpu());
  std::mt19937 rng(11);
  for (size_t V : {size_t{7}, size_t{1000}, size_t{262144}}) {
    auto row = gpu_test::randn(rng, V, 3.0f);
    const int32_t want = engine::argmax(row);
    for (const auto& s : {spec_of(0.0f, 0, 1.0f, 0.0f), spec_of(1.0f, 1, 1.0f, 0.0f)}) {
      const auto ids = draw_rows(row, s, 4, 0);
      for (int32_t id : ids) EXPECT_EQ(id, want) << "V " << V;
    }
  }
  // Ties go to the lowest id, as torch.argmax; NaN never wins.
  std::vector<float> tie(100, -1.0f);
  tie[40] = tie[17] = tie[90] = 2.0f;
  tie[3] = NAN;
  EXPECT_EQ(draw_rows(tie, spec_of(0.0f, 0, 1.0f, 0.0f), 2, 0), (std::vector<int32_t>{17, 17}));
}

TEST(CudaSampling, DistributionMatchesFilteredSoftmax) {
  ASSERT_TRUE(gpu_test::have_gpu());
  std::mt19937 rng(5);
  const auto row = gpu_test::randn(rng, 50, 1.5f);
  const std::vector<SamplingSpec> cases = {
      spec_of(1.0f, 0, 1.0f, 0.0f), spec_of(0.7f, 10, 1.0f, 0.0f),  spec_of(1.0f, 0, 0.8f, 0.0f),
      spec_of(1.3f, 0, 1.0f, 0.1f), spec_of(0.9f, 20, 0.9f, 0.02f), spec_of(2.0f, 45, 0.97f, 0.0f),
  };
  for (const auto& s : cases) {
    SCOPED_TRACE(::testing::Message() << "T " << s.temperature << " top_k " << s.top_k << " top_p " << s.top_p
                                      << " min_p " << s.min_p);
    const auto want = filtered_softmax(row, s);
    const auto got = frequencies(row, s, kDraws);
    double worst = 0;
    for (size_t i = 0; i < row.size(); ++i) {
      worst = std::max(worst, std::fabs(got[i] - want[i]));
      if (want[i] == 0.0) {
        EXPECT_EQ(got[i], 0.0) << "filtered id " << i << " was drawn";
      }
    }
    EXPECT_LE(worst, kFreqTol);
    std::printf("  [sampling] T %.2f top_k %d top_p %.2f min_p %.2f: max |freq - p| = %.4f\n", s.temperature,
                s.top_k, s.top_p, s.min_p, worst);
  }
}

TEST(CudaSampling, TopKTiesKeepTheLowestIds) {
  ASSERT_TRUE(gpu_test::have_gpu());
  const std::vector<float> flat(64, 0.5f);
  const auto s = spec_of(1.0f, 5, 1.0f, 0.0f);
  const auto got = frequencies(flat, s, kDraws);
  for (size_t i = 0; i < flat.size(); ++i) {
    if (i < 5) {
      EXPECT_NEAR(got[i], 0.2, kFreqTol) << i;
    } else {
      EXPECT_EQ(got[i], 0.0) << i;
    }
  }
}

// A full vocabulary: the radix select runs over the whole row before the candidates fit the list.
TEST(CudaSampling, LargeVocabNeverDrawsAFilteredToken) {
  ASSERT_TRUE(gpu_test::have_gpu());
  std::mt19937 rng(9);
  const size_t V = 262144;
  auto row = gpu_test::randn(rng, V, 2.0f);
  for (int i = 0; i < 64; ++i) row[static_cast<size_t>(rng() % V)] += 8.0f;  // a head of likely tokens
  const std::vector<SamplingSpec> cases = {spec_of(1.0f, 50, 1.0f, 0.0f),    spec_of(0.8f, 0, 0.9f, 0.0f),
                                           spec_of(1.0f, 0, 1.0f, 0.05f),    spec_of(1.0f, 0, 0.99f, 0.0f),
                                           spec_of(0.7f, 6000, 0.95f, 0.0f), spec_of(1.0f, 0, 1.0f, 0.0f)};
  for (const auto& s : cases) {
    SCOPED_TRACE(::testing::Message() << "top_k " << s.top_k << " top_p " << s.top_p << " min_p " << s.min_p);
    const auto want = filtered_softmax(row, s);
    size_t kept = 0;
    for (double p : want) kept += p > 0;
    std::vector<int32_t> ids;
    for (int c = 0; c < 8; ++c) {
      auto part = draw_rows(row, s, 64, static_cast<uint64_t>(c * 64));
      ids.insert(ids.end(), part.begin(), part.end());
    }
    double mass = 0;  // expected mass of the drawn ids' top: the draws should favour likely ids
    for (int32_t id : ids) {
      ASSERT_GE(id, 0);
      ASSERT_LT(static_cast<size_t>(id), V);
      EXPECT_GT(want[static_cast<size_t>(id)], 0.0) << "filtered id " << id << " (kept set " << kept << ")";
      mass += want[static_cast<size_t>(id)];
    }
    std::printf("  [sampling] V %zu top_k %d top_p %.2f min_p %.2f: kept %zu, mean p of draws %.3g\n", V,
                s.top_k, s.top_p, s.min_p, kept, mass / static_cast<double>(ids.size()));
  }
}

TEST(CudaSampling, PenaltiesFollowTheHostFormulas) {
  ASSERT_TRUE(gpu_test::have_gpu());
  std::mt19937 rng(3);
  const size_t V = 40;
  auto row = gpu_test::randn(rng, V, 2.0f);
  row[3] = -1.25f;  // a negative logit the repetition penalty multiplies
  row[7] = *std::max_element(row.begin(), row.end()) + 0.5f;  // the largest, until penalised
  SamplingSpec s = spec_of(1.0f, 0, 1.0f, 0.0f);
  s.presence_penalty = 0.5f;
  s.frequency_penalty = 0.3f;
  s.repetition_penalty = 1.5f;
  const std::vector<backend::TokenCount> gen = {{7, 2}, {3, 1}, {12, 4}};
  const std::vector<int32_t> prompt = {1, 3, 5};  // 3 is both seen and generated
  s.generated = gen;
  s.prompt_seen = prompt;
  // The host formulas: repetition on prompt and generated ids once, then frequency and presence.
  std::vector<float> want = row;
  std::set<int32_t> rep_ids(prompt.begin(), prompt.end());
  for (const auto& g : gen) rep_ids.insert(g.id);
  for (int32_t id : rep_ids) {
    float& x = want[static_cast<size_t>(id)];
    x = x > 0 ? x / 1.5f : x * 1.5f;
  }
  for (const auto& g : gen) want[static_cast<size_t>(g.id)] -= 0.3f * static_cast<float>(g.count) + 0.5f;

  DevBuf<float> d(row);
  SamplingBatch batch;
  std::vector<int32_t> ids;
  ASSERT_TRUE(batch.run(d.get(), static_cast<int64_t>(V), std::span<const SamplingSpec>(&s, 1), nullptr, ids)
                  .is_ok());
  EXPECT_EQ(d.download(), want);  // bit for bit

  // Greedy with penalties: the host Sampler's choice.
  engine::SamplingParams hp;
  hp.presence_penalty = 0.5f;
  hp.frequency_penalty = 0.3f;
  hp.repetition_penalty = 1.5f;
  engine::Sampler host(hp);
  host.add_prompt(prompt);
  for (const auto& g : gen)
    for (int i = 0; i < g.count; ++i) host.accept(g.id);
  SamplingSpec g0 = s;
  g0.temperature = 0.0f;
  const auto gid = draw_rows(row, g0, 1, 0);
  EXPECT_EQ(gid[0], host.sample(row));
  EXPECT_EQ(engine::argmax(row), 7);
  EXPECT_NE(gid[0], 7);  // the penalty moved it: (M + 0.5) / 1.5 - 1.1 < M

  // The distribution is the softmax of the penalised logits.
  std::vector<double> fw(V, 0.0);
  const int chunk = 1024;
  for (int d0 = 0; d0 < kDraws; d0 += chunk) {
    std::vector<float> all(V * chunk);
    for (int r = 0; r < chunk; ++r)
      std::copy(row.begin(), row.end(), all.begin() + static_cast<ptrdiff_t>(r * V));
    DevBuf<float> dd(all);
    std::vector<SamplingSpec> specs(chunk, s);
    for (int r = 0; r < chunk; ++r) specs[static_cast<size_t>(r)].step = static_cast<uint64_t>(d0 + r);
    std::vector<int32_t> out;
    ASSERT_TRUE(batch.run(dd.get(), static_cast<int64_t>(V), specs, nullptr, out).is_ok());
    for (int32_t id : out) fw[static_cast<size_t>(id)] += 1.0 / kDraws;
  }
  const auto p = filtered_softmax(want, spec_of(1.0f, 0, 1.0f, 0.0f));
  double worst = 0;
  for (size_t i = 0; i < V; ++i) worst = std::max(worst, std::fabs(fw[i] - p[i]));
  EXPECT_LE(worst, kFreqTol);
  std::printf("  [sampling] penalties: max |freq - p| = %.4f\n", worst);
}

TEST(CudaSampling, SameSeedSameIds) {
  ASSERT_TRUE(gpu_test::have_gpu());
  std::mt19937 rng(21);
  const auto row = gpu_test::randn(rng, 262144, 1.0f);
  const auto s = spec_of(1.0f, 0, 0.95f, 0.0f, 77);
  const auto a = draw_rows(row, s, 128, 0), b = draw_rows(row, s, 128, 0);
  EXPECT_EQ(a, b);
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 64u);  // the steps do draw differently
  const auto c = draw_rows(row, spec_of(1.0f, 0, 0.95f, 0.0f, 78), 128, 0);
  EXPECT_NE(a, c);
  // The generator: uniform in [0, 1).
  double mean = 0;
  for (uint64_t i = 0; i < 100000; ++i) {
    const double u = backend::cuda::sampling_uniform(5, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    mean += u / 100000;
  }
  EXPECT_NEAR(mean, 0.5, 0.005);  // sigma 0.0009
}

TEST(CudaSampling, PenaltyEntriesMergePromptAndGenerated) {
  SamplingSpec s = spec_of(1.0f, 0, 1.0f, 0.0f);
  s.repetition_penalty = 1.2f;
  const std::vector<backend::TokenCount> gen = {{9, 1}, {2, 3}, {50, 1}};
  const std::vector<int32_t> prompt = {2, 4, 9, 60};
  s.generated = gen;
  s.prompt_seen = prompt;
  std::vector<backend::cuda::SampleRowParams> rows;
  std::vector<backend::cuda::PenaltyEntry> e;
  backend::cuda::build_sample_rows(std::span<const SamplingSpec>(&s, 1), 55, rows, e);  // 60 is outside
  ASSERT_EQ(rows.size(), 1u);
  ASSERT_EQ(e.size(), 4u);
  EXPECT_EQ(e[0].id, 2);
  EXPECT_EQ(e[0].count, 3);
  EXPECT_EQ(e[1].id, 4);
  EXPECT_EQ(e[1].count, 0);
  EXPECT_EQ(e[2].id, 9);
  EXPECT_EQ(e[2].count, 1);
  EXPECT_EQ(e[3].id, 50);
  EXPECT_EQ(rows[0].pen_begin, 0);
  EXPECT_EQ(rows[0].pen_end, 4);
  // Without repetition the prompt is not listed.
  s.repetition_penalty = 1.0f;
  s.presence_penalty = 0.1f;
  rows.clear();
  e.clear();
  backend::cuda::build_sample_rows(std::span<const SamplingSpec>(&s, 1), 55, rows, e);
  EXPECT_EQ(e.size(), 3u);
}

// The backend entry points on a tiny model: decode_sample greedy == decode_greedy, top_k = 1 == greedy, and a
// seeded sampled run repeats.
TEST(CudaSampling, BackendDecodeSample) {
  ASSERT_TRUE(gpu_test::have_gpu());
  const auto dir =
      (std::filesystem::temp_directory_path() / ("df_cuda_sampling_" + std::to_string(::getpid()))).string();
  ASSERT_TRUE(model::write_tiny_checkpoint("dense", 1, dir).is_ok());
  auto loaded = backend::cuda::CudaBackend::load(dir, {});
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(loaded.is_ok()) << loaded.message();
  auto& b = **loaded;
  const std::vector<int32_t> prompt = {1, 5, 9, 2};
  auto run = [&](const SamplingSpec& spec, int steps, bool greedy_api) {
    auto seq = b.new_sequence();
    std::vector<float> logits;
    backend::PrefillItem item{seq.get(), prompt, false};
    EXPECT_TRUE(b.prefill(std::span<const backend::PrefillItem>(&item, 1), logits).is_ok());
    std::vector<int32_t> ids, out;
    SamplingSpec s = spec;
    EXPECT_TRUE(b.sample_logits(logits, std::span<const SamplingSpec>(&s, 1), out).is_ok());
    ids.push_back(out[0]);
    backend::SequenceState* sp = seq.get();
    for (int i = 1; i < steps; ++i) {
      s.step = static_cast<uint64_t>(i);
      const int32_t last = ids.back();
      const auto st = greedy_api ? b.decode_greedy(std::span<backend::SequenceState* const>(&sp, 1),
                                                   std::span<const int32_t>(&last, 1), out)
                                 : b.decode_sample(std::span<backend::SequenceState* const>(&sp, 1),
                                                   std::span<const int32_t>(&last, 1),
                                                   std::span<const SamplingSpec>(&s, 1), out);
      EXPECT_TRUE(st.is_ok()) << st.message();
      ids.push_back(out[0]);
    }
    return ids;
  };
  const auto greedy = run(spec_of(0.0f, 0, 1.0f, 0.0f), 12, true);
  EXPECT_EQ(run(spec_of(0.0f, 0, 1.0f, 0.0f), 12, false), greedy);
  EXPECT_EQ(run(spec_of(1.0f, 1, 1.0f, 0.0f), 12, false), greedy);
  const auto a = run(spec_of(1.2f, 40, 0.95f, 0.0f, 99), 12, false);
  EXPECT_EQ(run(spec_of(1.2f, 40, 0.95f, 0.0f, 99), 12, false), a);
}

// CudaBackend::memory_plan() against backend::estimate_memory_plan (what `inspect` prints), on every preset:
// the per-sequence layout (fast and exact), and the engine's pools (allocate_pools: paged KV and the state
// slots the engine asks for), and with the MTP head loaded and pools that draft (speculative decoding).
void expect_plan_equals_estimate(const std::string& preset, bool exact, bool engine_pools, bool fp8 = false,
                                 bool draft = false) {
  SCOPED_TRACE(preset + (exact ? " exact" : " fast") + (engine_pools ? " engine pools" : "") +
               (fp8 ? " fp8" : "") + (draft ? " draft" : ""));
  const auto dir = (std::filesystem::temp_directory_path() /
                    ("df_cuda_memory_plan_" + preset + "_" + std::to_string(::getpid())))
                       .string();
  ASSERT_TRUE(model::write_tiny_checkpoint(preset, 1, dir).is_ok());
  backend::cuda::CudaOptions opt;
  opt.max_sequences = 3;
  opt.max_context = 200;
  opt.prefill_chunk = 96;
  opt.exact = exact;
  opt.kv_fp8 = fp8;
  opt.engine_pools = engine_pools;
  opt.mtp = draft;
  auto cuda = backend::cuda::CudaBackend::load(dir, opt);
  ASSERT_TRUE(cuda.is_ok()) << cuda.message();
  backend::MemoryPlanOptions po;
  backend::Pools pools;
  if (engine_pools) {
    backend::PoolRequest req;
    req.kv_pages = 37;
    req.state_slots = 6;
    req.max_step_rows = 96;
    req.max_step_seqs = 6;
    req.draft = draft && (*cuda)->can_draft();
    ASSERT_TRUE((*cuda)->allocate_pools(req, pools).is_ok());
    po.kv_pages = req.kv_pages;
    po.state_slots = req.state_slots;
    if (req.draft) {
      po.draft_step_rows = req.max_step_rows;
      po.draft_step_seqs = req.max_step_seqs;
    }
  }
  po.mtp = draft && (*cuda)->can_draft();
  auto ck = io::Checkpoint::open(dir);
  ASSERT_TRUE(ck.is_ok()) << ck.message();
  auto w = model::bind_weights((*cuda)->config(), *ck);
  ASSERT_TRUE(w.is_ok()) << w.message();
  po.max_sequences = opt.max_sequences;
  po.max_context = opt.max_context;
  po.prefill_chunk = opt.prefill_chunk;
  po.exact = exact;
  po.kv_fp8 = fp8;
  po.matrix_dtype = w->embed_tokens.dtype;
  const auto want = backend::estimate_memory_plan((*cuda)->config(), po);
  const auto& got = (*cuda)->memory_plan();
  EXPECT_EQ(got.weights, want.weights);
  EXPECT_EQ(got.kv, want.kv);
  EXPECT_EQ(got.states, want.states);
  EXPECT_EQ(got.workspace, want.workspace);
  EXPECT_EQ(got.slots, want.slots);
  EXPECT_EQ(got.max_context, want.max_context);
  EXPECT_EQ(got.kv_f32, want.kv_f32);
  EXPECT_EQ(got.kv_fp8, want.kv_fp8);
  EXPECT_EQ(got.kv_pages, want.kv_pages);
  EXPECT_EQ(got.draft, want.draft);
  if (engine_pools) {
    EXPECT_EQ(pools.page_bytes, want.kv_page_bytes + (po.draft_step_rows > 0 ? want.draft_page_bytes : 0));
    EXPECT_EQ(pools.slot_bytes, want.state_bytes_per_sequence);
  }
  cuda->reset();
  std::filesystem::remove_all(dir);
}

TEST(CudaMemoryPlan, EqualsTheEstimate) {
  ASSERT_TRUE(gpu_test::have_gpu());
  for (const auto& preset : model::tiny_presets()) {
    expect_plan_equals_estimate(preset, false, false);
    expect_plan_equals_estimate(preset, true, false);
    expect_plan_equals_estimate(preset, false, true);
    expect_plan_equals_estimate(preset, false, false, true);
    expect_plan_equals_estimate(preset, false, true, true);
    expect_plan_equals_estimate(preset, false, true, false, true);
    expect_plan_equals_estimate(preset, true, true, false, true);
  }
}

}  // namespace
}  // namespace deltaflow
