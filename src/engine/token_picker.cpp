#include "engine/token_picker.hpp"

#include <algorithm>

namespace deltaflow::engine {

TokenPicker::TokenPicker(backend::Backend& backend, const SamplingParams& params, bool need_logits)
    : backend_(backend),
      params_(params),
      sampler_(params),
      on_backend_(!need_logits && params.logit_bias.empty() && backend.can_sample()) {}

void TokenPicker::add_prompt(std::span<const int32_t> ids) {
  if (params_.repetition_penalty == 1.0f) return;  // only the repetition penalty reads the prompt
  sampler_.add_prompt(ids);
  prompt_seen_.insert(prompt_seen_.end(), ids.begin(), ids.end());
  std::sort(prompt_seen_.begin(), prompt_seen_.end());
  prompt_seen_.erase(std::unique(prompt_seen_.begin(), prompt_seen_.end()), prompt_seen_.end());
}

void TokenPicker::accept(int32_t id) {
  sampler_.accept(id);
  ++counts_[id];
  ++step_;
}

backend::SamplingSpec TokenPicker::spec() {
  backend::SamplingSpec s;
  s.temperature = params_.temperature;
  s.top_k = params_.top_k;
  s.top_p = params_.top_p;
  s.min_p = params_.min_p;
  s.presence_penalty = params_.presence_penalty;
  s.frequency_penalty = params_.frequency_penalty;
  s.repetition_penalty = params_.repetition_penalty;
  s.seed = params_.seed;
  s.step = step_;
  if (s.has_penalties()) {
    generated_.clear();
    for (const auto& [id, n] : counts_) generated_.push_back({id, n});
    s.generated = generated_;
    s.prompt_seen = prompt_seen_;
  }
  return s;
}

core::Status TokenPicker::start(std::span<const float> row) {
  if (!on_backend_) return core::Status();
  const backend::SamplingSpec s = spec();
  std::vector<int32_t> ids;
  DF_TRY(backend_.sample_logits(row, std::span<const backend::SamplingSpec>(&s, 1), ids));
  if (ids.size() != 1) return core::Error{"sample_logits: expected one id"};
  next_ = ids[0];
  return core::Status();
}

int32_t TokenPicker::pick(std::span<const float> row) {
  return on_backend_ ? next_ : sampler_.sample(row);
}

core::Status TokenPicker::advance(backend::SequenceState* seq, int32_t token, std::vector<float>& logits) {
  const std::span<backend::SequenceState* const> seqs(&seq, 1);
  const std::span<const int32_t> tokens(&token, 1);
  if (!on_backend_) return backend_.decode(seqs, tokens, logits);
  const backend::SamplingSpec s = spec();
  std::vector<int32_t> ids;
  DF_TRY(backend_.decode_sample(seqs, tokens, std::span<const backend::SamplingSpec>(&s, 1), ids));
  if (ids.size() != 1) return core::Error{"decode_sample: expected one id"};
  next_ = ids[0];
  return core::Status();
}

}  // namespace deltaflow::engine
