#include "text/jinja/interpreter.hpp"

#include <cmath>
#include <limits>

#include "text/jinja/pystr.hpp"

namespace deltaflow::text::jinja {

namespace {

class NamespaceObject : public ObjectData {
 public:
  std::shared_ptr<DictData> attrs = std::make_shared<DictData>();
  std::string type_name() const override { return "Namespace"; }
  std::string module_name() const override { return "jinja2.utils"; }
  bool is_namespace() const override { return true; }
  bool get_attr(Interpreter&, const std::string& name, Value* out) override {
    const Value* v = attrs->get_str(name);
    if (!v) return false;
    *out = *v;
    return true;
  }
  bool set_attr(const std::string& name, const Value& v) override {
    attrs->set(Value::string(name), v);
    return true;
  }
  std::string repr() const override { return "<Namespace " + to_repr(Value::dict(attrs)) + ">"; }
};

class LoopObject : public ObjectData {
 public:
  std::shared_ptr<const std::vector<Value>> items;
  size_t index0 = 0;
  int depth0 = 0;
  const Stmt* stmt = nullptr;  // set for `recursive` loops
  ScopePtr scope;
  bool has_last = false;
  std::vector<Value> last_changed;

  std::string type_name() const override { return "LoopContext"; }
  std::string module_name() const override { return "jinja2.runtime"; }
  std::string repr() const override {
    return "<LoopContext " + std::to_string(index0 + 1) + "/" + std::to_string(items->size()) + ">";
  }

  bool get_attr(Interpreter&, const std::string& name, Value* out) override {
    auto n = static_cast<int64_t>(items->size());
    auto i = static_cast<int64_t>(index0);
    if (name == "index")
      *out = Value::integer(i + 1);
    else if (name == "index0")
      *out = Value::integer(i);
    else if (name == "revindex")
      *out = Value::integer(n - i);
    else if (name == "revindex0")
      *out = Value::integer(n - i - 1);
    else if (name == "first")
      *out = Value::boolean(i == 0);
    else if (name == "last")
      *out = Value::boolean(i + 1 == n);
    else if (name == "length")
      *out = Value::integer(n);
    else if (name == "depth")
      *out = Value::integer(depth0 + 1);
    else if (name == "depth0")
      *out = Value::integer(depth0);
    else if (name == "previtem")
      *out = i > 0 ? (*items)[index0 - 1] : Value::undefined("there is no previous item");
    else if (name == "nextitem")
      *out = i + 1 < n ? (*items)[index0 + 1] : Value::undefined("there is no next item");
    else if (name == "cycle") {
      size_t idx = index0;
      *out = Value::function("cycle", [idx](Interpreter& in, CallArgs& a) -> Value {
        if (a.args.empty()) in.fail("TypeError", "no items for cycling given");
        return a.args[idx % a.args.size()];
      });
    } else if (name == "changed") {
      auto self = std::static_pointer_cast<LoopObject>(shared_from_this());
      *out = Value::function("changed", [self](Interpreter&, CallArgs& a) -> Value {
        bool same = self->has_last && self->last_changed.size() == a.args.size();
        for (size_t k = 0; same && k < a.args.size(); ++k) same = equals(self->last_changed[k], a.args[k]);
        if (same) return Value::boolean(false);
        self->has_last = true;
        self->last_changed = a.args;
        return Value::boolean(true);
      });
    } else {
      return false;
    }
    return true;
  }

