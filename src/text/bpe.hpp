// The BPE model of a Hugging Face tokenizer.json ("model": {"type": "BPE", ...}), encoding one pre-token at a
// time exactly as `tokenizers` does (models/bpe/model.rs merge_word + word.rs merge_all): split the word into
// symbols, then repeatedly apply the lowest-ranked merge, leftmost first.
//
// In byte-level mode a word is given as raw bytes; symbol i is the vocabulary entry spelling byte i in the
// GPT-2 alphabet, so the hot loop never builds the alphabet spelling. Otherwise a word is UTF-8 text and
// symbols are its characters.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.hpp"

namespace deltaflow::text::tokenizer_impl {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept;
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

uint64_t hash_bytes(std::string_view s) noexcept;

// A bounded cache of merged words: open addressing over two arenas, no allocation on a hit. When it is full
// it starts again empty, which bounds memory and keeps recent words.
class WordCache {
 public:
  explicit WordCache(size_t max_entries = size_t{1} << 15);
  // Returns the cached ids (and their count in n), or nullptr.
  const int32_t* find(std::string_view key, uint64_t hash, size_t& n) const;
  void insert(std::string_view key, uint64_t hash, const int32_t* ids, size_t n);
  void clear();

 private:
  struct Slot {
    uint64_t hash = 0;  // 0 = empty (stored hashes have the low bit forced on)
    uint32_t key_off = 0;
    uint32_t ids_off = 0;
    uint32_t key_len = 0;
    uint32_t n_ids = 0;
  };
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t count_ = 0;
  size_t max_entries_;
};

// Working memory for merging one word, reused across words.
struct BpeScratch {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    uint32_t len;  // bytes covered; 0 once merged into its left neighbour
  };
  struct Merge {
    uint32_t rank;
    uint32_t pos;
    int32_t new_id;
  };
  std::vector<Symbol> symbols;
  std::vector<Merge> heap;
  std::string piece;  // spelling of one symbol on the slow path (prefix/suffix, unknown characters)
};

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

class BpeModel {
 public:
  // vocab: token string -> id; merges in rank order. Errors name the merge that refers to a missing token.
  static core::Expected<BpeModel> build(StringIdMap vocab,
                                        const std::vector<std::pair<std::string, std::string>>& merges,
                                        BpeOptions options, bool byte_level);

  // Appends the ids of one pre-token. `cache` may be null.
  void tokenize(std::string_view word, BpeScratch& scratch, WordCache* cache,
                std::vector<int32_t>& out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // Vocabulary string of an id, or nullptr.
  const std::string* id_to_token(int32_t id) const;
  // Number of entries (HF BPE::get_vocab_size), and one past the largest id.
  size_t size() const { return vocab_.size(); }
  size_t id_limit() const { return id_to_token_.size(); }
  bool byte_level() const { return byte_level_; }

 private:
  struct MergeEntry {
    uint64_t key;
    uint32_t rank;
    int32_t new_id;
  };
  static constexpr uint64_t kEmptyKey = ~uint64_t{0};

  const MergeEntry* find_merge(int32_t a, int32_t b) const {
    const uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
    size_t i = (key * 0x9E3779B97F4A7C15ULL) >> merge_shift_;
    for (;;) {
      const MergeEntry& e = merges_[i];
      if (e.key == key) return &e;
      if (e.key == kEmptyKey) return nullptr;
      i = (i + 1) & merge_mask_;
    }
  }
  void insert_merge(int32_t a, int32_t b, uint32_t rank, int32_t new_id);
  void merge_word(std::string_view word, BpeScratch& s, std::vector<int32_t>& out) const;
  void add_missing_symbol(std::string_view spelled, size_t byte_len, BpeScratch& s,
                          std::optional<std::pair<int32_t, uint32_t>>& unk) const;
  std::optional<int32_t> whole_word_id(std::string_view word) const;

  StringIdMap vocab_;
  std::vector<const std::string*> id_to_token_;  // points into vocab_ keys (node-based map: stable)
  std::vector<MergeEntry> merges_;
  size_t merge_mask_ = 0;
  int merge_shift_ = 64;
  BpeOptions options_;
  bool byte_level_ = false;
  // Byte-level mode: the id spelling byte b as a word's [first?][last?] symbol (prefix/suffix applied), -1 if
  // the vocabulary lacks it.
  int32_t byte_ids_[2][2][256] = {};
  std::optional<int32_t> unk_id_;
  StringIdMap raw_vocab_;  // byte-level mode with ignore_merges: raw bytes -> id
};

}  // namespace deltaflow::text::tokenizer_impl
