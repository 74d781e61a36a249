#include "engine/sampling_state.hpp"

#include <algorithm>

namespace deltaflow::engine {

void SamplingState::add_prompt(std::span<const int32_t> ids) {
  if (params_.repetition_penalty == 1.0f) return;  // only the repetition penalty reads the prompt
  prompt_seen_.insert(prompt_seen_.end(), ids.begin(), ids.end());
  std::sort(prompt_seen_.begin(), prompt_seen_.end());
  prompt_seen_.erase(std::unique(prompt_seen_.begin(), prompt_seen_.end()), prompt_seen_.end());
}

void SamplingState::accept(int32_t id) {
  ++counts_[id];
  ++step_;
}

const backend::SamplingSpec& SamplingState::spec() {
  backend::SamplingSpec& s = spec_;
  s = backend::SamplingSpec{};
  s.temperature = params_.temperature;
  s.top_k = params_.top_k;
  s.top_p = params_.top_p;
  s.min_p = params_.min_p;
  s.presence_penalty = params_.presence_penalty;
  s.frequency_penalty = params_.frequency_penalty;
  s.repetition_penalty = params_.repetition_penalty;
  s.seed = params_.seed;
  s.step = step_;
  s.logit_bias = params_.logit_bias;
  if (s.has_penalties()) {
    generated_.clear();
    for (const auto& [id, n] : counts_) generated_.push_back({id, n});
    s.generated = generated_;
    s.prompt_seen = prompt_seen_;
  }
  return s;
}

}  // namespace deltaflow::engine