  bool call(Interpreter& in, CallArgs& args, Value* out) override {
    if (!stmt) in.fail("TypeError", "The loop must have the 'recursive' marker to be called recursively.");
    if (args.args.size() != 1 || !args.kwargs.empty())
      in.fail("TypeError", "loop() takes exactly one argument");
    std::vector<Value> next = in.iterate(args.args[0]);
    if (++in.depth() > in.limits().max_call_depth) {
      --in.depth();
      in.fail("LimitError", "recursion deeper than " + std::to_string(in.limits().max_call_depth) + " calls");
    }
    std::string buf;
    bool iterated = false;
    in.run_loop(*stmt, next, scope, depth0 + 1, &buf, &iterated);
    --in.depth();
    *out = Value::string(std::move(buf));
    return true;
  }
};

bool checked_add(int64_t a, int64_t b, int64_t* r) {
  return !__builtin_add_overflow(a, b, r);
}
bool checked_sub(int64_t a, int64_t b, int64_t* r) {
  return !__builtin_sub_overflow(a, b, r);
}
bool checked_mul(int64_t a, int64_t b, int64_t* r) {
  return !__builtin_mul_overflow(a, b, r);
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t floor_mod(int64_t a, int64_t b) {
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

// CPython's float_divmod.
void float_divmod(double vx, double wx, double* floordiv, double* mod) {
  double m = std::fmod(vx, wx);
  double div = (vx - m) / wx;
  if (m != 0.0) {
    if ((wx < 0) != (m < 0)) {
      m += wx;
      div -= 1.0;
    }
  } else {
    m = std::copysign(0.0, wx);
  }
  double fd;
  if (div != 0.0) {
    fd = std::floor(div);
    if (div - fd > 0.5) fd += 1.0;
  } else {
    fd = std::copysign(0.0, vx / wx);
  }
  *floordiv = fd;
  *mod = m;
}

}  // namespace

// --- argument helpers --------------------------------------------------------------------------------

std::vector<Value> bind_args(Interpreter& in, const char* fname, const CallArgs& args,
                             std::initializer_list<Param> params) {
  std::vector<Value> out(params.size());
  std::vector<bool> set(params.size(), false);
  if (args.args.size() > params.size())
    in.fail("TypeError", std::string(fname) + "() takes at most " + std::to_string(params.size()) +
                             " argument(s) (" + std::to_string(args.args.size()) + " given)");
  for (size_t i = 0; i < args.args.size(); ++i) {
    out[i] = args.args[i];
    set[i] = true;
  }
  for (const auto& [k, v] : args.kwargs) {
    size_t idx = 0;
    bool found = false;
    for (const auto& p : params) {
      if (k == p.name) {
        found = true;
        break;
      }
      ++idx;
    }
    if (!found)
      in.fail("TypeError", std::string(fname) + "() got an unexpected keyword argument " + py::repr(k));
    if (set[idx])
      in.fail("TypeError", std::string(fname) + "() got multiple values for argument " + py::repr(k));
    out[idx] = v;
    set[idx] = true;
  }
  size_t i = 0;
  for (const auto& p : params) {
    if (!set[i]) {
      if (p.required)
        in.fail("TypeError", std::string(fname) + "() missing required argument " + py::repr(p.name));
      out[i] = p.def;
    }
    ++i;
  }
  return out;
}

int64_t to_index(Interpreter& in, const Value& v, const char* what) {
  if (v.is_int() || v.is_bool()) return v.int_value();
  in.ensure_defined(v);
  (void)what;
  in.fail("TypeError", py::repr(type_name(v)) + " object cannot be interpreted as an integer");
}

// --- interpreter -------------------------------------------------------------------------------------

Interpreter::Interpreter(const Limits& limits) : limits_(limits) {}

Interpreter::~Interpreter() {
  // Macros close over scopes and scopes hold macros: clear everything so no cycle outlives the render.
  for (auto& w : objects_)
    if (auto o = w.lock()) {
      if (o->is_namespace())
        static_cast<NamespaceObject*>(o.get())->attrs->entries.clear();
      else if (auto* l = dynamic_cast<LoopObject*>(o.get()))
        l->scope.reset();
    }
  for (auto& w : scopes_)
    if (auto s = w.lock()) s->clear();
}

ScopePtr Interpreter::new_scope(const ScopePtr& parent) {
  auto s = std::make_shared<Scope>(parent);
  // Forget expired scopes now and then so long renders do not grow the list without bound.
  if (scopes_.size() >= 1024 && (scopes_.size() & (scopes_.size() - 1)) == 0) {
    std::vector<std::weak_ptr<Scope>> live;
    for (auto& w : scopes_)
      if (!w.expired()) live.push_back(w);
    scopes_.swap(live);
  }
  scopes_.push_back(s);
  return s;
}

void Interpreter::fail(const std::string& type, const std::string& message) {
  throw_error(type, message, offset_);
}

void Interpreter::step(size_t offset) {
  offset_ = offset;
  if (++steps_ > limits_.max_steps)
    fail("LimitError", "template evaluation exceeded " + std::to_string(limits_.max_steps) + " steps");
}

void Interpreter::check_size(size_t bytes) {
  if (bytes > limits_.max_output_bytes)
    fail("LimitError",
         "template output or string larger than " + std::to_string(limits_.max_output_bytes) + " bytes");
}

void Interpreter::count_iterations(uint64_t n) {
  iterations_ += n;
  if (iterations_ > limits_.max_loop_iterations)
    fail("LimitError",
         "template loops exceeded " + std::to_string(limits_.max_loop_iterations) + " iterations");
}

void Interpreter::append(std::string& out, const std::string& text) {
  check_size(out.size() + text.size());
  out += text;
}

void Interpreter::ensure_defined(const Value& v) {
  if (v.is_undefined())
    fail(v.undefined_is_security() ? "SecurityError" : "UndefinedError", v.undefined_message());
}

std::string Interpreter::escape_html(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  check_size(out.size());
  return out;
}

Value Interpreter::make_namespace(CallArgs& args) {
  auto ns = std::make_shared<NamespaceObject>();
  track(ns);
  if (args.args.size() > 1)
    fail("TypeError", "dict expected at most 1 argument, got " + std::to_string(args.args.size()));
  if (!args.args.empty()) {
    const Value& src = args.args[0];
    if (src.is_dict()) {
      for (const auto& [k, v] : src.dict_data().entries) ns->attrs->set(k, v);
    } else {
      for (const Value& pair : iterate(src)) {
        std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2)
          fail("ValueError", "dictionary update sequence element has length " + std::to_string(kv.size()) +
                                 "; 2 is required");
        if (!ns->attrs->set(kv[0], kv[1]))
          fail("TypeError", "unhashable type: " + py::repr(type_name(kv[0])));
      }
    }
  }
  for (const auto& [k, v] : args.kwargs) ns->attrs->set(Value::string(k), v);
  return Value::object(ns);
}

Value Interpreter::undefined_attr(const Value& obj, const Value& name) {
  if (name.is_string())
    return Value::undefined(py::repr(object_type_repr(obj)) + " has no attribute " + py::repr(name.str()));
  return Value::undefined(object_type_repr(obj) + " has no element " + to_repr(name));
}

Value Interpreter::getattr(const Value& obj, const std::string& name) {
  ensure_defined(obj);
  if (name.size() > 4 && name.compare(0, 2, "__") == 0 && name.compare(name.size() - 2, 2, "__") == 0)
    return Value::undefined(
        "access to attribute " + py::repr(name) + " of " + py::repr(type_name(obj)) + " object is unsafe.",
        true);
  Value out;
  if (obj.is_object() && obj.object_data().get_attr(*this, name, &out)) return out;
  if (builtin_attribute(*this, obj, name, &out)) return out;
  if (obj.is_dict()) {
    if (const Value* v = obj.dict_data().get_str(name)) return *v;
  }
  return undefined_attr(obj, Value::string(name));
}

Value Interpreter::getitem(const Value& obj, const Value& key) {
  ensure_defined(obj);
  if (obj.is_dict()) {
    if (const Value* v = obj.dict_data().get(key)) return *v;
  } else if (obj.is_list() && (key.is_int() || key.is_bool())) {
    auto n = static_cast<int64_t>(obj.items().size());
    int64_t i = key.int_value();
    if (i < 0) i += n;
    if (i >= 0 && i < n) return obj.items()[static_cast<size_t>(i)];
  } else if (obj.is_iterable_object() && obj.seq_data().kind == SeqKind::kRange &&
             (key.is_int() || key.is_bool())) {
    const auto& items = obj.seq_data().items;
    auto n = static_cast<int64_t>(items.size());
    int64_t i = key.int_value();
    if (i < 0) i += n;
    if (i >= 0 && i < n) return items[static_cast<size_t>(i)];
  } else if (obj.is_string() && (key.is_int() || key.is_bool())) {
    std::u32string cps = py::decode(obj.str());
    auto n = static_cast<int64_t>(cps.size());
    int64_t i = key.int_value();
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      std::string ch;
      py::append_utf8(ch, cps[static_cast<size_t>(i)]);
      return Value::string(std::move(ch)).with_markup(obj.is_markup());
    }
  }
  if (key.is_string()) {
    const std::string& k = key.str();
    if (k.size() > 4 && k.compare(0, 2, "__") == 0 && k.compare(k.size() - 2, 2, "__") == 0)
      return Value::undefined("access to attribute " + py::repr(key.str()) + " of " +
                                  py::repr(type_name(obj)) + " object is unsafe.",
                              true);
    Value out;
    if (obj.is_object() && obj.object_data().get_attr(*this, key.str(), &out)) return out;
    if (builtin_attribute(*this, obj, key.str(), &out)) return out;
  }
  return undefined_attr(obj, key);
}

Value Interpreter::call(const Value& fn, CallArgs& args) {
  ensure_defined(fn);
  if (fn.is_function()) {
    size_t saved = offset_;
    Value r = fn.function_data().fn(*this, args);
    offset_ = saved;
    return r;
  }
  Value out;
  if (fn.is_object() && fn.object_data().call(*this, args, &out)) return out;
  fail("TypeError", py::repr(type_name(fn)) + " object is not callable");
}

std::vector<Value> Interpreter::iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return v.items();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.dict_data().size());
      for (const auto& e : v.dict_data().entries) keys.push_back(e.first);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (char32_t c : py::decode(v.str())) {
        std::string ch;
        py::append_utf8(ch, c);
        chars.push_back(Value::string(std::move(ch)).with_markup(v.is_markup()));
      }
      return chars;
    }
    case Value::Kind::kIterable: {
      auto& sd = v.seq_data();
      if (sd.kind != SeqKind::kGenerator && sd.kind != SeqKind::kIterator) return sd.items;
      if (sd.consumed) return {};
      sd.consumed = true;  // single use, also when the producer fails (like an exhausted generator)
      if (sd.producer) {
        auto producer = std::move(sd.producer);
        sd.producer = nullptr;
        return producer(*this);
      }
      return std::move(sd.items);
    }
    default:
      fail("TypeError", py::repr(type_name(v)) + " object is not iterable");
  }
}

