#include "grammar/json_schema.hpp"

#include <cmath>
#include <set>

#include "grammar/regex.hpp"

namespace deltaflow::grammar {

namespace {

constexpr int kMaxIntDigits = 16;
constexpr int kMaxFracDigits = 15;
constexpr int kMaxDepth = 64;
constexpr int64_t kIntCap = 9'999'999'999'999'999;  // 16 digits

// The formats, as regexes over the string's content (subsets of the valid values: no Feb 29, ASCII email).
const std::map<std::string, std::string>& format_regexes() {
  static const std::string date =
      R"(\d{4}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1\d|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31))";
  static const std::string time =
      R"((?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,6})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d))";
  static const std::string label = R"([A-Za-z0-9](?:[A-Za-z0-9-]{0,14}[A-Za-z0-9])?)";
  static const std::string octet = R"((?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))";
  static const std::map<std::string, std::string> m = {
      {"date", date},
      {"time", time},
      {"date-time", date + "T" + time},
      {"uuid", R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"},
      {"email", R"([A-Za-z0-9_%+-]{1,16}(?:\.[A-Za-z0-9_%+-]{1,16})?@)" + label + R"((?:\.)" + label +
                    R"(){0,2}\.[A-Za-z]{2,10})"},
      {"ipv4", "(?:" + octet + R"(\.){3})" + octet},
      {"hostname", label + R"((?:\.)" + label + "){0,6}"},
      {"uri", R"([A-Za-z][A-Za-z0-9+.-]{0,15}://[A-Za-z0-9\-._~:/?#@!$&'()*+,;=%]{1,120})"},
  };
  return m;
}

const std::set<std::string>& known_keywords() {
  static const std::set<std::string> k = {"type",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "items",
                                          "prefixItems",
                                          "minItems",
                                          "maxItems",
                                          "enum",
                                          "const",
                                          "anyOf",
                                          "oneOf",
                                          "allOf",
                                          "$ref",
                                          "$defs",
                                          "definitions",
                                          "format",
                                          "pattern",
                                          "minLength",
                                          "maxLength",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum",
                                          "nullable",
                                          "title",
                                          "description",
                                          "default",
                                          "examples",
                                          "$schema",
                                          "$id",
                                          "$comment",
                                          "deprecated",
                                          "readOnly",
                                          "writeOnly",
                                          "name",
                                          "strict",
                                          "unevaluatedProperties"};
  return k;
}

std::string type_of(const Json& s) {
  if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required"))
    return "object";
  if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems"))
    return "array";
  if (s.contains("pattern") || s.contains("format") || s.contains("minLength") || s.contains("maxLength"))
    return "string";
  if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
      s.contains("exclusiveMaximum"))
    return "number";
  return "";
}

int64_t get_int(const Json& s, const char* key, int64_t def) {
  auto it = s.find(key);
  if (it == s.end() || it->is_null()) return def;
  if (!it->is_number_integer() &&
      !(it->is_number_float() && it->get<double>() == std::floor(it->get<double>())))
    throw GrammarError(std::string("'") + key + "' must be a non-negative integer");
  const double v = it->get<double>();
  if (v < 0) throw GrammarError(std::string("'") + key + "' must be a non-negative integer");
  return static_cast<int64_t>(std::min(v, 1e9));
}

// Decimal strings of the integers in [a, b] with the same number of digits.
int32_t same_length(Grammar& g, const std::string& a, const std::string& b) {
  if (a.empty()) return g.empty();
  if (a == b) return g.literal(a);
  if (a[0] == b[0]) return g.seq({g.literal(a.substr(0, 1)), same_length(g, a.substr(1), b.substr(1))});
  const size_t n = a.size() - 1;
  const int32_t digit = g.char_class({{'0', '9'}});
  auto rest = [&](int32_t first) {
    return n ? g.seq({first, g.repeat(digit, int32_t(n), int32_t(n))}) : first;
  };
  const bool low_full = a.find_first_not_of('0', 1) == std::string::npos;
  const bool high_full = b.find_first_not_of('9', 1) == std::string::npos;
  std::vector<int32_t> alts;
  char mid_lo = low_full ? a[0] : static_cast<char>(a[0] + 1);
  char mid_hi = high_full ? b[0] : static_cast<char>(b[0] - 1);
  if (!low_full)
    alts.push_back(g.seq({g.literal(a.substr(0, 1)), same_length(g, a.substr(1), std::string(n, '9'))}));
  if (mid_lo <= mid_hi)
    alts.push_back(rest(g.char_class({{static_cast<uint32_t>(mid_lo), static_cast<uint32_t>(mid_hi)}})));
  if (!high_full)
    alts.push_back(g.seq({g.literal(b.substr(0, 1)), same_length(g, std::string(n, '0'), b.substr(1))}));
  return g.alt(std::move(alts));
}

int32_t uint_range(Grammar& g, int64_t lo, int64_t hi) {
  std::vector<int32_t> alts;
  const std::string sl = std::to_string(lo), sh = std::to_string(hi);
  int64_t p = 1;
  for (size_t k = 1; k < sl.size(); ++k) p *= 10;
  for (size_t n = sl.size(); n <= sh.size(); ++n, p *= 10) {
    const int64_t a = n == sl.size() ? lo : p;
    const int64_t b = n == sh.size() ? hi : p * 10 - 1;
    alts.push_back(same_length(g, std::to_string(a), std::to_string(b)));
  }
  return g.alt(std::move(alts));
}

int32_t int_range(Grammar& g, int64_t lo, int64_t hi) {
  if (hi < 0) return g.seq({g.literal("-"), uint_range(g, -hi, -lo)});
  if (lo >= 0) return uint_range(g, lo, hi);
  return g.alt({g.seq({g.literal("-"), uint_range(g, 1, -lo)}), uint_range(g, 0, hi)});
}

struct Bounds {
  bool has_lo = false, has_hi = false;
  double lo = 0, hi = 0;
  bool lo_excl = false, hi_excl = false;
};

Bounds bounds(const Json& s) {
  Bounds b;
  auto num = [&](const char* k) -> std::optional<double> {
    auto it = s.find(k);
    if (it == s.end() || it->is_null()) return std::nullopt;
    if (it->is_boolean()) return std::nullopt;  // draft-4 boolean exclusives: handled below
    if (!it->is_number()) throw GrammarError(std::string("'") + k + "' must be a number");
    return it->get<double>();
  };
  if (auto v = num("minimum")) b.has_lo = true, b.lo = *v;
  if (auto v = num("maximum")) b.has_hi = true, b.hi = *v;
  if (auto v = num("exclusiveMinimum")) {
    if (!b.has_lo || *v >= b.lo) b.has_lo = true, b.lo = *v, b.lo_excl = true;
  }
  if (auto v = num("exclusiveMaximum")) {
    if (!b.has_hi || *v <= b.hi) b.has_hi = true, b.hi = *v, b.hi_excl = true;
  }
  if (auto it = s.find("exclusiveMinimum"); it != s.end() && it->is_boolean() && it->get<bool>())
    b.lo_excl = true;
  if (auto it = s.find("exclusiveMaximum"); it != s.end() && it->is_boolean() && it->get<bool>())
    b.hi_excl = true;
  return b;
}

// Integer bounds implied by numeric ones (inward), capped at 16 digits.
std::pair<int64_t, int64_t> integer_bounds(const Bounds& b) {
  double lo = -static_cast<double>(kIntCap), hi = static_cast<double>(kIntCap);
  if (b.has_lo) lo = b.lo_excl ? std::floor(b.lo) + 1 : std::ceil(b.lo);
  if (b.has_hi) hi = b.hi_excl ? std::ceil(b.hi) - 1 : std::floor(b.hi);
  lo = std::max(lo, -static_cast<double>(kIntCap));
  hi = std::min(hi, static_cast<double>(kIntCap));
  if (lo > hi) throw GrammarError("the bounds admit no integer; a grammar cannot bound this number");
  return {static_cast<int64_t>(lo), static_cast<int64_t>(hi)};
}

}  // namespace

SchemaCompiler::SchemaCompiler(Grammar& g, const Json& root, SchemaOptions o) : g_(g), root_(root), o_(o) {
  ws_ = g_.repeat(g_.char_class({{'\t', '\t'}, {'\n', '\n'}, {' ', ' '}}), 0, kMaxWhitespace);
}

int32_t SchemaCompiler::sep() {
  return g_.seq({ws_, g_.literal(","), ws_});
}

int32_t SchemaCompiler::quoted(int32_t content) {
  return g_.seq({g_.literal("\""), content, g_.literal("\"")});
}

void SchemaCompiler::check_keywords(const Json& s) const {
  if (!o_.strict) return;
  for (auto it = s.begin(); it != s.end(); ++it)
    if (!known_keywords().count(it.key()))
      throw GrammarError("schema keyword '" + it.key() + "' cannot be enforced by a grammar (strict mode)");
  if (auto f = s.find("format");
      f != s.end() && f->is_string() && !format_regexes().count(f->get<std::string>()))
    throw GrammarError("string format '" + f->get<std::string>() + "' is not supported (strict mode)");
}

int32_t SchemaCompiler::any_value() {
  if (any_value_rule_ >= 0) return g_.ref(any_value_rule_);
  any_value_rule_ = g_.new_rule("json_value");
  any_object_rule_ = g_.new_rule("json_object");
  const int32_t array_rule = g_.new_rule("json_array");
  const int32_t v = g_.ref(any_value_rule_);
  const int32_t str = string(Json::object());
  const int32_t member = g_.seq({str, ws_, g_.literal(":"), ws_, v});
  g_.define(any_object_rule_,
            g_.seq({g_.literal("{"), ws_, g_.optional(g_.seq({member, g_.star(g_.seq({sep(), member}))})),
                    ws_, g_.literal("}")}));
  g_.define(array_rule, g_.seq({g_.literal("["), ws_, g_.optional(g_.seq({v, g_.star(g_.seq({sep(), v}))})),
                                ws_, g_.literal("]")}));
  g_.define(any_value_rule_,
            g_.alt({g_.ref(any_object_rule_), g_.ref(array_rule), str, number(Json::object()),
                    g_.literal("true"), g_.literal("false"), g_.literal("null")}));
  return g_.ref(any_value_rule_);
}

int32_t SchemaCompiler::any_object() {
  any_value();
  return g_.ref(any_object_rule_);
}

int32_t SchemaCompiler::ref(const std::string& r, int depth) {
  if (auto it = refs_.find(r); it != refs_.end()) return g_.ref(it->second);
  if (r.empty() || r[0] != '#')
    throw GrammarError("$ref '" + r + "': only references inside the schema (#...)");
  const Json* target = nullptr;
  try {
    target = &root_.at(Json::json_pointer(r.substr(1)));
  } catch (const std::exception&) {
    throw GrammarError("$ref '" + r + "' points at nothing in the schema");
  }
  std::string name = "ref";
  for (char c : r.substr(r.rfind('/') == std::string::npos ? 0 : r.rfind('/') + 1))
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_') name += c;
  const int32_t rule = g_.new_rule(name);
  refs_.emplace(r, rule);
  g_.define(rule, value(*target, depth + 1));
  return g_.ref(rule);
}

Json SchemaCompiler::merged_all_of(const Json& s, int depth) {
  Json out = s;
  out.erase("allOf");
  const Json& parts = s["allOf"];
  if (!parts.is_array() || parts.empty()) throw GrammarError("'allOf' must be a non-empty array");
  for (const Json& raw : parts) {
    Json p = raw;
    for (int k = 0; p.is_object() && p.contains("$ref") && k < 16; ++k) {
      try {
        p = root_.at(Json::json_pointer(p["$ref"].get<std::string>().substr(1)));
      } catch (const std::exception&) {
        throw GrammarError("a $ref in 'allOf' points at nothing in the schema");
      }
    }
    if (p.is_object() && p.contains("allOf")) p = merged_all_of(p, depth + 1);
    if (!p.is_object()) throw GrammarError("'allOf' entries must be schemas");
    for (auto it = p.begin(); it != p.end(); ++it) {
      if (it.key() == "properties" && out.contains("properties")) {
        for (auto q = it->begin(); q != it->end(); ++q) out["properties"][q.key()] = q.value();
      } else if (it.key() == "required" && out.contains("required")) {
        for (const auto& r : *it) out["required"].push_back(r);
      } else if (!out.contains(it.key())) {
        out[it.key()] = it.value();
      }
    }
  }
  return out;
}

int32_t SchemaCompiler::value(const Json& s, int depth) {
  if (depth > kMaxDepth) throw GrammarError("the schema nests too deeply");
  if (s.is_boolean()) {
    if (s.get<bool>()) return any_value();
    throw GrammarError("the schema 'false' matches nothing");
  }
  if (!s.is_object()) throw GrammarError("a schema must be an object or a boolean");
  check_keywords(s);
  if (s.contains("allOf")) return value(merged_all_of(s, depth), depth + 1);
  if (auto it = s.find("nullable"); it != s.end() && it->is_boolean() && it->get<bool>()) {
    Json inner = s;
    inner.erase("nullable");
    return g_.alt({value(inner, depth + 1), g_.literal("null")});
  }
  if (auto it = s.find("$ref"); it != s.end()) {
    if (!it->is_string()) throw GrammarError("'$ref' must be a string");
    return ref(it->get<std::string>(), depth);
  }
  if (auto it = s.find("const"); it != s.end()) return g_.literal(it->dump());
  if (auto it = s.find("enum"); it != s.end()) {
    if (!it->is_array() || it->empty()) throw GrammarError("'enum' must be a non-empty array");
    std::vector<int32_t> alts;
    for (const auto& v : *it) alts.push_back(g_.literal(v.dump()));
    return g_.alt(std::move(alts));
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (auto it = s.find(key); it != s.end()) {
      if (!it->is_array() || it->empty())
        throw GrammarError(std::string("'") + key + "' must be a non-empty array");
      std::vector<int32_t> alts;
      for (const auto& sub : *it) alts.push_back(value(sub, depth + 1));
      return g_.alt(std::move(alts));
    }
  }
  auto t = s.find("type");
  if (t == s.end()) {
    const std::string inferred = type_of(s);
    return inferred.empty() ? any_value() : typed(s, inferred, depth);
  }
  if (t->is_string()) return typed(s, t->get<std::string>(), depth);
  if (t->is_array() && !t->empty()) {
    std::vector<int32_t> alts;
    for (const auto& x : *t) {
      if (!x.is_string()) throw GrammarError("'type' must be a string or a list of strings");
      alts.push_back(typed(s, x.get<std::string>(), depth));
    }
    return g_.alt(std::move(alts));
  }
  throw GrammarError("'type' must be a string or a non-empty list of strings");
}

int32_t SchemaCompiler::typed(const Json& s, const std::string& type, int depth) {
  if (type == "object") return object(s, depth);
  if (type == "array") return array(s, depth);
  if (type == "string") return string(s);
  if (type == "integer") return integer(s);
  if (type == "number") return number(s);
  if (type == "boolean") return g_.alt({g_.literal("true"), g_.literal("false")});
  if (type == "null") return g_.literal("null");
  throw GrammarError("unknown schema type '" + type + "'");
}

int32_t SchemaCompiler::object(const Json& s, int depth) {
  const Json empty = Json::object();
  const Json* props = &empty;
  if (auto it = s.find("properties"); it != s.end()) {
    if (!it->is_object()) throw GrammarError("'properties' must be an object");
    props = &*it;
  }
  std::set<std::string> required;
  if (auto it = s.find("required"); it != s.end()) {
    if (!it->is_array()) throw GrammarError("'required' must be an array of names");
    for (const auto& r : *it) {
      if (!r.is_string()) throw GrammarError("'required' must be an array of names");
      required.insert(r.get<std::string>());
    }
  }
  // Additional properties: a schema for them, or none (absent or false).
  int32_t extra = -1;
  for (const char* key : {"additionalProperties", "unevaluatedProperties"}) {
    auto it = s.find(key);
    if (it == s.end() || extra >= 0) continue;
    if (it->is_boolean()) {
      if (it->get<bool>()) extra = g_.seq({string(Json::object()), ws_, g_.literal(":"), ws_, any_value()});
    } else {
      extra = g_.seq({string(Json::object()), ws_, g_.literal(":"), ws_, value(*it, depth + 1)});
    }
  }
  if (props->empty() && extra < 0 && !s.contains("additionalProperties") && !s.contains("properties"))
    extra =
        g_.seq({string(Json::object()), ws_, g_.literal(":"), ws_, any_value()});  // a bare {"type":"object"}

  std::vector<int32_t> prop_exprs;
  std::vector<bool> req;
  for (auto it = props->begin(); it != props->end(); ++it) {
    prop_exprs.push_back(
        g_.seq({g_.literal(Json(it.key()).dump()), ws_, g_.literal(":"), ws_, value(it.value(), depth + 1)}));
    req.push_back(required.count(it.key()) > 0);
  }
  // rest[i]: properties i.. after at least one was written; first[i]: the same when none was written yet.
  const size_t n = prop_exprs.size();
  int32_t rest = extra >= 0 ? g_.star(g_.seq({sep(), extra})) : g_.empty();
  int32_t first = extra >= 0 ? g_.optional(g_.seq({extra, g_.star(g_.seq({sep(), extra}))})) : g_.empty();
  for (size_t k = n; k-- > 0;) {
    const int32_t p = prop_exprs[k];
    const int32_t new_first = req[k] ? g_.seq({p, rest}) : g_.alt({g_.seq({p, rest}), first});
    rest = req[k] ? g_.seq({sep(), p, rest}) : g_.seq({g_.optional(g_.seq({sep(), p})), rest});
    first = new_first;
  }
  return g_.seq({g_.literal("{"), ws_, first, ws_, g_.literal("}")});
}

int32_t SchemaCompiler::array(const Json& s, int depth) {
  const int64_t min = get_int(s, "minItems", 0);
  const int64_t max = s.contains("maxItems") && !s["maxItems"].is_null() ? get_int(s, "maxItems", 0) : -1;
  if (max >= 0 && max < min) throw GrammarError("'maxItems' is below 'minItems'");
  if (min > 1000 || max > 1000) throw GrammarError("'minItems' / 'maxItems' above 1000 cannot be a grammar");
  std::vector<int32_t> prefix;
  if (auto it = s.find("prefixItems"); it != s.end()) {
    if (!it->is_array()) throw GrammarError("'prefixItems' must be an array of schemas");
    for (const auto& p : *it) prefix.push_back(value(p, depth + 1));
  }
  int32_t item = -1;  // -1: no further items
  if (auto it = s.find("items"); it != s.end()) {
    if (!(it->is_boolean() && !it->get<bool>())) item = value(*it, depth + 1);
  } else {
    item = any_value();
  }
  const auto k = static_cast<int64_t>(prefix.size());
  if (max >= 0 && max < k) prefix.resize(static_cast<size_t>(max));
  std::vector<int32_t> parts;
  // The prefix items present: min..k of them in order (each after a separator but the first).
  int32_t body;
  if (prefix.empty()) {
    if (item < 0 || max == 0) {
      body = g_.empty();
    } else {
      const int32_t tail =
          g_.repeat(g_.seq({sep(), item}), static_cast<int32_t>(std::max<int64_t>(min - 1, 0)),
                    static_cast<int32_t>(max < 0 ? -1 : max - 1));
      body = g_.seq({item, tail});
      if (min == 0) body = g_.optional(body);
    }
  } else {
    // Prefix items are all written (a simplification of "up to k"), then more items within the bounds.
    std::vector<int32_t> seq;
    for (size_t i = 0; i < prefix.size(); ++i) {
      if (i) seq.push_back(sep());
      seq.push_back(prefix[i]);
    }
    const auto kk = static_cast<int64_t>(prefix.size());
    if (item >= 0 && (max < 0 || max > kk)) {
      seq.push_back(g_.repeat(g_.seq({sep(), item}), static_cast<int32_t>(std::max<int64_t>(min - kk, 0)),
                              static_cast<int32_t>(max < 0 ? -1 : max - kk)));
    }
    body = g_.seq(std::move(seq));
  }
  return g_.seq({g_.literal("["), ws_, body, ws_, g_.literal("]")});
}

int32_t SchemaCompiler::string(const Json& s) {
  if (auto it = s.find("format"); it != s.end() && it->is_string()) {
    const auto& m = format_regexes();
    if (auto f = m.find(it->get<std::string>()); f != m.end())
      return quoted(parse_regex(g_, f->second, true));
  }
  if (auto it = s.find("pattern"); it != s.end()) {
    if (!it->is_string()) throw GrammarError("'pattern' must be a string");
    return quoted(parse_regex(g_, it->get<std::string>(), true));
  }
  const int64_t min = get_int(s, "minLength", 0);
  const int64_t max = s.contains("maxLength") && !s["maxLength"].is_null() ? get_int(s, "maxLength", 0) : -1;
  if (max >= 0 && max < min) throw GrammarError("'maxLength' is below 'minLength'");
  if (min > 10000 || max > 10000)
    throw GrammarError("'minLength' / 'maxLength' above 10000 cannot be a grammar");
  const int32_t ch = json_string_char(g_, {{0, 0x10FFFF}});
  return quoted(g_.repeat(ch, static_cast<int32_t>(min), static_cast<int32_t>(max)));
}

int32_t SchemaCompiler::integer(const Json& s) {
  const Bounds b = bounds(s);
  if (!b.has_lo && !b.has_hi) {
    const int32_t digit = g_.char_class({{'0', '9'}});
    return g_.seq({g_.optional(g_.literal("-")),
                   g_.alt({g_.literal("0"),
                           g_.seq({g_.char_class({{'1', '9'}}), g_.repeat(digit, 0, kMaxIntDigits - 1)})})});
  }
  auto [lo, hi] = integer_bounds(b);
  return int_range(g_, lo, hi);
}

int32_t SchemaCompiler::number(const Json& s) {
  const int32_t digit = g_.char_class({{'0', '9'}});
  const int32_t frac = g_.seq({g_.literal("."), g_.repeat(digit, 1, kMaxFracDigits)});
  const Bounds b = bounds(s);
  if (!b.has_lo && !b.has_hi) {
    const int32_t exp =
        g_.seq({g_.char_class({{'E', 'E'}, {'e', 'e'}}), g_.optional(g_.char_class({{'+', '+'}, {'-', '-'}})),
                g_.repeat(digit, 1, 3)});
    return g_.seq({integer(Json::object()), g_.optional(frac), g_.optional(exp)});
  }
  auto [lo, hi] = integer_bounds(b);
  std::vector<int32_t> alts = {int_range(g_, lo, hi)};
  // k.fff lies in [k, k + 1): allowed for 0 <= k <= hi - 1 and k >= lo.
  if (std::max<int64_t>(lo, 0) <= hi - 1)
    alts.push_back(g_.seq({uint_range(g_, std::max<int64_t>(lo, 0), hi - 1), frac}));
  // -m.fff lies in (-m - 1, -m]: allowed for m >= 1, -m <= hi and -m - 1 >= lo.
  const int64_t mlo = std::max<int64_t>(1, -hi), mhi = -lo - 1;
  if (mlo <= mhi) alts.push_back(g_.seq({g_.literal("-"), uint_range(g_, mlo, mhi), frac}));
  if (lo <= -1 && hi >= 0) alts.push_back(g_.seq({g_.literal("-0"), frac}));
  return g_.alt(std::move(alts));
}

Grammar grammar_from_json_schema(const Json& schema, SchemaOptions o) {
  Grammar g;
  SchemaCompiler c(g, schema, o);
  const int32_t root = g.new_rule("root");
  g.define(root, c.value(schema));
  g.set_root(root);
  return g;
}

Grammar grammar_any_json_object() {
  Grammar g;
  const Json empty = Json::object();
  SchemaCompiler c(g, empty, {});
  const int32_t root = g.new_rule("root");
  g.define(root, c.any_object());
  g.set_root(root);
  return g;
}

}  // namespace deltaflow::grammar
