#include "grammar/vocabulary.hpp"

#include <algorithm>

#include "text/tokenizer.hpp"

namespace deltaflow::grammar {

Vocabulary::Vocabulary(const std::vector<std::string>& token_bytes, size_t mask_size)
    : mask_size_(std::max(mask_size, token_bytes.size())) {
  offset_.reserve(token_bytes.size() + 1);
  offset_.push_back(0);
  whitespace_.assign(mask_words(), 0);
  for (size_t id = 0; id < token_bytes.size(); ++id) {
    const std::string& b = token_bytes[id];
    blob_ += b;
    offset_.push_back(static_cast<uint32_t>(blob_.size()));
    if (b.empty()) continue;
    // Longer tokens than this are not matched (no tokenizer has them; the walk keeps a state per byte).
    if (b.size() > 4096) continue;
    sorted_.push_back(static_cast<int32_t>(id));
    max_len_ = std::max(max_len_, b.size());
    if (std::all_of(b.begin(), b.end(), [](char c) { return c == ' ' || c == '\t' || c == '\n'; }))
      whitespace_[id / 32] |= 1u << (id % 32);
  }
  std::sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) { return bytes(a) < bytes(b); });
  sorted_offset_.push_back(0);
  for (int32_t id : sorted_) {
    sorted_blob_ += bytes(id);
    sorted_offset_.push_back(static_cast<uint32_t>(sorted_blob_.size()));
  }
  lcp_.assign(sorted_.size(), 0);
  for (size_t k = 1; k < sorted_.size(); ++k) {
    const std::string_view a = bytes(sorted_[k - 1]), b = bytes(sorted_[k]);
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    lcp_[k] = static_cast<uint16_t>(n);
  }
}

std::shared_ptr<const Vocabulary> Vocabulary::from_tokenizer(const text::Tokenizer& tok, size_t mask_size) {
  std::vector<std::string> bytes(tok.vocab_size());
  for (size_t id = 0; id < bytes.size(); ++id) {
    const auto i = static_cast<int32_t>(id);
    // Special tokens (<|im_end|>) never match a grammar; other added tokens (<tool_call>) match their text.
    if (!tok.has_id(i) || tok.is_special(i)) continue;
    bytes[id] = std::string(tok.token_bytes(i));
  }
  return std::make_shared<const Vocabulary>(bytes, mask_size);
}

}  // namespace deltaflow::grammar
