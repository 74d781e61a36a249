// The engine's glue to sampling on the backend (TokenPicker), on a fake backend that "samples" a known
// function of what it is given: generate and the scheduler draw on the backend when it can and no logprobs
// are asked for, pass the penalty history and the step, and fall back to decode + the host Sampler otherwise.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>

#include "engine/generate.hpp"
#include "engine/scheduler.hpp"
#include "engine/token_picker.hpp"

namespace deltaflow::engine {
namespace {

using namespace std::chrono_literals;

struct FakeState : backend::SequenceState {
  int64_t pos = 0;
  int32_t last = 0;
  int64_t length() const override { return pos; }
};

// Host logits put the maximum at last + 1; the backend's draw is last + 3 (so the two paths differ).
struct Seen {
  uint64_t step = 0, seed = 0;
  float temperature = 0, top_p = 1, min_p = 0, repetition = 1;
  int top_k = 0;
  std::vector<backend::TokenCount> generated;
  std::vector<int32_t> prompt_seen;
};

class SamplingFake : public backend::Backend {
 public:
  explicit SamplingFake(bool can) : can_(can) {
    config_.vocab_size = 32;
    config_.max_position_embeddings = 256;
  }
  const model::TextConfig& config() const override { return config_; }
  const char* name() const override { return "fake"; }
  std::unique_ptr<backend::SequenceState> new_sequence() override { return std::make_unique<FakeState>(); }
  core::Status prefill(std::span<const backend::PrefillItem> items, std::vector<float>& logits) override {
    logits.clear();
    for (const auto& it : items) {
      auto* s = static_cast<FakeState*>(it.state);
      s->pos += static_cast<int64_t>(it.tokens.size());
      s->last = it.tokens.back();
      row(s->last, logits);
    }
    return core::Status();
  }
  core::Status decode(std::span<backend::SequenceState* const> seqs, std::span<const int32_t> tokens,
                      std::vector<float>& logits) override {
    ++decodes;
    logits.clear();
    for (size_t i = 0; i < seqs.size(); ++i) {
      auto* s = static_cast<FakeState*>(seqs[i]);
      s->pos += 1;
      s->last = tokens[i];
      row(s->last, logits);
    }
    return core::Status();
  }
  bool can_sample() const override { return can_; }
  core::Status decode_sample(std::span<backend::SequenceState* const> seqs, std::span<const int32_t> tokens,
                             std::span<const backend::SamplingSpec> specs,
                             std::vector<int32_t>& ids) override {
    ++decode_samples;
    ids.clear();
    for (size_t i = 0; i < seqs.size(); ++i) {
      auto* s = static_cast<FakeState*>(seqs[i]);
      s->pos += 1;
      s->last = tokens[i];
      record(specs[i]);
      ids.push_back((s->last + 3) % 32);
    }
    return core::Status();
  }
  core::Status sample_logits(std::span<const float> logits, std::span<const backend::SamplingSpec> specs,
                             std::vector<int32_t>& ids) override {
    ++logit_samples;
    ids.clear();
    for (size_t i = 0; i < specs.size(); ++i) {
      record(specs[i]);
      // The row's maximum is at last + 1, so this is last + 3 as well.
      const auto r = logits.subspan(i * 32, 32);
      ids.push_back((static_cast<int32_t>(std::max_element(r.begin(), r.end()) - r.begin()) + 2) % 32);
    }
    return core::Status();
  }
  void record(const backend::SamplingSpec& s) {
    std::lock_guard<std::mutex> lock(mu);
    Seen v;
    v.step = s.step;
    v.seed = s.seed;
    v.temperature = s.temperature;
    v.top_p = s.top_p;
    v.min_p = s.min_p;
    v.top_k = s.top_k;
    v.repetition = s.repetition_penalty;
    v.generated.assign(s.generated.begin(), s.generated.end());
    v.prompt_seen.assign(s.prompt_seen.begin(), s.prompt_seen.end());
    seen.push_back(std::move(v));
  }
  void row(int32_t last, std::vector<float>& logits) const {
    const size_t at = logits.size();
    logits.resize(at + 32, 0.0f);
    logits[at + static_cast<size_t>((last + 1) % 32)] = 10.0f;
  }

