// The normalizer of a tokenizer.json: null, one Unicode normal form (NFC, NFD, NFKC, NFKD) or a Sequence of
// them. Qwen uses NFC.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer_unicode.hpp"

namespace deltaflow::text::tokenizer_impl {

class Normalizer {
 public:
  Normalizer() = default;
  explicit Normalizer(std::vector<NormalForm> steps) : steps_(std::move(steps)) {}

  bool empty() const { return steps_.empty(); }
  // Normalizes valid UTF-8 text. Returns `in` itself when nothing changes, else a view of `buf`.
  std::string_view apply(std::string_view in, std::string& buf) const;

 private:
  std::vector<NormalForm> steps_;
};

}  // namespace deltaflow::text::tokenizer_impl
