#include "engine/pool_plan.hpp"

#include <algorithm>
#include <string>

#include "engine/scheduler.hpp"

namespace deltaflow::engine {

core::Expected<PoolPlan> plan_pools(const SchedulerOptions& o, const PoolGeometry& g) {
  if (o.max_num_seqs < 1) return core::Error{"--max-num-seqs must be at least 1"};
  if (o.max_num_batched_tokens < 1) return core::Error{"--max-num-batched-tokens must be at least 1"};
  if (o.speculative_tokens < 0 || o.speculative_tokens > kMaxSpeculativeTokens)
    return core::Error{"--speculative-tokens must be in [0, " + std::to_string(kMaxSpeculativeTokens) +
                       "], not " + std::to_string(o.speculative_tokens)};
  const size_t page_bytes = std::max<size_t>(g.page_bytes, 1);
  const size_t slot_bytes = std::max<size_t>(g.slot_bytes, 1);
  const int64_t page_size = std::max<int32_t>(g.page_size, 1);
  const int64_t one_seq = (g.model_len + page_size - 1) / page_size;
  PoolPlan p;
  if (o.kv_cache_gb > 0) {
    p.running_pages = static_cast<int64_t>(o.kv_cache_gb * (1ull << 30) / static_cast<double>(page_bytes));
  } else {
    p.running_pages = std::min<int64_t>(
        o.max_num_seqs * one_seq,
        std::max<int64_t>(one_seq, static_cast<int64_t>(kDefaultKvCacheBytes / page_bytes)));
  }
  if (p.running_pages < 1)
    return core::Error{"--kv-cache-gb " + std::to_string(o.kv_cache_gb) + " holds no KV page"};
  // Verification snapshots: a state slot per drafted token of every running sequence.
  p.running_slots = o.max_num_seqs + o.max_num_seqs * o.speculative_tokens;
  const double cache_bytes = o.prefix_cache ? o.prefix_cache_gb * (1ull << 30) : 0.0;
  if (o.prefix_cache && g.paged && cache_bytes >= static_cast<double>(slot_bytes)) {
    p.cache_slots = static_cast<int32_t>(
        std::min<double>(cache_bytes / 2 / static_cast<double>(slot_bytes), 16.0 * o.max_num_seqs));
    p.cache_slots = std::max(p.cache_slots, 1);
    p.cache_pages = static_cast<int64_t>(cache_bytes / 2 / static_cast<double>(page_bytes));
    p.prefix_cache = true;
  }
  return p;
}

}  // namespace deltaflow::engine
