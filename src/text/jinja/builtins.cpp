// jinja2's built-in filters, tests and globals (jinja2/filters.py, tests.py, defaults.py), HF's additions
// (tojson with json.dumps options, raise_exception, strftime_now), and the Python methods of str, dict and
// list that templates call. Each follows the Python source it mirrors; comments note the quirks.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <set>

#include "text/jinja/interpreter.hpp"
#include "text/jinja/pystr.hpp"

namespace deltaflow::text::jinja {

namespace {

bool is_int_like(const Value& v) {
  return v.is_int() || v.is_bool();
}

// soft_str: strings (and Markup) stay as they are, anything else becomes str(value).
Value soft_str(const Value& v) {
  return v.is_string() ? v : Value::string(to_str(v));
}

std::string require_str(Interpreter& in, const Value& v, const char* what) {
  if (v.is_string()) return v.str();
  in.ensure_defined(v);
  in.fail("TypeError", std::string(what) + " must be str, not " + type_name(v));
}

Value str_result(Interpreter& in, std::string s, bool markup) {
  in.check_size(s.size());
  return Value::string(std::move(s)).with_markup(markup);
}

// --- attribute getters (jinja2 make_attrgetter / make_multi_attrgetter) ---------------------------------

std::vector<Value> attribute_parts(const Value& attribute) {
  std::vector<Value> parts;
  if (attribute.is_none() || attribute.is_undefined()) return parts;
  if (!attribute.is_string()) return {attribute};
  for (const std::string& p : py::split_sep(attribute.str(), ".", -1, false)) {
    bool digits = !p.empty() && std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; });
    parts.push_back(digits ? Value::integer(std::stoll(p)) : Value::string(p));
  }
  return parts;
}

Value ignore_case(const Value& v) {
  return v.is_string() ? Value::string(py::lower(v.str())) : v;
}

struct AttrGetter {
  std::vector<Value> parts;
  bool lower = false;
  Value def;  // Undefined: no default
  Value operator()(Interpreter& in, Value item) const {
    for (const auto& p : parts) {
      item = in.getitem(item, p);
      if (!def.is_undefined() && !def.is_none() && item.is_undefined()) item = def;
    }
    return lower ? ignore_case(item) : item;
  }
};

AttrGetter attrgetter(const Value& attribute, bool lower, Value def = Value()) {
  return AttrGetter{attribute_parts(attribute), lower, std::move(def)};
}

// Sort key for sort(attribute="a,b"): a list of keys compared lexicographically.
std::vector<AttrGetter> multi_attrgetter(const Value& attribute, bool lower) {
  std::vector<AttrGetter> out;
  if (attribute.is_string()) {
    for (const std::string& a : py::split_sep(attribute.str(), ",", -1, false))
      out.push_back(attrgetter(Value::string(a), lower));
  } else {
    out.push_back(attrgetter(attribute, lower));
  }
  return out;
}

// --- numbers from strings (Python int() and float()) ----------------------------------------------------

bool parse_py_int(const std::string& text, int base, int64_t* out) {
  std::string s = py::strip(text, nullptr, true, true);
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  auto lower = [](char c) { return static_cast<char>(tolower(static_cast<unsigned char>(c))); };
  if (base == 0 || base == 16 || base == 8 || base == 2) {
    if (i + 1 < s.size() && s[i] == '0') {
      char p = lower(s[i + 1]);
      int pb = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
      if (pb && (base == 0 || base == pb)) {
        base = pb;
        i += 2;
        if (i < s.size() && s[i] == '_') ++i;
      }
    }
    if (base == 0) {
      base = 10;
      // Python rejects "010" in base 0.
      if (i + 1 < s.size() && s[i] == '0' && s.find_first_not_of("0_", i) != std::string::npos) return false;
    }
  }
  if (base < 2 || base > 36 || i >= s.size()) return false;
  int64_t v = 0;
  bool prev_digit = false;
  for (; i < s.size(); ++i) {
    char c = lower(s[i]);
    if (c == '_') {
      if (!prev_digit || i + 1 >= s.size()) return false;
      prev_digit = false;
      continue;
    }
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'z') ? c - 'a' + 10 : 99;
    if (d >= base) return false;
    if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, d, &v)) return false;
    prev_digit = true;
  }
  if (!prev_digit) return false;
  *out = neg ? -v : v;
  return true;
}

bool parse_py_float(const std::string& text, double* out) {
  std::string s = py::strip(text, nullptr, true, true);
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      bool ok = i > 0 && i + 1 < s.size() && isdigit(static_cast<unsigned char>(s[i - 1])) &&
                isdigit(static_cast<unsigned char>(s[i + 1]));
      if (!ok) return false;
      continue;
    }
    clean.push_back(s[i]);
  }
  if (clean.empty()) return false;
  std::string l = py::lower(clean);
  std::string body = (l[0] == '+' || l[0] == '-') ? l.substr(1) : l;
  if (body == "inf" || body == "infinity" || body == "nan") {
    double v = body == "nan" ? NAN : INFINITY;
    *out = l[0] == '-' ? -v : v;
    return true;
  }
  for (char c : body)
    if (!(isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == '+' || c == '-'))
      return false;
  char* end = nullptr;
  *out = std::strtod(clean.c_str(), &end);
  return end && *end == '\0';
}

// jinja2 filters that are Python generators return one: lazy (errors surface when it is consumed),
// single-use, always true, without len().
Value make_generator(const char* name, std::function<std::vector<Value>(Interpreter&)> producer) {
  auto sd = std::make_shared<SeqData>();
  sd->kind = SeqKind::kGenerator;
  sd->name = name;
  sd->producer = std::move(producer);
  return Value::iterable(std::move(sd));
}

Value make_iterator(const std::string& type, std::vector<Value> items) {
  auto sd = std::make_shared<SeqData>();
  sd->kind = SeqKind::kIterator;
  sd->name = type;
  sd->items = std::move(items);
  return Value::iterable(std::move(sd));
}

Value make_view(SeqKind kind, std::vector<Value> items) {
  auto sd = std::make_shared<SeqData>();
  sd->kind = kind;
  sd->items = std::move(items);
  return Value::iterable(std::move(sd));
}

bool is_lazy(const Value& v) {
  return v.is_iterable_object() &&
         (v.seq_data().kind == SeqKind::kGenerator || v.seq_data().kind == SeqKind::kIterator);
}

// --- filters -----------------------------------------------------------------------------------------

Value f_abs(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "abs", a, {});
  in.ensure_defined(v);
  if (v.is_float()) return Value::floating(std::fabs(v.float_value()));
  if (is_int_like(v)) {
    if (v.int_value() == INT64_MIN) in.fail("OverflowError", "integer result does not fit in 64 bits");
    return Value::integer(v.int_value() < 0 ? -v.int_value() : v.int_value());
  }
  in.fail("TypeError", "bad operand type for abs(): " + py::repr(type_name(v)));
}

Value f_attr(Interpreter& in, const Value& v, CallArgs& a) {
  auto p = bind_args(in, "do_attr", a, {{"name", true}});
  std::string name = require_str(in, p[0], "attribute name");
  Value out;
  if (v.is_object() && v.object_data().get_attr(in, name, &out)) return out;
  if (!v.is_undefined() && builtin_attribute(in, v, name, &out)) return out;
  return in.undefined_attr(v, p[0]);
}

Value batch_eager(Interpreter& in, const Value& v, CallArgs& a) {
  auto p = bind_args(in, "do_batch", a, {{"linecount", true}, {"fill_with", false, Value::none()}});
  int64_t n = to_index(in, p[0], "");
  std::vector<Value> out, tmp;
  for (auto& item : in.iterate(v)) {
    if (static_cast<int64_t>(tmp.size()) == n) {
      out.push_back(Value::list(std::move(tmp)));
      tmp.clear();
    }
    tmp.push_back(item);
  }
  if (!tmp.empty()) {
    if (!p[1].is_none())
      while (static_cast<int64_t>(tmp.size()) < n) tmp.push_back(p[1]);
    out.push_back(Value::list(std::move(tmp)));
  }
  return Value::list(std::move(out));
}

Value f_batch(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "do_batch", a, {{"linecount", true}, {"fill_with", false, Value::none()}});
  return make_generator("do_batch", [v, a](Interpreter& i) mutable { return batch_eager(i, v, a).items(); });
}

Value f_capitalize(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "do_capitalize", a, {});
  Value s = soft_str(v);
  return str_result(in, py::capitalize(s.str()), s.is_markup());
}

std::string center_str(const std::string& s, int64_t width, const std::string& fill) {
  int64_t len = static_cast<int64_t>(py::length(s));
  if (width <= len) return s;
  int64_t marg = width - len;
  int64_t left = marg / 2 + (marg & width & 1);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < marg - left; ++i) out += fill;
  return out;
}

