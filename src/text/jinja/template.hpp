// deltaflow::text::jinja: our own Jinja2 engine, behaving like the environment transformers uses for
// chat templates (jinja2 3.1 ImmutableSandboxedEnvironment, trim_blocks and lstrip_blocks on,
// loopcontrols, HF's tojson/raise_exception/strftime_now and its {% generation %} tag).
//
//   auto t = Template::parse(source);            // syntax errors come back with line:column
//   auto text = t->render(vars);                 // vars: a dict Value or an ordered JSON object
//
// Bounded: nesting depth, call depth (macros, recursive loops), loop iterations, evaluation steps and
// output size; no file access (include/import/extends are errors). A parsed Template is immutable, so
// render() may run on several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.hpp"
#include "text/jinja/value.hpp"

namespace deltaflow::text::jinja {

struct Limits {
  int max_nesting = 100;                   // parser: nested expressions and blocks
  int max_call_depth = 100;                // macro calls / recursive loop calls in flight
  uint64_t max_loop_iterations = 1000000;  // all loop iterations of one render
  uint64_t max_steps = 50000000;           // evaluated nodes of one render
  size_t max_output_bytes = 64u << 20;     // the output, and any single string built on the way
  int64_t max_range = 100000;              // jinja2 sandbox MAX_RANGE
};

struct TemplateError {
  std::string type;     // Python exception name jinja2 would raise, e.g. "TemplateSyntaxError", "TypeError",
                        // "UndefinedError", "TemplateError" (raise_exception), or "LimitError"
  std::string message;  // jinja2's message where we mirror it
  int line = 0;         // 1-based
  int column = 0;       // 1-based, in code points
  std::string to_string() const;  // "line:column: message"
};

class Template {
 public:
  static core::Expected<Template> parse(std::string_view source, const Limits& limits = {},
                                        TemplateError* detail = nullptr);

  core::Expected<std::string> render(const Value& vars, TemplateError* detail = nullptr) const;
  core::Expected<std::string> render(const nlohmann::ordered_json& vars,
                                     TemplateError* detail = nullptr) const;

  const Limits& limits() const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace deltaflow::text::jinja
