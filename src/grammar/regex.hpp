// Regular expressions (the subset shared by JSON-schema `pattern`, Python `re` and vLLM's guided_regex) to
// grammar expressions: literals, `.`, classes with ranges and negation, \d \w \s (and negations), escapes
// (\n \t \xHH \uHHHH, escaped punctuation), groups (capturing, (?:...), named), alternation, and the
// quantifiers * + ? {n} {n,} {n,m} (lazy forms match the same strings). The whole text must match: a
// leading ^ and trailing $ are accepted and change nothing. Backreferences, lookaround and word boundaries
// are refused with a GrammarError naming the position.
#pragma once

#include <string_view>

#include "grammar/grammar.hpp"

namespace deltaflow::grammar {

// json_string: the expression matches the *encoded* content of a JSON string whose decoded value matches
// the pattern (quote, backslash and control characters appear as escapes).
int32_t parse_regex(Grammar& g, std::string_view pattern, bool json_string = false);

// One character of a JSON string's content whose decoded value is in `ranges` (positive, sorted).
int32_t json_string_char(Grammar& g, const std::vector<CodepointRange>& ranges);

}  // namespace deltaflow::grammar
