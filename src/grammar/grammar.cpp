#include "grammar/grammar.hpp"

#include <algorithm>
#include <cstdio>

namespace deltaflow::grammar {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::vector<CodepointRange> positive_ranges(std::vector<CodepointRange> r, bool negated) {
  for (auto& x : r) x.hi = std::min<uint32_t>(x.hi, 0x10FFFF);
  std::sort(r.begin(), r.end(), [](auto& x, auto& y) { return x.lo < y.lo; });
  std::vector<CodepointRange> merged;
  for (const auto& x : r) {
    if (x.lo > x.hi) continue;
    if (!merged.empty() && x.lo <= merged.back().hi + 1)
      merged.back().hi = std::max(merged.back().hi, x.hi);
    else
      merged.push_back(x);
  }
  if (!negated) return merged;
  std::vector<CodepointRange> comp;
  uint32_t next = 0;
  for (const auto& x : merged) {
    if (x.lo > next) comp.push_back({next, x.lo - 1});
    next = x.hi + 1;
  }
  if (next <= 0x10FFFF) comp.push_back({next, 0x10FFFF});
  return comp;
}

bool contains(const std::vector<CodepointRange>& r, uint32_t cp) {
  for (const auto& x : r)
    if (x.lo <= cp && cp <= x.hi) return true;
  return false;
}

std::vector<uint32_t> decode_utf8(std::string_view s, const char* what) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + static_cast<size_t>(n) > s.size())
      throw GrammarError(std::string(what) + " is not valid UTF-8");
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (int k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((d >> 6) != 2) throw GrammarError(std::string(what) + " is not valid UTF-8");
      cp = (cp << 6) | (d & 0x3F);
    }
    out.push_back(cp);
    i += static_cast<size_t>(n);
  }
  return out;
}

int32_t Grammar::add(Expr e) {
  exprs_.push_back(std::move(e));
  return static_cast<int32_t>(exprs_.size() - 1);
}

int32_t Grammar::empty() {
  return add(Expr{});
}

int32_t Grammar::literal(std::string_view bytes) {
  if (bytes.empty()) return empty();
  Expr e;
  e.kind = Expr::Kind::kBytes;
  e.bytes = std::string(bytes);
  return add(std::move(e));
}

int32_t Grammar::char_class(std::vector<CodepointRange> ranges, bool negated) {
  Expr e;
  e.kind = Expr::Kind::kClass;
  e.ranges = std::move(ranges);
  e.negated = negated;
  return add(std::move(e));
}

int32_t Grammar::seq(std::vector<int32_t> items) {
  if (items.empty()) return empty();
  if (items.size() == 1) return items[0];
  Expr e;
  e.kind = Expr::Kind::kSeq;
  e.children = std::move(items);
  return add(std::move(e));
}

int32_t Grammar::alt(std::vector<int32_t> items) {
  if (items.size() == 1) return items[0];
  Expr e;
  e.kind = Expr::Kind::kAlt;  // no children: matches nothing
  e.children = std::move(items);
  return add(std::move(e));
}

int32_t Grammar::repeat(int32_t item, int32_t min, int32_t max) {
  if (max >= 0 && max < min) throw GrammarError("a repeat's maximum is below its minimum");
  if (min == 1 && max == 1) return item;
  Expr e;
  e.kind = Expr::Kind::kRepeat;
  e.children = {item};
  e.min = min;
  e.max = max;
  return add(std::move(e));
}

int32_t Grammar::ref(int32_t rule) {
  Expr e;
  e.kind = Expr::Kind::kRef;
  e.rule = rule;
  return add(std::move(e));
}

int32_t Grammar::find_rule(const std::string& name) const {
  for (size_t i = 0; i < rules_.size(); ++i)
    if (rules_[i].name == name) return static_cast<int32_t>(i);
  return -1;
}

int32_t Grammar::rule_id(const std::string& name) {
  if (int32_t r = find_rule(name); r >= 0) return r;
  rules_.push_back(Rule{name, -1});
  return static_cast<int32_t>(rules_.size() - 1);
}

int32_t Grammar::new_rule(const std::string& base_name) {
  std::string name = base_name;
  for (int i = 1; find_rule(name) >= 0; ++i) name = base_name + "_" + std::to_string(i);
  rules_.push_back(Rule{name, -1});
  return static_cast<int32_t>(rules_.size() - 1);
}

void Grammar::define(int32_t rule, int32_t body) {
  rules_[static_cast<size_t>(rule)].body = body;
}

void Grammar::check() const {
  if (root_ < 0 || static_cast<size_t>(root_) >= rules_.size())
    throw GrammarError("the grammar has no root rule");
  for (const auto& r : rules_)
    if (r.body < 0) throw GrammarError("rule '" + r.name + "' is used but not defined");
}

namespace {

std::string escape_byte(unsigned char c, bool in_class) {
  if (c == '"' && !in_class) return "\\\"";
  if (c == '\\') return "\\\\";
  if (in_class && (c == ']' || c == '-' || c == '^')) return std::string("\\") + static_cast<char>(c);
  if (c == '\n') return "\\n";
  if (c == '\t') return "\\t";
  if (c == '\r') return "\\r";
  if (c < 0x20 || c == 0x7F) {
    char b[8];
    std::snprintf(b, sizeof b, "\\x%02X", c);
    return b;
  }
  return std::string(1, static_cast<char>(c));
}

std::string escape_cp(uint32_t cp) {
  if (cp < 0x80) return escape_byte(static_cast<unsigned char>(cp), true);
  std::string s;
  append_utf8(s, cp);
  return s;
}

}  // namespace

std::string Grammar::to_string() const {
  // Recursive printer; parenthesises every composite child so that precedence never matters.
  std::string out;
  auto print = [&](auto&& self, int32_t i, bool nested) -> void {
    const Expr& e = expr(i);
    switch (e.kind) {
      case Expr::Kind::kEmpty:
        out += "\"\"";
        break;
      case Expr::Kind::kBytes:
        out += '"';
        for (unsigned char c : e.bytes) out += escape_byte(c, false);
        out += '"';
        break;
      case Expr::Kind::kClass:
        out += e.negated ? "[^" : "[";
        for (const auto& r : e.ranges) {
          out += escape_cp(r.lo);
          if (r.hi != r.lo) out += "-" + escape_cp(r.hi);
        }
        out += "]";
        break;
      case Expr::Kind::kSeq:
      case Expr::Kind::kAlt: {
        if (nested) out += "(";
        for (size_t k = 0; k < e.children.size(); ++k) {
          if (k) out += e.kind == Expr::Kind::kSeq ? " " : " | ";
          self(self, e.children[k], true);
        }
        if (nested) out += ")";
        break;
      }
      case Expr::Kind::kRepeat:
        self(self, e.children[0], true);
        if (e.min == 0 && e.max == 1)
          out += "?";
        else if (e.min == 0 && e.max < 0)
          out += "*";
        else if (e.min == 1 && e.max < 0)
          out += "+";
        else
          out += "{" + std::to_string(e.min) + "," + (e.max < 0 ? "" : std::to_string(e.max)) + "}";
        break;
      case Expr::Kind::kRef:
        out += rules_[static_cast<size_t>(e.rule)].name;
        break;
    }
  };
  for (const auto& r : rules_) {
    out += r.name + " ::= ";
    if (r.body >= 0) print(print, r.body, false);
    out += "\n";
  }
  return out;
}

}  // namespace deltaflow::grammar
