// The engine thread's request logic on a fake per-sequence backend (behind the real SequenceStepper) whose
// next token is always (last token + 1) mod vocab: stop ids, max_tokens, forced tokens, the thinking budget,
// cancellation, the queue bound, FCFS order, errors. The batching, paging and prefix cache on the real CPU
// backend are in engine_batching_test.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include "backend/sequence_stepper.hpp"
#include "engine/scheduler.hpp"

namespace deltaflow::engine {
namespace {

using namespace std::chrono_literals;

struct FakeState : backend::SequenceState {
  int64_t pos = 0;
  int32_t last = 0;
  int64_t length() const override { return pos; }
};

class FakeBackend : public backend::SequenceBackend {
 public:
  explicit FakeBackend(int64_t vocab = 16, int64_t max_len = 64) {
    config_.vocab_size = vocab;
    config_.max_position_embeddings = max_len;
  }
  const model::TextConfig& config() const override { return config_; }
  const char* name() const override { return "fake"; }
  std::unique_ptr<backend::SequenceState> new_sequence() override { return std::make_unique<FakeState>(); }
  int max_sequences() const override { return 64; }
  int64_t max_context() const override { return config_.max_position_embeddings; }
  core::Status prefill(std::span<const backend::PrefillItem> items, std::vector<float>& logits) override {
    logits.clear();
    for (const auto& it : items) {
      auto* s = static_cast<FakeState*>(it.state);
      s->pos += static_cast<int64_t>(it.tokens.size());
      s->last = it.tokens.back();
      row(s->last, logits);
    }
    prefills.fetch_add(1);
    return core::Status();
  }
  core::Status decode(std::span<backend::SequenceState* const> seqs, std::span<const int32_t> tokens,
                      std::vector<float>& logits) override {
    if (delay.count()) std::this_thread::sleep_for(delay);
    if (fail_decode) return core::Error{"fake decode failure"};
    logits.clear();
    for (size_t i = 0; i < seqs.size(); ++i) {
      auto* s = static_cast<FakeState*>(seqs[i]);
      s->pos += 1;
      s->last = tokens[i];
      row(s->last, logits);
    }
    return core::Status();
  }
  void row(int32_t last, std::vector<float>& logits) const {
    const size_t V = static_cast<size_t>(config_.vocab_size);
    const size_t at = logits.size();
    logits.resize(at + V, 0.0f);
    logits[at + static_cast<size_t>((last + 1) % config_.vocab_size)] = 10.0f;
    logits[at + static_cast<size_t>((last + 2) % config_.vocab_size)] = 9.0f;
  }

  model::TextConfig config_;
  std::chrono::milliseconds delay{0};
  bool fail_decode = false;
  std::atomic<int> prefills{0};
};

// The real engine over the fake model. The fake is owned by the stepper; `fake` stays valid meanwhile.
struct Engine {
  explicit Engine(SchedulerOptions o = {}, int64_t vocab = 16, std::chrono::milliseconds delay = {},
                  bool fail_decode = false) {
    auto f = std::make_unique<FakeBackend>(vocab);
    f->delay = delay;
    f->fail_decode = fail_decode;
    fake = f.get();
    stepper = std::make_unique<backend::SequenceStepper>(std::move(f));
    auto started = Scheduler::start(*stepper, o);
    EXPECT_TRUE(started.is_ok()) << started.message();
    s = std::move(started).value();
  }
  FakeBackend* fake = nullptr;
  std::unique_ptr<backend::SequenceStepper> stepper;
  std::unique_ptr<Scheduler> s;
  Scheduler* operator->() { return s.get(); }
};

struct Collected {
  std::vector<int32_t> ids;
  std::vector<SampledToken> tokens;
  Event last;
  bool finished = false;
};

Collected collect(ResponseChannel& ch, int choice = 0, std::chrono::milliseconds limit = 5000ms) {
  Collected c;
  std::vector<Event> evs;
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!c.finished && std::chrono::steady_clock::now() < deadline) {
    if (!ch.wait(50ms, evs)) continue;
    for (auto& e : evs) {
      if (e.choice != choice) continue;
      for (auto& t : e.tokens) {
        c.ids.push_back(t.id);
        c.tokens.push_back(t);
      }
      if (e.finished) {
        c.finished = true;
        c.last = e;
      }
    }
  }
  return c;
}

GenerationRequest make(std::vector<int32_t> prompt, int max_tokens, std::shared_ptr<ResponseChannel> ch) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.channel = std::move(ch);
  return r;
}

