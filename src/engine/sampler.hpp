// Token sampling from a row of logits: greedy, or temperature with top-k / min-p / top-p, after the presence,
// frequency and repetition penalties, from a seeded generator (same seed and inputs: same tokens). Also the
// log-probabilities the OpenAI `logprobs` / `top_logprobs` fields report.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampling_params.hpp"
#include "engine/sampling_state.hpp"

namespace deltaflow::engine {

// The host reference draw of one sequence (backend/host_sampling.hpp) with its penalty history: the same
// tokens as the engine gives that sequence.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& p) : state_(p) {}

  // Tokens the repetition penalty counts as already seen (the prompt).
  void add_prompt(std::span<const int32_t> ids) { state_.add_prompt(ids); }
  // Records a token as generated, for the penalties, and moves to the next step. `sample` does not record by
  // itself, so that tokens chosen elsewhere (forced ones) are counted the same way.
  void accept(int32_t id) { state_.accept(id); }

  int32_t sample(std::span<const float> logits);

 private:
  SamplingState state_;
  std::vector<float> work_;  // penalised copy of the logits
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