Value f_center(Interpreter& in, const Value& v, CallArgs& a) {
  auto p = bind_args(in, "do_center", a, {{"width", false, Value::integer(80)}});
  Value s = soft_str(v);
  int64_t w = to_index(in, p[0], "");
  in.check_size(static_cast<size_t>(std::max<int64_t>(0, w)) * 4);
  return str_result(in, center_str(s.str(), w, " "), s.is_markup());
}

Value f_length(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "len", a, {});
  return Value::integer(in.length(v));
}

Value f_default(Interpreter& in, const Value& v, CallArgs& a) {
  auto p =
      bind_args(in, "do_default", a,
                {{"default_value", false, Value::string("")}, {"boolean", false, Value::boolean(false)}});
  if (v.is_undefined() || (truthy(p[1]) && !truthy(v))) return p[0];
  return v;
}

Value f_dictsort(Interpreter& in, const Value& v, CallArgs& a) {
  auto p = bind_args(in, "do_dictsort", a,
                     {{"case_sensitive", false, Value::boolean(false)},
                      {"by", false, Value::string("key")},
                      {"reverse", false, Value::boolean(false)}});
  int pos;
  if (p[1].is_string() && p[1].str() == "key")
    pos = 0;
  else if (p[1].is_string() && p[1].str() == "value")
    pos = 1;
  else
    in.fail("FilterArgumentError", "You can only sort by either \"key\" or \"value\"");
  in.ensure_defined(v);
  if (!v.is_dict()) in.fail("AttributeError", py::repr(type_name(v)) + " object has no attribute 'items'");
  std::vector<Value> items;
  for (const auto& [k, val] : v.dict_data().entries) items.push_back(Value::tuple({k, val}));
  bool cs = truthy(p[0]), rev = truthy(p[2]);
  auto key = [&](const Value& t) { return cs ? t.items()[pos] : ignore_case(t.items()[pos]); };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return rev ? in.less(key(y), key(x)) : in.less(key(x), key(y));
  });
  return Value::list(std::move(items));
}

Value f_escape(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "escape", a, {});
  if (v.is_markup()) return v;
  return Value::markup(in.escape_html(to_str(v)));
}

Value f_forceescape(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "do_forceescape", a, {});
  return Value::markup(in.escape_html(to_str(v)));
}

Value f_first(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "do_first", a, {});
  auto items = in.iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "do_last", a, {});
  if (is_lazy(v)) in.fail("TypeError", py::repr(type_name(v)) + " object is not reversible");
  auto items = in.iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value to_float_value(Interpreter& in, const Value& v, bool* ok) {
  *ok = true;
  if (v.is_float()) return v;
  if (is_int_like(v)) return Value::floating(static_cast<double>(v.int_value()));
  if (v.is_string()) {
    double d;
    if (parse_py_float(v.str(), &d)) return Value::floating(d);
  }
  in.ensure_defined(v);
  *ok = false;
  return Value();
}

Value f_float(Interpreter& in, const Value& v, CallArgs& a) {
  auto p = bind_args(in, "do_float", a, {{"default", false, Value::floating(0.0)}});
  bool ok;
  Value r = to_float_value(in, v, &ok);
  return ok ? r : p[0];
}

Value f_int(Interpreter& in, const Value& v, CallArgs& a) {
  auto p = bind_args(in, "do_int", a,
                     {{"default", false, Value::integer(0)}, {"base", false, Value::integer(10)}});
  in.ensure_defined(v);
  if (is_int_like(v)) return Value::integer(v.int_value());
  if (v.is_string()) {
    int64_t r;
    if (parse_py_int(v.str(), static_cast<int>(to_index(in, p[1], "")), &r)) return Value::integer(r);
  }
  // jinja2's fallback: int(float(value)), so "42.23"|int gives 42.
  bool ok;
  Value f = to_float_value(in, v, &ok);
  if (ok && std::isfinite(f.float_value()) && std::fabs(f.float_value()) < 9.2e18)
    return Value::integer(static_cast<int64_t>(f.float_value()));
  return p[0];
}

Value f_format(Interpreter& in, const Value& v, CallArgs& a) {
  if (!a.args.empty() && !a.kwargs.empty())
    in.fail("FilterArgumentError", "can't handle positional and keyword arguments at the same time");
  Value s = soft_str(v);
  Value args;
  if (!a.kwargs.empty()) {
    args = Value::dict();
    for (const auto& [k, val] : a.kwargs) args.dict_data().set(Value::string(k), val);
  } else {
    args = Value::tuple(a.args);
  }
  return str_result(in, percent_format(in, s.str(), args), s.is_markup());
}

Value f_groupby(Interpreter& in, const Value& v, CallArgs& a) {
  auto p = bind_args(in, "do_groupby", a,
                     {{"attribute", true},
                      {"default", false, Value::none()},
                      {"case_sensitive", false, Value::boolean(false)}});
  bool cs = truthy(p[2]);
  AttrGetter key = attrgetter(p[0], !cs, p[1]);
  AttrGetter real = attrgetter(p[0], false, p[1]);
  std::vector<Value> items = in.iterate(v);
  std::vector<Value> keys;
  for (auto& it : items) keys.push_back(key(in, it));
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return in.less(keys[x], keys[y]); });
  std::vector<Value> out;
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    std::vector<Value> group;
    while (j < order.size() && equals(keys[order[j]], keys[order[i]])) group.push_back(items[order[j++]]);
    Value grouper = cs ? keys[order[i]] : real(in, group.front());
    Value t = Value::tuple({grouper, Value::list(std::move(group))});
    t.list_data().is_group = true;
    out.push_back(t);
    i = j;
  }
  return Value::list(std::move(out));
}

Value f_indent(Interpreter& in, const Value& v, CallArgs& a) {
  auto p = bind_args(in, "do_indent", a,
                     {{"width", false, Value::integer(4)},
                      {"first", false, Value::boolean(false)},
                      {"blank", false, Value::boolean(false)}});
  std::string indention;
  if (p[0].is_string()) {
    indention = p[0].str();
  } else {
    int64_t w = to_index(in, p[0], "");
    in.check_size(static_cast<size_t>(std::max<int64_t>(0, w)));
    indention.assign(static_cast<size_t>(std::max<int64_t>(0, w)), ' ');
  }
  if (!v.is_string()) {
    // jinja2 does `s += "\n"` first, which only strings survive.
    in.ensure_defined(v);
    if (v.is_list() && !v.is_tuple())
      in.fail("AttributeError", "'list' object has no attribute 'splitlines'");
    if (v.is_tuple()) in.fail("TypeError", "can only concatenate tuple (not \"str\") to tuple");
    in.fail("TypeError", "unsupported operand type(s) for +=: " + py::repr(type_name(v)) + " and 'str'");
  }
  bool markup = v.is_markup();
  std::string s = v.str() + "\n";  // the quirk jinja2 needs for splitlines
  std::vector<std::string> lines = py::splitlines(s, false);
  std::string rv;
  if (truthy(p[2])) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + indention;
      rv += lines[i];
      in.check_size(rv.size());
    }
  } else {
    rv = lines.empty() ? std::string() : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += indention;
      rv += lines[i];
      in.check_size(rv.size());
    }
  }
  if (truthy(p[1])) rv = indention + rv;
  return str_result(in, std::move(rv), markup);
}

Value f_join(Interpreter& in, const Value& v, CallArgs& a) {
  auto p =
      bind_args(in, "do_join", a, {{"d", false, Value::string("")}, {"attribute", false, Value::none()}});
  std::string sep = to_str(p[0]);
  std::vector<Value> items = in.iterate(v);
  AttrGetter get = attrgetter(p[1], false);
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += to_str(p[1].is_none() ? items[i] : get(in, items[i]));
    in.check_size(out.size());
  }
  return Value::string(std::move(out));
}

Value f_list(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "do_list", a, {});
  return Value::list(in.iterate(v));
}

Value f_lower(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "do_lower", a, {});
  Value s = soft_str(v);
  return str_result(in, py::lower(s.str()), s.is_markup());
}

Value f_upper(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "do_upper", a, {});
  Value s = soft_str(v);
  return str_result(in, py::upper(s.str()), s.is_markup());
}

Value items_eager(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "do_items", a, {});
  if (v.is_undefined()) return Value::list();
  if (!v.is_dict()) in.fail("TypeError", "Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, val] : v.dict_data().entries) out.push_back(Value::tuple({k, val}));
  return Value::list(std::move(out));
}

Value f_items(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "do_items", a, {});
  return make_generator("do_items", [v, a](Interpreter& i) mutable { return items_eager(i, v, a).items(); });
}

