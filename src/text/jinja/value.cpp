#include "text/jinja/value.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "text/jinja/pystr.hpp"

namespace deltaflow::text::jinja {

// --- construction ------------------------------------------------------------------------------------

Value Value::undefined(std::string message, bool security) {
  Value v;
  v.s_ = std::move(message);
  v.markup_ = security;
  return v;
}
Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.i_ = b ? 1 : 0;  // keeps int_value() meaningful for bool, as Python's bool is an int
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::floating(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::move(s);
  return v;
}
Value Value::markup(std::string s) {
  Value v = string(std::move(s));
  v.markup_ = true;
  return v;
}
Value Value::list(std::vector<Value> items) {
  auto d = std::make_shared<ListData>();
  d->items = std::move(items);
  Value v;
  v.kind_ = Kind::kList;
  v.p_ = std::move(d);
  return v;
}
Value Value::tuple(std::vector<Value> items) {
  Value v = list(std::move(items));
  v.list_data().is_tuple = true;
  return v;
}
Value Value::dict() {
  return dict(std::make_shared<DictData>());
}
Value Value::dict(std::shared_ptr<DictData> d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.p_ = std::move(d);
  return v;
}
Value Value::function(std::string name, NativeFn fn) {
  auto f = std::make_shared<FunctionData>();
  f->name = std::move(name);
  f->fn = std::move(fn);
  return function(std::move(f));
}
Value Value::function(std::shared_ptr<FunctionData> f) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.p_ = std::move(f);
  return v;
}
Value Value::object(std::shared_ptr<ObjectData> o) {
  Value v;
  v.kind_ = Kind::kObject;
  v.p_ = std::move(o);
  return v;
}

Value Value::iterable(std::shared_ptr<SeqData> sd) {
  Value v;
  v.kind_ = Kind::kIterable;
  v.p_ = std::move(sd);
  return v;
}

Value Value::with_markup(bool m) const {
  Value v = *this;
  if (v.kind_ == Kind::kString) v.markup_ = m;
  return v;
}

double Value::number_as_double() const {
  if (kind_ == Kind::kFloat) return f_;
  return static_cast<double>(i_);
}

std::string ObjectData::repr() const {
  return "<" + module_name() + "." + type_name() + " object>";
}

// --- dict --------------------------------------------------------------------------------------------

bool DictData::set(const Value& key, Value value) {
  if (key.is_string()) {
    auto it = str_index_.find(key.str());
    if (it != str_index_.end()) {
      entries[it->second].second = std::move(value);
    } else {
      str_index_.emplace(key.str(), entries.size());
      entries.emplace_back(key, std::move(value));
    }
    return true;
  }
  auto h = hash_key(key);
  if (!h) return false;
  auto it = other_index_.find(*h);
  if (it != other_index_.end()) {
    entries[it->second].second = std::move(value);
  } else {
    other_index_.emplace(*h, entries.size());
    entries.emplace_back(key, std::move(value));
  }
  return true;
}

const Value* DictData::get_str(const std::string& key) const {
  auto it = str_index_.find(key);
  return it == str_index_.end() ? nullptr : &entries[it->second].second;
}

const Value* DictData::get(const Value& key) const {
  if (key.is_string()) return get_str(key.str());
  auto h = hash_key(key);
  if (!h) return nullptr;
  auto it = other_index_.find(*h);
  return it == other_index_.end() ? nullptr : &entries[it->second].second;
}

// --- Python protocols --------------------------------------------------------------------------------