TEST(EngineScheduler, GreedyUntilLength) {
  Engine s;
  auto ch = std::make_shared<ResponseChannel>();
  ASSERT_EQ(s->submit({make({3}, 5, ch)}), SubmitResult::kQueued);
  auto c = collect(*ch);
  ASSERT_TRUE(c.finished);
  EXPECT_EQ(c.ids, (std::vector<int32_t>{4, 5, 6, 7, 8}));
  EXPECT_EQ(c.last.finish, FinishReason::kLength);
  EXPECT_EQ(c.last.prompt_tokens, 1);
  EXPECT_EQ(c.last.completion_tokens, 5);
}

TEST(EngineScheduler, StopTokenEndsAndIsReported) {
  Engine s;
  auto ch = std::make_shared<ResponseChannel>();
  auto r = make({1, 2}, 50, ch);
  r.stop_ids = {6};
  ASSERT_EQ(s->submit({std::move(r)}), SubmitResult::kQueued);
  auto c = collect(*ch);
  EXPECT_EQ(c.ids, (std::vector<int32_t>{3, 4, 5, 6}));
  EXPECT_EQ(c.last.finish, FinishReason::kStop);
  EXPECT_EQ(c.last.stop_id, 6);
}

TEST(EngineScheduler, ForcedTokensComeFirstThenSampling) {
  Engine s;
  auto ch = std::make_shared<ResponseChannel>();
  auto r = make({0}, 5, ch);
  r.forced_ids = {9, 9, 12};
  ASSERT_EQ(s->submit({std::move(r)}), SubmitResult::kQueued);
  EXPECT_EQ(collect(*ch).ids, (std::vector<int32_t>{9, 9, 12, 13, 14}));
}

TEST(EngineScheduler, ThinkingBudgetForcesTheClose) {
  Engine s({}, 32);
  auto ch = std::make_shared<ResponseChannel>();
  auto r = make({0}, 12, ch);
  r.thinking.max_tokens = 3;
  r.thinking.start_id = 30;
  r.thinking.end_id = 31;
  r.thinking.open_at_start = true;
  r.thinking.close_ids = {20, 31, 20};
  ASSERT_EQ(s->submit({std::move(r)}), SubmitResult::kQueued);
  // 3 thought tokens, then the forced close, then sampling goes on from the last forced token.
  EXPECT_EQ(collect(*ch).ids, (std::vector<int32_t>{1, 2, 3, 20, 31, 20, 21, 22, 23, 24, 25, 26}));
}

TEST(EngineScheduler, ThinkingBudgetCountsFromAGeneratedThinkToken) {
  Engine s({}, 32);
  auto ch = std::make_shared<ResponseChannel>();
  auto r = make({28}, 8, ch);  // samples 29, then 30 = <think>, then 31 = </think> naturally
  r.thinking.max_tokens = 0;
  r.thinking.start_id = 30;
  r.thinking.end_id = 31;
  r.thinking.close_ids = {5, 31};
  ASSERT_EQ(s->submit({std::move(r)}), SubmitResult::kQueued);
  EXPECT_EQ(collect(*ch).ids, (std::vector<int32_t>{29, 30, 5, 31, 0, 1, 2, 3}));
}

TEST(EngineScheduler, LogprobsAreOfTheRawDistribution) {
  Engine s;
  auto ch = std::make_shared<ResponseChannel>();
  auto r = make({0}, 2, ch);
  r.logprobs = true;
  r.top_logprobs = 2;
  ASSERT_EQ(s->submit({std::move(r)}), SubmitResult::kQueued);
  auto c = collect(*ch);
  ASSERT_EQ(c.tokens.size(), 2u);
  // logits: 10 at id 1, 9 at id 2, 0 elsewhere (14 ids).
  const double z = std::exp(10.0) + std::exp(9.0) + 14.0;
  EXPECT_NEAR(c.tokens[0].logprob, 10.0 - std::log(z), 1e-5);
  ASSERT_EQ(c.tokens[0].top.size(), 2u);
  EXPECT_EQ(c.tokens[0].top[0].id, 1);
  EXPECT_EQ(c.tokens[0].top[1].id, 2);
  EXPECT_NEAR(c.tokens[0].top[1].logprob, 9.0 - std::log(z), 1e-5);
}

TEST(EngineScheduler, CancelStopsARunningRequest) {
  Engine s({}, 16, 5ms);
  auto ch = std::make_shared<ResponseChannel>();
  ASSERT_EQ(s->submit({make({0}, 60, ch)}), SubmitResult::kQueued);
  std::vector<Event> evs;
  ASSERT_TRUE(ch->wait(2000ms, evs));
  ch->cancel();
  auto c = collect(*ch);
  ASSERT_TRUE(c.finished);
  EXPECT_EQ(c.last.finish, FinishReason::kCancelled);
  EXPECT_LT(c.last.completion_tokens, 60);
}

