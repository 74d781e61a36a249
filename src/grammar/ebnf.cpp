#include "grammar/ebnf.hpp"

namespace deltaflow::grammar {

namespace {

constexpr int kMaxEbnfRepeat = 1000;

class EbnfParser {
 public:
  explicit EbnfParser(std::string_view text) : s_(text) {}

  Grammar parse() {
    skip_space(true);
    int32_t first = -1;
    while (!at_end()) {
      const std::string name = identifier();
      if (name.empty()) fail("expected a rule name");
      skip_space(true);
      if (s_.substr(pos_, 3) != "::=") fail("expected '::=' after rule name '" + name + "'");
      pos_ += 3;
      const int32_t r = g_.rule_id(name);
      if (defined_.size() <= static_cast<size_t>(r)) defined_.resize(static_cast<size_t>(r) + 1, 0);
      if (defined_[static_cast<size_t>(r)]) fail("rule '" + name + "' is defined twice");
      defined_[static_cast<size_t>(r)] = 1;
      if (first < 0) first = r;
      g_.define(r, alternation(0));
      skip_space(true);
    }
    if (first < 0) fail("the grammar has no rules");
    const int32_t root = g_.find_rule("root");
    g_.set_root(root >= 0 ? root : first);
    g_.check();
    return std::move(g_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw GrammarError("grammar: " + what + " at line " + std::to_string(line) + ", column " +
                       std::to_string(col));
  }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return s_[pos_]; }

  // Skips blanks and comments; newlines too when `newlines` (between rules, or inside parentheses).
  void skip_space(bool newlines) {
    while (!at_end()) {
      const char c = peek();
      if (c == '#') {
        while (!at_end() && peek() != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  }
  std::string identifier() {
    const size_t start = pos_;
    while (!at_end() && name_char(peek())) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }

  // `name ::=` starts the next rule; anything else continues this one (newlines included).
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < s_.size() && name_char(s_[p])) ++p;
    if (p == pos_) return false;
    while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t')) ++p;
    return s_.substr(p, 3) == "::=";
  }

  int32_t alternation(int depth) {
    if (depth > 100) fail("groups nest too deeply");
    std::vector<int32_t> alts = {sequence(depth)};
    while (!at_end() && peek() == '|') {
      ++pos_;
      alts.push_back(sequence(depth));
    }
    return g_.alt(std::move(alts));
  }

  int32_t sequence(int depth) {
    std::vector<int32_t> items;
    for (;;) {
      skip_space(true);
      if (at_end() || peek() == '|' || peek() == ')' || at_rule_start()) break;
      items.push_back(quantified(primary(depth)));
    }
    return g_.seq(std::move(items));
  }

  int number() {
    if (at_end() || peek() < '0' || peek() > '9') fail("expected a number");
    long v = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > kMaxEbnfRepeat) fail("a repeat count above " + std::to_string(kMaxEbnfRepeat));
      ++pos_;
    }
    return static_cast<int>(v);
  }

  int32_t quantified(int32_t e) {
    for (int count = 0;; ++count) {
      if (at_end()) return e;
      if (count > 0 && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{'))
        fail("a quantifier after a quantifier (group it: (x*)+)");
      if (count > 0) return e;
      const char c = peek();
      if (c == '*') {
        ++pos_;
        e = g_.star(e);
      } else if (c == '+') {
        ++pos_;
        e = g_.repeat(e, 1, -1);
      } else if (c == '?') {
        ++pos_;
        e = g_.optional(e);
      } else if (c == '{') {
        ++pos_;
        skip_space(false);
        const int lo = number();
        int hi = lo;
        skip_space(false);
        if (!at_end() && peek() == ',') {
          ++pos_;
          skip_space(false);
          hi = !at_end() && peek() == '}' ? -1 : number();
          skip_space(false);
        }
        if (at_end() || peek() != '}') fail("expected '}'");
        ++pos_;
        if (hi >= 0 && hi < lo) fail("a {n,m} repeat with m < n");
        e = g_.repeat(e, lo, hi);
      } else {
        return e;
      }
    }
  }

  // One (possibly escaped) code point inside a literal or class.
  uint32_t char_in(char close) {
    if (at_end()) fail(std::string("an unterminated ") + (close == ']' ? "class" : "string"));
    const auto c = static_cast<unsigned char>(peek());
    if (c == '\\') {
      ++pos_;
      if (at_end()) fail("a trailing backslash");
      const char e = s_[pos_++];
      switch (e) {
        case 'n':
          return '\n';
        case 't':
          return '\t';
        case 'r':
          return '\r';
        case '0':
          return 0;
        case 'x':
        case 'u':
        case 'U': {
          const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t v = 0;
          for (int k = 0; k < n; ++k) {
            if (at_end()) fail("a short hex escape");
            const char h = s_[pos_++];
            int d = h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : -1;
            if (d < 0) fail("a bad hex digit");
            v = v * 16 + static_cast<uint32_t>(d);
          }
          if (v > 0x10FFFF) fail("a code point above U+10FFFF");
          return v;
        }
        default:
          return static_cast<unsigned char>(e);
      }
    }
    // A UTF-8 character.
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + static_cast<size_t>(n) > s_.size()) fail("invalid UTF-8");
    const auto cps = decode_utf8(s_.substr(pos_, static_cast<size_t>(n)), "the grammar");
    pos_ += static_cast<size_t>(n);
    return cps[0];
  }

  int32_t primary(int depth) {
    const char c = peek();
    if (c == '"' || c == '\'') {
      ++pos_;
      std::string bytes;
      while (!at_end() && peek() != c) append_utf8(bytes, char_in(c));
      if (at_end()) fail("an unterminated string");
      ++pos_;
      return g_.literal(bytes);
    }
    if (c == '[') {
      ++pos_;
      bool negated = false;
      if (!at_end() && peek() == '^') {
        negated = true;
        ++pos_;
      }
      std::vector<CodepointRange> ranges;
      while (!at_end() && peek() != ']') {
        const uint32_t lo = char_in(']');
        uint32_t hi = lo;
        if (pos_ + 1 < s_.size() && peek() == '-' && s_[pos_ + 1] != ']') {
          ++pos_;
          hi = char_in(']');
          if (hi < lo) fail("a range out of order in a class");
        }
        ranges.push_back({lo, hi});
      }
      if (at_end()) fail("an unterminated class");
      ++pos_;
      return g_.char_class(std::move(ranges), negated);
    }
    if (c == '(') {
      ++pos_;
      const int32_t e = alternation(depth + 1);
      skip_space(true);
      if (at_end() || peek() != ')') fail("a missing ')'");
      ++pos_;
      return e;
    }
    if (c == '.') {
      ++pos_;
      return g_.char_class({}, true);  // any character
    }
    if (name_char(c)) {
      const std::string name = identifier();
      return g_.ref(g_.rule_id(name));
    }
    fail(std::string("unexpected '") + c + "'");
  }

  std::string_view s_;
  size_t pos_ = 0;
  Grammar g_;
  std::vector<uint8_t> defined_;
};

}  // namespace

Grammar parse_ebnf(std::string_view text) {
  return EbnfParser(text).parse();
}

}  // namespace deltaflow::grammar