int64_t Interpreter::length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return static_cast<int64_t>(py::length(v.str()));
    case Value::Kind::kList:
      return static_cast<int64_t>(v.items().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.dict_data().size());
    case Value::Kind::kIterable:
      if (v.seq_data().kind != SeqKind::kGenerator && v.seq_data().kind != SeqKind::kIterator)
        return static_cast<int64_t>(v.seq_data().items.size());
      [[fallthrough]];
    default:
      fail("TypeError", "object of type " + py::repr(type_name(v)) + " has no len()");
  }
}

bool Interpreter::less(const Value& a, const Value& b, const char* op) {
  ensure_defined(a);
  ensure_defined(b);
  std::string o = op;
  auto cmp_num = [&](double x, double y, int64_t xi, int64_t yi, bool ints) -> bool {
    if (ints) {
      if (o == "<") return xi < yi;
      if (o == "<=") return xi <= yi;
      if (o == ">") return xi > yi;
      return xi >= yi;
    }
    if (o == "<") return x < y;
    if (o == "<=") return x <= y;
    if (o == ">") return x > y;
    return x >= y;
  };
  if (a.is_number() && b.is_number()) {
    bool ints = !a.is_float() && !b.is_float();
    return cmp_num(a.number_as_double(), b.number_as_double(), ints ? a.int_value() : 0,
                   ints ? b.int_value() : 0, ints);
  }
  if (a.is_string() && b.is_string()) {
    int c = a.str().compare(b.str());
    return cmp_num(c, 0, c, 0, true);
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto &x = a.items(), &y = b.items();
    size_t n = std::min(x.size(), y.size());
    for (size_t i = 0; i < n; ++i)
      if (!equals(x[i], y[i])) return less(x[i], y[i], op);
    auto xs = static_cast<int64_t>(x.size()), ys = static_cast<int64_t>(y.size());
    return cmp_num(0, 0, xs, ys, true);
  }
  fail("TypeError", py::repr(o) + " not supported between instances of " + py::repr(type_name(a)) + " and " +
                        py::repr(type_name(b)));
}

