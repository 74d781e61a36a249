// The page and slot pools and the radix tree of checkpoints: deepest-prefix lookup across split edges, the
// depth limit, reference counts of shared pages, LRU eviction under the memory budget, and a tree that
// stays consistent through inserts and evictions in any order.
#include <gtest/gtest.h>

#include <random>

#include "engine/kv_pages.hpp"
#include "engine/prefix_cache.hpp"

namespace deltaflow::engine {
namespace {

std::vector<int32_t> toks(std::initializer_list<int32_t> l) {
  return std::vector<int32_t>(l);
}

TEST(EngineKvPages, ReferencesAndCacheOnlyCount) {
  KvPages p(3);
  auto a = p.take(), b = p.take(/*by_cache=*/true);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(p.used(), 2);
  EXPECT_EQ(p.cache_only(), 1);
  p.ref(*a, /*by_cache=*/true);  // a sequence's page the cache now shares
  EXPECT_EQ(p.cache_only(), 1);
  p.unref(*a);  // the sequence lets go: only the cache holds it
  EXPECT_EQ(p.cache_only(), 2);
  p.unref(*a, true);
  p.unref(*b, true);
  EXPECT_EQ(p.used(), 0);
  EXPECT_EQ(p.cache_only(), 0);
  auto c = p.take(), d = p.take(), e = p.take();
  EXPECT_TRUE(c && d && e);
  EXPECT_FALSE(p.take());
}

TEST(EnginePrefixCache, DeepestCheckpointAcrossSplitEdges) {
  KvPages pages(64);
  StateSlots slots(8);
  PrefixCache cache(pages, slots, {.max_bytes = 1 << 20, .page_bytes = 1, .slot_bytes = 1, .page_size = 4});
  auto own_pages = [&](int n) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; ++i) v.push_back(*pages.take());
    return v;
  };
  const auto long_seq = toks({1, 2, 3, 4, 5, 6, 7, 8, 9});
  auto p9 = own_pages(3);
  ASSERT_TRUE(cache.insert(long_seq, *slots.take(), p9));
  // A shorter checkpoint on the same path splits the edge.
  ASSERT_TRUE(cache.insert(std::span(long_seq).first(5), *slots.take(), p9));
  // A branch off the middle.
  const auto branch = toks({1, 2, 3, 7, 7});
  auto pb = own_pages(2);
  ASSERT_TRUE(cache.insert(branch, *slots.take(), pb));
  EXPECT_FALSE(cache.insert(branch, 7, pb));  // exists already: the slot stays the caller's
  EXPECT_EQ(cache.checkpoints(), 3);

  auto q = toks({1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  EXPECT_EQ(cache.lookup(q, 100)->depth, 9);
  EXPECT_EQ(cache.lookup(q, 8)->depth, 5);  // the depth limit
  EXPECT_EQ(cache.lookup(toks({1, 2, 3, 4, 5, 0}), 100)->depth, 5);
  EXPECT_EQ(cache.lookup(toks({1, 2, 3, 7, 7, 7}), 100)->depth, 5);
  EXPECT_EQ(cache.lookup(toks({1, 2, 3, 7}), 100), nullptr);
  EXPECT_EQ(cache.lookup(toks({2, 2}), 100), nullptr);
  // The cache holds a reference on each page it covers.
  EXPECT_EQ(pages.refs(p9[0]), 3);  // the caller, and the two checkpoints on that path
  EXPECT_EQ(pages.refs(p9[2]), 2);
  cache.clear();
  EXPECT_EQ(pages.refs(p9[0]), 1);
  EXPECT_EQ(slots.used(), 0);
  EXPECT_EQ(cache.checkpoints(), 0);
}

TEST(EnginePrefixCache, LeastRecentlyUsedGoesFirstUnderTheBudget) {
  KvPages pages(64);
  StateSlots slots(8);
  // Room for two checkpoints' slots (pages only the cache holds count too: none here, the caller keeps refs).
  PrefixCache cache(pages, slots, {.max_bytes = 200, .page_bytes = 1, .slot_bytes = 100, .page_size = 4});
  std::vector<int32_t> pg = {*pages.take(), *pages.take()};
  ASSERT_TRUE(cache.insert(toks({1, 1}), *slots.take(), pg));
  ASSERT_TRUE(cache.insert(toks({2, 2}), *slots.take(), pg));
  EXPECT_NE(cache.lookup(toks({1, 1, 5}), 9), nullptr);  // {1,1} is now the most recent
  ASSERT_TRUE(cache.insert(toks({3, 3}), *slots.take(), pg));
  EXPECT_EQ(cache.checkpoints(), 2);
  EXPECT_EQ(cache.evictions(), 1);
  EXPECT_EQ(cache.lookup(toks({2, 2, 5}), 9), nullptr);  // the least recently used went
  EXPECT_NE(cache.lookup(toks({1, 1, 5}), 9), nullptr);
  EXPECT_NE(cache.lookup(toks({3, 3, 5}), 9), nullptr);
  EXPECT_EQ(slots.used(), 2);
}

TEST(EnginePrefixCache, RandomInsertsAndEvictionsStayConsistent) {
  KvPages pages(4096);
  StateSlots slots(64);
  PrefixCache cache(pages, slots, {.max_bytes = 40 * 10, .page_bytes = 1, .slot_bytes = 10, .page_size = 2});
  std::mt19937 rng(3);
  std::vector<std::vector<int32_t>> inserted;
  for (int i = 0; i < 2000; ++i) {
    std::vector<int32_t> t(1 + rng() % 12);
    for (auto& x : t) x = static_cast<int32_t>(rng() % 3);
    std::vector<int32_t> pg;
    for (size_t k = 0; k < (t.size() + 1) / 2; ++k) pg.push_back(*pages.take());
    auto slot = slots.take();
    if (!slot) {
      ASSERT_TRUE(cache.evict_one());
      slot = slots.take();
    }
    if (!cache.insert(t, *slot, pg)) slots.give_back(*slot);
    for (int32_t p : pg) pages.unref(p);
    // Whatever lookup finds is a prefix of the query with the right depth.
    const Checkpoint* c = cache.lookup(t, 100);
    if (c) {
      EXPECT_LE(c->depth, static_cast<int64_t>(t.size()));
      EXPECT_EQ(c->pages.size(), static_cast<size_t>((c->depth + 1) / 2));
    }
    EXPECT_LE(cache.checkpoints(), 40);
    EXPECT_EQ(slots.used(), cache.checkpoints());
  }
  cache.clear();
  EXPECT_EQ(pages.used(), 0);
  EXPECT_EQ(slots.used(), 0);
}

}  // namespace
}  // namespace deltaflow::engine
