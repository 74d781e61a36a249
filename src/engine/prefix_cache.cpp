#include "engine/prefix_cache.hpp"

#include <algorithm>

namespace deltaflow::engine {

PrefixCache::PrefixCache(KvPages& pages, StateSlots& slots, const Budget& budget)
    : pages_(pages), slots_(slots), budget_(budget) {}

PrefixCache::~PrefixCache() {
  clear();
}

const Checkpoint* PrefixCache::lookup(std::span<const int32_t> tokens, int64_t max_depth) {
  const Node* n = &root_;
  Checkpoint* best = nullptr;
  size_t at = 0;
  while (at < tokens.size()) {
    auto it = n->children.find(tokens[at]);
    if (it == n->children.end()) break;
    const Node* c = it->second.get();
    if (at + c->edge.size() > tokens.size() ||
        !std::equal(c->edge.begin(), c->edge.end(), tokens.begin() + static_cast<std::ptrdiff_t>(at)))
      break;
    at += c->edge.size();
    if (c->depth > max_depth) break;
    if (c->checkpoint) best = c->checkpoint.get();
    n = c;
  }
  if (best) best->last_use = ++clock_;
  return best;
}

bool PrefixCache::insert(std::span<const int32_t> tokens, int32_t slot, std::span<const int32_t> pages) {
  if (tokens.empty()) return false;
  const size_t need_pages =
      (tokens.size() + static_cast<size_t>(budget_.page_size) - 1) / static_cast<size_t>(budget_.page_size);
  if (pages.size() < need_pages || budget_.slot_bytes > budget_.max_bytes) return false;
  Node* n = &root_;
  size_t at = 0;
  while (at < tokens.size()) {
    auto it = n->children.find(tokens[at]);
    if (it == n->children.end()) {
      auto leaf = std::make_unique<Node>();
      leaf->edge.assign(tokens.begin() + static_cast<std::ptrdiff_t>(at), tokens.end());
      leaf->parent = n;
      leaf->depth = static_cast<int64_t>(tokens.size());
      Node* raw = leaf.get();
      n->children[tokens[at]] = std::move(leaf);
      n = raw;
      at = tokens.size();
      break;
    }
    Node* c = it->second.get();
    // The common part of the edge and the rest of the tokens.
    size_t k = 0;
    while (k < c->edge.size() && at + k < tokens.size() && c->edge[k] == tokens[at + k]) ++k;
    if (k < c->edge.size()) {
      // Split c's edge at k: a middle node takes the first k tokens.
      auto mid = std::make_unique<Node>();
      mid->edge.assign(c->edge.begin(), c->edge.begin() + static_cast<std::ptrdiff_t>(k));
      mid->parent = n;
      mid->depth = c->depth - static_cast<int64_t>(c->edge.size() - k);
      std::unique_ptr<Node> old = std::move(it->second);
      old->edge.erase(old->edge.begin(), old->edge.begin() + static_cast<std::ptrdiff_t>(k));
      old->parent = mid.get();
      mid->children[old->edge[0]] = std::move(old);
      Node* raw = mid.get();
      it->second = std::move(mid);
      c = raw;
    }
    at += k;
    n = c;
  }
  if (n->checkpoint) return false;
  auto cp = std::make_unique<Checkpoint>();
  cp->depth = static_cast<int64_t>(tokens.size());
  cp->slot = slot;
  cp->pages.assign(pages.begin(), pages.begin() + static_cast<std::ptrdiff_t>(need_pages));
  for (int32_t p : cp->pages) pages_.ref(p, /*by_cache=*/true);
  cp->last_use = ++clock_;
  index_[cp.get()] = n;
  const Checkpoint* added = cp.get();
  n->checkpoint = std::move(cp);
  ++count_;
  fit_budget(added);
  return true;
}

size_t PrefixCache::bytes() const {
  return static_cast<size_t>(count_) * budget_.slot_bytes +
         static_cast<size_t>(pages_.cache_only()) * budget_.page_bytes;
}

void PrefixCache::fit_budget(const Checkpoint* keep) {
  while (bytes() > budget_.max_bytes && evict_one(keep)) {
  }
}

bool PrefixCache::evict_one(const Checkpoint* keep) {
  const Checkpoint* victim = nullptr;
  for (const auto& [cp, node] : index_)
    if (cp != keep && (!victim || cp->last_use < victim->last_use)) victim = cp;
  if (!victim) return false;
  drop(index_.at(victim));
  ++evictions_;
  return true;
}

void PrefixCache::drop(Node* n) {
  Checkpoint* cp = n->checkpoint.get();
  for (int32_t p : cp->pages) pages_.unref(p, /*by_cache=*/true);
  slots_.give_back(cp->slot);
  index_.erase(cp);
  n->checkpoint.reset();
  --count_;
  prune(n);
}

// Removes n and its empty ancestors when they hold no checkpoint and no children; merges a lone child into a
// node without a checkpoint, so the tree stays compact.
void PrefixCache::prune(Node* n) {
  while (n != &root_ && !n->checkpoint && n->children.empty()) {
    Node* parent = n->parent;
    parent->children.erase(n->edge[0]);
    n = parent;
  }
  if (n != &root_ && !n->checkpoint && n->children.size() == 1) {
    std::unique_ptr<Node> child = std::move(n->children.begin()->second);
    n->children.clear();
    n->edge.insert(n->edge.end(), child->edge.begin(), child->edge.end());
    n->depth = child->depth;
    n->checkpoint = std::move(child->checkpoint);
    if (n->checkpoint) index_[n->checkpoint.get()] = n;
    n->children = std::move(child->children);
    for (auto& [tok, c] : n->children) c->parent = n;
  }
}

void PrefixCache::clear() {
  while (evict_one()) {
  }
}

}  // namespace deltaflow::engine