Value map_eager(Interpreter& in, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  if (!truthy(v)) return Value::list();
  std::vector<Value> items = in.iterate(v);
  bool has_attr = false;
  for (const auto& kw : a.kwargs)
    if (kw.first == "attribute") has_attr = true;
  if (a.args.empty() && has_attr) {
    Value attribute, def = Value::none();
    for (const auto& [k, val] : a.kwargs) {
      if (k == "attribute")
        attribute = val;
      else if (k == "default")
        def = val;
      else
        in.fail("FilterArgumentError", "Unexpected keyword argument " + py::repr(k));
    }
    AttrGetter get = attrgetter(attribute, false, def);
    for (auto& item : items) out.push_back(get(in, item));
    return Value::list(std::move(out));
  }
  if (a.args.empty()) in.fail("FilterArgumentError", "map requires a filter argument");
  std::string name = require_str(in, a.args[0], "filter name");
  CallArgs rest;
  rest.args.assign(a.args.begin() + 1, a.args.end());
  rest.kwargs = a.kwargs;
  for (auto& item : items) {
    CallArgs copy = rest;
    out.push_back(in.call_filter(name, item, copy));
  }
  return Value::list(std::move(out));
}

Value f_map(Interpreter&, const Value& v, CallArgs& a) {
  return make_generator("sync_do_map", [v, a](Interpreter& i) mutable { return map_eager(i, v, a).items(); });
}

Value select_eager(Interpreter& in, const Value& v, CallArgs& a, bool select, bool lookup_attr) {
  if (!truthy(v)) return Value::list();
  std::vector<Value> items = in.iterate(v);
  size_t off = 0;
  AttrGetter get;
  if (lookup_attr) {
    if (a.args.empty()) in.fail("FilterArgumentError", "Missing parameter for attribute name");
    get = attrgetter(a.args[0], false);
    off = 1;
  }
  bool has_test = a.args.size() > off;
  std::string test_name = has_test ? require_str(in, a.args[off], "test name") : "";
  CallArgs rest;
  if (has_test) rest.args.assign(a.args.begin() + static_cast<long>(off) + 1, a.args.end());
  rest.kwargs = a.kwargs;
  std::vector<Value> out;
  for (auto& item : items) {
    Value x = lookup_attr ? get(in, item) : item;
    bool r;
    if (has_test) {
      CallArgs copy = rest;
      r = in.call_test(test_name, x, copy);
    } else {
      r = truthy(x);
    }
    if (r == select) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value select_or_reject(const Value& v, CallArgs& a, bool select, bool lookup_attr) {
  return make_generator("select_or_reject", [v, a, select, lookup_attr](Interpreter& i) mutable {
    return select_eager(i, v, a, select, lookup_attr).items();
  });
}
Value f_select(Interpreter&, const Value& v, CallArgs& a) {
  return select_or_reject(v, a, true, false);
}
Value f_reject(Interpreter&, const Value& v, CallArgs& a) {
  return select_or_reject(v, a, false, false);
}
Value f_selectattr(Interpreter&, const Value& v, CallArgs& a) {
  return select_or_reject(v, a, true, true);
}
Value f_rejectattr(Interpreter&, const Value& v, CallArgs& a) {
  return select_or_reject(v, a, false, true);
}

Value min_max(Interpreter& in, const Value& v, CallArgs& a, bool is_max) {
  auto p = bind_args(in, is_max ? "do_max" : "do_min", a,
                     {{"case_sensitive", false, Value::boolean(false)}, {"attribute", false, Value::none()}});
  std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  AttrGetter key = attrgetter(p[1], !truthy(p[0]));
  size_t best = 0;
  Value best_key = key(in, items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(in, items[i]);
    if (is_max ? in.less(best_key, k) : in.less(k, best_key)) {
      best = i;
      best_key = k;
    }
  }
  return items[best];
}
Value f_min(Interpreter& in, const Value& v, CallArgs& a) {
  return min_max(in, v, a, false);
}
Value f_max(Interpreter& in, const Value& v, CallArgs& a) {
  return min_max(in, v, a, true);
}

Value f_replace(Interpreter& in, const Value& v, CallArgs& a) {
  auto p = bind_args(in, "do_replace", a, {{"old", true}, {"new", true}, {"count", false, Value::none()}});
  int64_t count = p[2].is_none() ? -1 : to_index(in, p[2], "");
  std::string s = to_str(v), old = to_str(p[0]), with = to_str(p[1]);
  if (!old.empty()) {
    long long n = py::count(s, old);
    if (count >= 0) n = std::min<long long>(n, count);
    if (with.size() > old.size())
      in.check_size(s.size() + static_cast<size_t>(n) * (with.size() - old.size()));
  } else {
    in.check_size(s.size() + (py::length(s) + 1) * with.size());
  }
  return str_result(in, py::replace(s, old, with, count), false);
}

Value f_reverse(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "do_reverse", a, {});
  if (v.is_string()) {
    std::u32string cps = py::decode(v.str());
    std::reverse(cps.begin(), cps.end());
    return Value::string(py::encode(cps)).with_markup(v.is_markup());
  }
  // reversed(value) where Python can, else list(value) reversed.
  std::string type;
  if (v.is_undefined())
    type = "reversed";
  else if (v.is_list())
    type = v.is_tuple() ? "reversed" : "list_reverseiterator";
  else if (v.is_dict())
    type = "dict_reversekeyiterator";
  else if (v.is_iterable_object()) {
    switch (v.seq_data().kind) {
      case SeqKind::kRange:
        type = "range_iterator";
        break;
      case SeqKind::kDictKeys:
        type = "dict_reversekeyiterator";
        break;
      case SeqKind::kDictValues:
        type = "dict_reversevalueiterator";
        break;
      case SeqKind::kDictItems:
        type = "dict_reverseitemiterator";
        break;
      default:
        break;
    }
  } else {
    in.fail("FilterArgumentError", "argument must be iterable");
  }
  std::vector<Value> items = in.iterate(v);
  std::reverse(items.begin(), items.end());
  if (type.empty()) return Value::list(std::move(items));
  return make_iterator(type, std::move(items));
}

double round_half_even_digits(double x, int64_t ndigits) {
  if (!std::isfinite(x)) return x;
  if (ndigits >= 0) {
    if (ndigits > 300) return x;
    // printf rounds the exact binary value, ties to even: the same result as Python's round().
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(ndigits), x);
    return std::strtod(buf, nullptr);
  }
  double m = std::pow(10.0, static_cast<double>(-ndigits));
  return std::nearbyint(x / m) * m;
}

Value f_round(Interpreter& in, const Value& v, CallArgs& a) {
  auto p = bind_args(in, "do_round", a,
                     {{"precision", false, Value::integer(0)}, {"method", false, Value::string("common")}});
  std::string method = p[1].is_string() ? p[1].str() : "";
  if (method != "common" && method != "ceil" && method != "floor")
    in.fail("FilterArgumentError", "method must be common, ceil or floor");
  int64_t prec = to_index(in, p[0], "");
  in.ensure_defined(v);
  if (!v.is_number()) in.fail("TypeError", "type " + type_name(v) + " doesn't define __round__ method");
  if (method == "common") {
    if (!v.is_float()) {
      if (prec >= 0) return Value::integer(v.int_value());
      double r = round_half_even_digits(static_cast<double>(v.int_value()), prec);
      return Value::integer(static_cast<int64_t>(r));
    }
    return Value::floating(round_half_even_digits(v.float_value(), prec));
  }
  double scale = std::pow(10.0, static_cast<double>(prec));
  double x = v.number_as_double() * scale;
  double r = method == "ceil" ? std::ceil(x) : std::floor(x);
  return Value::floating(r / scale);
}

Value f_safe(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "do_mark_safe", a, {});
  return Value::markup(to_str(v));
}

Value slice_eager(Interpreter& in, const Value& v, CallArgs& a) {
  auto p = bind_args(in, "do_slice", a, {{"slices", true}, {"fill_with", false, Value::none()}});
  std::vector<Value> seq = in.iterate(v);
  int64_t slices = to_index(in, p[0], "");
  if (slices <= 0) in.fail("ZeroDivisionError", "integer division or modulo by zero");
  in.count_iterations(static_cast<uint64_t>(slices));
  auto length = static_cast<int64_t>(seq.size());
  int64_t per = length / slices, extra = length % slices, offset = 0;
  std::vector<Value> out;
  for (int64_t k = 0; k < slices; ++k) {
    int64_t start = offset + k * per;
    if (k < extra) ++offset;
    int64_t end = offset + (k + 1) * per;
    std::vector<Value> tmp(seq.begin() + start, seq.begin() + end);
    if (!p[1].is_none() && k >= extra) tmp.push_back(p[1]);
    out.push_back(Value::list(std::move(tmp)));
  }
  return Value::list(std::move(out));
}

Value f_slice(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "do_slice", a, {{"slices", true}, {"fill_with", false, Value::none()}});
  return make_generator("sync_do_slice",
                        [v, a](Interpreter& i) mutable { return slice_eager(i, v, a).items(); });
}

