// Errors at the HTTP edge (DESIGN.md §2): every failure becomes one JSON body, in the OpenAI shape
// {"error": {"message", "type", "param", "code"}} on OpenAI routes and {"error": "message"} on Ollama routes.
#pragma once

#include <string>

namespace deltaflow::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending request field; empty: null
  std::string code;   // e.g. "context_length_exceeded", "model_not_found"; empty: null
};

// 400 naming the field.
ApiError bad_field(const std::string& field, const std::string& message);
ApiError not_found(const std::string& message, const std::string& code = "");
ApiError unauthorized();
ApiError too_large(size_t limit);
ApiError queue_full();
ApiError unavailable(const std::string& message);
ApiError internal_error(const std::string& message);

std::string openai_error_body(const ApiError& e);
std::string ollama_error_body(const ApiError& e);

}  // namespace deltaflow::server
