// Request bodies -> native parameters. Every field is type- and range-checked, and a bad one becomes a 400
// naming it (OpenAI's "param"). Unknown fields are ignored, as OpenAI-compatible servers do, so clients that
// send extras keep working.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "engine/sampler.hpp"
#include "server/api_error.hpp"
#include "server/served_model.hpp"
#include "text/tool_call_parser.hpp"

namespace deltaflow::server {

// Parsed sampling and stopping fields, with the model's defaults applied where the request is silent.
struct GenParams {
  engine::SamplingParams sampling;
  bool seed_given = false;
  std::optional<int64_t> max_tokens;  // none: default_max_tokens, capped by the room left in the context
  std::optional<int64_t> default_max_tokens;  // the served default (request_defaults.hpp); none: the context
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool logprobs = false;
  int top_logprobs = 0;
  int n = 1;
  int best_of = 1;                     // completions: candidates per prompt, the n most likely returned
  bool echo = false;                   // completions: the prompt precedes the completion
  std::optional<int> prompt_logprobs;  // vLLM extra: teacher-forced logprobs of the prompt, top-k per token
  std::optional<int> thinking_budget;
  std::optional<std::string> forced_text;  // test hook (--enable-test-hooks)
  bool skip_special_tokens = true;
};

enum class Api { kChat, kCompletions, kOllama };

template <class T>
using Parsed = std::variant<T, ApiError>;

// Parses an OpenAI chat or completions body (or an Ollama "options" object with Api::kOllama).
Parsed<GenParams> parse_gen_params(const Json& body, Api api, const GenerationDefaults& defaults,
                                   int64_t vocab_size, bool test_hooks);

// The body as JSON, refusing nesting deeper than `max_depth` (deep nesting costs stack in every consumer).
Parsed<Json> parse_body(const std::string& body, int max_depth = 64);

// tools: [{type: "function", function: {name, description, parameters}}] -> the parser's view (parameter
// types from the JSON schema, through anyOf/oneOf and type lists).
Parsed<std::vector<text::ToolSpec>> parse_tools(const Json& tools, const std::string& field = "tools");

// OpenAI messages -> what the chat template expects: assistant tool_call arguments given as JSON text become
// objects, "developer" becomes "system", content parts are checked (text only).
Parsed<Json> normalize_messages(const Json& messages, const std::string& field = "messages");

}  // namespace deltaflow::server