Value f_sort(Interpreter& in, const Value& v, CallArgs& a) {
  auto p = bind_args(in, "do_sort", a,
                     {{"reverse", false, Value::boolean(false)},
                      {"case_sensitive", false, Value::boolean(false)},
                      {"attribute", false, Value::none()}});
  std::vector<Value> items = in.iterate(v);
  auto getters = multi_attrgetter(p[2], !truthy(p[1]));
  std::vector<Value> keys;
  for (auto& it : items) {
    std::vector<Value> k;
    for (auto& g : getters) k.push_back(g(in, it));
    keys.push_back(Value::list(std::move(k)));
  }
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  bool rev = truthy(p[0]);
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return rev ? in.less(keys[y], keys[x]) : in.less(keys[x], keys[y]);
  });
  std::vector<Value> out;
  for (size_t i : order) out.push_back(items[i]);
  return Value::list(std::move(out));
}

Value f_string(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "soft_str", a, {});
  return soft_str(v);
}

Value f_sum(Interpreter& in, const Value& v, CallArgs& a) {
  auto p =
      bind_args(in, "do_sum", a, {{"attribute", false, Value::none()}, {"start", false, Value::integer(0)}});
  AttrGetter get = attrgetter(p[0], false);
  Value acc = p[1];
  for (auto& item : in.iterate(v)) acc = in.binop("add", acc, p[0].is_none() ? item : get(in, item));
  return acc;
}

Value f_title(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "do_title", a, {});
  Value s = soft_str(v);
  // jinja2 splits on runs of [-\s({\[<] and title-cases each piece: item[0].upper() + item[1:].lower().
  std::u32string cps = py::decode(s.str());
  auto is_sep = [](char32_t c) {
    return c == '-' || py::is_space(c) || c == '(' || c == '{' || c == '[' || c == '<';
  };
  std::string out;
  size_t i = 0;
  while (i < cps.size()) {
    size_t j = i;
    bool sep = is_sep(cps[i]);
    while (j < cps.size() && is_sep(cps[j]) == sep) ++j;
    std::u32string piece = cps.substr(i, j - i);
    if (sep) {
      out += py::encode(piece);
    } else {
      out += py::upper(py::encode(piece.substr(0, 1)));
      out += py::lower(py::encode(piece.substr(1)));
    }
    i = j;
  }
  return str_result(in, std::move(out), s.is_markup());
}

// HF's override: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Value f_tojson(Interpreter& in, const Value& v, CallArgs& a) {
  auto p = bind_args(in, "tojson", a,
                     {{"ensure_ascii", false, Value::boolean(false)},
                      {"indent", false, Value::none()},
                      {"separators", false, Value::none()},
                      {"sort_keys", false, Value::boolean(false)}});
  JsonDumpOptions opt;
  opt.ensure_ascii = truthy(p[0]);
  opt.sort_keys = truthy(p[3]);
  if (p[1].is_string()) {
    opt.indent = p[1].str();
  } else if (is_int_like(p[1])) {
    opt.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(p[1].int_value(), 0, 1 << 16)), ' ');
  } else if (!p[1].is_none()) {
    in.ensure_defined(p[1]);
    in.fail("TypeError", "can't multiply sequence by non-int of type " + py::repr(type_name(p[1])));
  }
  if (!p[2].is_none()) {
    std::vector<Value> seps = in.iterate(p[2]);
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string())
      in.fail("ValueError", "separators must be a pair of strings");
    opt.separators = std::make_pair(seps[0].str(), seps[1].str());
  }
  std::string out, err;
  if (!json_dumps(v, opt, &out, &err)) in.fail("TypeError", err);
  in.check_size(out.size());
  return Value::string(std::move(out));
}

Value f_trim(Interpreter& in, const Value& v, CallArgs& a) {
  auto p = bind_args(in, "do_trim", a, {{"chars", false, Value::none()}});
  Value s = soft_str(v);
  std::string chars;
  if (!p[0].is_none()) chars = require_str(in, p[0], "strip arg");
  return Value::string(py::strip(s.str(), p[0].is_none() ? nullptr : &chars, true, true))
      .with_markup(s.is_markup());
}

Value f_truncate(Interpreter& in, const Value& v, CallArgs& a) {
  auto p = bind_args(in, "do_truncate", a,
                     {{"length", false, Value::integer(255)},
                      {"killwords", false, Value::boolean(false)},
                      {"end", false, Value::string("...")},
                      {"leeway", false, Value::none()}});
  int64_t length = to_index(in, p[0], "");
  std::string end = to_str(p[2]);
  int64_t end_len = static_cast<int64_t>(py::length(end));
  int64_t leeway = p[3].is_none() ? 5 : to_index(in, p[3], "");
  if (length < end_len)
    in.fail("AssertionError",
            "expected length >= " + std::to_string(end_len) + ", got " + std::to_string(length));
  if (leeway < 0) in.fail("AssertionError", "expected leeway >= 0, got " + std::to_string(leeway));
  if (!v.is_string()) {
    // len(s) decides first; only strings can actually be cut.
    if (in.length(v) <= length + leeway) return v;
    in.fail("AttributeError", py::repr(type_name(v)) + " object has no attribute 'rsplit'");
  }
  std::u32string s = py::decode(v.str());
  if (static_cast<int64_t>(s.size()) <= length + leeway) return Value::string(py::encode(s));
  std::u32string head = s.substr(0, static_cast<size_t>(length - end_len));
  if (truthy(p[1])) return Value::string(py::encode(head) + end);
  auto parts = py::split_sep(py::encode(head), " ", 1, true);
  return Value::string(parts[0] + end);
}

