// The template AST. One node type per category with kind-specific fields, mirroring jinja2.nodes.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.hpp"

namespace deltaflow::text::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class ExprKind {
  kConst,     // value
  kName,      // name
  kList,      // children = items
  kTuple,     // children = items
  kDict,      // children = k0, v0, k1, v1, ...
  kGetAttr,   // children[0] . name
  kGetItem,   // children[0] [ children[1] ]
  kSlice,     // children = start, stop, step (each may be null)
  kCall,      // children[0](children[1..], kwargs, *dyn_args, **dyn_kwargs)
  kFilter,    // name; children[0] = subject (null inside a filter block), children[1..] args
  kTest,      // name; children[0] = subject, children[1..] args
  kUnary,     // name in {neg, pos, not}; children[0]
  kBinary,    // name in {add, sub, mul, div, floordiv, mod, pow, and, or}; children[0], children[1]
  kConcat,    // children joined with ~
  kCompare,   // children[0] ops[i] children[i+1]; ops in {eq, ne, lt, lteq, gt, gteq, in, notin}
  kCondExpr,  // children = test, then, else (else may be null)
  kNsRef,     // name . attr (assignment target only)
};

struct Expr {
  ExprKind kind;
  size_t offset = 0;
  std::string name;
  std::string attr;
  Value value;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  ExprPtr dyn_args, dyn_kwargs;
  std::vector<std::string> ops;
  // Filters/tests: resolved at parse time; `soft` ones (inside if/ternary) may stay unknown until run.
  const void* fn = nullptr;
};

enum class StmtKind {
  kData,         // text
  kOutput,       // expr
  kIf,           // branches (test, body)...; else_body
  kFor,          // target in expr [if cond] body else_body; recursive
  kSet,          // target = expr
  kSetBlock,     // target (| filter expr) = rendered body
  kMacro,        // name(params = defaults) body
  kCallBlock,    // expr = call; params/defaults of caller; body
  kFilterBlock,  // expr = filter chain with a null subject; body
  kWith,         // targets = values; body
  kBreak,
  kContinue,
  kScope,  // body rendered in place ({% generation %}, {% block %}, {% autoescape false %})
};

struct Stmt {
  StmtKind kind;
  size_t offset = 0;
  std::string text;
  ExprPtr expr, target, cond;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  bool recursive = false;
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // aligned to the last params
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;
  std::vector<ExprPtr> targets, values;
};

}  // namespace deltaflow::text::jinja
