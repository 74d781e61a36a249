// Out of GPU memory (issue: reliability under faults), label `gpu`: a plan larger than the GPU is a clear
// error at load that says what was asked, what was free and which flags shrink it, and leaves nothing
// allocated; a prompt longer than the KV pool fails that request alone, with the flag to raise, and the
// engine goes on. (The engine allocates every pool at load, so no request can run the GPU out of memory.)
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "../engine_jobs.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/sequence_stepper.hpp"
#include "engine/scheduler.hpp"
#include "gpu_test_util.hpp"
#include "model/config.hpp"
#include "model/tiny_checkpoint.hpp"

namespace deltaflow {
namespace {

using backend::cuda::CudaBackend;
using backend::cuda::CudaOptions;

size_t free_bytes() {
  size_t f = 0, t = 0;
  EXPECT_EQ(cudaMemGetInfo(&f, &t), cudaSuccess);
  return f;
}

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

TEST(CudaOutOfMemory, WeightsLargerThanTheGpuAreAClearError) {
  ASSERT_TRUE(gpu_test::have_gpu());
  std::ifstream f(std::string(DF_SOURCE_DIR) + "/bench/configs/qwen3.5-397b-a17b.json");
  std::stringstream ss;
  ss << f.rdbuf();
  auto c = model::parse_text_config(ss.str(), "qwen3.5-397b-a17b.json");
  ASSERT_TRUE(c.is_ok()) << c.message();
  const size_t before = free_bytes();
  auto b = CudaBackend::synthetic(*c, CudaOptions{}, 1);
  ASSERT_FALSE(b.is_ok());
  EXPECT_TRUE(contains(b.message(), "not enough GPU memory for the weights")) << b.message();
  EXPECT_TRUE(contains(b.message(), "GB asked")) << b.message();
  EXPECT_TRUE(contains(b.message(), "--tensor-parallel-size")) << b.message();
  // Nothing stays allocated (the cuBLASLt workspace and the context's own pools may come and go: 256 MB).
  EXPECT_LE(before, free_bytes() + (256u << 20));
}

class CudaOutOfMemoryEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(gpu_test::have_gpu());
    dir_ = (std::filesystem::temp_directory_path() / ("df_cuda_oom_" + std::to_string(::getpid()))).string();
    ASSERT_TRUE(model::write_tiny_checkpoint("dense", 1, dir_).is_ok());
    CudaOptions opt;
    opt.engine_pools = true;
    opt.max_context = 1024;
    auto b = CudaBackend::load(dir_, opt);
    ASSERT_TRUE(b.is_ok()) << b.message();
    stepper_ = std::make_unique<backend::SequenceStepper>(std::move(b).value());
  }
  void TearDown() override {
    stepper_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::string dir_;
  std::unique_ptr<backend::SequenceStepper> stepper_;
};

TEST_F(CudaOutOfMemoryEngine, AKvPoolLargerThanTheGpuIsAClearErrorAndTheBackendGoesOn) {
  const size_t before = free_bytes();
  auto big = engine::Scheduler::start(*stepper_, {.max_model_len = 1024, .kv_cache_gb = 10000});
  ASSERT_FALSE(big.is_ok());
  EXPECT_TRUE(contains(big.message(), "not enough GPU memory for the KV cache and recurrent states"))
      << big.message();
  EXPECT_TRUE(contains(big.message(), "--kv-cache-gb")) << big.message();
  EXPECT_LE(before, free_bytes() + (64u << 20));
  // The same backend then takes a plan that fits and answers.
  auto s = engine::Scheduler::start(*stepper_, {.max_model_len = 1024, .kv_cache_gb = 0.01});
  ASSERT_TRUE(s.is_ok()) << s.message();
  engine::Job j;
  j.prompt = {1, 2, 3, 4, 5};
  j.max_tokens = 4;
  const auto out = engine::run_jobs(**s, {j});
  EXPECT_TRUE(out[0].error.empty()) << out[0].error;
  EXPECT_EQ(out[0].ids.size(), 4u);
}

TEST_F(CudaOutOfMemoryEngine, APromptLongerThanThePoolFailsAloneAndTheEngineGoesOn) {
  // 8 pages of 16 positions: 128 positions in all.
  const double gb = 8.0 * static_cast<double>(stepper_->page_bytes()) / (1ull << 30);
  auto s =
      engine::Scheduler::start(*stepper_, {.max_model_len = 1024, .kv_cache_gb = gb, .prefix_cache = false});
  ASSERT_TRUE(s.is_ok()) << s.message();
  engine::Job long_job, short_job;
  for (int i = 0; i < 300; ++i) long_job.prompt.push_back(1 + i % 50);
  long_job.max_tokens = 4;
  short_job.prompt = {7, 8, 9};
  short_job.max_tokens = 4;
  const auto out = engine::run_jobs(**s, {long_job, short_job});
  EXPECT_TRUE(contains(out[0].error, "KV pages")) << out[0].error;
  EXPECT_TRUE(contains(out[0].error, "--kv-cache-gb")) << out[0].error;
  EXPECT_TRUE(out[1].error.empty()) << out[1].error;
  EXPECT_EQ(out[1].ids.size(), 4u);
  engine::expect_idle(**s);
}

}  // namespace
}  // namespace deltaflow