Value unique_eager(Interpreter& in, const Value& v, CallArgs& a) {
  auto p = bind_args(in, "do_unique", a,
                     {{"case_sensitive", false, Value::boolean(false)}, {"attribute", false, Value::none()}});
  AttrGetter get = attrgetter(p[1], !truthy(p[0]));
  std::set<std::string> seen;
  std::vector<Value> out;
  for (auto& item : in.iterate(v)) {
    Value k = get(in, item);
    auto h = hash_key(k);
    if (!h) in.fail("TypeError", "unhashable type: " + py::repr(type_name(k)));
    if (seen.insert(*h).second) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_unique(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "do_unique", a,
            {{"case_sensitive", false, Value::boolean(false)}, {"attribute", false, Value::none()}});
  return make_generator("sync_do_unique",
                        [v, a](Interpreter& i) mutable { return unique_eager(i, v, a).items(); });
}

std::string url_quote(const std::string& s, bool for_qs) {
  std::string out;
  char buf[4];
  for (unsigned char c : s) {
    bool safe = isalnum(c) || c == '_' || c == '.' || c == '-' || c == '~' || (!for_qs && c == '/');
    if (safe) {
      out.push_back(static_cast<char>(c));
    } else if (for_qs && c == ' ') {
      out.push_back('+');
    } else {
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

Value f_urlencode(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "do_urlencode", a, {});
  if (v.is_string() || (!v.is_list() && !v.is_dict() && !v.is_iterable_object()))
    return Value::string(url_quote(to_str(v), false));
  std::vector<Value> pairs = v.is_dict() ? items_eager(in, v, a).items() : in.iterate(v);
  std::string out;
  for (size_t i = 0; i < pairs.size(); ++i) {
    std::vector<Value> kv = in.iterate(pairs[i]);
    if (kv.size() != 2) in.fail("ValueError", "too many values to unpack (expected 2)");
    if (i) out += "&";
    out += url_quote(to_str(kv[0]), true) + "=" + url_quote(to_str(kv[1]), true);
  }
  return Value::string(std::move(out));
}

Value f_wordcount(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "do_wordcount", a, {});
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : py::decode(to_str(v))) {
    bool w = py::is_word(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

Value f_filesizeformat(Interpreter& in, const Value& v, CallArgs& a) {
  auto p = bind_args(in, "do_filesizeformat", a, {{"binary", false, Value::boolean(false)}});
  bool ok;
  Value fv = to_float_value(in, v, &ok);
  if (!ok) in.fail("ValueError", "could not convert to float");
  double bytes = fv.float_value();
  bool binary = truthy(p[0]);
  double base = binary ? 1024 : 1000;
  const char* prefixes[] = {binary ? "KiB" : "kB", binary ? "MiB" : "MB", binary ? "GiB" : "GB",
                            binary ? "TiB" : "TB", binary ? "PiB" : "PB", binary ? "EiB" : "EB",
                            binary ? "ZiB" : "ZB", binary ? "YiB" : "YB"};
  char buf[64];
  if (bytes == 1) return Value::string("1 Byte");
  if (bytes < base) {
    std::snprintf(buf, sizeof buf, "%lld Bytes", static_cast<long long>(bytes));
    return Value::string(buf);
  }
  double unit = base;
  for (int i = 0; i < 8; ++i) {
    unit = std::pow(base, i + 2);
    if (bytes < unit || i == 7) {
      std::snprintf(buf, sizeof buf, "%.1f %s", base * bytes / unit, prefixes[i]);
      return Value::string(buf);
    }
  }
  return Value::string(buf);
}

const std::map<std::string, FilterFn>& filter_table() {
  static const std::map<std::string, FilterFn> t = {
      {"abs", f_abs},
      {"attr", f_attr},
      {"batch", f_batch},
      {"capitalize", f_capitalize},
      {"center", f_center},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"filesizeformat", f_filesizeformat},
      {"first", f_first},
      {"float", f_float},
      {"forceescape", f_forceescape},
      {"format", f_format},
      {"groupby", f_groupby},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"slice", f_slice},
      {"sort", f_sort},
      {"string", f_string},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"truncate", f_truncate},
      {"unique", f_unique},
      {"upper", f_upper},
      {"urlencode", f_urlencode},
      {"wordcount", f_wordcount},
  };
  return t;
}

// --- tests -------------------------------------------------------------------------------------------

Value one_arg(Interpreter& in, const char* name, CallArgs& a) {
  auto p = bind_args(in, name, a, {{"other", true}});
  return p[0];
}

bool t_odd(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "test_odd", a, {});
  return equals(in.binop("mod", v, Value::integer(2)), Value::integer(1));
}
bool t_even(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "test_even", a, {});
  return equals(in.binop("mod", v, Value::integer(2)), Value::integer(0));
}
bool t_divisibleby(Interpreter& in, const Value& v, CallArgs& a) {
  Value n = one_arg(in, "test_divisibleby", a);
  return equals(in.binop("mod", v, n), Value::integer(0));
}
bool t_defined(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "test_defined", a, {});
  return !v.is_undefined();
}
bool t_undefined(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "test_undefined", a, {});
  return v.is_undefined();
}
bool t_filter(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "test_filter", a, {});
  return v.is_string() && find_filter(v.str()) != nullptr;
}
bool t_test(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "test_test", a, {});
  return v.is_string() && find_test(v.str()) != nullptr;
}
bool t_none(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "test_none", a, {});
  return v.is_none();
}
bool t_boolean(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "test_boolean", a, {});
  return v.is_bool();
}
bool t_false(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "test_false", a, {});
  return v.is_bool() && !v.bool_value();
}
bool t_true(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "test_true", a, {});
  return v.is_bool() && v.bool_value();
}
bool t_integer(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "test_integer", a, {});
  return v.is_int();
}
bool t_float(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "test_float", a, {});
  return v.is_float();
}
bool t_lower(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "test_lower", a, {});
  bool cased = false;
  for (char32_t c : py::decode(to_str(v))) {
    if (py::is_upper_cased(c)) return false;
    if (py::is_lower_cased(c)) cased = true;
  }
  return cased;
}
bool t_upper(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "test_upper", a, {});
  bool cased = false;
  for (char32_t c : py::decode(to_str(v))) {
    if (py::is_lower_cased(c)) return false;
    if (py::is_upper_cased(c)) cased = true;
  }
  return cased;
}
bool t_string(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "test_string", a, {});
  return v.is_string();
}
bool t_mapping(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "test_mapping", a, {});
  return v.is_dict();
}
bool t_number(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "test_number", a, {});
  return v.is_number();
}
// jinja2's `sequence`: len() and __getitem__ work; Undefined defines both.
bool t_sequence(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "test_sequence", a, {});
  if (v.is_iterable_object()) return v.seq_data().kind == SeqKind::kRange;
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
// iter() works; Undefined iterates as empty.
bool t_iterable(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "test_iterable", a, {});
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined() || v.is_iterable_object();
}
bool t_callable(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "callable", a, {});
  if (v.is_function() || v.is_undefined()) return true;  // Undefined defines __call__
  return v.is_object() && v.object_data().type_name() == "LoopContext";
}
bool t_sameas(Interpreter& in, const Value& v, CallArgs& a) {
  Value o = one_arg(in, "test_sameas", a);
  if (v.kind() != o.kind()) return false;
  switch (v.kind()) {
    case Value::Kind::kNone:
    case Value::Kind::kUndefined:
      return v.is_none();
    case Value::Kind::kBool:
      return v.bool_value() == o.bool_value();
    case Value::Kind::kInt:  // CPython caches small ints
      return v.int_value() == o.int_value() && v.int_value() >= -5 && v.int_value() <= 256;
    case Value::Kind::kString:
      return false;
    case Value::Kind::kFloat:
      return false;
    default:
      return v.heap() == o.heap();
  }
}
bool t_escaped(Interpreter& in, const Value& v, CallArgs& a) {
  bind_args(in, "test_escaped", a, {});
  return v.is_markup();
}
bool t_in(Interpreter& in, const Value& v, CallArgs& a) {
  Value seq = one_arg(in, "test_in", a);
  return in.contains(seq, v);
}
bool t_eq(Interpreter& in, const Value& v, CallArgs& a) {
  return equals(v, one_arg(in, "eq", a));
}
bool t_ne(Interpreter& in, const Value& v, CallArgs& a) {
  return !equals(v, one_arg(in, "ne", a));
}
bool t_lt(Interpreter& in, const Value& v, CallArgs& a) {
  return in.less(v, one_arg(in, "lt", a), "<");
}
bool t_le(Interpreter& in, const Value& v, CallArgs& a) {
  return in.less(v, one_arg(in, "le", a), "<=");
}
bool t_gt(Interpreter& in, const Value& v, CallArgs& a) {
  return in.less(v, one_arg(in, "gt", a), ">");
}
bool t_ge(Interpreter& in, const Value& v, CallArgs& a) {
  return in.less(v, one_arg(in, "ge", a), ">=");
}

const std::map<std::string, TestFn>& test_table() {
  static const std::map<std::string, TestFn> t = {
      {"odd", t_odd},
      {"even", t_even},
      {"divisibleby", t_divisibleby},
      {"defined", t_defined},
      {"undefined", t_undefined},
      {"filter", t_filter},
      {"test", t_test},
      {"none", t_none},
      {"boolean", t_boolean},
      {"false", t_false},
      {"true", t_true},
      {"integer", t_integer},
      {"float", t_float},
      {"lower", t_lower},
      {"upper", t_upper},
      {"string", t_string},
      {"mapping", t_mapping},
      {"number", t_number},
      {"sequence", t_sequence},
      {"iterable", t_iterable},
      {"callable", t_callable},
      {"sameas", t_sameas},
      {"escaped", t_escaped},
      {"in", t_in},
      {"==", t_eq},
      {"eq", t_eq},
      {"equalto", t_eq},
      {"!=", t_ne},
      {"ne", t_ne},
      {">", t_gt},
      {"gt", t_gt},
      {"greaterthan", t_gt},
      {"ge", t_ge},
      {">=", t_ge},
      {"<", t_lt},
      {"lt", t_lt},
      {"lessthan", t_lt},
      {"<=", t_le},
      {"le", t_le},
  };
  return t;
}

// --- globals -----------------------------------------------------------------------------------------

class CyclerObject : public ObjectData {
 public:
  std::vector<Value> items;
  size_t pos = 0;
  std::string type_name() const override { return "Cycler"; }
  std::string module_name() const override { return "jinja2.utils"; }
  bool get_attr(Interpreter&, const std::string& name, Value* out) override {
    auto self = std::static_pointer_cast<CyclerObject>(shared_from_this());
    if (name == "current") {
      *out = items[pos];
    } else if (name == "next") {
      *out = Value::function("next", [self](Interpreter&, CallArgs&) -> Value {
        Value rv = self->items[self->pos];
        self->pos = (self->pos + 1) % self->items.size();
        return rv;
      });
    } else if (name == "reset") {
      *out = Value::function("reset", [self](Interpreter&, CallArgs&) -> Value {
        self->pos = 0;
        return Value::none();
      });
    } else {
      return false;
    }
    return true;
  }
};

Value g_range(Interpreter& in, CallArgs& a) {
  if (!a.kwargs.empty()) in.fail("TypeError", "range() takes no keyword arguments");
  if (a.args.empty() || a.args.size() > 3)
    in.fail("TypeError", "range expected at most 3 arguments, got " + std::to_string(a.args.size()));
  int64_t v[3] = {0, 0, 1};
  for (size_t i = 0; i < a.args.size(); ++i) v[i] = to_index(in, a.args[i], "");
  int64_t start = a.args.size() == 1 ? 0 : v[0];
  int64_t stop = a.args.size() == 1 ? v[0] : v[1];
  int64_t step = a.args.size() == 3 ? v[2] : 1;
  if (step == 0) in.fail("ValueError", "range() arg 3 must not be zero");
  long double n = 0;
  if (step > 0 && start < stop) n = std::floor((static_cast<long double>(stop) - start - 1) / step) + 1;
  if (step < 0 && start > stop) n = std::floor((static_cast<long double>(start) - stop - 1) / -step) + 1;
  if (n > static_cast<long double>(in.limits().max_range))
    in.fail("OverflowError", "Range too big. The sandbox blocks ranges larger than MAX_RANGE (" +
                                 std::to_string(in.limits().max_range) + ").");
  auto sd = std::make_shared<SeqData>();
  sd->kind = SeqKind::kRange;
  sd->start = start;
  sd->stop = stop;
  sd->step = step;
  sd->items.reserve(static_cast<size_t>(n));
  for (int64_t i = 0, x = start; i < static_cast<int64_t>(n); ++i, x += step)
    sd->items.push_back(Value::integer(x));
  return Value::iterable(std::move(sd));
}

