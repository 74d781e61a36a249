// Continuous batching, paged KV and the hybrid prefix cache on the real CPU backend over tiny random-weight
// checkpoints (dense and MoE): a sequence gives bit-identical log-probabilities and tokens alone and in any
// batch, prefilled whole or in chunks beside running decodes, from the prefix cache or cold, preempted and
// recomputed or not; cancellations and finishes leave no page or slot behind.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "backend/cpu/cpu_backend.hpp"
#include "engine/generate.hpp"
#include "engine/scheduler.hpp"
#include "engine_harness.hpp"
#include "model/tiny_checkpoint.hpp"

namespace deltaflow::engine {
namespace {

class EngineBatching : public EngineHarness {};

std::vector<Job> mixed_jobs(const EngineHarness& t, int salt) {
  (void)t;
  std::vector<Job> jobs;
  const int lens[] = {5, 70, 17, 1, 130, 33};
  for (int i = 0; i < 6; ++i) {
    Job j;
    j.prompt.clear();
    for (int k = 0; k < lens[i]; ++k)
      j.prompt.push_back(static_cast<int32_t>((k * 97 + i * 31 + salt) % 200 + 1));
    j.max_tokens = 6 + 3 * i;
    if (i % 2) {
      j.temperature = 0.9f;
      j.seed = 100 + static_cast<uint64_t>(i);
    }
    jobs.push_back(j);
  }
  return jobs;
}

// Alone vs all at once with a small token budget: prompts split into chunks that share steps with other
// sequences' decode rows.
TEST_P(EngineBatching, BatchedEqualsAloneBitwise) {
  const auto jobs = mixed_jobs(*this, 1);
  const auto ref = alone(jobs);
  for (const auto& r : ref) ASSERT_FALSE(r.ids.empty()) << r.error;
  for (int64_t budget : {16, 64, 1024}) {
    start({.max_num_seqs = 8, .max_num_batched_tokens = budget, .prefix_cache = false});
    const auto got = run(jobs);
    for (size_t i = 0; i < jobs.size(); ++i)
      EXPECT_TRUE(got[i] == ref[i]) << "job " << i << " budget " << budget;
    expect_idle();
    EXPECT_GT(sched_->stats().steps, 0);
  }
}

// The prefix cache: a repeated prompt reuses all but its last token, an extended one the whole earlier
// prompt's checkpoint, a conversation its messages; every result equals the cold run.
TEST_P(EngineBatching, PrefixCacheEqualsColdBitwise) {
  const auto base = prompt(90, 1);
  Job a = job(base, 7);
  Job same = job(base, 7, 0.8f, 5);
  auto ext = base;
  for (int i = 0; i < 23; ++i) ext.push_back(static_cast<int32_t>((i * 13 + 5) % vocab_));
  Job longer = job(ext, 9);
  // A conversation of three "messages"; the second request keeps the first two and changes the third.
  auto conv1 = prompt(40, 2), conv2 = conv1;
  for (int i = 0; i < 30; ++i) conv1.push_back(static_cast<int32_t>((i * 7 + 1) % vocab_));
  for (int i = 0; i < 25; ++i) conv2.push_back(static_cast<int32_t>((i * 11 + 2) % vocab_));
  Job c1 = job(conv1, 5, 0, 0, {20, 40});
  Job c2 = job(conv2, 5, 0, 0, {20, 40});
  const std::vector<Job> jobs = {a, same, longer, c1, c2};
  const auto ref = alone(jobs);

  start({.max_num_seqs = 4, .max_num_batched_tokens = 48});
  std::vector<Result> got;
  for (const auto& j : jobs) got.push_back(run({j})[0]);  // one after another: each sees the earlier ones
  for (size_t i = 0; i < jobs.size(); ++i) EXPECT_TRUE(got[i] == ref[i]) << "job " << i;
  EXPECT_EQ(got[0].cached, 0);
  EXPECT_EQ(got[1].cached, 89);  // all but the last prompt token
  EXPECT_GE(got[2].cached, 89);  // the first prompt's checkpoint (or the end of the first generation)
  EXPECT_EQ(got[4].cached, 40);  // up to the last unchanged message
  const auto st = sched_->stats();
  EXPECT_GE(st.prefix_hit_tokens, 89 + 89 + 40);
  EXPECT_GT(st.prefix_checkpoints, 0);
  expect_idle();
}

// A cache too small to keep much: checkpoints are evicted, and prompts whose prefix was evicted are
// recomputed with the same results.
TEST_P(EngineBatching, EvictedPrefixIsRecomputed) {
  std::vector<Job> jobs;
  for (int i = 0; i < 6; ++i) jobs.push_back(job(prompt(60, 10 + i % 3), 4));
  const auto ref = alone(jobs);
  const double slot_gb = static_cast<double>(backend_->slot_bytes()) / (1ull << 30);
  start({.max_num_seqs = 2, .max_num_batched_tokens = 32, .prefix_cache_gb = 2.5 * slot_gb});
  std::vector<Result> got;
  for (const auto& j : jobs) got.push_back(run({j})[0]);
  for (size_t i = 0; i < jobs.size(); ++i) EXPECT_TRUE(got[i] == ref[i]) << "job " << i;
  EXPECT_GT(sched_->stats().prefix_evictions, 0);
  expect_idle();
}

// KV pages for barely two sequences and six requests: sequences are preempted and recomputed; the tokens and
// log-probabilities (seeded draws too) are those of an ample plan.
TEST_P(EngineBatching, PreemptionGivesTheSameOutputs) {
  std::vector<Job> jobs;
  for (int i = 0; i < 6; ++i) {
    Job j = job(prompt(40 + 9 * i, 20 + i), 30);
    if (i % 2) {
      j.temperature = 1.0f;
      j.seed = static_cast<uint64_t>(i);
    }
    jobs.push_back(j);
  }
  const auto ref = alone(jobs);
  const double page_gb = static_cast<double>(backend_->page_bytes()) / (1ull << 30);
  // 90 + 30 positions need 8 pages of 16; 12 pages hold one sequence and a half.
  start({.max_num_seqs = 6,
         .max_num_batched_tokens = 64,
         .kv_cache_gb = 12.5 * page_gb,
         .prefix_cache = false});
  const auto got = run(jobs);
  for (size_t i = 0; i < jobs.size(); ++i)
    EXPECT_TRUE(got[i] == ref[i]) << "job " << i << ": " << got[i].error;
  EXPECT_GT(sched_->stats().preemptions, 0);
  expect_idle();
}

// More sequences than the KV pages hold once their outputs grow (KV for 100 pages; eight running sequences
// reach 17 pages each), as a user who sizes --kv-cache-gb a little short sees: a preempted sequence waits
// until its whole length fits again beside the running ones (with a little room for their growth), so it is
// not readmitted into the pages the decoders are about to take and preempted again at once, its whole
// length recomputed each time. Outputs equal an ample plan's; preemptions stay few (14 here before the
// admission rule, 2 with it).
TEST_P(EngineBatching, PreemptedSequencesDoNotThrash) {
  std::vector<Job> jobs;
  for (int i = 0; i < 12; ++i) jobs.push_back(job(prompt(100 + (i % 3), 30 + i), 160));
  const auto ref = alone(jobs);
  const double page_gb = static_cast<double>(backend_->page_bytes()) / (1ull << 30);
  start({.max_num_seqs = 8,
         .max_num_batched_tokens = 64,
         .kv_cache_gb = 100.5 * page_gb,
         .prefix_cache = false});
  const auto got = run(jobs);
  for (size_t i = 0; i < jobs.size(); ++i)
    EXPECT_TRUE(got[i] == ref[i]) << "job " << i << ": " << got[i].error;
  const auto st = sched_->stats();
  std::printf("[ preemption ] %lld preemptions, %lld steps for %zu requests\n",
              static_cast<long long>(st.preemptions), static_cast<long long>(st.steps), jobs.size());
  EXPECT_GT(st.preemptions, 0);
  EXPECT_LE(st.preemptions, 4);
  expect_idle();
}

// Teacher-forced scoring through the engine equals the reference forward pass (every logit row) bitwise.
TEST_P(EngineBatching, ScoringEqualsTheReferenceForward) {
  start({.max_num_seqs = 4, .max_num_batched_tokens = 40});
  const auto ids = prompt(100, 4), ids2 = prompt(57, 5);
  auto scored = score_all(*sched_, {ids, ids2});
  ASSERT_TRUE(scored.is_ok()) << scored.message();
  auto s = backend_->new_sequence();
  std::vector<float> logits;
  ASSERT_TRUE(backend_
                  ->forward(static_cast<backend::cpu::CpuSequenceState&>(*s), ids, /*recurrent=*/true,
                            /*all_logits=*/true, logits)
                  .is_ok());
  const size_t V = static_cast<size_t>(vocab_);
  ASSERT_EQ((*scored)[0].logprobs.size(), ids.size() - 1);
  for (size_t i = 0; i + 1 < ids.size(); ++i)
    EXPECT_EQ((*scored)[0].logprobs[i],
              log_prob(std::span<const float>(logits.data() + i * V, V), ids[i + 1]))
        << "position " << i;
  EXPECT_EQ((*scored)[1].logprobs.size(), ids2.size() - 1);
  expect_idle();
}

// 1,000 random submits and cancellations (before admission, mid-prefill, mid-decode, of requests whose
// client "disconnected" by dropping its channel) leave no page and no slot in use.
TEST_P(EngineBatching, RandomSubmitCancelLeavesNothingBehind) {
  for (bool cache : {false, true}) {
    start({.max_queue = 4096, .max_num_seqs = 5, .max_num_batched_tokens = 24, .prefix_cache = cache});
    std::mt19937 rng(7);
    std::vector<std::shared_ptr<ResponseChannel>> live;
    for (int ev = 0; ev < 1000; ++ev) {
      const int what = static_cast<int>(rng() % 4);
      if (what < 2 || live.empty()) {
        auto ch = std::make_shared<ResponseChannel>();
        const int len = 1 + static_cast<int>(rng() % 50), salt = static_cast<int>(rng() % 5);
        Job j = job(prompt(len, salt), 1 + static_cast<int>(rng() % 12));
        ASSERT_EQ(sched_->submit({job_request(j, ch, 0)}), SubmitResult::kQueued);
        live.push_back(ch);
      } else {
        const size_t k = rng() % live.size();
        live[k]->cancel();
        if (what == 3) live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));  // the client is gone
      }
      if (ev % 50 == 0) std::this_thread::sleep_for(1ms);
    }
    for (auto& ch : live) wait_all(*ch, 1);
    expect_idle();
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, EngineBatching, ::testing::Values("dense", "moe"));

}  // namespace
}  // namespace deltaflow::engine
