#include "text/bpe.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "text/byte_level.hpp"
#include "text/tokenizer_unicode.hpp"

namespace deltaflow::text::tokenizer_impl {

uint64_t hash_bytes(std::string_view s) noexcept {
  // A small multiply-xorshift hash over 8-byte words: words are short, so this beats byte-at-a-time hashes.
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ (s.size() * 0xFF51AFD7ED558CCDULL);
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 29;
  }
  h *= 0x94D049BB133111EBULL;
  h ^= h >> 32;
  return h;
}

size_t StringHash::operator()(std::string_view s) const noexcept {
  return static_cast<size_t>(hash_bytes(s));
}

// ---- WordCache ----

WordCache::WordCache(size_t max_entries) : max_entries_(max_entries) {
  size_t cap = 16;
  while (cap < max_entries * 2) cap <<= 1;
  slots_.resize(cap);
}

void WordCache::clear() {
  std::fill(slots_.begin(), slots_.end(), Slot{});
  keys_.clear();
  ids_.clear();
  count_ = 0;
}

const int32_t* WordCache::find(std::string_view key, uint64_t hash, size_t& n) const {
  hash |= 1;
  const size_t mask = slots_.size() - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.hash == 0) return nullptr;
    if (s.hash == hash && s.key_len == key.size() &&
        std::memcmp(keys_.data() + s.key_off, key.data(), key.size()) == 0) {
      n = s.n_ids;
      return ids_.data() + s.ids_off;
    }
  }
}

void WordCache::insert(std::string_view key, uint64_t hash, const int32_t* ids, size_t n) {
  // Bound the arenas too, so a stream of long words cannot grow them without limit.
  if (count_ >= max_entries_ || keys_.size() + key.size() > (max_entries_ << 5) ||
      ids_.size() + n > (max_entries_ << 3))
    clear();
  hash |= 1;
  const size_t mask = slots_.size() - 1;
  size_t i = hash & mask;
  while (slots_[i].hash != 0) i = (i + 1) & mask;
  Slot& s = slots_[i];
  s.hash = hash;
  s.key_off = static_cast<uint32_t>(keys_.size());
  s.key_len = static_cast<uint32_t>(key.size());
  s.ids_off = static_cast<uint32_t>(ids_.size());
  s.n_ids = static_cast<uint32_t>(n);
  keys_.append(key);
  ids_.insert(ids_.end(), ids, ids + n);
  ++count_;
}

// ---- BpeModel ----

void BpeModel::insert_merge(int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
  const uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  size_t i = (key * 0x9E3779B97F4A7C15ULL) >> merge_shift_;
  for (;;) {
    MergeEntry& e = merges_[i];
    if (e.key == kEmptyKey || e.key == key) {
      // A repeated pair keeps the later rank, like collecting the merges into a HashMap.
      e = {key, rank, new_id};
      return;
    }
    i = (i + 1) & merge_mask_;
  }
}

