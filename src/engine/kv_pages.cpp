#include "engine/kv_pages.hpp"

#include <cstdlib>

namespace deltaflow::engine {

KvPages::KvPages(int64_t pages) : refs_(static_cast<size_t>(pages)), cache_refs_(static_cast<size_t>(pages)) {
  for (int64_t p = pages - 1; p >= 0; --p) free_.push_back(static_cast<int32_t>(p));
}

std::optional<int32_t> KvPages::take(bool by_cache) {
  if (free_.empty()) return std::nullopt;
  const int32_t p = free_.back();
  free_.pop_back();
  refs_[static_cast<size_t>(p)] = 0;
  cache_refs_[static_cast<size_t>(p)] = 0;
  ref(p, by_cache);
  return p;
}

void KvPages::ref(int32_t page, bool by_cache) {
  const size_t i = static_cast<size_t>(page);
  const bool was = refs_[i] > 0 && refs_[i] == cache_refs_[i];
  ++refs_[i];
  if (by_cache) ++cache_refs_[i];
  const bool is = refs_[i] == cache_refs_[i];
  cache_only_ += static_cast<int64_t>(is) - static_cast<int64_t>(was);
}

void KvPages::unref(int32_t page, bool by_cache) {
  const size_t i = static_cast<size_t>(page);
  if (refs_[i] <= 0 || (by_cache && cache_refs_[i] <= 0)) std::abort();  // a reference counted twice: a bug
  const bool was = refs_[i] == cache_refs_[i];
  --refs_[i];
  if (by_cache) --cache_refs_[i];
  const bool is = refs_[i] > 0 && refs_[i] == cache_refs_[i];
  cache_only_ += static_cast<int64_t>(is) - static_cast<int64_t>(was);
  if (refs_[i] == 0) free_.push_back(page);
}

StateSlots::StateSlots(int32_t slots) : total_(slots), in_use_(static_cast<size_t>(slots)) {
  for (int32_t s = slots - 1; s >= 0; --s) free_.push_back(s);
}

std::optional<int32_t> StateSlots::take() {
  if (free_.empty()) return std::nullopt;
  const int32_t s = free_.back();
  free_.pop_back();
  in_use_[static_cast<size_t>(s)] = true;
  return s;
}

void StateSlots::give_back(int32_t slot) {
  if (slot < 0 || slot >= total_ || !in_use_[static_cast<size_t>(slot)]) std::abort();  // freed twice: a bug
  in_use_[static_cast<size_t>(slot)] = false;
  free_.push_back(slot);
}

}  // namespace deltaflow::engine
