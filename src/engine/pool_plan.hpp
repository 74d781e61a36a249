// How the engine sizes the backend's pools from its flags (Scheduler::plan), apart from the scheduler so that
// `deltaflow inspect` prints the plan a server would make without loading a backend: KV pages for the running
// sequences (max_num_seqs sequences of max_model_len, or --kv-cache-gb), a state slot per running sequence
// (and per drafted token with speculative decoding), and the prefix cache's share of --prefix-cache-gb (half
// for checkpoint state slots, half for pages only the cache holds).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.hpp"

namespace deltaflow::engine {

struct SchedulerOptions;

// What the plan needs from the backend (or, in `inspect`, from the config).
struct PoolGeometry {
  int64_t model_len = 0;   // positions one sequence may reach (max_model_len, or the backend's default)
  int32_t page_size = 16;  // positions per KV page
  size_t page_bytes = 0;   // one KV page of every full-attention layer (and the MTP layer's, when drafting)
  size_t slot_bytes = 0;   // one state slot of every linear-attention layer
  bool paged = true;       // a backend without paged KV has no prefix cache
};

struct PoolPlan {
  int64_t running_pages = 0;  // for the running sequences
  int64_t cache_pages = 0;    // held only by the prefix cache
  int32_t running_slots = 0;  // one per running sequence, plus a verification slot per drafted token
  int32_t cache_slots = 0;    // prefix-cache checkpoints
  bool prefix_cache = false;  // the cache is on and has room for at least one checkpoint
  int64_t kv_pages() const { return running_pages + cache_pages; }
  int32_t state_slots() const { return running_slots + cache_slots; }
};

// The default KV budget when --kv-cache-gb is 0: max_num_seqs full-length sequences, capped at this many
// bytes (but never less than one full-length sequence). Fewer pages only mean earlier preemption.
inline constexpr size_t kDefaultKvCacheBytes = size_t{4} << 30;

core::Expected<PoolPlan> plan_pools(const SchedulerOptions& o, const PoolGeometry& g);

}  // namespace deltaflow::engine
