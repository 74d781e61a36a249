// HTTP request bodies -> request parameters: any bytes go through what a handler does before the engine
// (the JSON parse with its depth limit, the OpenAI chat / completions and Ollama parameter parsers, messages,
// tools, structured outputs). Each either gives parameters in range or an ApiError that is a 400 naming what
// is wrong; nothing crashes, throws anything else or answers 5xx.
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/request_params.hpp"
#include "server/structured_output.hpp"

using namespace deltaflow::server;

namespace {

void check_error(const ApiError& e) {
  if (e.status != 400 || e.message.empty()) __builtin_trap();
}

template <class T>
const T* value_of(const Parsed<T>& p) {
  if (const auto* e = std::get_if<ApiError>(&p)) {
    check_error(*e);
    return nullptr;
  }
  return &std::get<T>(p);
}

void check_params(const GenParams& p) {
  if (p.max_tokens && (*p.max_tokens < 0 || *p.max_tokens > (int64_t{1} << 30))) __builtin_trap();
  if (p.n < 1 || p.best_of < p.n) __builtin_trap();
  if (p.top_logprobs < 0 || p.top_logprobs > 20) __builtin_trap();
  if (!(p.sampling.temperature >= 0) || !(p.sampling.top_p > 0 && p.sampling.top_p <= 1)) __builtin_trap();
  for (int32_t id : p.stop_token_ids)
    if (id < 0 || id >= 1024) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const auto body = parse_body(text);
  const Json* j = value_of(body);
  if (!j) return 0;
  GenerationDefaults d;
  d.max_tokens_limit = (size & 1) ? std::optional<int64_t>(64) : std::nullopt;
  for (Api api : {Api::kChat, Api::kCompletions, Api::kOllama}) {
    try {
      const auto p = parse_gen_params(*j, api, d, 1024, (size & 2) != 0);
      if (const GenParams* g = value_of(p)) {
        check_params(*g);
        if (d.max_tokens_limit && g->max_tokens && *g->max_tokens > *d.max_tokens_limit) __builtin_trap();
      }
      if (j->is_object()) (void)parse_structured_output(*j, api);
    } catch (const ApiError& e) {
      check_error(e);
    }
  }
  if (j->is_object()) {
    if (auto it = j->find("messages"); it != j->end()) (void)value_of(normalize_messages(*it));
    if (auto it = j->find("tools"); it != j->end()) (void)value_of(parse_tools(*it));
  }
  return 0;
}
