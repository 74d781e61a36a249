// The sampling parameters of a request, as the OpenAI and Ollama APIs name them.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace deltaflow::engine {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax)
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off; keeps tokens with p >= min_p * max p (after temperature)
  // OpenAI penalties over the generated tokens: logit -= presence * [count > 0] + frequency * count.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // HF / vLLM repetition penalty over prompt and generated tokens: positive logits divided by it, negative
  // ones multiplied. 1: off.
  float repetition_penalty = 1.0f;
  uint64_t seed = 0;
  // OpenAI logit_bias: (id, bias) pairs added to the logits before sampling (after the penalties).
  std::vector<std::pair<int32_t, float>> logit_bias = {};
};

}  // namespace deltaflow::engine
