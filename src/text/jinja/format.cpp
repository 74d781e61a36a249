// Python string formatting for templates: str.format (the sandbox's formatter: fields, attribute and
// index lookups through the sandbox, !r/!s conversions, the format-spec mini-language) and printf-style
// `%` (used by the `format` filter and `"..." % args`).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "text/jinja/interpreter.hpp"
#include "text/jinja/pystr.hpp"

namespace deltaflow::text::jinja {

namespace {

struct Spec {
  std::string fill = " ";
  char align = 0;  // < > ^ =
  char sign = '-';
  bool alt = false;
  bool zero = false;
  int64_t width = -1;
  char grouping = 0;
  int64_t precision = -1;
  char type = 0;
};

Spec parse_spec(Interpreter& in, const std::string& text) {
  Spec s;
  std::u32string t = py::decode(text);
  size_t i = 0;
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (t.size() >= 2 && is_align(t[1])) {
    s.fill.clear();
    py::append_utf8(s.fill, t[0]);
    s.align = static_cast<char>(t[1]);
    i = 2;
  } else if (!t.empty() && is_align(t[0])) {
    s.align = static_cast<char>(t[0]);
    i = 1;
  }
  if (i < t.size() && (t[i] == '+' || t[i] == '-' || t[i] == ' ')) s.sign = static_cast<char>(t[i++]);
  if (i < t.size() && t[i] == '#') {
    s.alt = true;
    ++i;
  }
  if (i < t.size() && t[i] == '0') {
    s.zero = true;
    ++i;
  }
  auto digits = [&](int64_t* out) {
    size_t st = i;
    int64_t v = 0;
    while (i < t.size() && t[i] >= '0' && t[i] <= '9') {
      v = v * 10 + (t[i] - '0');
      if (v > 1000000) in.fail("ValueError", "Too many decimal digits in format string");
      ++i;
    }
    if (i > st) *out = v;
    return i > st;
  };
  digits(&s.width);
  if (i < t.size() && (t[i] == ',' || t[i] == '_')) s.grouping = static_cast<char>(t[i++]);
  if (i < t.size() && t[i] == '.') {
    ++i;
    if (!digits(&s.precision)) in.fail("ValueError", "Format specifier missing precision");
  }
  if (i < t.size()) s.type = static_cast<char>(t[i++]);
  if (i < t.size()) in.fail("ValueError", "Invalid format specifier");
  if (s.zero && !s.align) {
    s.fill = "0";
    s.align = '=';
  }
  return s;
}

std::string group_digits(const std::string& digits, char sep, int every) {
  std::string out;
  int n = static_cast<int>(digits.size());
  for (int i = 0; i < n; ++i) {
    if (i && (n - i) % every == 0) out.push_back(sep);
    out.push_back(digits[static_cast<size_t>(i)]);
  }
  return out;
}

std::string pad(Interpreter& in, const std::string& sign_prefix, const std::string& body, const Spec& s,
                char def_align) {
  in.check_size(static_cast<size_t>(std::max<int64_t>(0, s.width)) * 4 + body.size());
  auto len = static_cast<int64_t>(py::length(sign_prefix) + py::length(body));
  char align = s.align ? s.align : def_align;
  if (s.width <= len) return sign_prefix + body;
  int64_t n = s.width - len;
  auto rep = [&](int64_t k) {
    std::string o;
    for (int64_t j = 0; j < k; ++j) o += s.fill;
    return o;
  };
  switch (align) {
    case '<':
      return sign_prefix + body + rep(n);
    case '^':
      return rep(n / 2) + sign_prefix + body + rep(n - n / 2);
    case '=':
      return sign_prefix + rep(n) + body;
    default:
      return rep(n) + sign_prefix + body;
  }
}

std::string format_float_body(double x, char type, int64_t precision, bool alt) {
  char buf[512];
  int p = static_cast<int>(std::min<int64_t>(precision, 400));
  if (std::isinf(x)) return (type >= 'A' && type <= 'Z') ? "INF" : "inf";
  if (std::isnan(x)) return (type >= 'A' && type <= 'Z') ? "NAN" : "nan";
  switch (type) {
    case 'f':
    case 'F':
      std::snprintf(buf, sizeof buf, alt ? "%#.*f" : "%.*f", p < 0 ? 6 : p, x);
      return buf;
    case 'e':
    case 'E':
      std::snprintf(buf, sizeof buf, type == 'e' ? (alt ? "%#.*e" : "%.*e") : (alt ? "%#.*E" : "%.*E"),
                    p < 0 ? 6 : p, x);
      return buf;
    case 'g':
    case 'G':
    case 'n':
      std::snprintf(buf, sizeof buf, type == 'G' ? (alt ? "%#.*G" : "%.*G") : (alt ? "%#.*g" : "%.*g"),
                    p < 0 ? 6 : (p == 0 ? 1 : p), x);
      return buf;
    case '%':
      std::snprintf(buf, sizeof buf, "%.*f%%", p < 0 ? 6 : p, x * 100);
      return buf;
    default: {
      if (p < 0) return py::float_repr(x);
      std::snprintf(buf, sizeof buf, "%.*g", p == 0 ? 1 : p, x);
      std::string r = buf;
      if (r.find_first_of(".e") == std::string::npos) r += ".0";
      return r;
    }
  }
}

std::string apply_spec(Interpreter& in, const Value& v, const Spec& s, const std::string& raw) {
  if (!v.is_string() && !v.is_number()) {
    if (!raw.empty()) {
      in.ensure_defined(v);
      in.fail("TypeError", "unsupported format string passed to " + type_name(v) + ".__format__");
    }
    return to_str(v);
  }
  if (v.is_string()) {
    std::string body = to_str(v);
    if (s.type && s.type != 's')
      in.fail("ValueError", std::string("Unknown format code '") + s.type + "' for object of type 'str'");
    if (s.sign != '-') in.fail("ValueError", "Sign not allowed in string format specifier");
    if (s.align == '=') in.fail("ValueError", "'=' alignment not allowed in string format specifier");
    if (s.precision >= 0) {
      std::u32string cps = py::decode(body);
      if (static_cast<int64_t>(cps.size()) > s.precision)
        body = py::encode(cps.substr(0, static_cast<size_t>(s.precision)));
    }
    return pad(in, "", body, s, '<');
  }
  if (v.is_bool() && raw.empty()) return to_str(v);
  std::string sign;
  std::string body;
  bool int_type = s.type == 0 || s.type == 'd' || s.type == 'b' || s.type == 'o' || s.type == 'x' ||
                  s.type == 'X' || s.type == 'c' || s.type == 'n';
  if (!v.is_float() && int_type) {
    int64_t i = v.int_value();
    if (s.precision >= 0) in.fail("ValueError", "Precision not allowed in integer format specifier");
    if (s.type == 'c') {
      std::string ch;
      py::append_utf8(ch, static_cast<char32_t>(i));
      return pad(in, "", ch, s, '<');
    }
    uint64_t mag = i < 0 ? static_cast<uint64_t>(0) - static_cast<uint64_t>(i) : static_cast<uint64_t>(i);
    int base = s.type == 'b' ? 2 : s.type == 'o' ? 8 : (s.type == 'x' || s.type == 'X') ? 16 : 10;
    std::string digits;
    do {
      int d = static_cast<int>(mag % static_cast<uint64_t>(base));
      digits.insert(digits.begin(),
                    static_cast<char>(d < 10 ? '0' + d : (s.type == 'X' ? 'A' : 'a') + d - 10));
      mag /= static_cast<uint64_t>(base);
    } while (mag);
    if (s.grouping) digits = group_digits(digits, s.grouping, base == 10 ? 3 : 4);
    if (i < 0)
      sign = "-";
    else if (s.sign == '+')
      sign = "+";
    else if (s.sign == ' ')
      sign = " ";
    if (s.alt && base != 10) sign += base == 2 ? "0b" : base == 8 ? "0o" : (s.type == 'X' ? "0X" : "0x");
    return pad(in, sign, digits, s, '>');
  }
  if (!(s.type == 0 || s.type == 'e' || s.type == 'E' || s.type == 'f' || s.type == 'F' || s.type == 'g' ||
        s.type == 'G' || s.type == 'n' || s.type == '%'))
    in.fail("ValueError", std::string("Unknown format code '") + s.type + "' for object of type 'float'");
  double x = v.number_as_double();
  char type = s.type;
  if (!v.is_float() && type == 0) type = 'd';
  bool neg = std::signbit(x) && !std::isnan(x);
  body = format_float_body(std::fabs(x), type == 'd' ? 'g' : type, s.precision, s.alt);
  if (s.grouping) {
    size_t end = body.find_first_of(".eE%");
    std::string ip = body.substr(0, end == std::string::npos ? body.size() : end);
    body = group_digits(ip, s.grouping, 3) + (end == std::string::npos ? "" : body.substr(end));
  }
  if (neg)
    sign = "-";
  else if (s.sign == '+')
    sign = "+";
  else if (s.sign == ' ')
    sign = " ";
  return pad(in, sign, body, s, '>');
}

}  // namespace

std::string format_spec(Interpreter& in, const Value& v, const std::string& spec) {
  return apply_spec(in, v, parse_spec(in, spec), spec);
}

std::string python_format(Interpreter& in, const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  int numbering = 0;  // 0 unknown, 1 automatic, 2 manual
  size_t i = 0, n = fmt.size();
  auto field_value = [&](const std::string& field) -> Value {
    size_t k = 0;
    while (k < field.size() && field[k] != '.' && field[k] != '[') ++k;
    std::string first = field.substr(0, k);
    Value v;
    if (first.empty()) {
      if (numbering == 2)
        in.fail("ValueError", "cannot switch from manual field specification to automatic field numbering");
      numbering = 1;
      if (auto_index >= args.args.size())
        in.fail("IndexError", "Replacement index " + std::to_string(auto_index) +
                                  " out of range for positional args tuple");
      v = args.args[auto_index++];
    } else if (std::all_of(first.begin(), first.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      if (numbering == 1)
        in.fail("ValueError", "cannot switch from automatic field numbering to manual field specification");
      numbering = 2;
      size_t idx = std::stoul(first);
      if (idx >= args.args.size())
        in.fail("IndexError", "Replacement index " + first + " out of range for positional args tuple");
      v = args.args[idx];
    } else {
      bool found = false;
      for (const auto& [kk, vv] : args.kwargs)
        if (kk == first) {
          v = vv;
          found = true;
        }
      if (!found) in.fail("KeyError", py::repr(first));
    }
    while (k < field.size()) {
      if (field[k] == '.') {
        size_t e = k + 1;
        while (e < field.size() && field[e] != '.' && field[e] != '[') ++e;
        v = in.getattr(v, field.substr(k + 1, e - k - 1));
        k = e;
      } else {
        size_t e = field.find(']', k);
        if (e == std::string::npos) in.fail("ValueError", "Missing ']' in format string");
        std::string key = field.substr(k + 1, e - k - 1);
        bool digits =
            !key.empty() && std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
        v = in.getitem(v, digits ? Value::integer(std::stoll(key)) : Value::string(key));
        k = e + 1;
      }
    }
    return v;
  };
  while (i < n) {
    char c = fmt[i];
    if (c == '{') {
      if (i + 1 < n && fmt[i + 1] == '{') {
        out.push_back('{');
        i += 2;
        continue;
      }
      // Find the matching '}' (one level of nesting in the spec).
      size_t depth = 1, j = i + 1;
      while (j < n && depth) {
        if (fmt[j] == '{')
          ++depth;
        else if (fmt[j] == '}')
          --depth;
        if (depth) ++j;
      }
      if (j >= n) in.fail("ValueError", "expected '}' before end of string");
      std::string inner = fmt.substr(i + 1, j - i - 1);
      size_t colon = std::string::npos, bang = std::string::npos;
      for (size_t k = 0, br = 0; k < inner.size(); ++k) {
        if (inner[k] == '[')
          ++br;
        else if (inner[k] == ']' && br)
          --br;
        else if (!br && inner[k] == '!' && bang == std::string::npos && colon == std::string::npos)
          bang = k;
        else if (!br && inner[k] == ':' && colon == std::string::npos) {
          colon = k;
          break;
        }
      }
      std::string field = inner.substr(0, std::min(bang, colon));
      std::string conv =
          bang != std::string::npos
              ? inner.substr(bang + 1, (colon == std::string::npos ? inner.size() : colon) - bang - 1)
              : "";
      std::string spec = colon != std::string::npos ? inner.substr(colon + 1) : "";
      if (spec.find('{') != std::string::npos) {
        CallArgs sub = args;
        spec = python_format(in, spec, sub);
      }
      Value v = field_value(field);
      if (conv == "r" || conv == "a")
        v = Value::string(to_repr(v));
      else if (conv == "s")
        v = Value::string(to_str(v));
      else if (!conv.empty())
        in.fail("ValueError", "Unknown conversion specifier " + conv);
      out += format_spec(in, v, spec);
      in.check_size(out.size());
      i = j + 1;
      continue;
    }
    if (c == '}') {
      if (i + 1 < n && fmt[i + 1] == '}') {
        out.push_back('}');
        i += 2;
        continue;
      }
      in.fail("ValueError", "Single '}' encountered in format string");
    }
    out.push_back(c);
    ++i;
  }
  return out;
}

std::string percent_format(Interpreter& in, const std::string& fmt, const Value& args) {
  std::vector<Value> positional;
  const Value* mapping = nullptr;
  if (args.is_tuple())
    positional = args.items();
  else {
    positional.push_back(args);
    if (args.is_dict()) mapping = &args;
  }
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  size_t i = 0, n = fmt.size();
  auto take = [&]() -> Value {
    if (next >= positional.size()) in.fail("TypeError", "not enough arguments for format string");
    return positional[next++];
  };
  while (i < n) {
    char c = fmt[i];
    if (c != '%') {
      out.push_back(c);
      ++i;
      continue;
    }
    ++i;
    if (i >= n) in.fail("ValueError", "incomplete format");
    Value value;
    bool have_value = false;
    if (fmt[i] == '(') {
      size_t e = fmt.find(')', i);
      if (e == std::string::npos) in.fail("ValueError", "incomplete format key");
      if (!mapping) in.fail("TypeError", "format requires a mapping");
      std::string key = fmt.substr(i + 1, e - i - 1);
      const Value* v = mapping->dict_data().get_str(key);
      if (!v) in.fail("KeyError", py::repr(key));
      value = *v;
      have_value = true;
      used_mapping = true;
      i = e + 1;
    }
    Spec s;
    bool left = false;
    while (i < n && (fmt[i] == '-' || fmt[i] == '+' || fmt[i] == ' ' || fmt[i] == '#' || fmt[i] == '0')) {
      if (fmt[i] == '-')
        left = true;
      else if (fmt[i] == '+')
        s.sign = '+';
      else if (fmt[i] == ' ' && s.sign != '+')
        s.sign = ' ';
      else if (fmt[i] == '#')
        s.alt = true;
      else
        s.zero = true;
      ++i;
    }
    auto number = [&](int64_t* out_v) {
      if (i < n && fmt[i] == '*') {
        *out_v = to_index(in, take(), "");
        ++i;
        return;
      }
      int64_t v = -1;
      while (i < n && fmt[i] >= '0' && fmt[i] <= '9') {
        v = (v < 0 ? 0 : v) * 10 + (fmt[i] - '0');
        if (v > 1000000) in.fail("ValueError", "width too big");
        ++i;
      }
      if (v >= 0) *out_v = v;
    };
    number(&s.width);
    if (i < n && fmt[i] == '.') {
      ++i;
      s.precision = 0;
      number(&s.precision);
    }
    while (i < n && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= n) in.fail("ValueError", "incomplete format");
    char type = fmt[i++];
    if (type == '%') {
      out.push_back('%');
      continue;
    }
    if (!have_value) value = take();
    if (left)
      s.align = '<';
    else if (s.zero && type != 's' && type != 'r' && type != 'a' && type != 'c') {
      s.fill = "0";
      s.align = '=';
    }
    std::string piece;
    switch (type) {
      case 's':
      case 'r':
      case 'a': {
        Value str = Value::string(type == 's' ? to_str(value) : to_repr(value));
        Spec t = s;
        t.sign = '-';
        if (t.align == '=') t.align = 0;
        piece = apply_spec(in, str, t, "s");
        break;
      }
      case 'd':
      case 'i':
      case 'u': {
        in.ensure_defined(value);
        if (!value.is_number())
          in.fail("TypeError",
                  std::string("%") + type + " format: a real number is required, not " + type_name(value));
        Value iv = value.is_float() ? Value::integer(static_cast<int64_t>(std::trunc(value.float_value())))
                                    : Value::integer(value.int_value());
        Spec t = s;
        t.type = 'd';
        int64_t prec = t.precision;
        t.precision = -1;
        std::string digits = std::to_string(iv.int_value() < 0 ? -iv.int_value() : iv.int_value());
        if (prec > static_cast<int64_t>(digits.size())) {
          std::string sign = iv.int_value() < 0 ? "-" : (t.sign == '+' ? "+" : t.sign == ' ' ? " " : "");
          piece = pad(in, sign, std::string(static_cast<size_t>(prec) - digits.size(), '0') + digits, t, '>');
        } else {
          piece = apply_spec(in, iv, t, "d");
        }
        break;
      }
      case 'x':
      case 'X':
      case 'o': {
        in.ensure_defined(value);
        if (!(value.is_int() || value.is_bool()))
          in.fail("TypeError",
                  std::string("%") + type + " format: an integer is required, not " + type_name(value));
        Spec t = s;
        t.type = type;
        t.precision = -1;
        piece = apply_spec(in, Value::integer(value.int_value()), t, "x");
        break;
      }
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G': {
        in.ensure_defined(value);
        if (!value.is_number())
          in.fail("TypeError", std::string("must be real number, not ") + type_name(value));
        Spec t = s;
        t.type = type;
        if (t.precision < 0) t.precision = 6;
        piece = apply_spec(in, Value::floating(value.number_as_double()), t, "f");
        break;
      }
      case 'c': {
        std::string ch;
        if (value.is_string() && py::length(value.str()) == 1)
          ch = value.str();
        else if (value.is_int())
          py::append_utf8(ch, static_cast<char32_t>(value.int_value()));
        else
          in.fail("TypeError", "%c requires int or char");
        Spec t = s;
        piece = pad(in, "", ch, t, '>');
        break;
      }
      default:
        in.fail("ValueError", std::string("unsupported format character '") + type + "'");
    }
    out += piece;
    in.check_size(out.size());
  }
  // Python only complains about unused arguments when they cannot be a mapping (list, dict, range and
  // Undefined have __getitem__, so `"abc" % [1]` is fine).
  bool subscriptable = !args.is_tuple() && !args.is_string() &&
                       (args.is_list() || args.is_dict() || args.is_undefined() ||
                        (args.is_iterable_object() && args.seq_data().kind == SeqKind::kRange));
  if (!used_mapping && next < positional.size() && !subscriptable)
    in.fail("TypeError", "not all arguments converted during string formatting");
  return out;
}

}  // namespace deltaflow::text::jinja
