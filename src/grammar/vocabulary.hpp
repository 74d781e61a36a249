// The byte strings of a tokenizer's ids, sorted so that ids sharing a prefix sit together: the matcher walks
// them in this order and reuses the automaton states of the shared prefix (xgrammar's sorted-vocabulary
// walk, which needs no trie). Built once per model and shared by every request.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace deltaflow::text {
class Tokenizer;
}

namespace deltaflow::grammar {

class Vocabulary {
 public:
  // token_bytes[id]: what decoding the id contributes; ids with no bytes (special tokens) are never
  // allowed by a grammar. mask_size: the ids a mask covers (the model's vocabulary, possibly larger).
  Vocabulary(const std::vector<std::string>& token_bytes, size_t mask_size);
  // Every id of the tokenizer except special tokens (added ones that are not special, like <tool_call>, count
  // as their text).
  static std::shared_ptr<const Vocabulary> from_tokenizer(const text::Tokenizer& tok, size_t mask_size);

  size_t mask_size() const { return mask_size_; }
  size_t mask_words() const { return (mask_size_ + 31) / 32; }
  size_t max_token_bytes() const { return max_len_; }
  size_t ids() const { return offset_.size() - 1; }  // ids with an entry (bytes(id) valid below this)

  // Ids with bytes, sorted by their bytes; lcp()[k] is the common prefix length of sorted k-1 and k.
  const std::vector<int32_t>& sorted() const { return sorted_; }
  const std::vector<uint16_t>& lcp() const { return lcp_; }
  // The bytes of the k-th id in sorted order (stored contiguously in that order: the walk reads them in it).
  std::string_view sorted_bytes(size_t k) const {
    return std::string_view(sorted_blob_)
        .substr(sorted_offset_[k], sorted_offset_[k + 1] - sorted_offset_[k]);
  }
  std::string_view bytes(int32_t id) const {
    const auto i = static_cast<size_t>(id);
    return std::string_view(blob_).substr(offset_[i], offset_[i + 1] - offset_[i]);
  }
  // Ids made only of spaces, tabs and newlines (allowed between a reasoning block and the answer).
  std::span<const uint32_t> whitespace_mask() const { return whitespace_; }

 private:
  size_t mask_size_ = 0;
  size_t max_len_ = 0;
  std::string blob_;
  std::vector<uint32_t> offset_;  // [id] .. [id + 1] in blob_
  std::vector<int32_t> sorted_;
  std::vector<uint16_t> lcp_;
  std::string sorted_blob_;
  std::vector<uint32_t> sorted_offset_;
  std::vector<uint32_t> whitespace_;
};

}  // namespace deltaflow::grammar
