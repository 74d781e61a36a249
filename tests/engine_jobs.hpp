// Requests submitted to a running engine and their outputs collected (tokens, log-probabilities, finish,
// cached tokens), for the engine tests on any backend: tests/unit (the CPU reference) and tests/gpu (CUDA).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "engine/scheduler.hpp"

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
  std::vector<int64_t> message_ends = {};
  int speculative = -1;  // GenerationRequest::speculative_tokens
};

inline Job job(std::vector<int32_t> prompt, int max_tokens, float temperature = 0.0f, uint64_t seed = 0,
               std::vector<int64_t> message_ends = {}) {
  return Job{std::move(prompt), max_tokens, temperature, seed, std::move(message_ends), -1};
}

// The request a job makes: log-probabilities with the top 3 on, so every row's logits are read.
inline GenerationRequest job_request(const Job& j, std::shared_ptr<ResponseChannel> ch, int choice) {
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

// Waits (up to 120 s) for n requests that share `ch`, each identified by its choice index.
inline std::vector<Result> wait_all(ResponseChannel& ch, size_t n) {
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

// Submits every job at once and waits for all.
inline std::vector<Result> run_jobs(Scheduler& s, const std::vector<Job>& jobs) {
  auto ch = std::make_shared<ResponseChannel>();
  std::vector<GenerationRequest> reqs;
  for (size_t i = 0; i < jobs.size(); ++i) reqs.push_back(job_request(jobs[i], ch, static_cast<int>(i)));
  EXPECT_EQ(s.submit(std::move(reqs)), SubmitResult::kQueued);
  return wait_all(*ch, jobs.size());
}

// Nothing running or waiting, and nothing held but the prefix cache's checkpoints.
inline void expect_idle(Scheduler& s) {
  // Give the engine thread a moment to publish its last step's stats.
  for (int i = 0; i < 100 && s.stats().running + s.stats().waiting > 0; ++i)
    std::this_thread::sleep_for(10ms);
  const auto st = s.stats();
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.waiting, 0);
  EXPECT_EQ(st.state_slots_used, st.prefix_checkpoints);
  if (st.prefix_checkpoints == 0) {
    EXPECT_EQ(st.kv_pages_used, 0);
  }
}

}  // namespace deltaflow::engine
