#include "grammar/regex.hpp"

#include <cstdio>

namespace deltaflow::grammar {

namespace {

constexpr int kMaxRegexRepeat = 1000;

const std::vector<CodepointRange> kDigit = {{'0', '9'}};
const std::vector<CodepointRange> kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const std::vector<CodepointRange> kSpace = {{'\t', '\r'}, {' ', ' '}};

class RegexParser {
 public:
  RegexParser(Grammar& g, std::string_view pattern, bool json)
      : g_(g), cps_(decode_utf8(pattern, "the regex")), json_(json) {}

  int32_t parse() {
    if (pos_ < cps_.size() && cps_[pos_] == '^') ++pos_;
    const int32_t e = alternation(0);
    if (pos_ < cps_.size()) fail("unbalanced ')'");
    return e;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw GrammarError("regex: " + what + " at position " + std::to_string(pos_));
  }
  bool at_end() const { return pos_ >= cps_.size(); }
  uint32_t peek() const { return cps_[pos_]; }

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
    while (!at_end() && peek() != '|' && peek() != ')') {
      // Anchors where they only restate that the whole text matches.
      if (peek() == '$' && (pos_ + 1 == cps_.size() || cps_[pos_ + 1] == '|' || cps_[pos_ + 1] == ')')) {
        ++pos_;
        continue;
      }
      if (peek() == '^' && items.empty()) {
        ++pos_;
        continue;
      }
      items.push_back(quantified(atom(depth)));
    }
    return g_.seq(std::move(items));
  }

  int number() {
    if (at_end() || peek() < '0' || peek() > '9') fail("expected a number in a {} quantifier");
    long v = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > kMaxRegexRepeat) fail("a repeat count above " + std::to_string(kMaxRegexRepeat));
      ++pos_;
    }
    return static_cast<int>(v);
  }

  int32_t quantified(int32_t e) {
    if (!at_end()) {
      const uint32_t c = peek();
      int lo, hi;
      if (c == '*') {
        lo = 0, hi = -1, ++pos_;
      } else if (c == '+') {
        lo = 1, hi = -1, ++pos_;
      } else if (c == '?') {
        lo = 0, hi = 1, ++pos_;
      } else if (c == '{') {
        // A '{' that does not start a quantifier is a literal (as in Python).
        size_t p = pos_ + 1;
        if (p >= cps_.size() || cps_[p] < '0' || cps_[p] > '9') return e;
        ++pos_;
        lo = number();
        hi = lo;
        if (!at_end() && peek() == ',') {
          ++pos_;
          hi = !at_end() && peek() == '}' ? -1 : number();
        }
        if (at_end() || peek() != '}') fail("expected '}'");
        ++pos_;
        if (hi >= 0 && hi < lo) fail("a {n,m} quantifier with m < n");
      } else {
        return e;
      }
      if (!at_end() && (peek() == '?' || peek() == '+')) ++pos_;  // lazy / possessive: same language
      e = g_.repeat(e, lo, hi);
      // A second quantifier is an error (Python: "multiple repeat"); nesting them only costs states.
      if (!at_end() &&
          (peek() == '*' || peek() == '+' || peek() == '?' ||
           (peek() == '{' && pos_ + 1 < cps_.size() && cps_[pos_ + 1] >= '0' && cps_[pos_ + 1] <= '9')))
        fail("a quantifier after a quantifier");
      return e;
    }
    return e;
  }

  int32_t chars(std::vector<CodepointRange> ranges, bool negated) {
    auto pos = positive_ranges(std::move(ranges), negated);
    if (json_) return json_string_char(g_, pos);
    return g_.char_class(std::move(pos));
  }

  int32_t literal(uint32_t cp) { return chars({{cp, cp}}, false); }

  // An escape after '\' (pos_ at the character after it). Returns a class for \d etc.
  std::vector<CodepointRange> escape(bool& negated) {
    if (at_end()) fail("a trailing backslash");
    const uint32_t c = cps_[pos_++];
    negated = false;
    switch (c) {
      case 'd':
        return kDigit;
      case 'D':
        negated = true;
        return kDigit;
      case 'w':
        return kWord;
      case 'W':
        negated = true;
        return kWord;
      case 's':
        return kSpace;
      case 'S':
        negated = true;
        return kSpace;
      case 'n':
        return {{'\n', '\n'}};
      case 't':
        return {{'\t', '\t'}};
      case 'r':
        return {{'\r', '\r'}};
      case 'f':
        return {{'\f', '\f'}};
      case 'v':
        return {{'\v', '\v'}};
      case '0':
        return {{0, 0}};
      case 'x':
      case 'u': {
        const int n = c == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int k = 0; k < n; ++k) {
          if (at_end()) fail("a short \\x or \\u escape");
          const uint32_t h = cps_[pos_++];
          int d = h >= '0' && h <= '9'   ? int(h - '0')
                  : h >= 'a' && h <= 'f' ? int(h - 'a' + 10)
                  : h >= 'A' && h <= 'F' ? int(h - 'A' + 10)
                                         : -1;
          if (d < 0) fail("a bad hex digit in an escape");
          v = v * 16 + static_cast<uint32_t>(d);
        }
        return {{v, v}};
      }
      case 'b':
      case 'B':
        fail("word boundaries (\\b) are not supported");
      default:
        if (c >= '1' && c <= '9') fail("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
          fail(std::string("an unknown escape \\") + static_cast<char>(c));
        return {{c, c}};
    }
  }

  int32_t klass() {
    // pos_ after '['
    bool negated = false;
    if (!at_end() && peek() == '^') {
      negated = true;
      ++pos_;
    }
    std::vector<CodepointRange> ranges;
    bool first = true;
    for (;;) {
      if (at_end()) fail("an unterminated character class");
      uint32_t c = peek();
      if (c == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      ++pos_;
      uint32_t lo;
      if (c == '\\') {
        bool neg;
        auto r = escape(neg);
        if (neg || r.size() != 1 || r[0].lo != r[0].hi) {
          auto p = positive_ranges(std::move(r), neg);
          ranges.insert(ranges.end(), p.begin(), p.end());
          continue;
        }
        lo = r[0].lo;
      } else if (c == '[' && !at_end() && peek() == ':') {
        fail("POSIX classes ([:alpha:]) are not supported");
      } else {
        lo = c;
      }
      uint32_t hi = lo;
      if (pos_ + 1 < cps_.size() && peek() == '-' && cps_[pos_ + 1] != ']') {
        ++pos_;
        uint32_t h = cps_[pos_++];
        if (h == '\\') {
          bool neg;
          auto r = escape(neg);
          if (neg || r.size() != 1 || r[0].lo != r[0].hi) fail("a class escape as a range end");
          h = r[0].lo;
        }
        if (h < lo) fail("a range out of order in a character class");
        hi = h;
      }
      ranges.push_back({lo, hi});
    }
    return chars(std::move(ranges), negated);
  }

  int32_t atom(int depth) {
    const uint32_t c = cps_[pos_++];
    switch (c) {
      case '(': {
        if (!at_end() && peek() == '?') {
          ++pos_;
          if (!at_end() && peek() == ':') {
            ++pos_;
          } else if (!at_end() && (peek() == 'P' || peek() == '<')) {
            if (peek() == 'P') ++pos_;
            if (at_end() || peek() != '<') fail("a bad named group");
            if (pos_ + 1 < cps_.size() && (cps_[pos_ + 1] == '=' || cps_[pos_ + 1] == '!'))
              fail("lookbehind is not supported");
            while (!at_end() && peek() != '>') ++pos_;
            if (at_end()) fail("an unterminated group name");
            ++pos_;
          } else {
            fail("lookaround and inline flags are not supported");
          }
        }
        const int32_t e = alternation(depth + 1);
        if (at_end() || peek() != ')') fail("a missing ')'");
        ++pos_;
        return e;
      }
      case '[':
        return klass();
      case '.':
        return chars({{'\n', '\n'}}, true);
      case '\\': {
        bool neg;
        auto r = escape(neg);
        return chars(std::move(r), neg);
      }
      case '*':
      case '+':
      case '?':
        --pos_;
        fail("a quantifier with nothing to repeat");
      case '^':
        --pos_;
        fail("'^' inside a pattern is not supported");
      case '$':
        --pos_;
        fail("'$' inside a pattern is not supported");
      default:
        return literal(c);
    }
  }

  Grammar& g_;
  std::vector<uint32_t> cps_;
  bool json_;
  size_t pos_ = 0;
};

}  // namespace