Value g_dict(Interpreter& in, CallArgs& a) {
  Value d = Value::dict();
  if (a.args.size() > 1)
    in.fail("TypeError", "dict expected at most 1 argument, got " + std::to_string(a.args.size()));
  if (!a.args.empty()) {
    const Value& src = a.args[0];
    if (src.is_dict()) {
      for (const auto& [k, v] : src.dict_data().entries) d.dict_data().set(k, v);
    } else {
      for (const Value& pair : in.iterate(src)) {
        std::vector<Value> kv = in.iterate(pair);
        if (kv.size() != 2)
          in.fail("ValueError", "dictionary update sequence element has length " + std::to_string(kv.size()) +
                                    "; 2 is required");
        if (!d.dict_data().set(kv[0], kv[1]))
          in.fail("TypeError", "unhashable type: " + py::repr(type_name(kv[0])));
      }
    }
  }
  for (const auto& [k, v] : a.kwargs) d.dict_data().set(Value::string(k), v);
  return d;
}

Value g_cycler(Interpreter& in, CallArgs& a) {
  if (a.args.empty()) in.fail("RuntimeError", "at least one item has to be provided");
  auto c = std::make_shared<CyclerObject>();
  c->items = a.args;
  in.track(c);
  return Value::object(c);
}

Value g_joiner(Interpreter& in, CallArgs& a) {
  auto p = bind_args(in, "joiner", a, {{"sep", false, Value::string(", ")}});
  auto used = std::make_shared<bool>(false);
  Value sep = p[0];
  return Value::function("joiner", [used, sep](Interpreter&, CallArgs&) -> Value {
    if (!*used) {
      *used = true;
      return Value::string("");
    }
    return sep;
  });
}

Value g_raise_exception(Interpreter& in, CallArgs& a) {
  auto p = bind_args(in, "raise_exception", a, {{"message", true}});
  in.fail("TemplateError", to_str(p[0]));
}

Value g_strftime_now(Interpreter& in, CallArgs& a) {
  auto p = bind_args(in, "strftime_now", a, {{"format", true}});
  std::string fmt = require_str(in, p[0], "strftime() argument 1");
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  std::string buf(256 + fmt.size() * 8, '\0');
  size_t n = fmt.empty() ? 0 : std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
  buf.resize(n);
  return Value::string(buf);
}

// --- methods of built-in types -------------------------------------------------------------------------

using Method = Value (*)(Interpreter&, const Value& self, CallArgs& a);

Value bind(const std::string& name, const Value& self, Method m) {
  return Value::function(name, [self, m](Interpreter& in, CallArgs& a) { return m(in, self, a); });
}

std::u32string slice_cps(Interpreter& in, const std::u32string& s, const Value& start, const Value& end) {
  auto n = static_cast<int64_t>(s.size());
  auto norm = [&](const Value& v, int64_t def) {
    if (v.is_none() || v.is_undefined()) return def;
    int64_t i = to_index(in, v, "");
    if (i < 0) i = std::max<int64_t>(0, i + n);
    return std::min(i, n);
  };
  int64_t b = norm(start, 0), e = norm(end, n);
  if (b > e) return U"";
  return s.substr(static_cast<size_t>(b), static_cast<size_t>(e - b));
}

Value m_startswith_impl(Interpreter& in, const Value& self, CallArgs& a, bool ends) {
  const char* name = ends ? "endswith" : "startswith";
  auto p = bind_args(in, name, a,
                     {{"prefix", true}, {"start", false, Value::none()}, {"end", false, Value::none()}});
  std::u32string s = py::decode(self.str());
  bool sliced = !p[1].is_none() || !p[2].is_none();
  std::u32string sub = sliced ? slice_cps(in, s, p[1], p[2]) : s;
  if (sliced && !p[1].is_none()) {
    int64_t st = to_index(in, p[1], "");
    if (st < 0) st = std::max<int64_t>(0, st + static_cast<int64_t>(s.size()));
    if (st > static_cast<int64_t>(s.size())) return Value::boolean(false);
  }
  std::vector<Value> options;
  if (p[0].is_string()) {
    options.push_back(p[0]);
  } else if (p[0].is_tuple()) {
    options = p[0].items();
  } else {
    in.ensure_defined(p[0]);
    in.fail("TypeError",
            std::string(name) + " first arg must be str or a tuple of str, not " + type_name(p[0]));
  }
  for (const auto& o : options) {
    if (!o.is_string())
      in.fail("TypeError", std::string("tuple for ") + name + " must only contain str, not " + type_name(o));
    std::u32string x = py::decode(o.str());
    if (x.size() > sub.size()) continue;
    if (ends ? sub.compare(sub.size() - x.size(), x.size(), x) == 0 : sub.compare(0, x.size(), x) == 0)
      return Value::boolean(true);
  }
  return Value::boolean(false);
}
Value m_startswith(Interpreter& in, const Value& s, CallArgs& a) {
  return m_startswith_impl(in, s, a, false);
}
Value m_endswith(Interpreter& in, const Value& s, CallArgs& a) {
  return m_startswith_impl(in, s, a, true);
}

Value strings_to_list(std::vector<std::string> parts, bool markup) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (auto& p : parts) out.push_back(Value::string(std::move(p)).with_markup(markup));
  return Value::list(std::move(out));
}

Value m_split_impl(Interpreter& in, const Value& self, CallArgs& a, bool right) {
  auto p = bind_args(in, right ? "rsplit" : "split", a,
                     {{"sep", false, Value::none()}, {"maxsplit", false, Value::integer(-1)}});
  int64_t maxsplit = to_index(in, p[1], "");
  if (p[0].is_none())
    return strings_to_list(py::split_whitespace(self.str(), maxsplit, right), self.is_markup());
  std::string sep = require_str(in, p[0], "separator");
  if (sep.empty()) in.fail("ValueError", "empty separator");
  return strings_to_list(py::split_sep(self.str(), sep, maxsplit, right), self.is_markup());
}
Value m_split(Interpreter& in, const Value& s, CallArgs& a) {
  return m_split_impl(in, s, a, false);
}
Value m_rsplit(Interpreter& in, const Value& s, CallArgs& a) {
  return m_split_impl(in, s, a, true);
}

Value m_splitlines(Interpreter& in, const Value& self, CallArgs& a) {
  auto p = bind_args(in, "splitlines", a, {{"keepends", false, Value::boolean(false)}});
  return strings_to_list(py::splitlines(self.str(), truthy(p[0])), self.is_markup());
}

std::string markup_arg(Interpreter& in, const Value& self, const Value& arg) {
  // markupsafe escapes str arguments of Markup methods.
  if (self.is_markup() && arg.is_string() && !arg.is_markup()) return in.escape_html(arg.str());
  return arg.str();
}

Value m_strip_impl(Interpreter& in, const Value& self, CallArgs& a, bool l, bool r, const char* name) {
  auto p = bind_args(in, name, a, {{"chars", false, Value::none()}});
  if (p[0].is_none())
    return Value::string(py::strip(self.str(), nullptr, l, r)).with_markup(self.is_markup());
  if (!p[0].is_string()) {
    in.ensure_defined(p[0]);
    in.fail("TypeError", std::string(name) + " arg must be None or str");
  }
  std::string chars = markup_arg(in, self, p[0]);
  return Value::string(py::strip(self.str(), &chars, l, r)).with_markup(self.is_markup());
}
Value m_strip(Interpreter& in, const Value& s, CallArgs& a) {
  return m_strip_impl(in, s, a, true, true, "strip");
}
Value m_lstrip(Interpreter& in, const Value& s, CallArgs& a) {
  return m_strip_impl(in, s, a, true, false, "lstrip");
}
Value m_rstrip(Interpreter& in, const Value& s, CallArgs& a) {
  return m_strip_impl(in, s, a, false, true, "rstrip");
}

Value m_upper(Interpreter& in, const Value& s, CallArgs& a) {
  bind_args(in, "upper", a, {});
  return str_result(in, py::upper(s.str()), s.is_markup());
}
Value m_lower(Interpreter& in, const Value& s, CallArgs& a) {
  bind_args(in, "lower", a, {});
  return str_result(in, py::lower(s.str()), s.is_markup());
}
Value m_casefold(Interpreter& in, const Value& s, CallArgs& a) {
  bind_args(in, "casefold", a, {});
  return str_result(in, py::replace(py::lower(s.str()), "\u00df", "ss", -1), s.is_markup());
}
Value m_title(Interpreter& in, const Value& s, CallArgs& a) {
  bind_args(in, "title", a, {});
  return str_result(in, py::title(s.str()), s.is_markup());
}
Value m_capitalize(Interpreter& in, const Value& s, CallArgs& a) {
  bind_args(in, "capitalize", a, {});
  return str_result(in, py::capitalize(s.str()), s.is_markup());
}
Value m_swapcase(Interpreter& in, const Value& s, CallArgs& a) {
  bind_args(in, "swapcase", a, {});
  return str_result(in, py::swapcase(s.str()), s.is_markup());
}

