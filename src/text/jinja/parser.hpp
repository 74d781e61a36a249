// Recursive-descent parser following jinja2/parser.py production by production, so precedence,
// tuple rules and error messages match. Statements: if/elif/else, for (else, if-filter, recursive),
// set (tuple, namespace attr, block form), macro, call, filter, with, print, block (rendered in place),
// autoescape false, break/continue (HF enables loopcontrols) and HF's {% generation %}.
// include/import/extends are rejected: templates get no file access.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "text/jinja/ast.hpp"
#include "text/jinja/lexer.hpp"

namespace deltaflow::text::jinja {

struct ParseOptions {
  int max_nesting = 100;  // expression and block nesting; deeper input is rejected, not recursed into
  // Resolves a filter (is_filter) or test name to the engine's implementation; nullptr if unknown.
  std::function<const void*(bool is_filter, const std::string& name)> resolve;
};

// Throws EngineError on syntax errors.
Body parse_template(std::vector<Token> tokens, const ParseOptions& opt);

}  // namespace deltaflow::text::jinja
