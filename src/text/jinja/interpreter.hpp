// Evaluator over the AST (internal to the engine). Semantics follow what jinja2 compiles templates to in
// HF's ImmutableSandboxedEnvironment: Python operators and protocols, jinja2 scoping (for-loop bodies,
// macros, with/set blocks get their own scope; if does not), the sandbox's attribute rules (no mutating
// methods, no dunder attributes) and its range limit. Every evaluation step counts against the limits.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/jinja/ast.hpp"
#include "text/jinja/error.hpp"
#include "text/jinja/template.hpp"
#include "text/jinja/value.hpp"

namespace deltaflow::text::jinja {

class Scope {
 public:
  explicit Scope(std::shared_ptr<Scope> parent) : parent_(std::move(parent)) {}
  const Value* find(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent_.get()) {
      auto it = s->vars_.find(name);
      if (it != s->vars_.end()) return &it->second;
    }
    return nullptr;
  }
  void set(const std::string& name, Value v) { vars_[name] = std::move(v); }
  void clear() {
    vars_.clear();
    parent_.reset();
  }

 private:
  std::shared_ptr<Scope> parent_;
  std::unordered_map<std::string, Value> vars_;
};
using ScopePtr = std::shared_ptr<Scope>;

enum class Flow { kNormal, kBreak, kContinue };

using FilterFn = Value (*)(Interpreter&, const Value& subject, CallArgs& args);
using TestFn = bool (*)(Interpreter&, const Value& subject, CallArgs& args);

// builtins.cpp
const FilterFn* find_filter(const std::string& name);
const TestFn* find_test(const std::string& name);
void add_globals(Interpreter& in, Scope& globals);
// Python attributes of built-in types (bound methods); false if the type has no such attribute.
bool builtin_attribute(Interpreter& in, const Value& obj, const std::string& name, Value* out);

// format.cpp: str.format and printf-style `%`.
std::string python_format(Interpreter& in, const std::string& fmt, const CallArgs& args);
std::string percent_format(Interpreter& in, const std::string& fmt, const Value& args);
std::string format_spec(Interpreter& in, const Value& v, const std::string& spec);

class Interpreter {
 public:
  explicit Interpreter(const Limits& limits);
  ~Interpreter();

  std::string render(const Body& body, const Value& vars);

  // Python protocols, for the built-ins.
  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);
  Value call(const Value& fn, CallArgs& args);
  std::vector<Value> iterate(const Value& v);
  int64_t length(const Value& v);
  bool less(const Value& a, const Value& b, const char* op = "<");
  bool contains(const Value& container, const Value& item);
  Value binop(const std::string& op, const Value& a, const Value& b);
  Value call_filter(const std::string& name, const Value& subject, CallArgs& args);
  bool call_test(const std::string& name, const Value& subject, CallArgs& args);
  Value make_namespace(CallArgs& args);
  Value undefined_attr(const Value& obj, const Value& name);

  void ensure_defined(const Value& v);  // raises the Undefined's own error
  void check_size(size_t bytes);
  void count_iterations(uint64_t n);
  [[noreturn]] void fail(const std::string& type, const std::string& message);
  std::string escape_html(const std::string& s);

  const Limits& limits() const { return limits_; }
  size_t offset() const { return offset_; }
  void track(const std::shared_ptr<ObjectData>& o) { objects_.push_back(o); }
  int& depth() { return depth_; }

  // Used by macros and loop objects.
  Value call_macro(const Stmt& def, const ScopePtr& closure, CallArgs& args);
  void run_loop(const Stmt& s, const std::vector<Value>& items, const ScopePtr& scope, int depth0,
                std::string* out, bool* iterated);
  Flow exec(const Body& body, const ScopePtr& scope, std::string& out);

 private:
  const Limits& limits_;
  size_t offset_ = 0;
  uint64_t steps_ = 0;
  uint64_t iterations_ = 0;
  int depth_ = 0;
  ScopePtr globals_;
  std::vector<std::weak_ptr<Scope>> scopes_;
  std::vector<std::weak_ptr<ObjectData>> objects_;

  ScopePtr new_scope(const ScopePtr& parent);
  void step(size_t offset);
  Value eval(const Expr& e, const ScopePtr& scope);
  Value eval_filter(const Expr& e, const ScopePtr& scope, const Value* block_subject);
  Value eval_slice(const Value& obj, const Expr& slice, const ScopePtr& scope);
  Value eval_compare(const Expr& e, const ScopePtr& scope);
  void eval_call_args(const Expr& e, const ScopePtr& scope, size_t first, CallArgs* out);
  void assign(const Expr& target, const Value& v, const ScopePtr& scope);
  Flow exec_stmt(const Stmt& s, const ScopePtr& scope, std::string& out);
  void append(std::string& out, const std::string& text);
  Value make_macro(const Stmt& s, const ScopePtr& scope, bool is_caller);
};

// Argument binding for built-ins, Python style: positional then keyword, defaults for the rest.
struct Param {
  const char* name;
  bool required = false;
  Value def = Value();
};
std::vector<Value> bind_args(Interpreter& in, const char* fname, const CallArgs& args,
                             std::initializer_list<Param> params);
int64_t to_index(Interpreter& in, const Value& v, const char* what);

}  // namespace deltaflow::text::jinja
