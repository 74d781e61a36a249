// The engine test harness: a real CPU backend over a make-tiny checkpoint (or the default model), a
// scheduler, jobs submitted together, and their tokens, log-probabilities and finishes collected.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "../engine_jobs.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "engine/generate.hpp"
#include "engine/scheduler.hpp"
#include "model/tiny_checkpoint.hpp"

namespace deltaflow::engine {

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

  // Submits every job at once and waits for all.
  std::vector<Result> run(const std::vector<Job>& jobs) { return run_jobs(*sched_, jobs); }

  // Each job alone: one sequence at a time, the whole prompt in one step, no prefix cache.
  std::vector<Result> alone(const std::vector<Job>& jobs) {
    start({.max_num_seqs = 1, .max_num_batched_tokens = 4096, .prefix_cache = false});
    std::vector<Result> out;
    for (const auto& j : jobs) out.push_back(run({j})[0]);
    return out;
  }

  void expect_idle() { engine::expect_idle(*sched_); }

  std::string dir_;
  std::unique_ptr<backend::cpu::CpuBackend> backend_;
  std::unique_ptr<Scheduler> sched_;
  int64_t vocab_ = 0;
};

}  // namespace deltaflow::engine