bool Interpreter::contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        ensure_defined(item);
        fail("TypeError", "'in <string>' requires string as left operand, not " + type_name(item));
      }
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
      for (const auto& e : container.items())
        if (equals(e, item)) return true;
      return false;
    case Value::Kind::kDict:
      if (!hash_key(item)) fail("TypeError", "unhashable type: " + py::repr(type_name(item)));
      return container.dict_data().get(item) != nullptr;
    case Value::Kind::kIterable:
      for (const auto& e : iterate(container))
        if (equals(e, item)) return true;
      return false;
    default:
      fail("TypeError", "argument of type " + py::repr(type_name(container)) + " is not iterable");
  }
}

Value Interpreter::binop(const std::string& op, const Value& a, const Value& b) {
  ensure_defined(a);
  ensure_defined(b);
  const char* sym = op == "add"        ? "+"
                    : op == "sub"      ? "-"
                    : op == "mul"      ? "*"
                    : op == "div"      ? "/"
                    : op == "floordiv" ? "//"
                    : op == "mod"      ? "%"
                                       : "**";
  auto unsupported = [&]() {
    fail("TypeError", std::string("unsupported operand type(s) for ") + sym + ": " + py::repr(type_name(a)) +
                          " and " + py::repr(type_name(b)));
  };
  auto overflow = [&]() { fail("OverflowError", "integer result does not fit in 64 bits"); };
  bool nums = a.is_number() && b.is_number();
  bool ints = nums && !a.is_float() && !b.is_float();
  if (op == "add") {
    if (ints) {
      int64_t r;
      if (!checked_add(a.int_value(), b.int_value(), &r)) overflow();
      return Value::integer(r);
    }
    if (nums) return Value::floating(a.number_as_double() + b.number_as_double());
    if (a.is_string() && b.is_string()) {
      // Markup + str escapes the str side (markupsafe's __add__/__radd__).
      bool markup = a.is_markup() || b.is_markup();
      std::string l = a.is_markup() || !markup ? a.str() : escape_html(a.str());
      std::string r = b.is_markup() || !markup ? b.str() : escape_html(b.str());
      check_size(l.size() + r.size());
      return Value::string(l + r).with_markup(markup);
    }
    if (a.is_list() && b.is_list()) {
      if (a.is_tuple() != b.is_tuple())
        fail("TypeError", std::string("can only concatenate ") + type_name(a) + " (not \"" + type_name(b) +
                              "\") to " + type_name(a));
      std::vector<Value> items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      return a.is_tuple() ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    if (a.is_string() || a.is_list())
      fail("TypeError", std::string("can only concatenate ") + type_name(a) + " (not \"" + type_name(b) +
                            "\") to " + type_name(a));
    unsupported();
  }
  if (op == "sub") {
    if (ints) {
      int64_t r;
      if (!checked_sub(a.int_value(), b.int_value(), &r)) overflow();
      return Value::integer(r);
    }
    if (nums) return Value::floating(a.number_as_double() - b.number_as_double());
    unsupported();
  }
  if (op == "mul") {
    if (ints) {
      int64_t r;
      if (!checked_mul(a.int_value(), b.int_value(), &r)) overflow();
      return Value::integer(r);
    }
    if (nums) return Value::floating(a.number_as_double() * b.number_as_double());
    const Value* seq = (a.is_string() || a.is_list()) ? &a : (b.is_string() || b.is_list()) ? &b : nullptr;
    const Value* n = seq == &a ? &b : &a;
    if (seq && (n->is_int() || n->is_bool())) {
      int64_t times = std::max<int64_t>(0, n->int_value());
      if (seq->is_string()) {
        size_t total = seq->str().size() * static_cast<size_t>(std::min<int64_t>(times, INT32_MAX));
        if (times > 0 && !seq->str().empty()) check_size(total);
        std::string out;
        if (!seq->str().empty())
          for (int64_t i = 0; i < times; ++i) out += seq->str();
        return Value::string(std::move(out)).with_markup(seq->is_markup());
      }
      size_t total = seq->items().size() * static_cast<size_t>(std::min<int64_t>(times, INT32_MAX));
      if (times > 0 && !seq->items().empty()) {
        check_size(total);
        count_iterations(total);
      }
      std::vector<Value> items;
      if (!seq->items().empty())
        for (int64_t i = 0; i < times; ++i)
          items.insert(items.end(), seq->items().begin(), seq->items().end());
      return seq->is_tuple() ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    if (seq) fail("TypeError", "can't multiply sequence by non-int of type " + py::repr(type_name(*n)));
    unsupported();
  }
  if (op == "div") {
    if (nums) {
      double d = b.number_as_double();
      if (d == 0.0) fail("ZeroDivisionError", "division by zero");
      return Value::floating(a.number_as_double() / d);
    }
    unsupported();
  }
  if (op == "floordiv" || op == "mod") {
    if (ints) {
      if (b.int_value() == 0)
        fail("ZeroDivisionError",
             op == "mod" ? "integer modulo by zero" : "integer division or modulo by zero");
      if (a.int_value() == INT64_MIN && b.int_value() == -1) {
        if (op == "mod") return Value::integer(0);
        overflow();
      }
      return Value::integer(op == "mod" ? floor_mod(a.int_value(), b.int_value())
                                        : floor_div(a.int_value(), b.int_value()));
    }
    if (nums) {
      double y = b.number_as_double();
      if (y == 0.0)
        fail("ZeroDivisionError", op == "mod" ? "float modulo by zero" : "float floor division by zero");
      double fd, m;
      float_divmod(a.number_as_double(), y, &fd, &m);
      return Value::floating(op == "mod" ? m : fd);
    }
    if (op == "mod" && a.is_string()) {
      std::string r = percent_format(*this, a.str(), b);
      return Value::string(std::move(r)).with_markup(a.is_markup());
    }
    unsupported();
  }
  if (op == "pow") {
    if (ints && b.int_value() >= 0) {
      int64_t base = a.int_value(), e = b.int_value(), r = 1;
      while (e > 0) {
        if (e & 1) {
          if (!checked_mul(r, base, &r)) overflow();
        }
        e >>= 1;
        if (e > 0 && !checked_mul(base, base, &base)) overflow();
      }
      return Value::integer(r);
    }
    if (nums) {
      double x = a.number_as_double(), y = b.number_as_double();
      if (x == 0.0 && y < 0) fail("ZeroDivisionError", "0.0 cannot be raised to a negative power");
      return Value::floating(std::pow(x, y));
    }
    unsupported();
  }
  unsupported();
  __builtin_unreachable();
}

Value Interpreter::call_filter(const std::string& name, const Value& subject, CallArgs& args) {
  const FilterFn* fn = find_filter(name);
  if (!fn) fail("TemplateRuntimeError", "No filter named " + py::repr(name) + " found.");
  return (*fn)(*this, subject, args);
}

bool Interpreter::call_test(const std::string& name, const Value& subject, CallArgs& args) {
  const TestFn* fn = find_test(name);
  if (!fn) fail("TemplateRuntimeError", "No test named " + py::repr(name) + " found.");
  return (*fn)(*this, subject, args);
}

// --- expressions -------------------------------------------------------------------------------------

void Interpreter::eval_call_args(const Expr& e, const ScopePtr& scope, size_t first, CallArgs* out) {
  for (size_t i = first; i < e.children.size(); ++i) out->args.push_back(eval(*e.children[i], scope));
  for (const auto& [k, v] : e.kwargs) out->kwargs.emplace_back(k, eval(*v, scope));
  if (e.dyn_args) {
    Value v = eval(*e.dyn_args, scope);
    for (auto& item : iterate(v)) out->args.push_back(std::move(item));
  }
  if (e.dyn_kwargs) {
    Value v = eval(*e.dyn_kwargs, scope);
    offset_ = e.offset;
    if (!v.is_dict()) fail("TypeError", "argument after ** must be a mapping, not " + type_name(v));
    for (const auto& [k, val] : v.dict_data().entries) {
      if (!k.is_string()) fail("TypeError", "keywords must be strings");
      out->kwargs.emplace_back(k.str(), val);
    }
  }
}

Value Interpreter::eval_filter(const Expr& e, const ScopePtr& scope, const Value* block_subject) {
  step(e.offset);
  Value subject;
  if (!e.children[0]) {
    subject = *block_subject;
  } else if (e.children[0]->kind == ExprKind::kFilter) {
    subject = eval_filter(*e.children[0], scope, block_subject);
  } else {
    subject = eval(*e.children[0], scope);
  }
  CallArgs args;
  eval_call_args(e, scope, 1, &args);
  offset_ = e.offset;
  const FilterFn* fn = static_cast<const FilterFn*>(e.fn);
  if (!fn) fail("TemplateRuntimeError", "No filter named " + py::repr(e.name) + " found.");
  if (++depth_ > limits_.max_call_depth + 64) {
    --depth_;
    fail("LimitError", "nesting of calls too deep");
  }
  Value r = (*fn)(*this, subject, args);
  --depth_;
  return r;
}

Value Interpreter::eval_slice(const Value& obj, const Expr& slice, const ScopePtr& scope) {
  Value parts[3];
  for (int i = 0; i < 3; ++i) parts[i] = slice.children[i] ? eval(*slice.children[i], scope) : Value::none();
  offset_ = slice.offset;
  ensure_defined(obj);
  int64_t idx[3] = {0, 0, 1};
  bool given[3];
  for (int i = 0; i < 3; ++i) {
    given[i] = !parts[i].is_none();
    if (given[i]) {
      if (!(parts[i].is_int() || parts[i].is_bool())) {
        ensure_defined(parts[i]);
        fail("TypeError", "slice indices must be integers or None or have an __index__ method");
      }
      idx[i] = parts[i].int_value();
    }
  }
  bool is_range = obj.is_iterable_object() && obj.seq_data().kind == SeqKind::kRange;
  if (!obj.is_list() && !obj.is_string() && !is_range) {
    return Value::undefined(object_type_repr(obj) + " has no element slice(" + to_repr(parts[0]) + ", " +
                            to_repr(parts[1]) + ", " + to_repr(parts[2]) + ")");
  }
  int64_t step = idx[2];
  if (step == 0) fail("ValueError", "slice step cannot be zero");
  std::u32string cps;
  int64_t n;
  if (obj.is_string()) {
    cps = py::decode(obj.str());
    n = static_cast<int64_t>(cps.size());
  } else if (is_range) {
    n = static_cast<int64_t>(obj.seq_data().items.size());
  } else {
    n = static_cast<int64_t>(obj.items().size());
  }
  int64_t start, stop;
  auto adjust = [&](int64_t v, bool is_given, int64_t def) -> int64_t {
    if (!is_given) return def;
    if (v < 0) {
      v += n;
      if (v < 0) v = step < 0 ? -1 : 0;
    } else if (v >= n) {
      v = step < 0 ? n - 1 : n;
    }
    return v;
  };
  start = adjust(idx[0], given[0], step < 0 ? n - 1 : 0);
  stop = adjust(idx[1], given[1], step < 0 ? -1 : n);
  std::vector<size_t> picks;
  if (step > 0) {
    for (int64_t i = start; i < stop; i += step) picks.push_back(static_cast<size_t>(i));
  } else {
    for (int64_t i = start; i > stop; i += step) picks.push_back(static_cast<size_t>(i));
  }
  if (obj.is_string()) {
    std::u32string out;
    for (size_t p : picks) out.push_back(cps[p]);
    return Value::string(py::encode(out)).with_markup(obj.is_markup());
  }
  if (is_range) {
    // CPython's range slicing: the result is a range again, with derived start/stop/step.
    const auto& r = obj.seq_data();
    auto sd = std::make_shared<SeqData>();
    sd->kind = SeqKind::kRange;
    sd->start = r.start + start * r.step;
    sd->stop = r.start + stop * r.step;
    sd->step = r.step * step;
    for (size_t p : picks) sd->items.push_back(r.items[p]);
    return Value::iterable(std::move(sd));
  }
  std::vector<Value> items;
  items.reserve(picks.size());
  for (size_t p : picks) items.push_back(obj.items()[p]);
  return obj.is_tuple() ? Value::tuple(std::move(items)) : Value::list(std::move(items));
}

Value Interpreter::eval_compare(const Expr& e, const ScopePtr& scope) {
  Value left = eval(*e.children[0], scope);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.children[i + 1], scope);
    offset_ = e.offset;
    const std::string& op = e.ops[i];
    bool r;
    if (op == "eq")
      r = equals(left, right);
    else if (op == "ne")
      r = !equals(left, right);
    else if (op == "lt")
      r = less(left, right, "<");
    else if (op == "lteq")
      r = less(left, right, "<=");
    else if (op == "gt")
      r = less(left, right, ">");
    else if (op == "gteq")
      r = less(left, right, ">=");
    else if (op == "in")
      r = contains(right, left);
    else
      r = !contains(right, left);
    if (!r) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Interpreter::eval(const Expr& e, const ScopePtr& scope) {
  step(e.offset);
  switch (e.kind) {
    case ExprKind::kConst:
      return e.value;
    case ExprKind::kName: {
      if (const Value* v = scope->find(e.name)) return *v;
      return Value::undefined(py::repr(e.name) + " is undefined");
    }
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.children.size());
      for (const auto& c : e.children) items.push_back(eval(*c, scope));
      return e.kind == ExprKind::kTuple ? Value::tuple(std::move(items)) : Value::list(std::move(items));
    }
    case ExprKind::kDict: {
      Value d = Value::dict();
      for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
        Value k = eval(*e.children[i], scope);
        Value v = eval(*e.children[i + 1], scope);
        offset_ = e.children[i]->offset;
        if (!d.dict_data().set(k, std::move(v)))
          fail("TypeError", "unhashable type: " + py::repr(type_name(k)));
      }
      return d;
    }
    case ExprKind::kGetAttr: {
      Value obj = eval(*e.children[0], scope);
      offset_ = e.offset;
      return getattr(obj, e.name);
    }
    case ExprKind::kGetItem: {
      Value obj = eval(*e.children[0], scope);
      if (e.children[1]->kind == ExprKind::kSlice) return eval_slice(obj, *e.children[1], scope);
      Value key = eval(*e.children[1], scope);
      offset_ = e.offset;
      return getitem(obj, key);
    }
    case ExprKind::kCall: {
      Value callee = eval(*e.children[0], scope);
      CallArgs args;
      eval_call_args(e, scope, 1, &args);
      offset_ = e.offset;
      return call(callee, args);
    }
    case ExprKind::kFilter:
      return eval_filter(e, scope, nullptr);
    case ExprKind::kTest: {
      Value subject = eval(*e.children[0], scope);
      CallArgs args;
      eval_call_args(e, scope, 1, &args);
      offset_ = e.offset;
      const TestFn* fn = static_cast<const TestFn*>(e.fn);
      if (!fn) fail("TemplateRuntimeError", "No test named " + py::repr(e.name) + " found.");
      return Value::boolean((*fn)(*this, subject, args));
    }
    case ExprKind::kUnary: {
      Value v = eval(*e.children[0], scope);
      offset_ = e.offset;
      if (e.name == "not") return Value::boolean(!truthy(v));
      ensure_defined(v);
      if (v.is_float()) return Value::floating(e.name == "neg" ? -v.float_value() : v.float_value());
      if (v.is_int() || v.is_bool()) {
        if (e.name == "pos") return Value::integer(v.int_value());
        if (v.int_value() == INT64_MIN) fail("OverflowError", "integer result does not fit in 64 bits");
        return Value::integer(-v.int_value());
      }
      fail("TypeError", std::string("bad operand type for unary ") + (e.name == "neg" ? "-" : "+") + ": " +
                            py::repr(type_name(v)));
    }
    case ExprKind::kBinary: {
      if (e.name == "and" || e.name == "or") {
        Value l = eval(*e.children[0], scope);
        bool t = truthy(l);
        if ((e.name == "and") ? !t : t) return l;
        return eval(*e.children[1], scope);
      }
      Value l = eval(*e.children[0], scope);
      Value r = eval(*e.children[1], scope);
      offset_ = e.offset;
      return binop(e.name, l, r);
    }
    case ExprKind::kConcat: {
      std::string out;
      for (const auto& c : e.children) {
        Value v = eval(*c, scope);
        out += to_str(v);
        offset_ = e.offset;
        check_size(out.size());
      }
      return Value::string(std::move(out));
    }
    case ExprKind::kCompare:
      return eval_compare(e, scope);
    case ExprKind::kCondExpr: {
      if (truthy(eval(*e.children[0], scope))) return eval(*e.children[1], scope);
      if (e.children[2]) return eval(*e.children[2], scope);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined.");
    }
    case ExprKind::kSlice:
    case ExprKind::kNsRef:
      fail("TemplateSyntaxError", "unexpected expression");
  }
  return Value();
}

