// A context-free grammar over UTF-8 bytes: named rules whose bodies are expressions (literal bytes, classes
// of code points, sequences, alternatives, bounded or unbounded repeats, references to rules). Every front
// end (JSON schema, regex, EBNF text, choice lists) builds one of these; grammar/automaton.hpp compiles it to
// byte automata for the matcher.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace deltaflow::grammar {

// A bad schema, regex or grammar; what() says what and where. Front ends throw it; the public entry points
// (grammar/compile.hpp) return it as a core::Status.
struct GrammarError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct CodepointRange {
  uint32_t lo = 0, hi = 0;  // inclusive
};

struct Expr {
  enum class Kind : uint8_t {
    kEmpty,   // matches ""
    kBytes,   // the literal bytes in `bytes`
    kClass,   // one code point in `ranges` (or not in them, when `negated`), UTF-8 encoded
    kSeq,     // children in order
    kAlt,     // one of the children
    kRepeat,  // children[0], between min and max times (max < 0: unbounded)
    kRef,     // the rule `rule`
  };
  Kind kind = Kind::kEmpty;
  std::string bytes;
  std::vector<CodepointRange> ranges;
  bool negated = false;
  std::vector<int32_t> children;
  int32_t min = 0, max = -1;
  int32_t rule = -1;
};

struct Rule {
  std::string name;
  int32_t body = -1;  // an index into Grammar::exprs; -1 until defined
};

class Grammar {
 public:
  // Expressions (each returns its index).
  int32_t empty();
  int32_t literal(std::string_view bytes);
  int32_t char_class(std::vector<CodepointRange> ranges, bool negated = false);
  int32_t seq(std::vector<int32_t> items);
  int32_t alt(std::vector<int32_t> items);
  int32_t repeat(int32_t item, int32_t min, int32_t max);
  int32_t optional(int32_t item) { return repeat(item, 0, 1); }
  int32_t star(int32_t item) { return repeat(item, 0, -1); }
  int32_t ref(int32_t rule);

  // Rules: `rule_id` finds or declares one by name; `define` gives it a body.
  int32_t rule_id(const std::string& name);
  int32_t new_rule(const std::string& base_name);  // a fresh name: base_name, base_name_1, ...
  void define(int32_t rule, int32_t body);
  int32_t find_rule(const std::string& name) const;

  const std::vector<Expr>& exprs() const { return exprs_; }
  const std::vector<Rule>& rules() const { return rules_; }
  const Expr& expr(int32_t i) const { return exprs_[static_cast<size_t>(i)]; }
  int32_t root() const { return root_; }
  void set_root(int32_t rule) { root_ = rule; }

  // Throws GrammarError naming a rule that is referenced but never defined, or a missing root.
  void check() const;
  // GBNF-like text (for docs, debugging and error messages).
  std::string to_string() const;

 private:
  int32_t add(Expr e);
  std::vector<Expr> exprs_;
  std::vector<Rule> rules_;
  int32_t root_ = -1;
};

// The sorted, merged ranges a class matches (the complement within U+0000..U+10FFFF when negated).
std::vector<CodepointRange> positive_ranges(std::vector<CodepointRange> ranges, bool negated);
bool contains(const std::vector<CodepointRange>& sorted_ranges, uint32_t cp);
// Decodes UTF-8 text into code points; throws GrammarError on invalid UTF-8, naming `what`.
std::vector<uint32_t> decode_utf8(std::string_view text, const char* what);

// Appends the UTF-8 encoding of code point `cp`.
void append_utf8(std::string& out, uint32_t cp);

}  // namespace deltaflow::grammar
