// EBNF grammar text (llama.cpp's GBNF, which xgrammar's EBNF also reads): rules `name ::= body`, bodies of
// "literals" and 'literals' (with \n \t \" \\ \xHH \uHHHH escapes), [character classes] ([^...] negated),
// rule names, ( groups ), alternation |, and the quantifiers * + ? {n} {n,} {n,m}; `#` starts a comment.
// The rule named `root` is where matching starts (else the first rule).
#pragma once

#include <string_view>

#include "grammar/grammar.hpp"

namespace deltaflow::grammar {

// Throws GrammarError naming the line and column of the problem.
Grammar parse_ebnf(std::string_view text);

}  // namespace deltaflow::grammar
