// Errors inside the engine travel as a C++ exception (deep recursion makes Expected<> everywhere noisy);
// Template::parse/render catch it and return an Error value, so nothing escapes the public API.
#pragma once

#include <cstddef>
#include <exception>
#include <string>

namespace deltaflow::text::jinja {

// `type` names the Python exception jinja2 would raise ("TemplateSyntaxError", "UndefinedError",
// "TypeError", "TemplateError" for raise_exception, ...) or "LimitError" for our own bounds.
struct EngineError : std::exception {
  EngineError(std::string t, std::string m, size_t off)
      : type(std::move(t)), message(std::move(m)), offset(off) {}
  const char* what() const noexcept override { return message.c_str(); }
  std::string type;
  std::string message;
  size_t offset;  // byte offset in the (newline-normalised) template source
};

[[noreturn]] inline void throw_error(std::string type, std::string message, size_t offset) {
  throw EngineError(std::move(type), std::move(message), offset);
}

}  // namespace deltaflow::text::jinja
