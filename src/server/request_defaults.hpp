// What a request gets when it is silent, decided once per served model from its directory and the backend:
// whether chat templates render with thinking on, and the max_tokens cap.
//
// Thinking (the `enable_thinking` template variable) is on by default only for a model trained to think:
//   1. the tokenizer has no <think> / </think> tokens: off (the model cannot think);
//   2. generation_config.json holds a boolean "enable_thinking": that (models/house says false: it was
//      trained on Python code only, never on conversations or thoughts);
//   3. otherwise the chat template decides: on when it mentions `enable_thinking` or <think> (the Qwen3.5 /
//      Qwen3.6 templates, whose models were trained to think), else off.
// `--default-enable-thinking` overrides the rule.
//
// max_tokens when a request gives none: `--default-max-tokens` when given, else generation_config.json's
// max_new_tokens, else 512 on the CPU backend (seconds with the house model; a long answer should not
// hold the one engine thread for minutes), else the rest of the context (vLLM's behaviour on a GPU). Always
// capped by the room the prompt leaves in the context.
#pragma once

#include <cstdint>
#include <optional>

#include "server/served_model.hpp"

namespace deltaflow::server {

constexpr int64_t kCpuDefaultMaxTokens = 512;

struct RequestDefaults {
  bool enable_thinking = false;
  GenerationDefaults generation;  // sampling defaults, and max_tokens as resolved above
};

// The model directory's answer (rules 1 to 3 above).
bool trained_to_think(const ServedModel& m);

RequestDefaults resolve_request_defaults(const ServedModel& m, std::optional<bool> enable_thinking,
                                         int64_t default_max_tokens);

}  // namespace deltaflow::server
