// engine::plan_pools: how the engine sizes its KV pages and state slots from its flags (what Scheduler::plan
// allocates and `inspect` prints). Figures worked out by hand.
#include <gtest/gtest.h>

#include "engine/pool_plan.hpp"
#include "engine/scheduler.hpp"

namespace deltaflow::engine {
namespace {

// Qwen3.6-27B on CUDA: 1 MiB KV pages of 16 positions, 156,893,184-byte state slots.
PoolGeometry qwen36_27b(int64_t model_len) {
  PoolGeometry g;
  g.model_len = model_len;
  g.page_size = 16;
  g.page_bytes = size_t{1} << 20;
  g.slot_bytes = 156893184;
  return g;
}

TEST(EnginePoolPlan, DefaultBudgetIsFourGiBOrOneSequence) {
  SchedulerOptions o;  // 16 sequences, 1 GiB prefix cache
  auto p = plan_pools(o, qwen36_27b(32768));
  ASSERT_TRUE(p.is_ok()) << p.message();
  // 16 x 2048 pages wanted, capped at 4 GiB of 1 MiB pages.
  EXPECT_EQ(p->running_pages, 4096);
  EXPECT_EQ(p->running_slots, 16);
  // The cache: half of 1 GiB in slots (3 of 150 MB), half in pages (512 of 1 MiB).
  EXPECT_EQ(p->cache_slots, 3);
  EXPECT_EQ(p->cache_pages, 512);
  EXPECT_TRUE(p->prefix_cache);
  EXPECT_EQ(p->kv_pages(), 4608);
  EXPECT_EQ(p->state_slots(), 19);
  // A context longer than the cap still gets one whole sequence.
  auto longer = plan_pools(o, qwen36_27b(262144));
  ASSERT_TRUE(longer.is_ok());
  EXPECT_EQ(longer->running_pages, 16384);
  // Few short sequences take only what they need.
  o.max_num_seqs = 2;
  auto few = plan_pools(o, qwen36_27b(1000));
  ASSERT_TRUE(few.is_ok());
  EXPECT_EQ(few->running_pages, 2 * 63);
}

TEST(EnginePoolPlan, FlagsSizeThePools) {
  SchedulerOptions o;
  o.max_num_seqs = 64;
  o.kv_cache_gb = 40;
  o.prefix_cache_gb = 16;
  auto p = plan_pools(o, qwen36_27b(9300));
  ASSERT_TRUE(p.is_ok()) << p.message();
  EXPECT_EQ(p->running_pages, 40 * 1024);
  EXPECT_EQ(p->cache_pages, 8 * 1024);
  EXPECT_EQ(p->cache_slots, 54);  // 8 GiB / 156,893,184 bytes
  // The cache's slots are capped at 16 per running sequence.
  o.max_num_seqs = 2;
  EXPECT_EQ(plan_pools(o, qwen36_27b(9300))->cache_slots, 32);
  // Speculative decoding: a verification slot per drafted token of every running sequence.
  o.speculative_tokens = 3;
  EXPECT_EQ(plan_pools(o, qwen36_27b(9300))->running_slots, 2 + 2 * 3);
  // No prefix cache: no cache pages or slots; nor on a backend without paged KV.
  o.prefix_cache = false;
  auto off = plan_pools(o, qwen36_27b(9300));
  EXPECT_EQ(off->cache_pages, 0);
  EXPECT_EQ(off->cache_slots, 0);
  EXPECT_FALSE(off->prefix_cache);
  o.prefix_cache = true;
  auto g = qwen36_27b(9300);
  g.paged = false;
  EXPECT_FALSE(plan_pools(o, g)->prefix_cache);
  // A budget smaller than one slot has no cache.
  o.prefix_cache_gb = 0.1;
  EXPECT_FALSE(plan_pools(o, qwen36_27b(9300))->prefix_cache);
}

TEST(EnginePoolPlan, BadFlagsAreErrors) {
  SchedulerOptions o;
  o.max_num_seqs = 0;
  EXPECT_NE(plan_pools(o, qwen36_27b(4096)).message().find("--max-num-seqs"), std::string::npos);
  o = {};
  o.max_num_batched_tokens = 0;
  EXPECT_NE(plan_pools(o, qwen36_27b(4096)).message().find("--max-num-batched-tokens"), std::string::npos);
  o = {};
  o.speculative_tokens = kMaxSpeculativeTokens + 1;
  EXPECT_NE(plan_pools(o, qwen36_27b(4096)).message().find("--speculative-tokens"), std::string::npos);
  o = {};
  o.kv_cache_gb = 1e-9;  // less than one page
  EXPECT_NE(plan_pools(o, qwen36_27b(4096)).message().find("holds no KV page"), std::string::npos);
}

}  // namespace
}  // namespace deltaflow::engine