TEST(EngineScheduler, QueueBoundAndFirstComeFirstServed) {
  // One sequence at a time, so that the later ones wait in the queue.
  Engine s({.max_queue = 2, .max_num_seqs = 1}, 16, 10ms);
  auto first = std::make_shared<ResponseChannel>();
  ASSERT_EQ(s->submit({make({0}, 20, first)}), SubmitResult::kQueued);
  std::vector<Event> evs;
  ASSERT_TRUE(first->wait(2000ms, evs));  // running now: the queue is empty again
  auto a = std::make_shared<ResponseChannel>();
  auto c2 = std::make_shared<ResponseChannel>();
  ASSERT_EQ(s->submit({make({5}, 2, a), make({7}, 2, c2)}), SubmitResult::kQueued);
  EXPECT_EQ(s->waiting(), 2u);
  auto refused = std::make_shared<ResponseChannel>();
  EXPECT_EQ(s->submit({make({1}, 2, refused)}), SubmitResult::kQueueFull);
  auto ra = collect(*a);
  auto rc = collect(*c2);
  EXPECT_EQ(ra.ids, (std::vector<int32_t>{6, 7}));
  EXPECT_EQ(rc.ids, (std::vector<int32_t>{8, 9}));
  EXPECT_TRUE(collect(*first).finished);
}

TEST(EngineScheduler, SeveralChoicesOnOneChannel) {
  Engine s;
  auto ch = std::make_shared<ResponseChannel>();
  auto r0 = make({0}, 3, ch);
  auto r1 = make({10}, 3, ch);
  r1.choice = 1;
  ASSERT_EQ(s->submit({std::move(r0), std::move(r1)}), SubmitResult::kQueued);
  std::map<int, std::vector<int32_t>> ids;
  int finished = 0;
  std::vector<Event> evs;
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (finished < 2 && std::chrono::steady_clock::now() < deadline) {
    if (!ch->wait(50ms, evs)) continue;
    for (auto& e : evs) {
      for (auto& t : e.tokens) ids[e.choice].push_back(t.id);
      finished += e.finished;
    }
  }
  EXPECT_EQ(ids[0], (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(ids[1], (std::vector<int32_t>{11, 12, 13}));
}

TEST(EngineScheduler, BadRequestsFailWithoutHurtingTheEngine) {
  Engine s;
  auto bad_id = std::make_shared<ResponseChannel>();
  auto too_long = std::make_shared<ResponseChannel>();
  auto empty = std::make_shared<ResponseChannel>();
  auto good = std::make_shared<ResponseChannel>();
  ASSERT_EQ(s->submit({make({99}, 2, bad_id)}), SubmitResult::kQueued);
  ASSERT_EQ(s->submit({make({1}, 64, too_long)}), SubmitResult::kQueued);
  ASSERT_EQ(s->submit({make({}, 2, empty)}), SubmitResult::kQueued);
  ASSERT_EQ(s->submit({make({1}, 2, good)}), SubmitResult::kQueued);
  EXPECT_EQ(collect(*bad_id).last.finish, FinishReason::kError);
  EXPECT_EQ(collect(*too_long).last.finish, FinishReason::kError);
  EXPECT_EQ(collect(*empty).last.finish, FinishReason::kError);
  EXPECT_EQ(collect(*good).ids, (std::vector<int32_t>{2, 3}));
}

TEST(EngineScheduler, BackendFailureIsAnErrorEvent) {
  Engine s({}, 16, {}, true);
  auto ch = std::make_shared<ResponseChannel>();
  ASSERT_EQ(s->submit({make({1}, 5, ch)}), SubmitResult::kQueued);
  auto c = collect(*ch);
  EXPECT_EQ(c.last.finish, FinishReason::kError);
  EXPECT_NE(c.last.error.find("fake decode failure"), std::string::npos);
}

TEST(EngineScheduler, StopFailsWaitingRequests) {
  Engine s({.max_num_seqs = 1}, 16, 20ms);
  auto running = std::make_shared<ResponseChannel>();
  auto waiting = std::make_shared<ResponseChannel>();
  ASSERT_EQ(s->submit({make({0}, 50, running), make({0}, 5, waiting)}), SubmitResult::kQueued);
  std::this_thread::sleep_for(50ms);
  s->stop();
  EXPECT_EQ(collect(*running).last.finish, FinishReason::kCancelled);
  EXPECT_EQ(collect(*waiting).last.finish, FinishReason::kError);
  EXPECT_EQ(s->submit({make({0}, 5, waiting)}), SubmitResult::kStopped);
}

}  // namespace
}  // namespace deltaflow::engine
