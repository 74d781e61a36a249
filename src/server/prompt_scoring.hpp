// Teacher-forced log-probabilities of prompts, for completions' `echo` with `logprobs` and vLLM's
// `prompt_logprobs`: engine::score (the same scoring as `deltaflow eval`) run on the engine thread, queued
// like a generation (429 when the queue is full).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/generate.hpp"
#include "server/api_error.hpp"
#include "server/request_params.hpp"
#include "server/served_model.hpp"
#include "text/tokenizer.hpp"

namespace deltaflow::server {

// One result per prompt (entry i of a result is about token i + 1; a one-token prompt has none), with the
// top_k alternatives and ranks when top_k >= 0. `images`: empty, or each prompt's images (its placeholders
// expanded). Blocks until scored; throws ApiError.
std::vector<engine::ScoreResult> score_prompts(
    ServedModel& m, const std::vector<std::vector<int32_t>>& prompts, int top_k,
    const std::vector<std::vector<engine::ImageInput>>& images = {});

// Legacy completions logprobs lists for an echoed prompt: the first token has null logprob and null
// top_logprobs, as OpenAI reports it.
Json echo_logprobs(const text::Tokenizer& tok, const std::vector<int32_t>& prompt,
                   const engine::ScoreResult& s);

// vLLM's prompt_logprobs: [null, {"<id>": {"logprob", "rank", "decoded_token"}, ...}, ...] holding the
// prompt's token and the top_k most likely at each position.
Json vllm_prompt_logprobs(const text::Tokenizer& tok, const std::vector<int32_t>& prompt,
                          const engine::ScoreResult& s);

}  // namespace deltaflow::server
