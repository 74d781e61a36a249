// Tokenizer with jinja2's lexing rules, including whitespace control as HF configures it
// (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False), `-`/`+` modifiers, comments
// and raw blocks. Data tokens come out already stripped.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace deltaflow::text::jinja {

enum class Tok : uint8_t {
  kData,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInteger,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok type;
  std::string value;  // data text, name, decoded string, operator text
  int64_t ival = 0;
  double fval = 0;
  size_t offset = 0;  // byte offset in the normalised source
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// Newlines become "\n" and one trailing newline is dropped, as jinja2 does before lexing.
std::string normalize_source(std::string_view source);

// Tokenizes a normalised source; throws EngineError (TemplateSyntaxError) on lexing errors.
std::vector<Token> tokenize(const std::string& source, const LexerOptions& opt);

}  // namespace deltaflow::text::jinja
