// Added tokens ("added_tokens" of tokenizer.json): found in the text before pre-tokenization and emitted as
// one id each. Mirrors `tokenizers` AddedVocabulary (tokenizer/added_vocabulary.rs): ids are (re)assigned the
// way add_tokens does, non-normalized tokens are matched on the raw text and normalized ones on the
// normalized text, leftmost-longest, then single_word / lstrip / rstrip are applied to each match.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "text/bpe.hpp"
#include "text/normalizer.hpp"
#include "text/text_span.hpp"

namespace deltaflow::text {

struct AddedToken {
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
  bool operator==(const AddedToken&) const = default;
};

}  // namespace deltaflow::text

namespace deltaflow::text::tokenizer_impl {

// Leftmost-longest, non-overlapping matching of a set of byte strings (aho-corasick's
// MatchKind::LeftmostLongest).
class TokenTrie {
 public:
  struct Match {
    size_t begin, end;
    size_t pattern;
  };
  void build(const std::vector<std::string>& patterns);
  bool empty() const { return nodes_.size() <= 1; }
  void find_all(std::string_view s, std::vector<Match>& out) const;

 private:
  struct Node {
    int64_t pattern = -1;  // first pattern ending here
  };
  int32_t child(int32_t node, unsigned char b) const {
    auto it = edges_.find((uint64_t(uint32_t(node)) << 8) | b);
    return it == edges_.end() ? -1 : it->second;
  }
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> edges_;
  std::array<bool, 256> first_byte_{};
};

class AddedVocabulary {
 public:
  // A piece of the input: an added token (id >= 0) or text to tokenize (id == -1).
  struct Split {
    size_t begin, end;
    int32_t id;
  };

  void add_tokens(const std::vector<AddedToken>& tokens, const BpeModel& model, const Normalizer& normalizer);

  // Splits `sentence` on the non-normalized tokens (normalized_set false) or the normalized ones (true).
  // Empty pieces are dropped. A match overlapping a `literal` range (sorted, offsets into sentence) stays
  // text, and so does every special-token match when no_special is set.
  void split(std::string_view sentence, bool normalized_set, std::vector<Split>& out,
             std::span<const TextSpan> literal = {}, bool no_special = false) const;
  bool has_tokens(bool normalized_set) const { return !(normalized_set ? normalized_ : raw_).trie.empty(); }

  std::optional<int32_t> token_to_id(std::string_view content) const;
  const AddedToken* token_of(int32_t id) const;
  // The string decode() and id_to_token() use: the normalized content for a normalized token that the
  // normalizer changes (tokenizers' normalized_cache), else the content. nullptr if id is not added.
  const std::string* decode_form(int32_t id) const;
  bool is_special(std::string_view content) const { return special_set_.count(std::string(content)) != 0; }
  size_t size() const { return by_content_.size(); }
  // All added tokens with their ids, in id order.
  std::vector<std::pair<int32_t, AddedToken>> tokens_by_id() const;

 private:
  struct MatchingSet {
    TokenTrie trie;
    std::vector<int32_t> ids;  // pattern index -> id
  };
  void refresh(const BpeModel& model, const Normalizer& normalizer);
  int32_t resolve_id(const std::string& content, const BpeModel& model) const;

  std::unordered_map<std::string, int32_t> by_content_;
  std::unordered_map<int32_t, AddedToken> by_id_;
  std::unordered_map<int32_t, std::string> normalized_form_;
  std::vector<AddedToken> added_;    // non-special, in the order given
  std::vector<AddedToken> special_;  // special, in the order given
  std::unordered_set<std::string> special_set_;
  MatchingSet raw_, normalized_;
  size_t model_size_ = 0;
  int64_t max_added_id_ = -1;
};

}  // namespace deltaflow::text::tokenizer_impl