Value m_replace(Interpreter& in, const Value& self, CallArgs& a) {
  auto p = bind_args(in, "replace", a, {{"old", true}, {"new", true}, {"count", false, Value::integer(-1)}});
  std::string old = markup_arg(
      in, self, Value::string(require_str(in, p[0], "replace() argument 1")).with_markup(p[0].is_markup()));
  std::string with = markup_arg(
      in, self, Value::string(require_str(in, p[1], "replace() argument 2")).with_markup(p[1].is_markup()));
  int64_t count = to_index(in, p[2], "");
  const std::string& s = self.str();
  size_t n = old.empty() ? py::length(s) + 1 : static_cast<size_t>(py::count(s, old));
  if (with.size() > old.size()) in.check_size(s.size() + n * (with.size() - old.size()));
  return str_result(in, py::replace(s, old, with, count), self.is_markup());
}

Value m_find_impl(Interpreter& in, const Value& self, CallArgs& a, bool right, bool raise, const char* name) {
  auto p =
      bind_args(in, name, a, {{"sub", true}, {"start", false, Value::none()}, {"end", false, Value::none()}});
  std::string sub = require_str(in, p[0], "must be str");
  int64_t start = p[1].is_none() ? 0 : to_index(in, p[1], "");
  int64_t end = p[2].is_none() ? INT64_MAX / 2 : to_index(in, p[2], "");
  long long r = py::find(self.str(), sub, start, end, right);
  if (r < 0 && raise) in.fail("ValueError", "substring not found");
  return Value::integer(r);
}
Value m_find(Interpreter& in, const Value& s, CallArgs& a) {
  return m_find_impl(in, s, a, false, false, "find");
}
Value m_rfind(Interpreter& in, const Value& s, CallArgs& a) {
  return m_find_impl(in, s, a, true, false, "rfind");
}
Value m_index(Interpreter& in, const Value& s, CallArgs& a) {
  return m_find_impl(in, s, a, false, true, "index");
}
Value m_rindex(Interpreter& in, const Value& s, CallArgs& a) {
  return m_find_impl(in, s, a, true, true, "rindex");
}

Value m_count(Interpreter& in, const Value& self, CallArgs& a) {
  auto p = bind_args(in, "count", a,
                     {{"sub", true}, {"start", false, Value::none()}, {"end", false, Value::none()}});
  std::string sub = require_str(in, p[0], "must be str");
  std::u32string s = py::decode(self.str());
  std::u32string part = (p[1].is_none() && p[2].is_none()) ? s : slice_cps(in, s, p[1], p[2]);
  return Value::integer(py::count(py::encode(part), sub));
}

Value m_join(Interpreter& in, const Value& self, CallArgs& a) {
  auto p = bind_args(in, "join", a, {{"iterable", true}});
  std::vector<Value> items = in.iterate(p[0]);
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string())
      in.fail("TypeError", "sequence item " + std::to_string(i) + ": expected str instance, " +
                               type_name(items[i]) + " found");
    if (i) out += self.str();
    out += self.is_markup() ? markup_arg(in, self, items[i]) : items[i].str();
    in.check_size(out.size());
  }
  return Value::string(std::move(out)).with_markup(self.is_markup());
}

Value m_format(Interpreter& in, const Value& self, CallArgs& a) {
  return str_result(in, python_format(in, self.str(), a), self.is_markup());
}

template <bool (*Pred)(char32_t)>
Value m_is_all(Interpreter& in, const Value& self, CallArgs& a) {
  bind_args(in, "is", a, {});
  std::u32string s = py::decode(self.str());
  if (s.empty()) return Value::boolean(false);
  for (char32_t c : s)
    if (!Pred(c)) return Value::boolean(false);
  return Value::boolean(true);
}

Value m_isascii(Interpreter& in, const Value& self, CallArgs& a) {
  bind_args(in, "isascii", a, {});
  for (unsigned char c : self.str())
    if (c >= 0x80) return Value::boolean(false);
  return Value::boolean(true);
}
Value m_islower(Interpreter& in, const Value& self, CallArgs& a) {
  CallArgs none;
  bind_args(in, "islower", a, {});
  return Value::boolean(t_lower(in, self, none));
}
Value m_isupper(Interpreter& in, const Value& self, CallArgs& a) {
  CallArgs none;
  bind_args(in, "isupper", a, {});
  return Value::boolean(t_upper(in, self, none));
}
Value m_istitle(Interpreter& in, const Value& self, CallArgs& a) {
  bind_args(in, "istitle", a, {});
  bool cased = false, prev_cased = false;
  for (char32_t c : py::decode(self.str())) {
    bool up = py::is_upper_cased(c) || py::to_title_char(c) == c;
    bool lo = py::is_lower_cased(c);
    if (py::is_upper_cased(c)) {
      if (prev_cased) return Value::boolean(false);
      prev_cased = cased = true;
    } else if (lo) {
      if (!prev_cased) return Value::boolean(false);
      prev_cased = cased = true;
    } else {
      (void)up;
      prev_cased = false;
    }
  }
  return Value::boolean(cased);
}
Value m_isprintable(Interpreter& in, const Value& self, CallArgs& a) {
  bind_args(in, "isprintable", a, {});
  for (char32_t c : py::decode(self.str()))
    if (!py::is_printable(c)) return Value::boolean(false);
  return Value::boolean(true);
}
Value m_isidentifier(Interpreter& in, const Value& self, CallArgs& a) {
  bind_args(in, "isidentifier", a, {});
  return Value::boolean(py::is_identifier(self.str()));
}

Value m_removeprefix(Interpreter& in, const Value& self, CallArgs& a) {
  auto p = bind_args(in, "removeprefix", a, {{"prefix", true}});
  std::string x = markup_arg(in, self, Value::string(require_str(in, p[0], "removeprefix() argument")));
  const std::string& s = self.str();
  if (s.compare(0, x.size(), x) == 0) return Value::string(s.substr(x.size())).with_markup(self.is_markup());
  return self;
}
Value m_removesuffix(Interpreter& in, const Value& self, CallArgs& a) {
  auto p = bind_args(in, "removesuffix", a, {{"suffix", true}});
  std::string x = markup_arg(in, self, Value::string(require_str(in, p[0], "removesuffix() argument")));
  const std::string& s = self.str();
  if (!x.empty() && s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
    return Value::string(s.substr(0, s.size() - x.size())).with_markup(self.is_markup());
  return self;
}

Value pad_impl(Interpreter& in, const Value& self, CallArgs& a, char how, const char* name) {
  auto p = bind_args(in, name, a, {{"width", true}, {"fillchar", false, Value::string(" ")}});
  int64_t w = to_index(in, p[0], "");
  std::string fill = require_str(in, p[1], "fill character");
  if (py::length(fill) != 1) in.fail("TypeError", "The fill character must be exactly one character long");
  in.check_size(static_cast<size_t>(std::max<int64_t>(0, w)) * fill.size());
  const std::string& s = self.str();
  auto len = static_cast<int64_t>(py::length(s));
  if (w <= len) return self;
  std::string out;
  if (how == 'c') return Value::string(center_str(s, w, fill)).with_markup(self.is_markup());
  std::string pad;
  for (int64_t i = 0; i < w - len; ++i) pad += fill;
  out = how == 'l' ? s + pad : pad + s;
  return Value::string(std::move(out)).with_markup(self.is_markup());
}
Value m_ljust(Interpreter& in, const Value& s, CallArgs& a) {
  return pad_impl(in, s, a, 'l', "ljust");
}
Value m_rjust(Interpreter& in, const Value& s, CallArgs& a) {
  return pad_impl(in, s, a, 'r', "rjust");
}
Value m_center(Interpreter& in, const Value& s, CallArgs& a) {
  return pad_impl(in, s, a, 'c', "center");
}

Value m_zfill(Interpreter& in, const Value& self, CallArgs& a) {
  auto p = bind_args(in, "zfill", a, {{"width", true}});
  int64_t w = to_index(in, p[0], "");
  in.check_size(static_cast<size_t>(std::max<int64_t>(0, w)));
  std::string s = self.str();
  auto len = static_cast<int64_t>(py::length(s));
  if (w <= len) return self;
  std::string zeros(static_cast<size_t>(w - len), '0');
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) return Value::string(s.substr(0, 1) + zeros + s.substr(1));
  return Value::string(zeros + s).with_markup(self.is_markup());
}

