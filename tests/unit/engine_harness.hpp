// The engine test harness: a real CPU backend over a make-tiny checkpoint (or the default model), a
// scheduler, jobs submitted together, and their tokens, log-probabilities and finishes collected.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "backend/cpu/cpu_backend.hpp"
#include "engine/generate.hpp"
#include "engine/scheduler.hpp"
#include "model/tiny_checkpoint.hpp"

namespace deltaflow::engine {

using namespace std::chrono_literals;

struct Result {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;  // of each generated token
  std::vector<std::vector<TokenLogprob>> top;
  FinishReason finish = FinishReason::kError;
  int64_t cached = 0;
  int64_t drafted = 0, accepted = 0;  // speculative decoding
  std::string error;
  bool operator==(const Result& o) const {
    if (ids != o.ids || logprobs != o.logprobs || finish != o.finish || top.size() != o.top.size())
      return false;
    for (size_t i = 0; i < top.size(); ++i) {
      if (top[i].size() != o.top[i].size()) return false;
      for (size_t k = 0; k < top[i].size(); ++k)
        if (top[i][k].id != o.top[i][k].id || top[i][k].logprob != o.top[i][k].logprob) return false;
    }
    return true;
  }
};

struct Job {
  std::vector<int32_t> prompt;
  int max_tokens = 8;
  float temperature = 0.0f;
  uint64_t seed = 0;
  std::vector<int64_t> message_ends;
  int speculative = -1;  // GenerationRequest::speculative_tokens
};

inline Job job(std::vector<int32_t> prompt, int max_tokens, float temperature = 0.0f, uint64_t seed = 0,
               std::vector<int64_t> message_ends = {}) {
  return Job{std::move(prompt), max_tokens, temperature, seed, std::move(message_ends), -1};
}

class EngineHarness : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {}
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() /
            ("df_batching_" + GetParam() + "_" + std::to_string(::getpid())))
               .string();
    // "house": the default model (models/house); any other name: a make-tiny preset.
    const bool house = GetParam() == "house";
    if (!house) {
      ASSERT_TRUE(model::write_tiny_checkpoint(GetParam(), 3, dir_).is_ok());
    }
    auto b = backend::cpu::CpuBackend::load(house ? std::string(DF_SOURCE_DIR) + "/models/house" : dir_);
    ASSERT_TRUE(b.is_ok()) << b.message();
    backend_ = std::move(b).value();
    vocab_ = backend_->config().vocab_size;
  }
  void TearDown() override {
    sched_.reset();
    std::filesystem::remove_all(dir_);
  }

  void start(SchedulerOptions o) {
    sched_.reset();
    if (o.max_model_len == 0) o.max_model_len = 512;
    auto s = Scheduler::start(*backend_, o);
    ASSERT_TRUE(s.is_ok()) << s.message();
    sched_ = std::move(s).value();
  }

  std::vector<int32_t> prompt(int n, int salt) const {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 131 + salt * 7919 + 3) % vocab_));
    return p;
  }

  GenerationRequest request(const Job& j, std::shared_ptr<ResponseChannel> ch, int choice) const {
    GenerationRequest r;
    r.prompt = j.prompt;
    r.max_tokens = j.max_tokens;
    r.sampling.temperature = j.temperature;
    r.sampling.seed = j.seed;
    r.logprobs = true;
    r.top_logprobs = 3;
    r.message_ends = j.message_ends;
    r.speculative_tokens = j.speculative;
    r.channel = std::move(ch);
    r.choice = choice;
    return r;
  }

  // Submits every job at once and waits for all.
  std::vector<Result> run(const std::vector<Job>& jobs) {
    auto ch = std::make_shared<ResponseChannel>();
    std::vector<GenerationRequest> reqs;
    for (size_t i = 0; i < jobs.size(); ++i) reqs.push_back(request(jobs[i], ch, static_cast<int>(i)));
    EXPECT_EQ(sched_->submit(std::move(reqs)), SubmitResult::kQueued);
    return wait_all(*ch, jobs.size());
  }

  static std::vector<Result> wait_all(ResponseChannel& ch, size_t n) {
    std::vector<Result> out(n);
    size_t done = 0;
    std::vector<Event> evs;
    const auto deadline = std::chrono::steady_clock::now() + 120s;
    while (done < n && std::chrono::steady_clock::now() < deadline) {
      if (!ch.wait(50ms, evs)) continue;
      for (auto& e : evs) {
        Result& r = out[static_cast<size_t>(e.choice)];
        for (auto& t : e.tokens) {
          r.ids.push_back(t.id);
          r.logprobs.push_back(t.logprob);
          r.top.push_back(t.top);
        }
        if (e.finished) {
          r.finish = e.finish;
          r.cached = e.cached_tokens;
          r.drafted = e.drafted_tokens;
          r.accepted = e.accepted_tokens;
          r.error = e.error;
          ++done;
        }
      }
    }
    EXPECT_EQ(done, n) << "timed out";
    return out;
  }

  // Each job alone: one sequence at a time, the whole prompt in one step, no prefix cache.
  std::vector<Result> alone(const std::vector<Job>& jobs) {
    start({.max_num_seqs = 1, .max_num_batched_tokens = 4096, .prefix_cache = false});
    std::vector<Result> out;
    for (const auto& j : jobs) out.push_back(run({j})[0]);
    return out;
  }

  void expect_idle() {
    // Give the engine thread a moment to publish its last step's stats.
    for (int i = 0; i < 100 && sched_->stats().running + sched_->stats().waiting > 0; ++i)
      std::this_thread::sleep_for(10ms);
    const auto st = sched_->stats();
    EXPECT_EQ(st.running, 0);
    EXPECT_EQ(st.waiting, 0);
    // What is still held belongs to the prefix cache's checkpoints.
    EXPECT_EQ(st.state_slots_used, st.prefix_checkpoints);
    if (st.prefix_checkpoints == 0) {
      EXPECT_EQ(st.kv_pages_used, 0);
    }
  }

  std::string dir_;
  std::unique_ptr<backend::cpu::CpuBackend> backend_;
  std::unique_ptr<Scheduler> sched_;
  int64_t vocab_ = 0;
};

}  // namespace deltaflow::engine
