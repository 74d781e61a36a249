// The KV pages of the backend's pool, handed out by the engine (docs/architecture.md §4). A page is shared by
// reference: every sequence and prefix-cache entry that covers it holds one reference, and it returns to the
// free list when the last one lets go. Pages the prefix cache alone holds are counted, for its memory budget.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace deltaflow::engine {

class KvPages {
 public:
  explicit KvPages(int64_t pages = 0);

  int64_t total() const { return static_cast<int64_t>(refs_.size()); }
  int64_t free_count() const { return static_cast<int64_t>(free_.size()); }
  int64_t used() const { return total() - free_count(); }
  // Pages whose every reference is the prefix cache's.
  int64_t cache_only() const { return cache_only_; }

  // A free page with one reference (by a sequence, or by the cache), or none.
  std::optional<int32_t> take(bool by_cache = false);
  void ref(int32_t page, bool by_cache = false);
  void unref(int32_t page, bool by_cache = false);
  int32_t refs(int32_t page) const { return refs_[static_cast<size_t>(page)]; }

 private:
  std::vector<int32_t> refs_, cache_refs_;
  std::vector<int32_t> free_;  // a stack: the most recently freed page is taken first
  int64_t cache_only_ = 0;
};

// The recurrent-state slots: running sequences and prefix-cache checkpoints.
class StateSlots {
 public:
  explicit StateSlots(int32_t slots = 0);
  int32_t total() const { return total_; }
  int32_t free_count() const { return static_cast<int32_t>(free_.size()); }
  int32_t used() const { return total_ - free_count(); }
  std::optional<int32_t> take();
  void give_back(int32_t slot);

 private:
  int32_t total_ = 0;
  std::vector<int32_t> free_;
  std::vector<bool> in_use_;
};

}  // namespace deltaflow::engine