Value m_partition_impl(Interpreter& in, const Value& self, CallArgs& a, bool right) {
  auto p = bind_args(in, right ? "rpartition" : "partition", a, {{"sep", true}});
  std::string sep = require_str(in, p[0], "separator");
  if (sep.empty()) in.fail("ValueError", "empty separator");
  const std::string& s = self.str();
  size_t f = right ? s.rfind(sep) : s.find(sep);
  bool m = self.is_markup();
  if (f == std::string::npos) {
    if (right)
      return Value::tuple({Value::string("").with_markup(m), Value::string("").with_markup(m), self});
    return Value::tuple({self, Value::string("").with_markup(m), Value::string("").with_markup(m)});
  }
  return Value::tuple({Value::string(s.substr(0, f)).with_markup(m), Value::string(sep).with_markup(m),
                       Value::string(s.substr(f + sep.size())).with_markup(m)});
}
Value m_partition(Interpreter& in, const Value& s, CallArgs& a) {
  return m_partition_impl(in, s, a, false);
}
Value m_rpartition(Interpreter& in, const Value& s, CallArgs& a) {
  return m_partition_impl(in, s, a, true);
}

const std::map<std::string, Method>& str_methods() {
  static const std::map<std::string, Method> t = {
      {"startswith", m_startswith},
      {"endswith", m_endswith},
      {"split", m_split},
      {"rsplit", m_rsplit},
      {"splitlines", m_splitlines},
      {"strip", m_strip},
      {"lstrip", m_lstrip},
      {"rstrip", m_rstrip},
      {"upper", m_upper},
      {"lower", m_lower},
      {"casefold", m_casefold},
      {"title", m_title},
      {"capitalize", m_capitalize},
      {"swapcase", m_swapcase},
      {"replace", m_replace},
      {"find", m_find},
      {"rfind", m_rfind},
      {"index", m_index},
      {"rindex", m_rindex},
      {"count", m_count},
      {"join", m_join},
      {"format", m_format},
      {"isdigit", m_is_all<py::is_digit>},
      {"isdecimal", m_is_all<py::is_decimal>},
      {"isnumeric", m_is_all<py::is_numeric>},
      {"isalpha", m_is_all<py::is_alpha>},
      {"isalnum", m_is_all<py::is_alnum>},
      {"isspace", m_is_all<py::is_space>},
      {"isascii", m_isascii},
      {"islower", m_islower},
      {"isupper", m_isupper},
      {"istitle", m_istitle},
      {"isprintable", m_isprintable},
      {"isidentifier", m_isidentifier},
      {"removeprefix", m_removeprefix},
      {"removesuffix", m_removesuffix},
      {"ljust", m_ljust},
      {"rjust", m_rjust},
      {"center", m_center},
      {"zfill", m_zfill},
      {"partition", m_partition},
      {"rpartition", m_rpartition},
  };
  return t;
}

Value m_dict_keys(Interpreter& in, const Value& self, CallArgs& a) {
  bind_args(in, "keys", a, {});
  std::vector<Value> out;
  for (const auto& e : self.dict_data().entries) out.push_back(e.first);
  return make_view(SeqKind::kDictKeys, std::move(out));
}
Value m_dict_values(Interpreter& in, const Value& self, CallArgs& a) {
  bind_args(in, "values", a, {});
  std::vector<Value> out;
  for (const auto& e : self.dict_data().entries) out.push_back(e.second);
  return make_view(SeqKind::kDictValues, std::move(out));
}
Value m_dict_items(Interpreter& in, const Value& self, CallArgs& a) {
  bind_args(in, "items", a, {});
  std::vector<Value> out;
  for (const auto& e : self.dict_data().entries) out.push_back(Value::tuple({e.first, e.second}));
  return make_view(SeqKind::kDictItems, std::move(out));
}
Value m_dict_get(Interpreter& in, const Value& self, CallArgs& a) {
  if (!a.kwargs.empty()) in.fail("TypeError", "get() takes no keyword arguments");
  if (a.args.empty() || a.args.size() > 2)
    in.fail("TypeError", "get expected at most 2 arguments, got " + std::to_string(a.args.size()));
  if (!hash_key(a.args[0])) in.fail("TypeError", "unhashable type: " + py::repr(type_name(a.args[0])));
  if (const Value* v = self.dict_data().get(a.args[0])) return *v;
  return a.args.size() == 2 ? a.args[1] : Value::none();
}
Value m_dict_copy(Interpreter& in, const Value& self, CallArgs& a) {
  bind_args(in, "copy", a, {});
  auto d = std::make_shared<DictData>(self.dict_data());
  return Value::dict(d);
}

Value m_list_index(Interpreter& in, const Value& self, CallArgs& a) {
  auto p = bind_args(
      in, "index", a,
      {{"value", true}, {"start", false, Value::integer(0)}, {"stop", false, Value::integer(INT64_MAX)}});
  const auto& items = self.items();
  auto n = static_cast<int64_t>(items.size());
  int64_t start = to_index(in, p[1], ""), stop = to_index(in, p[2], "");
  if (start < 0) start = std::max<int64_t>(0, start + n);
  if (stop < 0) stop = std::max<int64_t>(0, stop + n);
  for (int64_t i = start; i < std::min(stop, n); ++i)
    if (equals(items[static_cast<size_t>(i)], p[0])) return Value::integer(i);
  in.fail("ValueError", to_repr(p[0]) + " is not in " + (self.is_tuple() ? "tuple" : "list"));
}
Value m_list_count(Interpreter& in, const Value& self, CallArgs& a) {
  auto p = bind_args(in, "count", a, {{"value", true}});
  int64_t n = 0;
  for (const auto& e : self.items())
    if (equals(e, p[0])) ++n;
  return Value::integer(n);
}
Value m_list_copy(Interpreter& in, const Value& self, CallArgs& a) {
  bind_args(in, "copy", a, {});
  return Value::list(self.items());
}

Value unsafe(const Value& obj, const std::string& name) {
  return Value::undefined(
      "access to attribute " + py::repr(name) + " of " + py::repr(type_name(obj)) + " object is unsafe.",
      true);
}

}  // namespace

const FilterFn* find_filter(const std::string& name) {
  const auto& t = filter_table();
  auto it = t.find(name);
  return it == t.end() ? nullptr : &it->second;
}

const TestFn* find_test(const std::string& name) {
  const auto& t = test_table();
  auto it = t.find(name);
  return it == t.end() ? nullptr : &it->second;
}

void add_globals(Interpreter& in, Scope& g) {
  (void)in;
  g.set("range", Value::function("range", g_range));
  g.set("dict", Value::function("dict", g_dict));
  g.set("namespace",
        Value::function("namespace", [](Interpreter& i, CallArgs& a) { return i.make_namespace(a); }));
  g.set("cycler", Value::function("cycler", g_cycler));
  g.set("joiner", Value::function("joiner", g_joiner));
  g.set("raise_exception", Value::function("raise_exception", g_raise_exception));
  g.set("strftime_now", Value::function("strftime_now", g_strftime_now));
}

bool builtin_attribute(Interpreter& in, const Value& obj, const std::string& name, Value* out) {
  (void)in;
  switch (obj.kind()) {
    case Value::Kind::kString: {
      const auto& t = str_methods();
      auto it = t.find(name);
      if (it == t.end()) return false;
      *out = bind(name, obj, it->second);
      return true;
    }
    case Value::Kind::kDict: {
      static const std::map<std::string, Method> safe = {{"keys", m_dict_keys},
                                                         {"values", m_dict_values},
                                                         {"items", m_dict_items},
                                                         {"get", m_dict_get},
                                                         {"copy", m_dict_copy}};
      static const std::set<std::string> mutating = {"clear", "pop", "popitem", "setdefault", "update"};
      auto it = safe.find(name);
      if (it != safe.end()) {
        *out = bind(name, obj, it->second);
        return true;
      }
      if (mutating.count(name)) {
        *out = unsafe(obj, name);
        return true;
      }
      return false;
    }
    case Value::Kind::kList: {
      if (obj.list_data().is_group && (name == "grouper" || name == "list")) {
        *out = obj.items()[name == "grouper" ? 0 : 1];
        return true;
      }
      if (name == "index") {
        *out = bind(name, obj, m_list_index);
        return true;
      }
      if (name == "count") {
        *out = bind(name, obj, m_list_count);
        return true;
      }
      if (obj.is_tuple()) return false;
      if (name == "copy") {
        *out = bind(name, obj, m_list_copy);
        return true;
      }
      static const std::set<std::string> mutating = {"append", "clear", "pop",    "reverse",
                                                     "insert", "sort",  "extend", "remove"};
      if (mutating.count(name)) {
        *out = unsafe(obj, name);
        return true;
      }
      return false;
    }
    case Value::Kind::kFunction: {
      const auto& f = obj.function_data();
      if (!f.is_macro) return false;
      if (name == "name")
        *out = Value::string(f.name);
      else if (name == "arguments") {
        std::vector<Value> names;
        for (const auto& n : f.arguments) names.push_back(Value::string(n));
        *out = Value::tuple(std::move(names));
      } else if (name == "catch_kwargs")
        *out = Value::boolean(f.catch_kwargs);
      else if (name == "catch_varargs")
        *out = Value::boolean(f.catch_varargs);
      else if (name == "caller")
        *out = Value::boolean(f.caller);
      else
        return false;
      return true;
    }
    default:
      return false;
  }
}

}  // namespace deltaflow::text::jinja