core::Expected<BpeModel> BpeModel::build(StringIdMap vocab,
                                         const std::vector<std::pair<std::string, std::string>>& merges,
                                         BpeOptions options, bool byte_level) {
  BpeModel m;
  m.vocab_ = std::move(vocab);
  m.options_ = std::move(options);
  m.byte_level_ = byte_level;

  int32_t max_id = -1;
  for (const auto& [tok, id] : m.vocab_) max_id = std::max(max_id, id);
  m.id_to_token_.assign(static_cast<size_t>(max_id + 1), nullptr);
  for (const auto& kv : m.vocab_) {
    auto& slot = m.id_to_token_[static_cast<size_t>(kv.second)];
    if (slot == nullptr) slot = &kv.first;
  }

  // Merge table at load factor <= 1/2.
  size_t cap = 16;
  int bits = 4;
  while (cap < merges.size() * 2) {
    cap <<= 1;
    ++bits;
  }
  m.merges_.assign(cap, MergeEntry{kEmptyKey, 0, 0});
  m.merge_mask_ = cap - 1;
  m.merge_shift_ = 64 - bits;
  const size_t prefix_len = m.options_.continuing_subword_prefix.size();
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = m.vocab_.find(a);
    if (ia == m.vocab_.end())
      return core::Error{"BPE merge " + std::to_string(rank) + ": token '" + a +
                         "' is not in the vocabulary"};
    auto ib = m.vocab_.find(b);
    if (ib == m.vocab_.end())
      return core::Error{"BPE merge " + std::to_string(rank) + ": token '" + b +
                         "' is not in the vocabulary"};
    if (b.size() < prefix_len)
      return core::Error{"BPE merge " + std::to_string(rank) + ": '" + b +
                         "' is shorter than the continuing_subword_prefix"};
    joined.assign(a);
    joined.append(b, prefix_len, std::string::npos);
    auto in = m.vocab_.find(joined);
    if (in == m.vocab_.end())
      return core::Error{"BPE merge " + std::to_string(rank) + ": merged token '" + joined +
                         "' is not in the vocabulary"};
    m.insert_merge(ia->second, ib->second, static_cast<uint32_t>(rank), in->second);
  }

  if (m.options_.unk_token) {
    auto it = m.vocab_.find(*m.options_.unk_token);
    if (it != m.vocab_.end()) m.unk_id_ = it->second;
  }

  if (byte_level) {
    const auto& alpha = ByteLevelAlphabet::get();
    std::string s;
    for (int first = 0; first < 2; ++first)
      for (int last = 0; last < 2; ++last)
        for (int b = 0; b < 256; ++b) {
          s.clear();
          if (!first) s += m.options_.continuing_subword_prefix;
          s += alpha.utf8_of(static_cast<unsigned char>(b));
          if (last) s += m.options_.end_of_word_suffix;
          auto it = m.vocab_.find(s);
          m.byte_ids_[first][last][b] = it == m.vocab_.end() ? -1 : it->second;
        }
    if (m.options_.ignore_merges) {
      std::string raw;
      for (const auto& [tok, id] : m.vocab_) {
        raw.clear();
        if (alpha.decode(tok, raw)) m.raw_vocab_.emplace(raw, id);
      }
    }
  }
  return m;
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return nullptr;
  return id_to_token_[static_cast<size_t>(id)];
}

std::optional<int32_t> BpeModel::whole_word_id(std::string_view word) const {
  const StringIdMap& map = byte_level_ ? raw_vocab_ : vocab_;
  auto it = map.find(word);
  if (it == map.end()) return std::nullopt;
  return it->second;
}

void BpeModel::tokenize(std::string_view word, BpeScratch& scratch, WordCache* cache,
                        std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (auto id = whole_word_id(word)) {
      out.push_back(*id);
      return;
    }
  }
  // Very long words are rare and would crowd the cache; tokenizers does not cache them either.
  constexpr size_t kMaxCachedBytes = 256;
  uint64_t h = 0;
  if (cache != nullptr && word.size() <= kMaxCachedBytes) {
    h = hash_bytes(word);
    size_t n = 0;
    if (const int32_t* ids = cache->find(word, h, n)) {
      out.insert(out.end(), ids, ids + n);
      return;
    }
  }
  const size_t start = out.size();
  merge_word(word, scratch, out);
  if (cache != nullptr && word.size() <= kMaxCachedBytes)
    cache->insert(word, h, out.data() + start, out.size() - start);
}

namespace {

inline void add_symbol(BpeScratch& s, int32_t id, uint32_t len) {
  const auto n = static_cast<int32_t>(s.symbols.size());
  if (n > 0) s.symbols.back().next = n;
  s.symbols.push_back({id, n - 1, -1, len});
}

// Min-heap on (rank, pos): tokenizers' Merge ordering.
inline bool heap_after(const BpeScratch::Merge& a, const BpeScratch::Merge& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
}

}  // namespace

void BpeModel::add_missing_symbol(std::string_view spelled, size_t byte_len, BpeScratch& s,
                                  std::optional<std::pair<int32_t, uint32_t>>& unk) const {
  if (options_.byte_fallback) {
    // "<0xAB>" tokens for every byte of the spelling; only if all exist. Like tokenizers, a pending unknown
    // is not flushed first.
    int32_t ids[16];
    size_t k = 0;
    bool ok = spelled.size() <= 16;
    char name[8];
    for (size_t i = 0; ok && i < spelled.size(); ++i) {
      std::snprintf(name, sizeof(name), "<0x%02X>", static_cast<unsigned char>(spelled[i]));
      auto it = vocab_.find(std::string_view(name));
      if (it == vocab_.end())
        ok = false;
      else
        ids[k++] = it->second;
    }
    if (ok) {
      for (size_t i = 0; i < k; ++i) add_symbol(s, ids[i], 1);
      return;
    }
  }
  if (options_.unk_token && unk_id_) {
    if (unk && options_.fuse_unk) {
      unk->second += static_cast<uint32_t>(byte_len);
    } else {
      if (unk) add_symbol(s, unk->first, unk->second);
      unk = std::make_pair(*unk_id_, static_cast<uint32_t>(byte_len));
    }
  }
  // Otherwise the character is dropped, as tokenizers does without an unk token. (With an unk token that is
  // not in the vocabulary tokenizers fails the whole encode; we drop the character instead.)
}

