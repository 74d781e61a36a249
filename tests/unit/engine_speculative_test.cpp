// Speculative decoding with the MTP head on the real CPU backend: drafts verified in one step never change
// what a request gets. Greedy and seeded sampled tokens, their log-probabilities and top alternatives are
// bit-identical with and without speculation (every make-tiny preset with a head, and the default model,
// whose trained head gets most drafts accepted), in batches of requests with different draft counts, under
// preemption and from the prefix cache; a rejected draft leaves the recurrent state bitwise as if it had
// never been seen; and the sampled distribution of the first and second tokens over 20,000 seeds is the
// non-speculative one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "backend/host_sampling.hpp"
#include "engine_harness.hpp"

namespace deltaflow::engine {
namespace {

class EngineSpeculation : public EngineHarness {
 protected:
  // Prompts that make a model repeat itself (and so its head's drafts get accepted), and others.
  std::vector<Job> jobs(int n_tokens) const {
    std::vector<Job> out;
    const int lens[] = {9, 40, 3, 75, 20, 12};
    const int spec[] = {-1, 1, 2, 8, 0, 3};  // 8 is capped by the engine's count, 0 is off
    for (int i = 0; i < 6; ++i) {
      Job j = job(prompt(lens[i], 40 + i), n_tokens + 5 * i);
      if (i % 2) {
        j.temperature = 0.8f;
        j.seed = 7 + static_cast<uint64_t>(i);
      }
      j.speculative = spec[i];
      out.push_back(j);
    }
    return out;
  }
};

TEST_P(EngineSpeculation, TokensEqualDecodingWithoutItBitwise) {
  const auto js = jobs(20);
  start({.max_num_seqs = 8, .max_num_batched_tokens = 256, .prefix_cache = false});
  const auto ref = run(js);
  for (const auto& r : ref) ASSERT_FALSE(r.ids.empty()) << r.error;
  for (int32_t k : {1, 4}) {
    // A small budget too: drafts share steps with prompt chunks, and are cut where the budget ends.
    for (int64_t budget : {12, 256}) {
      start({.max_num_seqs = 8,
             .max_num_batched_tokens = budget,
             .prefix_cache = false,
             .speculative_tokens = k});
      const auto got = run(js);
      int64_t drafted = 0;
      for (size_t i = 0; i < js.size(); ++i) {
        EXPECT_TRUE(got[i] == ref[i])
            << "job " << i << " k " << k << " budget " << budget << ": " << got[i].error;
        drafted += got[i].drafted;
        EXPECT_LE(got[i].accepted, got[i].drafted);
        if (js[i].speculative == 0) {
          EXPECT_EQ(got[i].drafted, 0) << "job " << i;
        }
      }
      EXPECT_GT(drafted, 0);
      const auto st = sched_->stats();
      ASSERT_FALSE(st.drafted_at.empty());
      EXPECT_LE(st.drafted_at.size(), static_cast<size_t>(k));
      for (size_t p = 0; p < st.drafted_at.size(); ++p) EXPECT_LE(st.accepted_at[p], st.drafted_at[p]);
      expect_idle();
    }
  }
}

// KV pages for about one sequence and a half: sequences with drafts in flight are preempted and recomputed
// (the head's cache with them); and a prefix cache that serves repeated prompts. Same tokens.
TEST_P(EngineSpeculation, PreemptionAndPrefixCacheKeepTokens) {
  const auto js = jobs(24);
  start({.max_num_seqs = 6, .max_num_batched_tokens = 64, .prefix_cache = false});
  const auto ref = run(js);
  const double page_gb =
      static_cast<double>(backend_->page_bytes() + backend_->draft_page_bytes()) / (1ull << 30);
  start({.max_num_seqs = 6,
         .max_num_batched_tokens = 64,
         .kv_cache_gb = 14.5 * page_gb,
         .prefix_cache = false,
         .speculative_tokens = 3});
  auto got = run(js);
  for (size_t i = 0; i < js.size(); ++i) EXPECT_TRUE(got[i] == ref[i]) << "job " << i << ": " << got[i].error;
  EXPECT_GT(sched_->stats().preemptions, 0);
  expect_idle();

  start({.max_num_seqs = 6, .max_num_batched_tokens = 64, .speculative_tokens = 3});
  for (int round = 0; round < 2; ++round) {
    got.clear();
    for (const auto& j : js) got.push_back(run({j})[0]);
    for (size_t i = 0; i < js.size(); ++i) EXPECT_TRUE(got[i] == ref[i]) << "round " << round << " job " << i;
  }
  EXPECT_GT(sched_->stats().prefix_hit_tokens, 0);
  expect_idle();
}

class SpeculationForced : public EngineHarness {};

// bench --accept-rates: verification accepts draft positions at a forced profile whatever the model draws.
// Over about 250 verification steps (6 greedy requests of 150 tokens, K = 3, a fixed seed) the share of steps
// that accepted position k is the profile's p_k within 0.1 (about three standard errors); all-accepting and
// never-accepting profiles give every draft and none; every request still gets all its tokens. Bad profiles
// and a profile without --speculative-tokens are refused when the engine starts.
TEST_P(SpeculationForced, ForcedAcceptanceFollowsItsProfile) {
  std::vector<Job> js;
  for (int i = 0; i < 6; ++i) js.push_back(job(prompt(10 + 7 * i, 60 + i), 150));
  const std::vector<double> profile = {0.9, 0.6, 0.3};
  for (const auto& p : {profile, std::vector<double>{1.0, 1.0, 1.0}, std::vector<double>{0.0}}) {
    start({.max_num_seqs = 8,
           .max_num_batched_tokens = 256,
           .prefix_cache = false,
           .speculative_tokens = 3,
           .forced_acceptance = p});
    const auto got = run(js);
    int64_t drafted = 0, accepted = 0;
    for (size_t i = 0; i < js.size(); ++i) {
      ASSERT_TRUE(got[i].error.empty()) << got[i].error;
      EXPECT_EQ(got[i].ids.size(), 150u) << "job " << i;
      drafted += got[i].drafted;
      accepted += got[i].accepted;
    }
    const auto st = sched_->stats();
    ASSERT_EQ(st.drafted_at.size(), 3u);
    if (p == profile) {
      for (size_t k = 0; k < 3; ++k) {
        const double share = static_cast<double>(st.accepted_at[k]) / static_cast<double>(st.drafted_at[k]);
        std::printf("[ forced ] position %zu: %lld of %lld (%.3f, profile %.2f)\n", k + 1,
                    static_cast<long long>(st.accepted_at[k]), static_cast<long long>(st.drafted_at[k]),
                    share, p[k]);
        EXPECT_NEAR(share, p[k], 0.1) << "position " << k + 1;
      }
      EXPECT_GT(st.drafted_at[0], 200);
    } else if (p[0] == 1.0) {
      EXPECT_GT(drafted, 0);
      EXPECT_EQ(accepted, drafted);
    } else {
      EXPECT_GT(drafted, 0);
      EXPECT_EQ(accepted, 0);
    }
    expect_idle();
  }
  sched_.reset();
  for (const auto& bad : {SchedulerOptions{.speculative_tokens = 3, .forced_acceptance = {0.5, 0.7}},
                          SchedulerOptions{.speculative_tokens = 3, .forced_acceptance = {1.5}},
                          SchedulerOptions{.forced_acceptance = {0.5}}}) {
    auto o = bad;
    o.max_model_len = 512;
    EXPECT_FALSE(Scheduler::start(*backend_, o).is_ok());
  }
}

// The forced draws do not depend on the model (one preset is enough).
INSTANTIATE_TEST_SUITE_P(Presets, SpeculationForced, ::testing::Values("dense"));

INSTANTIATE_TEST_SUITE_P(Presets, EngineSpeculation,
                         ::testing::Values("dense", "moe", "tied", "next", "multimodal", "house"));

class SpeculationOnDefaultModel : public EngineHarness {};

// The default model's head was trained: most of its drafts are accepted, and the tokens stay the same.
TEST_P(SpeculationOnDefaultModel, DraftsAreAcceptedAndTokensEqual) {
  std::vector<Job> js;
  for (int i = 0; i < 4; ++i) {
    Job j = job(prompt(16 + 8 * i, i), 48);
    if (i >= 2) {
      j.temperature = 0.7f;
      j.seed = static_cast<uint64_t>(i);
    }
    js.push_back(j);
  }
  start({.max_num_seqs = 4, .prefix_cache = false});
  const auto ref = run(js);
  start({.max_num_seqs = 4, .prefix_cache = false, .speculative_tokens = 4, .speculation_auto_off = false});
  const auto got = run(js);
  int64_t drafted = 0, accepted = 0;
  for (size_t i = 0; i < js.size(); ++i) {
    EXPECT_TRUE(got[i] == ref[i]) << "job " << i;
    drafted += got[i].drafted;
    accepted += got[i].accepted;
  }
  EXPECT_GT(drafted, 0);
  EXPECT_GT(static_cast<double>(accepted), 0.3 * static_cast<double>(drafted)) << accepted << "/" << drafted;
}

// SchedulerOptions::speculation_auto_off, with a cost model (step_cost) in place of the clock: at the default
// model's acceptance (about 2.5 tokens a verification of four sequences' K = 3 drafts), a decode step that
// verifies drafts and costs as much as ten plain ones does not pay, and the engine turns speculation off (the
// tokens unchanged); at 1.2 plain steps it pays and stays on.
TEST_P(SpeculationOnDefaultModel, TurnsItselfOffWhenItDoesNotPay) {
  std::vector<Job> js;
  for (int i = 0; i < 4; ++i) js.push_back(job(prompt(16 + 8 * i, i), 240));
  start({.max_num_seqs = 4, .prefix_cache = false});
  const auto ref = run(js);
  int64_t drafted_at[2] = {0, 0};
  for (int c = 0; c < 2; ++c) {
    const double verify_cost = c == 0 ? 10.0 : 1.2;
    SchedulerOptions o{.max_num_seqs = 4, .prefix_cache = false, .speculative_tokens = 3};
    o.step_cost = [verify_cost](const StepInfo& s) { return s.draft_rows > 0 ? verify_cost : 1.0; };
    start(o);
    const auto got = run(js);
    for (size_t i = 0; i < js.size(); ++i) {
      EXPECT_TRUE(got[i] == ref[i]) << "job " << i << " verify cost " << verify_cost;
      drafted_at[c] += got[i].drafted;
    }
    const auto st = sched_->stats();
    std::printf(
        "[ auto off ] verify cost %.1f: off %d, %.3f per token with drafts, %.3f without, %lld drafted\n",
        verify_cost, st.speculation_off ? 1 : 0, st.speculative_cost_per_token, st.plain_cost_per_token,
        static_cast<long long>(drafted_at[c]));
    EXPECT_EQ(st.speculation_off, c == 0) << "verify cost " << verify_cost;
    if (c == 0) {
      EXPECT_GT(st.speculative_cost_per_token, st.plain_cost_per_token);
    } else {
      EXPECT_LT(st.speculative_cost_per_token, st.plain_cost_per_token);
    }
    expect_idle();
  }
  EXPECT_GT(drafted_at[0], 0);  // it drafted until it knew
  EXPECT_LT(2 * drafted_at[0], drafted_at[1]);
}

INSTANTIATE_TEST_SUITE_P(House, SpeculationOnDefaultModel, ::testing::Values("house"));

class SpeculationState : public EngineHarness {};

// The backend level: a verification step over [x, d1, d2, d3] with snapshots after each row; the snapshot
// after two rows is bitwise the state of a sequence that only ever saw [.., x, d1], and the next step from
// it gives bitwise the same logits as from that sequence (its KV past the kept rows is overwritten before
// it is read).
TEST_P(SpeculationState, RejectedDraftsLeaveStateAsIfNeverSeen) {
  backend::PoolRequest req;
  req.kv_pages = 32;
  req.state_slots = 8;
  req.max_step_rows = 64;
  req.max_step_seqs = 4;
  req.draft = true;
  ASSERT_TRUE(backend_->allocate(req).is_ok());
  const std::vector<int32_t> pa = {0, 1, 2, 3, 4, 5, 6, 7}, pb = {8, 9, 10, 11, 12, 13, 14, 15};
  const auto p = prompt(21, 3);
  auto step = [&](int32_t slot, const std::vector<int32_t>& pages, int64_t start, std::vector<int32_t> toks,
                  std::vector<backend::StateSnapshot> snaps = {}) {
    backend::SeqRun run;
    run.n_rows = static_cast<int32_t>(toks.size());
    run.start_pos = start;
    run.state_slot = slot;
    run.kv_pages = pages;
    run.logits = backend::RunLogits::kLast;
    run.snapshots = snaps;
    backend::StepOut out;
    EXPECT_TRUE(backend_->step(backend::Step{toks, std::span<const backend::SeqRun>(&run, 1)}, out).is_ok());
    return out.logits;
  };
  step(0, pa, 0, p);
  step(1, pb, 0, p);
  const int32_t x = 5, d1 = 17, d2 = 23, d3 = 29;
  step(0, pa, 21, {x, d1, d2, d3}, {{1, 2}, {2, 3}, {3, 4}});
  step(1, pb, 21, {x, d1});
  const auto kept = backend_->slot_floats(3), ref = backend_->slot_floats(1);
  ASSERT_EQ(kept.size(), ref.size());
  EXPECT_EQ(std::memcmp(kept.data(), ref.data(), kept.size() * 4), 0);
  const auto a = step(3, pa, 23, {31}), b = step(1, pb, 23, {31});
  EXPECT_EQ(a, b);
}

INSTANTIATE_TEST_SUITE_P(Presets, SpeculationState, ::testing::Values("dense", "next"));

class SpeculationSampling : public EngineHarness {};

// Three tokens each at temperature 1 for 20,000 seeds on the tiny dense model (its random head's drafts are
// nearly always rejected: the residual draw) and 1,000 on the default model (many are accepted), a tenth of
// that under ASan: the first and second tokens with speculation (K = 2) are those without it, seed by seed,
// so their distributions are the same; and on the tiny model the first token's frequencies are within total
// variation 0.06 of the model's own softmax (the expected sampling error at 20,000 draws is about 0.04).
TEST_P(SpeculationSampling, FirstAndSecondTokenDistributionsMatch) {
  const bool house = GetParam() == "house";
#if defined(__SANITIZE_ADDRESS__)
  const int n = house ? 100 : 2000;
#else
  const int n = house ? 1000 : 20000;
#endif
  const auto p = prompt(6, 9);
  auto draws = [&](int32_t k) {
    start({.max_queue = 100000,
           .max_num_seqs = 64,
           .max_num_batched_tokens = 1024,
           .speculative_tokens = k,
           .speculation_auto_off = false});  // every request drafts once, whatever the steps cost
    std::vector<Job> js;
    for (int i = 0; i < n; ++i) js.push_back(job(p, 3, 1.0f, static_cast<uint64_t>(i)));
    return run(js);
  };
  const auto plain = draws(0), spec = draws(2);
  int64_t accepted = 0, drafted = 0;
  std::map<int32_t, int> first;
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(spec[i].ids.size(), 3u) << spec[i].error;
    EXPECT_EQ(std::vector<int32_t>(spec[i].ids.begin(), spec[i].ids.begin() + 2),
              std::vector<int32_t>(plain[i].ids.begin(), plain[i].ids.begin() + 2))
        << "seed " << i;
    accepted += spec[i].accepted;
    drafted += spec[i].drafted;
    ++first[spec[i].ids[0]];
  }
  EXPECT_EQ(drafted, n);  // one draft each, after the first token
  if (house) {
    EXPECT_GT(accepted, n / 5);
  }
  // The model's distribution of the first token.
  auto s = backend_->new_sequence();
  std::vector<float> logits;
  ASSERT_TRUE(
      backend_->forward(static_cast<backend::cpu::CpuSequenceState&>(*s), p, true, false, logits).is_ok());
  double mx = logits[0], z = 0, tv = 0;
  for (float v : logits) mx = std::max<double>(mx, v);
  for (float v : logits) z += std::exp(v - mx);
  for (size_t id = 0; id < logits.size(); ++id) {
    const double q = std::exp(logits[id] - mx) / z;
    const auto it = first.find(static_cast<int32_t>(id));
    tv += std::fabs((it == first.end() ? 0.0 : it->second / static_cast<double>(n)) - q);
  }
  if (!house) {
    EXPECT_LE(tv / 2, 0.06);
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, SpeculationSampling, ::testing::Values("dense", "house"));

}  // namespace
}  // namespace deltaflow::engine
