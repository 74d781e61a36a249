// engine::load_limits: what the engine's options ask of the backend that serve and the CLI open.
#include <gtest/gtest.h>

#include "engine/generate.hpp"

namespace deltaflow {
namespace {

TEST(EngineLoadLimits, CarryTheEngineOptions) {
  engine::SchedulerOptions o;
  o.max_num_seqs = 12;
  o.max_model_len = 4096;
  o.max_num_batched_tokens = 8192;
  o.kv_cache_dtype = backend::KvCacheDtype::kFp8;
  o.speculative_tokens = 3;
  const engine::LoadLimits l = engine::load_limits(o);
  EXPECT_EQ(l.max_sequences, 12);
  EXPECT_EQ(l.max_context, 4096);
  EXPECT_EQ(l.max_step_tokens, 8192);  // a CUDA pass holds a whole step's rows
  EXPECT_EQ(l.kv_cache_dtype, backend::KvCacheDtype::kFp8);
  EXPECT_TRUE(l.mtp);
  EXPECT_FALSE(l.emulate_activation_quant);
  o.speculative_tokens = 0;
  EXPECT_FALSE(engine::load_limits(o).mtp);
}

}  // namespace
}  // namespace deltaflow
