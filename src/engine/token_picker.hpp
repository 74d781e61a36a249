// The next-token choice of one sequence: on the backend when it can sample and the caller needs no logits
// (no logprobs), so that only ids cross to the host; otherwise from host logits by the Sampler (the
// reference). Either way it keeps the penalty history the Sampler's formulas need.
//
//   picker.start(prefill_logits_row);         // after the prefill
//   loop: id = picker.pick(row);  picker.accept(id);  ...  picker.advance(seq, id, logits);
#pragma once

#include <map>
#include <span>
#include <vector>

#include "backend/backend.hpp"
#include "engine/sampler.hpp"

namespace deltaflow::engine {

class TokenPicker {
 public:
  // need_logits: the caller reads the logits after each step (logprobs), which keeps sampling on the host.
  TokenPicker(backend::Backend& backend, const SamplingParams& params, bool need_logits);

  bool on_backend() const { return on_backend_; }

  // Tokens the repetition penalty counts as seen (the prompt).
  void add_prompt(std::span<const int32_t> ids);
  // Records a token as emitted (sampled or forced), for the penalties; the next draw is the next step.
  void accept(int32_t id);

  // After the prefill: `row` is the last prompt position's logits. On the backend this already draws the
  // first token.
  core::Status start(std::span<const float> row);
  // The token for the current position: the backend's draw, or the Sampler's draw from `row`.
  int32_t pick(std::span<const float> row);
  // Runs `token` through `seq` (one decode step). On the host path `logits` receives the step's logits; on
  // the backend path it is left alone and the next draw is made.
  core::Status advance(backend::SequenceState* seq, int32_t token, std::vector<float>& logits);

  // The backend's view of the next draw: the parameters, the history, and the step (tokens accepted so far).
  backend::SamplingSpec spec();

 private:
  backend::Backend& backend_;
  SamplingParams params_;
  Sampler sampler_;
  bool on_backend_ = false;
  std::map<int32_t, int32_t> counts_;  // generated id -> times
  std::vector<backend::TokenCount> generated_;
  std::vector<int32_t> prompt_seen_;  // sorted distinct
  uint64_t step_ = 0;
  int32_t next_ = 0;  // the backend's draw for the current position
};

}  // namespace deltaflow::engine
