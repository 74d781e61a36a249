// Token sampling from a row of logits: greedy, or temperature with top-k / min-p / top-p, after the presence,
// frequency and repetition penalties, from a seeded generator (same seed and inputs: same tokens). Also the
// log-probabilities the OpenAI `logprobs` / `top_logprobs` fields report.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
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

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : p_(p), rng_(p.seed) {}

  // Tokens the repetition penalty counts as already seen (the prompt).
  void add_prompt(std::span<const int32_t> ids);
  // Records a token as generated, for the penalties. `sample` does not record by itself, so that tokens
  // chosen elsewhere (forced ones) are counted the same way.
  void accept(int32_t id);

  int32_t sample(std::span<const float> logits);
  bool has_penalties() const;

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int32_t> output_counts_;  // generated id -> times
  std::vector<int32_t> prompt_seen_;                    // sorted unique prompt ids
  std::vector<float> work_;                             // penalised copy of the logits
};

// Index of the largest logit; ties go to the lowest index (as torch.argmax).
int32_t argmax(std::span<const float> logits);

// log_softmax(logits)[i], computed stably in double.
double log_prob(std::span<const float> logits, int32_t i);

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;
};

// log_softmax of the raw logits (the model's distribution, before penalties and temperature, as vLLM reports
// by default): the chosen id's entry, and the k most likely ids (k <= 0: none), most likely first, ties to
// the lower id.
TokenLogprob chosen_logprob(std::span<const float> logits, int32_t chosen);
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int k);

}  // namespace deltaflow::engine
