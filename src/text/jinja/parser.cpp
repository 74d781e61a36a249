#include "text/jinja/parser.hpp"

#include <set>

#include "text/jinja/error.hpp"
#include "text/jinja/pystr.hpp"

namespace deltaflow::text::jinja {

namespace {

const std::set<std::string> kCompareOps = {"==", "!=", "<", "<=", ">", ">="};

std::string compare_name(const std::string& op) {
  if (op == "==") return "eq";
  if (op == "!=") return "ne";
  if (op == "<") return "lt";
  if (op == "<=") return "lteq";
  if (op == ">") return "gt";
  return "gteq";
}

ExprPtr make_expr(ExprKind k, size_t off) {
  auto e = std::make_unique<Expr>();
  e->kind = k;
  e->offset = off;
  return e;
}

StmtPtr make_stmt(StmtKind k, size_t off) {
  auto s = std::make_unique<Stmt>();
  s->kind = k;
  s->offset = off;
  return s;
}

// "name:endfor" / "block_end" / an operator, as jinja2 token expressions.
struct TokExpr {
  Tok type;
  std::string value;  // name value or operator text; empty: any
};

class Parser {
 public:
  Parser(std::vector<Token> toks, const ParseOptions& opt) : t_(std::move(toks)), opt_(opt) {}

  Body parse() {
    Body b = subparse(nullptr);
    return b;
  }

 private:
  std::vector<Token> t_;
  const ParseOptions& opt_;
  size_t i_ = 0;
  std::vector<std::string> tag_stack_;
  std::vector<std::vector<TokExpr>> end_stack_;
  int depth_ = 0;
  int loop_depth_ = 0;

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& pp) : p(pp) {
      if (++p.depth_ > p.opt_.max_nesting)
        throw_error("LimitError", "template nesting deeper than " + std::to_string(p.opt_.max_nesting),
                    p.cur().offset);
    }
    ~DepthGuard() { --p.depth_; }
  };

