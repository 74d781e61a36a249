#include "server/api_error.hpp"

#include <nlohmann/json.hpp>

namespace deltaflow::server {

namespace {

nlohmann::json null_if_empty(const std::string& s) {
  return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s);
}

}  // namespace

ApiError bad_field(const std::string& field, const std::string& message) {
  return {400, message, "invalid_request_error", field, ""};
}

ApiError not_found(const std::string& message, const std::string& code) {
  return {404, message, "invalid_request_error", "", code};
}

ApiError unauthorized() {
  return {401, "missing or invalid API key (send 'Authorization: Bearer <key>')", "authentication_error", "",
          "invalid_api_key"};
}

ApiError too_large(size_t limit) {
  return {
      413,
      "request body exceeds the server limit of " + std::to_string(limit) + " bytes (--max-request-bytes)",
      "invalid_request_error", "", "request_too_large"};
}

ApiError queue_full() {
  return {429, "the request queue is full; retry later", "rate_limit_error", "", "queue_full"};
}

ApiError unavailable(const std::string& message) {
  return {503, message, "service_unavailable", "", ""};
}

ApiError internal_error(const std::string& message) {
  return {500, message, "internal_error", "", ""};
}

std::string openai_error_body(const ApiError& e) {
  nlohmann::json j = {{"error",
                       {{"message", e.message},
                        {"type", e.type},
                        {"param", null_if_empty(e.param)},
                        {"code", null_if_empty(e.code)}}}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string ollama_error_body(const ApiError& e) {
  nlohmann::json j = {{"error", e.message}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace deltaflow::server