int32_t json_string_char(Grammar& g, const std::vector<CodepointRange>& ranges) {
  // Characters written raw: the class minus '"', '\\' and controls; those that are in it come as escapes.
  std::vector<CodepointRange> raw;
  for (auto r : ranges) {
    auto cut = [&](uint32_t lo, uint32_t hi) {
      if (lo <= hi) raw.push_back({lo, hi});
    };
    const uint32_t lo = std::max<uint32_t>(r.lo, 0x20);
    if (lo > r.hi) continue;
    // split around '"' (0x22) and '\\' (0x5C)
    uint32_t a = lo;
    for (uint32_t special : {0x22u, 0x5Cu}) {
      if (special >= a && special <= r.hi) {
        cut(a, special - 1);
        a = special + 1;
      }
    }
    cut(a, r.hi);
  }
  std::vector<int32_t> alts;
  if (!raw.empty()) alts.push_back(g.char_class(raw));
  static const std::pair<uint32_t, const char*> kNamed[] = {{'"', "\\\""}, {'\\', "\\\\"}, {'\n', "\\n"},
                                                            {'\t', "\\t"}, {'\r', "\\r"},  {'\b', "\\b"},
                                                            {'\f', "\\f"}};
  for (uint32_t cp = 0; cp < 0x20; ++cp) {
    if (!contains(ranges, cp)) continue;
    bool named = false;
    for (const auto& [c, esc] : kNamed)
      if (c == cp) named = true;
    if (named) continue;
    char b[8];
    std::snprintf(b, sizeof b, "\\u%04x", cp);
    alts.push_back(g.literal(b));
  }
  for (const auto& [c, esc] : kNamed)
    if (contains(ranges, c)) alts.push_back(g.literal(esc));
  return g.alt(std::move(alts));
}

int32_t parse_regex(Grammar& g, std::string_view pattern, bool json_string) {
  return RegexParser(g, pattern, json_string).parse();
}

}  // namespace deltaflow::grammar
