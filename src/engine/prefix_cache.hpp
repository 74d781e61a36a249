// The hybrid prefix cache (docs/architecture.md §5). A radix tree over token ids whose nodes may hold a
// checkpoint: the recurrent state after the node's tokens (a state slot of its own) and references to the KV
// pages that cover them. A hybrid model can resume only where its recurrent state was saved, so a new prompt
// reuses the deepest checkpoint that is a prefix of it; the engine takes checkpoints at the end of each
// prompt, at each rendered message's end, at prefill chunk boundaries and where a sequence finishes. Full
// pages are shared by reference; the page a checkpoint ends inside is copied by whoever resumes from it
// (they will write past the checkpoint into it). Least recently used checkpoints go first: when the memory
// budget is exceeded, and when the running sequences need pages or slots.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "engine/kv_pages.hpp"

namespace deltaflow::engine {

struct Checkpoint {
  int64_t depth = 0;           // tokens it covers
  int32_t slot = -1;           // the recurrent state after them
  std::vector<int32_t> pages;  // KV pages covering positions [0, depth)
  uint64_t last_use = 0;
};

class PrefixCache {
 public:
  struct Budget {
    size_t max_bytes = 0;  // state slots of checkpoints + pages only the cache holds
    size_t page_bytes = 0, slot_bytes = 0;
    int32_t page_size = 16;
  };
  PrefixCache(KvPages& pages, StateSlots& slots, const Budget& budget);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The deepest checkpoint whose tokens are a prefix of `tokens`, at most max_depth deep (null: none). It is
  // marked used, and stays valid until the next insert or eviction.
  const Checkpoint* lookup(std::span<const int32_t> tokens, int64_t max_depth);

  // Keeps the state in `slot` (which the cache now owns) as the checkpoint after `tokens`, referencing the
  // pages that cover them. False when that checkpoint exists already or the budget cannot hold it: the slot
  // stays the caller's.
  bool insert(std::span<const int32_t> tokens, int32_t slot, std::span<const int32_t> pages);

  // Drops the least recently used checkpoint other than `keep`; false when there is none.
  bool evict_one(const Checkpoint* keep = nullptr);
  void clear();

  size_t bytes() const;
  int64_t checkpoints() const { return count_; }
  int64_t evictions() const { return evictions_; }

 private:
  struct Node {
    std::vector<int32_t> edge;  // tokens from the parent to this node
    Node* parent = nullptr;
    std::map<int32_t, std::unique_ptr<Node>> children;  // by the first token of their edge
    std::unique_ptr<Checkpoint> checkpoint;
    int64_t depth = 0;
  };
  void drop(Node* n);
  void prune(Node* n);
  void fit_budget(const Checkpoint* keep);

  KvPages& pages_;
  StateSlots& slots_;
  Budget budget_;
  Node root_;
  uint64_t clock_ = 0;
  int64_t count_ = 0, evictions_ = 0;
  std::map<const Checkpoint*, Node*> index_;  // every checkpoint's node
};

}  // namespace deltaflow::engine