  model::TextConfig config_;
  bool can_;
  int decodes = 0, decode_samples = 0, logit_samples = 0;
  std::mutex mu;
  std::vector<Seen> seen;
};

TEST(EngineTokenPicker, GenerateSamplesOnTheBackendWithStepsAndSeed) {
  SamplingFake b(true);
  GenerateOptions opt;
  opt.max_tokens = 4;
  opt.sampling.temperature = 0.7f;
  opt.sampling.top_k = 20;
  opt.sampling.top_p = 0.9f;
  opt.sampling.min_p = 0.05f;
  opt.sampling.seed = 42;
  auto r = generate(b, {5}, opt);
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_EQ(r->ids, (std::vector<int32_t>{8, 11, 14, 17}));  // each +3: the backend's draws
  EXPECT_EQ(b.decodes, 0);
  EXPECT_EQ(b.logit_samples, 1);   // the token after the prefill
  EXPECT_EQ(b.decode_samples, 3);  // max_tokens - 1 decode steps
  ASSERT_EQ(b.seen.size(), 4u);
  for (size_t i = 0; i < b.seen.size(); ++i) {
    EXPECT_EQ(b.seen[i].step, i);
    EXPECT_EQ(b.seen[i].seed, 42u);
    EXPECT_FLOAT_EQ(b.seen[i].temperature, 0.7f);
    EXPECT_EQ(b.seen[i].top_k, 20);
    EXPECT_FLOAT_EQ(b.seen[i].top_p, 0.9f);
    EXPECT_FLOAT_EQ(b.seen[i].min_p, 0.05f);
    EXPECT_TRUE(b.seen[i].generated.empty());  // no penalties: no history sent
  }
}

TEST(EngineTokenPicker, GenerateFallsBackToTheHostSampler) {
  SamplingFake b(false);
  GenerateOptions opt;
  opt.max_tokens = 3;
  auto r = generate(b, {5}, opt);
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_EQ(r->ids, (std::vector<int32_t>{6, 7, 8}));  // greedy on the host logits: +1
  EXPECT_EQ(b.decodes, 2);
  EXPECT_EQ(b.decode_samples + b.logit_samples, 0);
}

TEST(EngineTokenPicker, PenaltyHistoryReachesTheBackend) {
  SamplingFake b(true);
  TokenPicker p(
      b,
      [] {
        SamplingParams s;
        s.temperature = 1.0f;
        s.repetition_penalty = 1.3f;
        s.presence_penalty = 0.5f;
        return s;
      }(),
      false);
  ASSERT_TRUE(p.on_backend());
  const std::vector<int32_t> prompt = {9, 3, 9, 1};
  p.add_prompt(prompt);
  p.accept(7);
  p.accept(3);
  p.accept(7);
  const backend::SamplingSpec s = p.spec();
  EXPECT_EQ(s.step, 3u);
  EXPECT_FLOAT_EQ(s.repetition_penalty, 1.3f);
  EXPECT_FLOAT_EQ(s.presence_penalty, 0.5f);
  EXPECT_EQ(std::vector<int32_t>(s.prompt_seen.begin(), s.prompt_seen.end()),
            (std::vector<int32_t>{1, 3, 9}));
  ASSERT_EQ(s.generated.size(), 2u);
  EXPECT_EQ(s.generated[0].id, 3);
  EXPECT_EQ(s.generated[0].count, 1);
  EXPECT_EQ(s.generated[1].id, 7);
  EXPECT_EQ(s.generated[1].count, 2);
}

TEST(EngineTokenPicker, RepetitionOffSendsNoPromptIds) {
  SamplingFake b(true);
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.frequency_penalty = 0.2f;
  TokenPicker p(b, sp, false);
  const std::vector<int32_t> prompt = {4, 5};
  p.add_prompt(prompt);
  p.accept(4);
  const auto s = p.spec();
  EXPECT_TRUE(s.prompt_seen.empty());
  ASSERT_EQ(s.generated.size(), 1u);
  EXPECT_EQ(s.generated[0].id, 4);
}

GenerationRequest make(std::vector<int32_t> prompt, int max_tokens, std::shared_ptr<ResponseChannel> ch) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.channel = std::move(ch);
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 7;
  return r;
}

std::vector<int32_t> collect(ResponseChannel& ch) {
  std::vector<int32_t> ids;
  std::vector<Event> evs;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!ch.wait(50ms, evs)) continue;
    bool done = false;
    for (auto& e : evs) {
      for (auto& t : e.tokens) ids.push_back(t.id);
      done |= e.finished;
    }
    if (done) break;
  }
  return ids;
}

TEST(EngineTokenPicker, SchedulerSamplesOnTheBackendAfterForcedTokens) {
  SamplingFake b(true);
  {
    Scheduler s(b, {});
    auto ch = std::make_shared<ResponseChannel>();
    auto r = make({0}, 4, ch);
    r.forced_ids = {20};
    ASSERT_EQ(s.submit({std::move(r)}), SubmitResult::kQueued);
    EXPECT_EQ(collect(*ch), (std::vector<int32_t>{20, 23, 26, 29}));
  }
  EXPECT_EQ(b.decodes, 0);
  ASSERT_EQ(b.seen.size(), 4u);  // the draw after the prefill (unused: forced), then one per decode
  for (size_t i = 0; i < b.seen.size(); ++i) EXPECT_EQ(b.seen[i].step, i);
}

TEST(EngineTokenPicker, SchedulerWithLogprobsSamplesOnTheHost) {
  SamplingFake b(true);
  {
    Scheduler s(b, {});
    auto ch = std::make_shared<ResponseChannel>();
    auto r = make({0}, 3, ch);
    r.sampling.temperature = 0.0f;
    r.logprobs = true;
    ASSERT_EQ(s.submit({std::move(r)}), SubmitResult::kQueued);
    EXPECT_EQ(collect(*ch), (std::vector<int32_t>{1, 2, 3}));  // greedy on the host logits
  }
  EXPECT_EQ(b.decodes, 2);
  EXPECT_EQ(b.decode_samples + b.logit_samples, 0);
}

}  // namespace
}  // namespace deltaflow::engine
