#include "text/jinja/template.hpp"

#include <algorithm>

#include "text/jinja/ast.hpp"
#include "text/jinja/error.hpp"
#include "text/jinja/interpreter.hpp"
#include "text/jinja/lexer.hpp"
#include "text/jinja/parser.hpp"
#include "text/jinja/pystr.hpp"

namespace deltaflow::text::jinja {

struct Template::Impl {
  std::string source;  // newline-normalised
  Body body;
  Limits limits;
  std::vector<size_t> line_starts;

  void position(size_t offset, int* line, int* column) const {
    offset = std::min(offset, source.size());
    auto it = std::upper_bound(line_starts.begin(), line_starts.end(), offset);
    size_t idx = static_cast<size_t>(it - line_starts.begin()) - 1;
    *line = static_cast<int>(idx) + 1;
    *column = static_cast<int>(
                  py::length(std::string_view(source).substr(line_starts[idx], offset - line_starts[idx]))) +
              1;
  }
};

namespace {

core::Error to_error(const Template::Impl& impl, const EngineError& e, TemplateError* detail) {
  TemplateError te;
  te.type = e.type;
  te.message = e.message;
  impl.position(e.offset, &te.line, &te.column);
  if (detail) *detail = te;
  return core::Error{te.to_string()};
}

}  // namespace

std::string TemplateError::to_string() const {
  return std::to_string(line) + ":" + std::to_string(column) + ": " + message;
}

core::Expected<Template> Template::parse(std::string_view source, const Limits& limits,
                                         TemplateError* detail) {
  auto impl = std::make_shared<Impl>();
  impl->source = normalize_source(source);
  impl->limits = limits;
  impl->line_starts.push_back(0);
  for (size_t i = 0; i < impl->source.size(); ++i)
    if (impl->source[i] == '\n') impl->line_starts.push_back(i + 1);
  try {
    ParseOptions opt;
    opt.max_nesting = limits.max_nesting;
    opt.resolve = [](bool is_filter, const std::string& name) -> const void* {
      return is_filter ? static_cast<const void*>(find_filter(name))
                       : static_cast<const void*>(find_test(name));
    };
    impl->body = parse_template(tokenize(impl->source, LexerOptions{}), opt);
  } catch (const EngineError& e) {
    return to_error(*impl, e, detail);
  } catch (const std::exception& e) {
    // std::bad_alloc and friends: still an error value, never an escaping exception.
    if (detail) *detail = TemplateError{"InternalError", e.what(), 0, 0};
    return core::Error{std::string("template parse failed: ") + e.what()};
  }
  Template t;
  t.impl_ = std::move(impl);
  return t;
}

core::Expected<std::string> Template::render(const Value& vars, TemplateError* detail) const {
  if (!vars.is_dict() && !vars.is_undefined() && !vars.is_none())
    return core::Error{"template variables must be a mapping"};
  try {
    Interpreter in(impl_->limits);
    return in.render(impl_->body, vars);
  } catch (const EngineError& e) {
    return to_error(*impl_, e, detail);
  } catch (const std::exception& e) {
    if (detail) *detail = TemplateError{"InternalError", e.what(), 0, 0};
    return core::Error{std::string("template render failed: ") + e.what()};
  }
}

core::Expected<std::string> Template::render(const nlohmann::ordered_json& vars,
                                             TemplateError* detail) const {
  if (!vars.is_object() && !vars.is_null()) return core::Error{"template variables must be a JSON object"};
  return render(from_json(vars), detail);
}

const Limits& Template::limits() const {
  return impl_->limits;
}

}  // namespace deltaflow::text::jinja