std::optional<std::string> hash_key(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString:
      return "s" + v.str();
    case Value::Kind::kBool:
    case Value::Kind::kInt:
      return "i" + std::to_string(v.int_value());
    case Value::Kind::kFloat: {
      double f = v.float_value();
      if (std::isfinite(f) && f == std::trunc(f) && std::fabs(f) < 9.2e18)
        return "i" + std::to_string(static_cast<int64_t>(f));
      return "f" + py::float_repr(f);
    }
    case Value::Kind::kNone:
      return std::string("n");
    case Value::Kind::kUndefined:
      return std::string("u");
    case Value::Kind::kList: {
      if (!v.is_tuple()) return std::nullopt;
      std::string k = "t" + std::to_string(v.items().size()) + "(";
      for (const auto& e : v.items()) {
        auto h = hash_key(e);
        if (!h) return std::nullopt;
        k += std::to_string(h->size()) + ":" + *h;
      }
      return k + ")";
    }
    case Value::Kind::kDict:
      return std::nullopt;
    case Value::Kind::kFunction:
    case Value::Kind::kObject:
    case Value::Kind::kIterable: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "p%p", static_cast<const void*>(v.heap().get()));
      return std::string(buf);
    }
  }
  return std::nullopt;
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return v.is_markup() ? "Markup" : "str";
    case Value::Kind::kList:
      return v.is_tuple() ? "tuple" : "list";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kFunction:
      return v.function_data().is_macro ? "Macro" : "builtin_function_or_method";
    case Value::Kind::kObject:
      return v.object_data().type_name();
    case Value::Kind::kIterable:
      switch (v.seq_data().kind) {
        case SeqKind::kGenerator:
          return "generator";
        case SeqKind::kIterator:
          return v.seq_data().name;
        case SeqKind::kRange:
          return "range";
        case SeqKind::kDictKeys:
          return "dict_keys";
        case SeqKind::kDictValues:
          return "dict_values";
        case SeqKind::kDictItems:
          return "dict_items";
      }
  }
  return "object";
}

std::string object_type_repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kString:
      return v.is_markup() ? "markupsafe.Markup object" : "str object";
    case Value::Kind::kFunction:
      return v.function_data().is_macro ? "jinja2.runtime.Macro object" : "builtin_function_or_method object";
    case Value::Kind::kObject:
      return v.object_data().module_name() + "." + v.object_data().type_name() + " object";
    case Value::Kind::kUndefined:
      return "jinja2.runtime.Undefined object";
    default:
      return type_name(v) + " object";
  }
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
    case Value::Kind::kInt:
      return v.int_value() != 0;
    case Value::Kind::kFloat:
      return v.float_value() != 0.0;
    case Value::Kind::kString:
      return !v.str().empty();
    case Value::Kind::kList:
      return !v.items().empty();
    case Value::Kind::kDict:
      return v.dict_data().size() != 0;
    case Value::Kind::kIterable: {
      const auto& sd = v.seq_data();
      if (sd.kind == SeqKind::kGenerator || sd.kind == SeqKind::kIterator) return true;
      return !sd.items.empty();
    }
    default:
      return true;
  }
}

namespace {

bool int_equals_float(int64_t i, double f) {
  if (!std::isfinite(f) || f != std::trunc(f) || std::fabs(f) >= 9.223372036854775808e18) return false;
  return static_cast<int64_t>(f) == i;
}

}  // namespace

bool equals(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() && b.is_float()) return a.float_value() == b.float_value();
    if (a.is_float()) return int_equals_float(b.int_value(), a.float_value());
    if (b.is_float()) return int_equals_float(a.int_value(), b.float_value());
    return a.int_value() == b.int_value();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.str() == b.str();
    case K::kList: {
      if (a.is_tuple() != b.is_tuple()) return false;
      const auto &x = a.items(), &y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equals(x[i], y[i])) return false;
      return true;
    }
    case K::kDict: {
      const auto &x = a.dict_data(), &y = b.dict_data();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* o = y.get(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    }
    case K::kIterable: {
      if (a.heap() == b.heap()) return true;
      if (a.seq_data().kind != SeqKind::kRange || b.seq_data().kind != SeqKind::kRange) return false;
      const auto &x = a.seq_data().items, &y = b.seq_data().items;
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equals(x[i], y[i])) return false;
      return true;
    }
    default:
      return a.heap() == b.heap();
  }
}

