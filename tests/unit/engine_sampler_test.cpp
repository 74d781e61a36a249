// Sampler: seeded reproducibility, the filters (top-k, top-p, min-p), the penalties, and the
// log-probabilities.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/sampler.hpp"

namespace deltaflow::engine {
namespace {

// n draws of one sequence: each accepted, so each is the next step of the counter-based draw.
std::vector<int32_t> draw(const SamplingParams& p, const std::vector<float>& logits, int n) {
  Sampler s(p);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(s.sample(logits));
    s.accept(out.back());
  }
  return out;
}

const std::vector<float> kLogits = {1.0f, 3.0f, 2.5f, 0.0f, -1.0f, 2.9f};

TEST(EngineSampler, GreedyIsArgmax) {
  EXPECT_EQ(draw({}, kLogits, 3), (std::vector<int32_t>{1, 1, 1}));
  EXPECT_EQ(argmax(std::vector<float>{2, 5, 5}), 1);
}

TEST(EngineSampler, SameSeedSameTokensOtherSeedOtherTokens) {
  SamplingParams p{.temperature = 1.0f, .seed = 42};
  auto a = draw(p, kLogits, 64);
  EXPECT_EQ(a, draw(p, kLogits, 64));
  p.seed = 43;
  EXPECT_NE(a, draw(p, kLogits, 64));
}

// A draw depends on (seed, step) alone: asking again before accepting gives the same id, and the host
// reference's uniform is the one the GPU kernel uses (core/philox.hpp).
TEST(EngineSampler, ADrawIsKeyedBySeedAndStep) {
  const SamplingParams p{.temperature = 1.0f, .seed = 7};
  Sampler s(p);
  const int32_t first = s.sample(kLogits);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(s.sample(kLogits), first);
  const auto seq = draw(p, kLogits, 16);
  EXPECT_EQ(seq[0], first);
  Sampler t(p);
  for (int i = 0; i < 10; ++i) t.accept(seq[static_cast<size_t>(i)]);
  EXPECT_EQ(t.sample(kLogits), seq[10]);  // step 10, whatever came before
}

TEST(EngineSampler, TopKAndTopPAndMinPRestrictTheSupport) {
  auto support = [&](SamplingParams p) {
    std::map<int32_t, int> seen;
    for (int32_t id : draw(p, kLogits, 2000)) ++seen[id];
    std::vector<int32_t> ids;
    for (auto& [id, n] : seen) ids.push_back(id);
    return ids;
  };
  EXPECT_EQ(support({.temperature = 1.0f, .top_k = 2, .seed = 1}), (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(support({.temperature = 1.0f, .top_k = 1, .seed = 1}), (std::vector<int32_t>{1}));
  // Probabilities at T=1: ids 1, 5, 2 hold ~0.36, 0.33, 0.22; top_p 0.6 keeps the first two.
  EXPECT_EQ(support({.temperature = 1.0f, .top_p = 0.6f, .seed = 1}), (std::vector<int32_t>{1, 5}));
  // min_p 0.5: keep p >= 0.5 * p_max -> ids 1, 5, 2 (exp(-0.5) = 0.61 >= 0.5), not 0 (exp(-2) = 0.14).
  EXPECT_EQ(support({.temperature = 1.0f, .min_p = 0.5f, .seed = 1}), (std::vector<int32_t>{1, 2, 5}));
}

TEST(EngineSampler, TemperatureFollowsTheSoftmax) {
  const std::vector<float> two = {0.0f, std::log(3.0f)};  // p = 0.25, 0.75 at T=1
  auto ids = draw({.temperature = 1.0f, .seed = 5}, two, 20000);
  double ones = 0;
  for (auto id : ids) ones += id;
  EXPECT_NEAR(ones / 20000.0, 0.75, 0.015);
}

TEST(EngineSampler, PresenceAndFrequencyPenaltiesPushRepeatsDown) {
  SamplingParams p{.presence_penalty = 0.4f};
  Sampler s(p);
  s.accept(1);
  EXPECT_EQ(s.sample(kLogits), 5);  // 3.0 - 0.4 = 2.6 < 2.9
  SamplingParams f{.frequency_penalty = 0.06f};
  Sampler t(f);
  t.accept(1);
  EXPECT_EQ(t.sample(kLogits), 1);  // 3.0 - 0.06 > 2.9
  t.accept(1);
  EXPECT_EQ(t.sample(kLogits), 5);  // 3.0 - 0.12 < 2.9
}

TEST(EngineSampler, RepetitionPenaltyCoversThePrompt) {
  SamplingParams p{.repetition_penalty = 1.1f};
  Sampler s(p);
  EXPECT_EQ(s.sample(kLogits), 1);
  s.add_prompt(std::vector<int32_t>{1});
  EXPECT_EQ(s.sample(kLogits), 5);  // 3.0 / 1.1 = 2.73 < 2.9
  // Negative logits are multiplied: -1 * 1.1 moves further down, never up.
  const std::vector<float> neg = {-1.0f, -1.05f};
  Sampler n(p);
  n.add_prompt(std::vector<int32_t>{0});
  EXPECT_EQ(n.sample(neg), 1);
}

TEST(EngineSampler, LogitBiasMovesTheChoice) {
  SamplingParams p;
  p.logit_bias = {{4, 100.0f}};
  EXPECT_EQ(draw(p, kLogits, 2), (std::vector<int32_t>{4, 4}));  // -1 + 100 beats 3
  p.logit_bias = {{1, -100.0f}};
  EXPECT_EQ(draw(p, kLogits, 1), (std::vector<int32_t>{5}));  // the runner-up, 2.9
  // Sampled: a -100 bias removes the token in practice, +100 makes it certain; out-of-range ids are ignored.
  p.temperature = 1.0f;
  p.logit_bias = {{1, -100.0f}, {5, -100.0f}, {99, 5.0f}};
  for (int32_t id : draw(p, kLogits, 500)) EXPECT_TRUE(id != 1 && id != 5);
  p.logit_bias = {{3, 100.0f}};
  for (int32_t id : draw(p, kLogits, 100)) EXPECT_EQ(id, 3);
  // With penalties too: the bias adds to the penalised logits.
  p.temperature = 0.0f;
  p.presence_penalty = 2.0f;
  p.logit_bias = {{0, 1.95f}};
  EXPECT_EQ(draw(p, kLogits, 1), (std::vector<int32_t>{1}));  // nothing generated yet: 3 beats 1 + 1.95
  Sampler s(p);
  s.accept(1);
  EXPECT_EQ(s.sample(kLogits), 0);  // 1 + 1.95 beats 2.9, and 3 - 2
}

TEST(EngineSampler, LogprobsMatchLogSoftmax) {
  double z = 0;
  for (float x : kLogits) z += std::exp(static_cast<double>(x));
  for (int32_t i = 0; i < 6; ++i)
    EXPECT_NEAR(chosen_logprob(kLogits, i).logprob, kLogits[i] - std::log(z), 1e-6);
  auto top = top_logprobs(kLogits, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].id, 1);
  EXPECT_EQ(top[1].id, 5);
  EXPECT_EQ(top[2].id, 2);
  EXPECT_TRUE(top_logprobs(kLogits, 0).empty());
  EXPECT_EQ(top_logprobs(kLogits, 100).size(), 6u);
}

}  // namespace
}  // namespace deltaflow::engine