// --- statements --------------------------------------------------------------------------------------

void Interpreter::assign(const Expr& target, const Value& v, const ScopePtr& scope) {
  switch (target.kind) {
    case ExprKind::kName:
      scope->set(target.name, v);
      return;
    case ExprKind::kTuple: {
      offset_ = target.offset;
      ensure_defined(v);
      std::vector<Value> items = iterate(v);
      size_t n = target.children.size();
      if (items.size() < n)
        fail("ValueError", "not enough values to unpack (expected " + std::to_string(n) + ", got " +
                               std::to_string(items.size()) + ")");
      if (items.size() > n)
        fail("ValueError", "too many values to unpack (expected " + std::to_string(n) + ")");
      for (size_t i = 0; i < n; ++i) assign(*target.children[i], items[i], scope);
      return;
    }
    case ExprKind::kNsRef: {
      offset_ = target.offset;
      const Value* ns = scope->find(target.name);
      if (!ns || !ns->is_object() || !ns->object_data().is_namespace())
        fail("TemplateRuntimeError", "cannot assign attribute on non-namespace object");
      ns->object_data().set_attr(target.attr, v);
      return;
    }
    default:
      fail("TemplateSyntaxError", "can't assign to this expression");
  }
}

Value Interpreter::make_macro(const Stmt& s, const ScopePtr& scope, bool is_caller) {
  auto f = std::make_shared<FunctionData>();
  f->name = is_caller ? "caller" : s.name;
  f->is_macro = true;
  f->arguments = s.params;
  f->catch_varargs = s.uses_varargs;
  f->catch_kwargs = s.uses_kwargs;
  f->caller = s.uses_caller;
  const Stmt* def = &s;
  ScopePtr closure = scope;  // macros see the scope they were defined in, as jinja2's closures do
  f->fn = [def, closure](Interpreter& in, CallArgs& args) -> Value {
    return in.call_macro(*def, closure, args);
  };
  return Value::function(std::move(f));
}