std::string to_repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kString:
      return v.is_markup() ? "Markup(" + py::repr(v.str()) + ")" : py::repr(v.str());
    case Value::Kind::kList: {
      bool tuple = v.is_tuple();
      std::string out(1, tuple ? '(' : '[');
      const auto& items = v.items();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        out += to_repr(items[i]);
      }
      if (tuple && items.size() == 1) out += ",";
      out.push_back(tuple ? ')' : ']');
      return out;
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, val] : v.dict_data().entries) {
        if (!first) out += ", ";
        first = false;
        out += to_repr(k) + ": " + to_repr(val);
      }
      return out + "}";
    }
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.int_value() ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.int_value());
    case Value::Kind::kFloat:
      return py::float_repr(v.float_value());
    case Value::Kind::kString:
      return v.str();
    case Value::Kind::kList:
    case Value::Kind::kDict:
      return to_repr(v);
    case Value::Kind::kFunction: {
      const auto& f = v.function_data();
      if (f.is_macro) return "<Macro " + py::repr(f.name) + ">";
      return "<built-in function " + f.name + ">";
    }
    case Value::Kind::kObject:
      return v.object_data().repr();
    case Value::Kind::kIterable: {
      const auto& sd = v.seq_data();
      char addr[32];
      std::snprintf(addr, sizeof addr, "0x%llx",
                    static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(&sd)));
      switch (sd.kind) {
        case SeqKind::kGenerator:
          return "<generator object " + sd.name + " at " + addr + ">";
        case SeqKind::kIterator:
          return "<" + sd.name + " object at " + addr + ">";
        case SeqKind::kRange:
          return "range(" + std::to_string(sd.start) + ", " + std::to_string(sd.stop) +
                 (sd.step == 1 ? std::string() : ", " + std::to_string(sd.step)) + ")";
        default: {
          std::string out = type_name(v) + "([";
          for (size_t i = 0; i < sd.items.size(); ++i) {
            if (i) out += ", ";
            out += to_repr(sd.items[i]);
          }
          return out + "])";
        }
      }
    }
  }
  return "";
}

// --- JSON --------------------------------------------------------------------------------------------

namespace {

template <class J>
Value from_json_impl(const J& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      auto u = j.template get<uint64_t>();
      if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return Value::integer(static_cast<int64_t>(u));
      return Value::floating(static_cast<double>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::floating(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::string(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_impl(e));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value d = Value::dict();
      for (auto it = j.begin(); it != j.end(); ++it)
        d.dict_data().set(Value::string(it.key()), from_json_impl(*it));
      return d;
    }
    default:
      return Value::none();
  }
}

void escape_json_string(const std::string& s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  char buf[16];
  bool ascii = true;
  for (unsigned char c : s)
    if (c >= 0x80) {
      ascii = false;
      break;
    }
  auto emit = [&](char32_t c) {
    switch (c) {
      case '"':
        *out += "\\\"";
        return;
      case '\\':
        *out += "\\\\";
        return;
      case '\n':
        *out += "\\n";
        return;
      case '\r':
        *out += "\\r";
        return;
      case '\t':
        *out += "\\t";
        return;
      case '\b':
        *out += "\\b";
        return;
      case '\f':
        *out += "\\f";
        return;
      default:
        break;
    }
    if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
      if (c >= 0x10000 && !(c >= 0xDC80 && c <= 0xDCFF)) {
        char32_t v = c - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 | (v >> 10)),
                      static_cast<unsigned>(0xDC00 | (v & 0x3FF)));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      }
      *out += buf;
      return;
    }
    py::append_utf8(*out, c);
  };
  if (ascii || !ensure_ascii) {
    // Byte-wise is exact here: only ASCII bytes are ever escaped.
    for (unsigned char c : s) {
      if (c >= 0x80)
        out->push_back(static_cast<char>(c));
      else
        emit(c);
    }
  } else {
    for (char32_t c : py::decode(s)) emit(c);
  }
  out->push_back('"');
}

std::string json_float(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f < 0 ? "-Infinity" : "Infinity";
  return py::float_repr(f);
}

// Key order for sort_keys: Python sorts the original keys, so mixed types fail as in Python.
bool key_less(const Value& a, const Value& b, bool* ok) {
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_number() && b.is_number()) return a.number_as_double() < b.number_as_double();
  *ok = false;
  return false;
}

struct Dumper {
  const JsonDumpOptions& opt;
  std::string* out;
  std::string* error;
  std::string item_sep, key_sep;

  bool fail(const std::string& m) {
    *error = m;
    return false;
  }

  void newline(int level) {
    out->push_back('\n');
    for (int i = 0; i < level; ++i) *out += *opt.indent;
  }

