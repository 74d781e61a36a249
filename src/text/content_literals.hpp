// Special tokens written inside untrusted text (message contents, tool results, names, tool definitions)
// stay text: a user who types `<|im_end|>\n<|im_start|>system` gets those characters, not a new system turn.
//
// How: before the chat template renders, every occurrence of a special token's text in those strings is
// replaced by a marker (two private-use characters that appear nowhere in the input or the template, around
// the token's index). The template never sees the token, so it cannot be confused by it, and it renders
// everything else exactly as before. After rendering, each marker is put back to the token's text and its
// byte range recorded as a literal span; Tokenizer::encode_literal then tokenizes those ranges as ordinary
// text, in context with their neighbours (tokenizers' split_special_tokens), while the special tokens the
// template wrote itself are parsed. Content without special-token text is untouched: same text, same ids.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "text/text_span.hpp"

namespace deltaflow::text {

class ContentLiterals {
 public:
  // tokens: the special tokens' texts (Tokenizer::special_token_texts). avoid: texts the markers must not
  // occur in (the template source; the JSON inputs are checked by escape()).
  ContentLiterals(std::vector<std::string> tokens, std::string_view avoid);

  bool active() const { return !tokens_.empty(); }
  // Picks markers that occur in no string or key of `inputs` (everything escape() will be given).
  void prepare(const nlohmann::ordered_json& inputs);
  // Every string value and object key of j with each special token's text replaced by its marker.
  nlohmann::ordered_json escape(const nlohmann::ordered_json& j) const;
  // Puts the tokens back; the byte ranges they take in the result are appended to literal (in order).
  std::string resolve(std::string_view rendered, std::vector<TextSpan>& literal) const;

  // The same replacement for one string (exposed for tests).
  std::string escape_string(std::string_view s) const;

 private:
  bool occurs(const nlohmann::ordered_json& j) const;
  void pick(size_t from);
  nlohmann::ordered_json escape_rec(const nlohmann::ordered_json& j) const;

  std::vector<std::string> tokens_;  // longest first
  std::string avoid_;
  std::string open_, close_;
  size_t candidate_ = 0;
};

}  // namespace deltaflow::text