Value Interpreter::call_macro(const Stmt& def, const ScopePtr& closure, CallArgs& args) {
  if (++depth_ > limits_.max_call_depth) {
    --depth_;
    fail("LimitError", "recursion deeper than " + std::to_string(limits_.max_call_depth) + " calls");
  }
  struct Dec {
    int& d;
    ~Dec() { --d; }
  } dec{depth_};
  const std::string& name = def.kind == StmtKind::kMacro ? def.name : std::string("caller");
  ScopePtr scope = new_scope(closure);
  size_t np = def.params.size();
  std::vector<bool> bound(np, false);
  std::vector<Value> extra;
  for (size_t i = 0; i < args.args.size(); ++i) {
    if (i < np) {
      scope->set(def.params[i], args.args[i]);
      bound[i] = true;
    } else {
      extra.push_back(args.args[i]);
    }
  }
  if (!extra.empty() && !def.uses_varargs)
    fail("TypeError",
         "macro " + py::repr(name) + " takes not more than " + std::to_string(np) + " argument(s)");
  Value kw = Value::dict();
  Value caller = Value::undefined("No caller defined");
  for (const auto& [k, v] : args.kwargs) {
    size_t idx = np;
    for (size_t i = 0; i < np; ++i)
      if (def.params[i] == k) idx = i;
    if (idx < np) {
      if (bound[idx])
        fail("TypeError", "macro " + py::repr(name) + " got multiple values for argument " + py::repr(k));
      scope->set(k, v);
      bound[idx] = true;
    } else if (k == "caller" && def.uses_caller) {
      caller = v;
    } else if (def.uses_kwargs) {
      kw.dict_data().set(Value::string(k), v);
    } else {
      fail("TypeError", "macro " + py::repr(name) + " takes no keyword argument " + py::repr(k));
    }
  }
  size_t first_default = np - def.defaults.size();
  for (size_t i = 0; i < np; ++i) {
    if (bound[i]) continue;
    if (i >= first_default) {
      scope->set(def.params[i], eval(*def.defaults[i - first_default], scope));
    } else {
      scope->set(def.params[i],
                 Value::undefined("parameter " + py::repr(def.params[i]) + " was not provided"));
    }
  }
  if (def.uses_varargs) scope->set("varargs", Value::tuple(std::move(extra)));
  if (def.uses_kwargs) scope->set("kwargs", kw);
  if (def.uses_caller) scope->set("caller", caller);
  std::string buf;
  exec(def.body, scope, buf);
  return Value::string(std::move(buf));
}