  const Token& cur() const { return t_[i_]; }
  const Token& look() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }

  static bool test(const Token& t, const TokExpr& e) {
    if (t.type != e.type) return false;
    return e.value.empty() || t.value == e.value;
  }
  bool is_name(const char* v) const { return cur().type == Tok::kName && cur().value == v; }
  bool is_op(const char* v) const { return cur().type == Tok::kOp && cur().value == v; }
  bool skip_name(const char* v) {
    if (is_name(v)) {
      next();
      return true;
    }
    return false;
  }
  bool skip_op(const char* v) {
    if (is_op(v)) {
      next();
      return true;
    }
    return false;
  }

  static std::string describe_type(Tok t) {
    switch (t) {
      case Tok::kBlockBegin:
        return "begin of statement block";
      case Tok::kBlockEnd:
        return "end of statement block";
      case Tok::kVarBegin:
        return "begin of print statement";
      case Tok::kVarEnd:
        return "end of print statement";
      case Tok::kData:
        return "template data / text";
      case Tok::kEof:
        return "end of template";
      case Tok::kString:
        return "string";
      case Tok::kInteger:
        return "integer";
      case Tok::kFloat:
        return "float";
      case Tok::kName:
        return "name";
      case Tok::kOp:
        return "operator";
    }
    return "token";
  }
  static std::string describe(const Token& t) {
    if (t.type == Tok::kName || t.type == Tok::kOp) return t.value;
    return describe_type(t.type);
  }
  static std::string describe(const TokExpr& e) {
    if ((e.type == Tok::kName || e.type == Tok::kOp) && !e.value.empty()) return e.value;
    return describe_type(e.type);
  }

  [[noreturn]] void fail(const std::string& msg, size_t off) { throw_error("TemplateSyntaxError", msg, off); }
  [[noreturn]] void fail(const std::string& msg) { fail(msg, cur().offset); }

  const Token& expect(const TokExpr& e) {
    if (!test(cur(), e)) {
      std::string d = describe(e);
      if (cur().type == Tok::kEof) fail("unexpected end of template, expected " + py::repr(d) + ".");
      fail("expected token " + py::repr(d) + ", got " + py::repr(describe(cur())));
    }
    return next();
  }
  const Token& expect_op(const char* op) { return expect({Tok::kOp, op}); }
  const Token& expect_name() { return expect({Tok::kName, ""}); }

  [[noreturn]] void fail_ut_eof(const std::string* name, const std::vector<std::vector<TokExpr>>& stack,
                                size_t off) {
    std::set<std::string> expected;
    for (const auto& exprs : stack)
      for (const auto& e : exprs) expected.insert(describe(e));
    std::string looking;
    if (!stack.empty()) {
      for (size_t k = 0; k < stack.back().size(); ++k) {
        if (k) looking += " or ";
        looking += py::repr(describe(stack.back()[k]));
      }
    }
    std::string msg =
        name ? "Encountered unknown tag " + py::repr(*name) + "." : "Unexpected end of template.";
    if (!looking.empty()) {
      if (name && expected.count(*name))
        msg +=
            " You probably made a nesting mistake. Jinja is expecting this tag, but currently looking for " +
            looking + ".";
      else
        msg += " Jinja was looking for the following tags: " + looking + ".";
    }
    if (!tag_stack_.empty())
      msg += " The innermost block that needs to be closed is " + py::repr(tag_stack_.back()) + ".";
    fail(msg, off);
  }

  // --- statements ------------------------------------------------------------------------------------

  Body subparse(const std::vector<TokExpr>* end_tokens) {
    DepthGuard guard(*this);
    Body body;
    if (end_tokens) end_stack_.push_back(*end_tokens);
    struct Pop {
      Parser& p;
      bool on;
      ~Pop() {
        if (on) p.end_stack_.pop_back();
      }
    } pop{*this, end_tokens != nullptr};
    while (cur().type != Tok::kEof) {
      const Token& tok = cur();
      if (tok.type == Tok::kData) {
        auto s = make_stmt(StmtKind::kData, tok.offset);
        s->text = tok.value;
        body.push_back(std::move(s));
        next();
      } else if (tok.type == Tok::kVarBegin) {
        next();
        auto s = make_stmt(StmtKind::kOutput, cur().offset);
        s->expr = parse_tuple(false, true, nullptr, false, false);
        expect({Tok::kVarEnd, ""});
        body.push_back(std::move(s));
      } else if (tok.type == Tok::kBlockBegin) {
        next();
        if (end_tokens) {
          for (const auto& e : *end_tokens)
            if (test(cur(), e)) return body;
        }
        body.push_back(parse_statement());
        expect({Tok::kBlockEnd, ""});
      } else {
        fail("internal parsing error");
      }
    }
    return body;
  }

  Body parse_statements(std::vector<TokExpr> end_tokens, bool drop_needle) {
    skip_op(":");
    expect({Tok::kBlockEnd, ""});
    Body result = subparse(&end_tokens);
    if (cur().type == Tok::kEof) {
      auto stack = end_stack_;
      stack.push_back(end_tokens);
      fail_ut_eof(nullptr, stack, cur().offset);
    }
    if (drop_needle) next();
    return result;
  }

  StmtPtr parse_statement() {
    const Token& tok = cur();
    if (tok.type != Tok::kName) fail("tag name expected");
    std::string name = tok.value;
    size_t off = tok.offset;
    static const std::set<std::string> kKnown = {
        "for",        "if",    "set",      "macro",      "call",    "filter", "with", "print",  "block",
        "autoescape", "break", "continue", "generation", "include", "import", "from", "extends"};
    if (!kKnown.count(name)) fail_ut_eof(&name, end_stack_, off);
    tag_stack_.push_back(name);
    struct Pop {
      Parser& p;
      ~Pop() { p.tag_stack_.pop_back(); }
    } pop{*this};
    if (name == "for") return parse_for();
    if (name == "if") return parse_if();
    if (name == "set") return parse_set();
    if (name == "macro") return parse_macro();
    if (name == "call") return parse_call_block();
    if (name == "filter") return parse_filter_block();
    if (name == "with") return parse_with();
    if (name == "print") return parse_print();
    if (name == "block") return parse_block();
    if (name == "autoescape") return parse_autoescape();
    if (name == "break" || name == "continue") {
      next();
      if (loop_depth_ == 0) fail("'" + name + "' outside loop", off);
      return make_stmt(name == "break" ? StmtKind::kBreak : StmtKind::kContinue, off);
    }
    if (name == "generation") {
      next();
      auto s = make_stmt(StmtKind::kScope, off);
      s->body = parse_statements({{Tok::kName, "endgeneration"}}, true);
      return s;
    }
    throw_error("TemplateSyntaxError", "'" + name + "' is not supported: templates have no file access", off);
  }

  StmtPtr parse_for() {
    size_t off = expect({Tok::kName, "for"}).offset;
    auto s = make_stmt(StmtKind::kFor, off);
    std::vector<TokExpr> in_rule = {{Tok::kName, "in"}};
    s->target = parse_assign_target(true, false, &in_rule, false);
    expect({Tok::kName, "in"});
    std::vector<TokExpr> rec_rule = {{Tok::kName, "recursive"}};
    s->expr = parse_tuple(false, false, &rec_rule, false, false);
    if (skip_name("if")) s->cond = parse_expression(true);
    s->recursive = skip_name("recursive");
    ++loop_depth_;
    s->body = parse_statements({{Tok::kName, "endfor"}, {Tok::kName, "else"}}, false);
    --loop_depth_;
    if (next().value != "endfor") s->else_body = parse_statements({{Tok::kName, "endfor"}}, true);
    return s;
  }

  StmtPtr parse_if() {
    size_t off = expect({Tok::kName, "if"}).offset;
    auto s = make_stmt(StmtKind::kIf, off);
    while (true) {
      ExprPtr test = parse_tuple(false, false, nullptr, false, false);
      Body body =
          parse_statements({{Tok::kName, "elif"}, {Tok::kName, "else"}, {Tok::kName, "endif"}}, false);
      s->branches.emplace_back(std::move(test), std::move(body));
      const Token& tok = next();
      if (tok.value == "elif") continue;
      if (tok.value == "else") s->else_body = parse_statements({{Tok::kName, "endif"}}, true);
      break;
    }
    return s;
  }

  StmtPtr parse_set() {
    size_t off = next().offset;
    ExprPtr target = parse_assign_target(true, false, nullptr, true);
    if (skip_op("=")) {
      auto s = make_stmt(StmtKind::kSet, off);
      s->target = std::move(target);
      s->expr = parse_tuple(false, true, nullptr, false, false);
      return s;
    }
    auto s = make_stmt(StmtKind::kSetBlock, off);
    s->target = std::move(target);
    s->expr = parse_filter(nullptr, false);
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_statements({{Tok::kName, "endset"}}, true);
    loop_depth_ = saved;
    return s;
  }

  StmtPtr parse_with() {
    size_t off = next().offset;
    auto s = make_stmt(StmtKind::kWith, off);
    while (cur().type != Tok::kBlockEnd) {
      if (!s->targets.empty()) expect_op(",");
      s->targets.push_back(parse_assign_target(true, false, nullptr, false));
      expect_op("=");
      s->values.push_back(parse_expression(true));
    }
    s->body = parse_statements({{Tok::kName, "endwith"}}, true);
    return s;
  }

  StmtPtr parse_block() {
    size_t off = next().offset;
    auto s = make_stmt(StmtKind::kScope, off);
    std::string name = expect_name().value;
    skip_name("scoped");
    skip_name("required");
    if (is_op("-"))
      fail(
          "Block names in Jinja have to be valid Python identifiers and may not contain hyphens, use an "
          "underscore instead.");
    s->body = parse_statements({{Tok::kName, "endblock"}}, true);
    skip_name(name.c_str());
    return s;
  }

  StmtPtr parse_autoescape() {
    size_t off = next().offset;
    ExprPtr e = parse_expression(true);
    if (!(e->kind == ExprKind::kConst && e->value.is_bool() && !e->value.bool_value()))
      throw_error("TemplateSyntaxError", "only {% autoescape false %} is supported", off);
    auto s = make_stmt(StmtKind::kScope, off);
    s->body = parse_statements({{Tok::kName, "endautoescape"}}, true);
    return s;
  }

  void parse_signature(Stmt* s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s->params.empty()) expect_op(",");
      std::string name = expect_name().value;
      if (skip_op("="))
        s->defaults.push_back(parse_expression(true));
      else if (!s->defaults.empty())
        fail("non-default argument follows default argument");
      s->params.push_back(name);
    }
    expect_op(")");
  }

  static void scan_names(const Expr* e, Stmt* m) {
    if (!e) return;
    if (e->kind == ExprKind::kName) {
      if (e->name == "caller") m->uses_caller = true;
      if (e->name == "varargs") m->uses_varargs = true;
      if (e->name == "kwargs") m->uses_kwargs = true;
    }
    for (const auto& c : e->children) scan_names(c.get(), m);
    for (const auto& kv : e->kwargs) scan_names(kv.second.get(), m);
    scan_names(e->dyn_args.get(), m);
    scan_names(e->dyn_kwargs.get(), m);
  }
  static void scan_body(const Body& body, Stmt* m) {
    for (const auto& s : body) {
      for (const Expr* e : {s->expr.get(), s->target.get(), s->cond.get()}) scan_names(e, m);
      for (const auto& b : s->branches) {
        scan_names(b.first.get(), m);
        scan_body(b.second, m);
      }
      for (const auto& d : s->defaults) scan_names(d.get(), m);
      for (const auto& v : s->values) scan_names(v.get(), m);
      scan_body(s->body, m);
      scan_body(s->else_body, m);
    }
  }

  StmtPtr parse_macro() {
    size_t off = next().offset;
    auto s = make_stmt(StmtKind::kMacro, off);
    s->name = expect_name().value;
    parse_signature(s.get());
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_statements({{Tok::kName, "endmacro"}}, true);
    loop_depth_ = saved;
    scan_body(s->body, s.get());
    return s;
  }

  StmtPtr parse_call_block() {
    size_t off = next().offset;
    auto s = make_stmt(StmtKind::kCallBlock, off);
    if (is_op("(")) parse_signature(s.get());
    s->expr = parse_expression(true);
    if (s->expr->kind != ExprKind::kCall) fail("expected call", off);
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_statements({{Tok::kName, "endcall"}}, true);
    loop_depth_ = saved;
    scan_body(s->body, s.get());
    return s;
  }

  StmtPtr parse_filter_block() {
    size_t off = next().offset;
    auto s = make_stmt(StmtKind::kFilterBlock, off);
    s->expr = parse_filter(nullptr, true);
    s->body = parse_statements({{Tok::kName, "endfilter"}}, true);
    return s;
  }

  StmtPtr parse_print() {
    size_t off = next().offset;
    // {% print a, b %} prints a then b: one Concat-free output per expression, wrapped in a scope.
    auto scope = make_stmt(StmtKind::kScope, off);
    while (cur().type != Tok::kBlockEnd) {
      if (!scope->body.empty()) expect_op(",");
      auto o = make_stmt(StmtKind::kOutput, cur().offset);
      o->expr = parse_expression(true);
      scope->body.push_back(std::move(o));
    }
    return scope;
  }

  // --- expressions -----------------------------------------------------------------------------------

  static bool can_assign(const Expr& e) {
    switch (e.kind) {
      case ExprKind::kName:
        return true;
      case ExprKind::kNsRef:
        return true;
      case ExprKind::kTuple:
        for (const auto& c : e.children)
          if (!can_assign(*c)) return false;
        return true;
      default:
        return false;
    }
  }
  static std::string node_type_name(const Expr& e) {
    switch (e.kind) {
      case ExprKind::kConst:
        return "const";
      case ExprKind::kList:
        return "list";
      case ExprKind::kTuple:
        return "tuple";
      case ExprKind::kDict:
        return "dict";
      default:
        return "expr";
    }
  }

  ExprPtr parse_assign_target(bool with_tuple, bool name_only, const std::vector<TokExpr>* extra_end,
                              bool with_namespace) {
    ExprPtr target;
    if (name_only) {
      const Token& t = expect_name();
      target = make_expr(ExprKind::kName, t.offset);
      target->name = t.value;
    } else if (with_tuple) {
      target = parse_tuple(true, true, extra_end, false, with_namespace);
    } else {
      target = parse_primary(with_namespace);
    }
    if (!can_assign(*target)) fail("can't assign to " + py::repr(node_type_name(*target)), target->offset);
    return target;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    DepthGuard guard(*this);
    size_t off = cur().offset;
    ExprPtr expr1 = parse_or();
    while (skip_name("if")) {
      ExprPtr expr2 = parse_or();
      ExprPtr expr3;
      if (skip_name("else")) expr3 = parse_condexpr();
      auto e = make_expr(ExprKind::kCondExpr, off);
      e->children.push_back(std::move(expr2));
      e->children.push_back(std::move(expr1));
      e->children.push_back(std::move(expr3));
      expr1 = std::move(e);
      off = cur().offset;
    }
    return expr1;
  }

  ExprPtr binary(const char* op, ExprPtr l, ExprPtr r, size_t off) {
    auto e = make_expr(ExprKind::kBinary, off);
    e->name = op;
    e->children.push_back(std::move(l));
    e->children.push_back(std::move(r));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      size_t off = next().offset;
      left = binary("or", std::move(left), parse_and(), off);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      size_t off = next().offset;
      left = binary("and", std::move(left), parse_not(), off);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      size_t off = next().offset;
      auto e = make_expr(ExprKind::kUnary, off);
      e->name = "not";
      e->children.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    size_t off = cur().offset;
    ExprPtr expr = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      size_t op_off = cur().offset;
      if (cur().type == Tok::kOp && kCompareOps.count(cur().value)) {
        op = compare_name(cur().value);
        next();
      } else if (skip_name("in")) {
        op = "in";
      } else if (is_name("not") && look().type == Tok::kName && look().value == "in") {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make_expr(ExprKind::kCompare, off);
        cmp->children.push_back(std::move(expr));
      }
      cmp->ops.push_back(op);
      cmp->children.push_back(parse_math1());
      cmp->offset = op_off;
    }
    return cmp ? std::move(cmp) : std::move(expr);
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const char* op = is_op("+") ? "add" : "sub";
      size_t off = next().offset;
      left = binary(op, std::move(left), parse_concat(), off);
    }
    return left;
  }

  ExprPtr parse_concat() {
    size_t off = cur().offset;
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    auto e = make_expr(ExprKind::kConcat, off);
    e->children.push_back(std::move(first));
    while (is_op("~")) {
      next();
      e->children.push_back(parse_math2());
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const char* op = is_op("*") ? "mul" : is_op("/") ? "div" : is_op("//") ? "floordiv" : "mod";
      size_t off = next().offset;
      left = binary(op, std::move(left), parse_pow(), off);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      size_t off = next().offset;
      left = binary("pow", std::move(left), parse_unary(true), off);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    size_t off = cur().offset;
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const char* op = is_op("-") ? "neg" : "pos";
      next();
      node = make_expr(ExprKind::kUnary, off);
      node->name = op;
      node->children.push_back(parse_unary(false));
    } else {
      node = parse_primary(false);
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary(bool with_namespace) {
    DepthGuard guard(*this);
    const Token& tok = cur();
    size_t off = tok.offset;
    if (tok.type == Tok::kName) {
      std::string v = tok.value;
      next();
      if (v == "true" || v == "false" || v == "True" || v == "False") {
        auto e = make_expr(ExprKind::kConst, off);
        e->value = Value::boolean(v == "true" || v == "True");
        return e;
      }
      if (v == "none" || v == "None") {
        auto e = make_expr(ExprKind::kConst, off);
        e->value = Value::none();
        return e;
      }
      if (with_namespace && is_op(".")) {
        next();
        auto e = make_expr(ExprKind::kNsRef, off);
        e->name = v;
        e->attr = expect_name().value;
        return e;
      }
      auto e = make_expr(ExprKind::kName, off);
      e->name = v;
      return e;
    }
    if (tok.type == Tok::kString) {
      std::string buf;
      while (cur().type == Tok::kString) buf += next().value;
      auto e = make_expr(ExprKind::kConst, off);
      e->value = Value::string(std::move(buf));
      return e;
    }
    if (tok.type == Tok::kInteger || tok.type == Tok::kFloat) {
      auto e = make_expr(ExprKind::kConst, off);
      e->value = tok.type == Tok::kInteger ? Value::integer(tok.ival) : Value::floating(tok.fval);
      next();
      return e;
    }
    if (is_op("(")) {
      next();
      ExprPtr e = parse_tuple(false, true, nullptr, true, false);
      expect_op(")");
      return e;
    }
    if (is_op("[")) return parse_list();
    if (is_op("{")) return parse_dict();
    fail("unexpected " + py::repr(describe(tok)));
  }

  bool is_tuple_end(const std::vector<TokExpr>* extra) const {
    if (cur().type == Tok::kVarEnd || cur().type == Tok::kBlockEnd || is_op(")")) return true;
    if (extra)
      for (const auto& e : *extra)
        if (test(cur(), e)) return true;
    return false;
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, const std::vector<TokExpr>* extra_end,
                      bool explicit_parentheses, bool with_namespace) {
    DepthGuard guard(*this);
    size_t off = cur().offset;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(simplified ? parse_primary(with_namespace) : parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parentheses) fail("Expected an expression, got " + py::repr(describe(cur())));
    }
    auto e = make_expr(ExprKind::kTuple, off);
    e->children = std::move(args);
    return e;
  }

  ExprPtr parse_list() {
    size_t off = expect_op("[").offset;
    auto e = make_expr(ExprKind::kList, off);
    while (!is_op("]")) {
      if (!e->children.empty()) expect_op(",");
      if (is_op("]")) break;
      e->children.push_back(parse_expression(true));
    }
    expect_op("]");
    return e;
  }

  ExprPtr parse_dict() {
    size_t off = expect_op("{").offset;
    auto e = make_expr(ExprKind::kDict, off);
    while (!is_op("}")) {
      if (!e->children.empty()) expect_op(",");
      if (is_op("}")) break;
      e->children.push_back(parse_expression(true));
      expect_op(":");
      e->children.push_back(parse_expression(true));
    }
    expect_op("}");
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("["))
        node = parse_subscript(std::move(node));
      else if (is_op("("))
        node = parse_call(std::move(node));
      else
        break;
    }
    return node;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|"))
        node = parse_filter(std::move(node), false);
      else if (is_name("is"))
        node = parse_test(std::move(node));
      else if (is_op("("))
        node = parse_call(std::move(node));
      else
        break;
    }
    return node;
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& tok = next();
    size_t off = tok.offset;
    if (tok.value == ".") {
      const Token& attr = cur();
      next();
      if (attr.type == Tok::kName) {
        auto e = make_expr(ExprKind::kGetAttr, off);
        e->name = attr.value;
        e->children.push_back(std::move(node));
        return e;
      }
      if (attr.type != Tok::kInteger) fail("expected name or number", attr.offset);
      auto idx = make_expr(ExprKind::kConst, attr.offset);
      idx->value = Value::integer(attr.ival);
      auto e = make_expr(ExprKind::kGetItem, off);
      e->children.push_back(std::move(node));
      e->children.push_back(std::move(idx));
      return e;
    }
    // "["
    std::vector<ExprPtr> args;
    while (!is_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    ExprPtr arg;
    if (args.size() == 1) {
      arg = std::move(args[0]);
    } else {
      arg = make_expr(ExprKind::kTuple, off);
      arg->children = std::move(args);
    }
    auto e = make_expr(ExprKind::kGetItem, off);
    e->children.push_back(std::move(node));
    e->children.push_back(std::move(arg));
    return e;
  }

  ExprPtr parse_subscribed() {
    size_t off = cur().offset;
    std::vector<ExprPtr> args;
    if (is_op(":")) {
      next();
      args.push_back(nullptr);
    } else {
      ExprPtr node = parse_expression(true);
      if (!is_op(":")) return node;
      next();
      args.push_back(std::move(node));
    }
    if (is_op(":"))
      args.push_back(nullptr);
    else if (!is_op("]") && !is_op(","))
      args.push_back(parse_expression(true));
    else
      args.push_back(nullptr);
    if (is_op(":")) {
      next();
      if (!is_op("]") && !is_op(","))
        args.push_back(parse_expression(true));
      else
        args.push_back(nullptr);
    } else {
      args.push_back(nullptr);
    }
    auto e = make_expr(ExprKind::kSlice, off);
    e->children = std::move(args);
    return e;
  }

  void parse_call_args(Expr* e) {
    size_t off = expect_op("(").offset;
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) fail("invalid syntax for function call expression", off);
    };
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*")) {
        ensure(!e->dyn_args && !e->dyn_kwargs);
        next();
        e->dyn_args = parse_expression(true);
      } else if (is_op("**")) {
        ensure(!e->dyn_kwargs);
        next();
        e->dyn_kwargs = parse_expression(true);
      } else if (cur().type == Tok::kName && look().type == Tok::kOp && look().value == "=") {
        ensure(!e->dyn_kwargs);
        std::string key = cur().value;
        next();
        next();
        e->kwargs.emplace_back(key, parse_expression(true));
      } else {
        ensure(!e->dyn_args && !e->dyn_kwargs && e->kwargs.empty());
        e->children.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make_expr(ExprKind::kCall, cur().offset);
    e->children.push_back(std::move(node));
    parse_call_args(e.get());
    return e;
  }

  ExprPtr parse_filter(ExprPtr node, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      const Token& tok = expect_name();
      auto e = make_expr(ExprKind::kFilter, tok.offset);
      e->name = tok.value;
      while (is_op(".")) {
        next();
        e->name += "." + expect_name().value;
      }
      e->children.push_back(std::move(node));
      if (is_op("(")) parse_call_args(e.get());
      node = std::move(e);
      start_inline = false;
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    size_t off = next().offset;  // "is"
    bool negated = skip_name("not");
    auto e = make_expr(ExprKind::kTest, off);
    e->name = expect_name().value;
    while (is_op(".")) {
      next();
      e->name += "." + expect_name().value;
    }
    e->children.push_back(std::move(node));
    if (is_op("(")) {
      parse_call_args(e.get());
    } else if ((cur().type == Tok::kName || cur().type == Tok::kString || cur().type == Tok::kInteger ||
                cur().type == Tok::kFloat || is_op("(") || is_op("[") || is_op("{")) &&
               !(is_name("else") || is_name("or") || is_name("and"))) {
      if (is_name("is")) fail("You cannot chain multiple tests with is");
      ExprPtr arg = parse_primary(false);
      arg = parse_postfix(std::move(arg));
      e->children.push_back(std::move(arg));
    }
    if (!negated) return e;
    auto n = make_expr(ExprKind::kUnary, off);
    n->name = "not";
    n->children.push_back(std::move(e));
    return n;
  }
};