void BpeModel::merge_word(std::string_view word, BpeScratch& s, std::vector<int32_t>& out) const {
  s.symbols.clear();
  std::optional<std::pair<int32_t, uint32_t>> unk;
  auto add_known = [&](int32_t id, uint32_t len) {
    if (unk) {
      add_symbol(s, unk->first, unk->second);
      unk.reset();
    }
    add_symbol(s, id, len);
  };
  if (byte_level_) {
    const auto& alpha = ByteLevelAlphabet::get();
    const size_t n = word.size();
    for (size_t i = 0; i < n; ++i) {
      const auto b = static_cast<unsigned char>(word[i]);
      const int first = i == 0, last = i + 1 == n;
      const int32_t id = byte_ids_[first][last][b];
      if (id >= 0) {
        add_known(id, 1);
      } else {
        s.piece.clear();
        if (!first) s.piece += options_.continuing_subword_prefix;
        s.piece += alpha.utf8_of(b);
        if (last) s.piece += options_.end_of_word_suffix;
        add_missing_symbol(s.piece, 1, s, unk);
      }
    }
  } else {
    size_t i = 0;
    while (i < word.size()) {
      size_t len = utf8_seq_len(static_cast<unsigned char>(word[i]));
      if (i + len > word.size()) len = word.size() - i;
      const bool first = i == 0, last = i + len >= word.size();
      s.piece.clear();
      if (!first) s.piece += options_.continuing_subword_prefix;
      s.piece.append(word.data() + i, len);
      if (last) s.piece += options_.end_of_word_suffix;
      auto it = vocab_.find(std::string_view(s.piece));
      if (it != vocab_.end())
        add_known(it->second, static_cast<uint32_t>(len));
      else
        add_missing_symbol(s.piece, len, s, unk);
      i += len;
    }
  }
  if (unk) add_symbol(s, unk->first, unk->second);

  auto& sym = s.symbols;
  const size_t n = sym.size();
  if (n >= 2) {
    auto& heap = s.heap;
    heap.clear();
    for (size_t i = 0; i + 1 < n; ++i)
      if (const MergeEntry* m = find_merge(sym[i].id, sym[i + 1].id))
        heap.push_back({m->rank, static_cast<uint32_t>(i), m->new_id});
    std::make_heap(heap.begin(), heap.end(), heap_after);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), heap_after);
      const BpeScratch::Merge top = heap.back();
      heap.pop_back();
      BpeScratch::Symbol& cur = sym[top.pos];
      if (cur.len == 0 || cur.next == -1) continue;
      const size_t next_pos = static_cast<size_t>(cur.next);
      const BpeScratch::Symbol right = sym[next_pos];
      // Skip stale entries: the pair at this position changed since the entry was queued.
      const MergeEntry* now = find_merge(cur.id, right.id);
      if (now == nullptr || now->new_id != top.new_id) continue;
      cur.id = top.new_id;
      cur.len += right.len;
      cur.next = right.next;
      sym[next_pos].len = 0;
      if (right.next > -1 && static_cast<size_t>(right.next) < n)
        sym[static_cast<size_t>(right.next)].prev = static_cast<int32_t>(top.pos);
      if (cur.prev >= 0) {
        if (const MergeEntry* m = find_merge(sym[static_cast<size_t>(cur.prev)].id, cur.id)) {
          heap.push_back({m->rank, static_cast<uint32_t>(cur.prev), m->new_id});
          std::push_heap(heap.begin(), heap.end(), heap_after);
        }
      }
      if (cur.next >= 0 && static_cast<size_t>(cur.next) < n) {
        if (const MergeEntry* m = find_merge(cur.id, sym[static_cast<size_t>(cur.next)].id)) {
          heap.push_back({m->rank, top.pos, m->new_id});
          std::push_heap(heap.begin(), heap.end(), heap_after);
        }
      }
    }
  }
  for (const auto& x : sym)
    if (x.len != 0) out.push_back(x.id);
}

}  // namespace deltaflow::text::tokenizer_impl