void Interpreter::run_loop(const Stmt& s, const std::vector<Value>& items, const ScopePtr& scope, int depth0,
                           std::string* out, bool* iterated) {
  std::vector<Value> kept;
  const std::vector<Value>* list = &items;
  if (s.cond) {
    for (const auto& item : items) {
      count_iterations(1);
      ScopePtr probe = new_scope(scope);
      assign(*s.target, item, probe);
      if (truthy(eval(*s.cond, probe))) kept.push_back(item);
    }
    list = &kept;
  }
  auto shared = std::make_shared<const std::vector<Value>>(*list);
  auto loop = std::make_shared<LoopObject>();
  track(loop);
  loop->items = shared;
  loop->depth0 = depth0;
  if (s.recursive) {
    loop->stmt = &s;
    loop->scope = scope;
  }
  Value loop_value = Value::object(loop);
  *iterated = !shared->empty();
  for (size_t i = 0; i < shared->size(); ++i) {
    count_iterations(1);
    step(s.offset);
    loop->index0 = i;
    ScopePtr iter_scope = new_scope(scope);
    assign(*s.target, (*shared)[i], iter_scope);
    iter_scope->set("loop", loop_value);
    Flow f = exec(s.body, iter_scope, *out);
    if (f == Flow::kBreak) break;
  }
}