// Resolves filters and tests. jinja2 reports an unknown one when compiling, except inside an `if`
// (test and branches) or a conditional expression: there it fails only if evaluated.
class Resolver {
 public:
  explicit Resolver(const ParseOptions& opt) : opt_(opt) {}

  void body(Body& b, bool soft) {
    for (auto& s : b) stmt(*s, soft);
  }

 private:
  const ParseOptions& opt_;

  void expr(Expr* e, bool soft) {
    if (!e) return;
    if (e->kind == ExprKind::kCondExpr) soft = true;
    if (e->kind == ExprKind::kFilter || e->kind == ExprKind::kTest) {
      bool is_filter = e->kind == ExprKind::kFilter;
      e->fn = opt_.resolve ? opt_.resolve(is_filter, e->name) : nullptr;
      if (!e->fn && !soft)
        throw_error(
            "TemplateAssertionError",
            std::string("No ") + (is_filter ? "filter" : "test") + " named " + py::repr(e->name) + ".",
            e->offset);
    }
    for (auto& c : e->children) expr(c.get(), soft);
    for (auto& kv : e->kwargs) expr(kv.second.get(), soft);
    expr(e->dyn_args.get(), soft);
    expr(e->dyn_kwargs.get(), soft);
  }

  void stmt(Stmt& s, bool soft) {
    switch (s.kind) {
      case StmtKind::kIf:
        for (auto& br : s.branches) {
          expr(br.first.get(), true);
          body(br.second, true);
        }
        body(s.else_body, true);
        return;
      case StmtKind::kFor:
        expr(s.expr.get(), soft);
        expr(s.cond.get(), false);
        body(s.body, false);
        body(s.else_body, false);
        return;
      case StmtKind::kMacro:
      case StmtKind::kCallBlock:
        for (auto& d : s.defaults) expr(d.get(), false);
        expr(s.expr.get(), soft);
        body(s.body, false);
        return;
      case StmtKind::kSetBlock:
      case StmtKind::kFilterBlock:
        expr(s.expr.get(), soft);
        body(s.body, false);
        return;
      case StmtKind::kWith:
        for (auto& v : s.values) expr(v.get(), soft);
        body(s.body, false);
        return;
      default:
        expr(s.expr.get(), soft);
        expr(s.target.get(), soft);
        body(s.body, soft);
        return;
    }
  }
};

}  // namespace

Body parse_template(std::vector<Token> tokens, const ParseOptions& opt) {
  Parser p(std::move(tokens), opt);
  Body b = p.parse();
  Resolver(opt).body(b, false);
  return b;
}

}  // namespace deltaflow::text::jinja