  bool dump(const Value& v, int level) {
    switch (v.kind()) {
      case Value::Kind::kNone:
        *out += "null";
        return true;
      case Value::Kind::kBool:
        *out += v.int_value() ? "true" : "false";
        return true;
      case Value::Kind::kInt:
        *out += std::to_string(v.int_value());
        return true;
      case Value::Kind::kFloat:
        *out += json_float(v.float_value());
        return true;
      case Value::Kind::kString:
        escape_json_string(v.str(), opt.ensure_ascii, out);
        return true;
      case Value::Kind::kList: {
        const auto& items = v.items();
        if (items.empty()) {
          *out += "[]";
          return true;
        }
        out->push_back('[');
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) *out += item_sep;
          if (opt.indent) newline(level + 1);
          if (!dump(items[i], level + 1)) return false;
        }
        if (opt.indent) newline(level);
        out->push_back(']');
        return true;
      }
      case Value::Kind::kDict: {
        const auto& d = v.dict_data();
        if (d.size() == 0) {
          *out += "{}";
          return true;
        }
        std::vector<const std::pair<Value, Value>*> entries;
        for (const auto& e : d.entries) entries.push_back(&e);
        if (opt.sort_keys) {
          bool ok = true;
          std::stable_sort(entries.begin(), entries.end(),
                           [&](auto* a, auto* b) { return key_less(a->first, b->first, &ok); });
          if (!ok) return fail("'<' not supported between instances of dict keys of different types");
        }
        out->push_back('{');
        bool first = true;
        for (const auto* e : entries) {
          std::string key;
          const Value& k = e->first;
          switch (k.kind()) {
            case Value::Kind::kString:
              key = k.str();
              break;
            case Value::Kind::kFloat:
              key = json_float(k.float_value());
              break;
            case Value::Kind::kBool:
              key = k.int_value() ? "true" : "false";
              break;
            case Value::Kind::kInt:
              key = std::to_string(k.int_value());
              break;
            case Value::Kind::kNone:
              key = "null";
              break;
            default:
              return fail("keys must be str, int, float, bool or None, not " + type_name(k));
          }
          if (!first) *out += item_sep;
          first = false;
          if (opt.indent) newline(level + 1);
          escape_json_string(key, opt.ensure_ascii, out);
          *out += key_sep;
          if (!dump(e->second, level + 1)) return false;
        }
        if (opt.indent) newline(level);
        out->push_back('}');
        return true;
      }
      default:
        return fail("Object of type " + type_name(v) + " is not JSON serializable");
    }
  }
};

}  // namespace

Value from_json(const nlohmann::ordered_json& j) {
  return from_json_impl(j);
}
Value from_json(const nlohmann::json& j) {
  return from_json_impl(j);
}

bool to_json(const Value& v, nlohmann::ordered_json* out) {
  switch (v.kind()) {
    case Value::Kind::kNone:
      *out = nullptr;
      return true;
    case Value::Kind::kBool:
      *out = v.int_value() != 0;
      return true;
    case Value::Kind::kInt:
      *out = v.int_value();
      return true;
    case Value::Kind::kFloat:
      *out = v.float_value();
      return true;
    case Value::Kind::kString:
      *out = v.str();
      return true;
    case Value::Kind::kList: {
      *out = nlohmann::ordered_json::array();
      for (const auto& e : v.items()) {
        nlohmann::ordered_json j;
        if (!to_json(e, &j)) return false;
        out->push_back(std::move(j));
      }
      return true;
    }
    case Value::Kind::kDict: {
      *out = nlohmann::ordered_json::object();
      for (const auto& [k, e] : v.dict_data().entries) {
        nlohmann::ordered_json j;
        if (!to_json(e, &j)) return false;
        (*out)[k.is_string() ? k.str() : to_str(k)] = std::move(j);
      }
      return true;
    }
    default:
      return false;
  }
}

bool json_dumps(const Value& v, const JsonDumpOptions& opt, std::string* out, std::string* error) {
  Dumper d{opt, out, error, ", ", ": "};
  if (opt.indent) d.item_sep = ",";
  if (opt.separators) {
    d.item_sep = opt.separators->first;
    d.key_sep = opt.separators->second;
  }
  return d.dump(v, 0);
}

}  // namespace deltaflow::text::jinja