Flow Interpreter::exec(const Body& body, const ScopePtr& scope, std::string& out) {
  for (const auto& s : body) {
    Flow f = exec_stmt(*s, scope, out);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Flow Interpreter::exec_stmt(const Stmt& s, const ScopePtr& scope, std::string& out) {
  step(s.offset);
  switch (s.kind) {
    case StmtKind::kData:
      append(out, s.text);
      return Flow::kNormal;
    case StmtKind::kOutput: {
      Value v = eval(*s.expr, scope);
      offset_ = s.expr->offset;
      append(out, to_str(v));
      return Flow::kNormal;
    }
    case StmtKind::kIf:
      for (const auto& [test, body] : s.branches)
        if (truthy(eval(*test, scope))) return exec(body, scope, out);
      return exec(s.else_body, scope, out);
    case StmtKind::kFor: {
      Value it = eval(*s.expr, scope);
      offset_ = s.expr->offset;
      std::vector<Value> items = iterate(it);
      bool iterated = false;
      run_loop(s, items, scope, 0, &out, &iterated);
      if (!iterated && !s.else_body.empty()) return exec(s.else_body, new_scope(scope), out);
      return Flow::kNormal;
    }
    case StmtKind::kSet: {
      Value v = eval(*s.expr, scope);
      assign(*s.target, v, scope);
      return Flow::kNormal;
    }
    case StmtKind::kSetBlock: {
      std::string buf;
      exec(s.body, new_scope(scope), buf);
      Value v = Value::string(std::move(buf));
      if (s.expr) v = eval_filter(*s.expr, scope, &v);
      assign(*s.target, v, scope);
      return Flow::kNormal;
    }
    case StmtKind::kMacro:
      scope->set(s.name, make_macro(s, scope, false));
      return Flow::kNormal;
    case StmtKind::kCallBlock: {
      Value caller = make_macro(s, scope, true);
      Value callee = eval(*s.expr->children[0], scope);
      CallArgs args;
      eval_call_args(*s.expr, scope, 1, &args);
      args.kwargs.emplace_back("caller", caller);
      offset_ = s.expr->offset;
      append(out, to_str(call(callee, args)));
      return Flow::kNormal;
    }
    case StmtKind::kFilterBlock: {
      std::string buf;
      exec(s.body, new_scope(scope), buf);
      Value subject = Value::string(std::move(buf));
      append(out, to_str(eval_filter(*s.expr, scope, &subject)));
      return Flow::kNormal;
    }
    case StmtKind::kWith: {
      std::vector<Value> values;
      for (const auto& v : s.values) values.push_back(eval(*v, scope));
      ScopePtr inner = new_scope(scope);
      for (size_t i = 0; i < s.targets.size(); ++i) assign(*s.targets[i], values[i], inner);
      return exec(s.body, inner, out);
    }
    case StmtKind::kBreak:
      return Flow::kBreak;
    case StmtKind::kContinue:
      return Flow::kContinue;
    case StmtKind::kScope:
      return exec(s.body, new_scope(scope), out);
  }
  return Flow::kNormal;
}

std::string Interpreter::render(const Body& body, const Value& vars) {
  globals_ = new_scope(nullptr);
  add_globals(*this, *globals_);
  ScopePtr root = new_scope(globals_);
  if (vars.is_dict())
    for (const auto& [k, v] : vars.dict_data().entries)
      if (k.is_string()) root->set(k.str(), v);
  std::string out;
  exec(body, root, out);
  return out;
}

}  // namespace deltaflow::text::jinja
