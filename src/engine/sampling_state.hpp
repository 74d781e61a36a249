// One sequence's sampling parameters and penalty history, as the SamplingSpec of its next draw (backend.hpp).
// The step of a draw is the number of tokens the sequence has generated before it, so a draw depends on the
// seed and the sequence alone: not on the batch it ran in, nor on whether it was preempted and recomputed.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "backend/backend.hpp"
#include "engine/sampling_params.hpp"

namespace deltaflow::engine {

class SamplingState {
 public:
  explicit SamplingState(const SamplingParams& params = {}) : params_(params) {}

  // Tokens the repetition penalty counts as seen (the prompt).
  void add_prompt(std::span<const int32_t> ids);
  // Records a token as emitted (sampled or forced); the next draw is the next step.
  void accept(int32_t id);
  uint64_t step() const { return step_; }

  // The spec of the next draw; it points into this object, valid until the next accept().
  const backend::SamplingSpec& spec();

 private:
  SamplingParams params_;
  std::map<int32_t, int32_t> counts_;  // generated id -> times
  std::vector<backend::TokenCount> generated_;
  std::vector<int32_t> prompt_seen_;  // sorted distinct
  uint64_t step_ = 0;
  backend::SamplingSpec spec_;
};

}  // namespace deltaflow::engine
