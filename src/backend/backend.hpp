// The one seam between the engine and the compute backends (DESIGN.md §2-3): two entry points, prefill and
// decode, over several sequences at once. A backend owns the weights it runs and the per-sequence state it
// creates.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "model/config.hpp"

namespace deltaflow::backend {

// Per-sequence state: the KV cache of the full-attention layers, and the conv + fp32 Gated DeltaNet state of
// the linear layers. Opaque to the engine; each backend defines its own.
class SequenceState {
 public:
  virtual ~SequenceState() = default;
  virtual int64_t length() const = 0;  // tokens consumed so far
};

// How one row's next token is drawn when the backend samples where the logits are (DESIGN.md §5): the
// engine's SamplingParams plus the penalty history, with the same meanings as engine::Sampler (the
// reference). `seed` and `step` key a counter-based generator, so the same seed gives the same tokens.
struct TokenCount {
  int32_t id = 0;
  int32_t count = 0;  // times generated
};

struct SamplingSpec {
  float temperature = 0.0f;  // 0: greedy
  int top_k = 0;             // 0: off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  uint64_t seed = 0;
  uint64_t step = 0;                      // index of the token being drawn in its sequence
  std::span<const TokenCount> generated;  // distinct generated ids (presence / frequency / repetition)
  std::span<const int32_t> prompt_seen;   // sorted distinct prompt ids (repetition only)

  bool has_penalties() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f;
  }
  bool is_plain_greedy() const { return temperature <= 0.0f && !has_penalties(); }
};

struct PrefillItem {
  SequenceState* state = nullptr;
  std::span<const int32_t> tokens;  // appended after the tokens the state already holds
  bool all_logits = false;          // logits for every token (teacher forcing) instead of the last only
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const model::TextConfig& config() const = 0;
  virtual const char* name() const = 0;

  virtual std::unique_ptr<SequenceState> new_sequence() = 0;

  // Runs each item's tokens (chunked Gated DeltaNet, attention over the whole prompt). `logits` receives, in
  // item order, one row of vocab_size floats per requested position.
  virtual core::Status prefill(std::span<const PrefillItem> items, std::vector<float>& logits) = 0;

  // One token per sequence (recurrent Gated DeltaNet step, attention over the cache). logits: [n, vocab].
  virtual core::Status decode(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                              std::vector<float>& logits) = 0;

  // Sampling on the backend, so that no logits cross to the host. A backend that returns true implements
  // both calls below; otherwise the engine runs decode and its host Sampler.
  virtual bool can_sample() const { return false; }
  // decode, then ids[i] = a draw from sequence i's next-token logits under specs[i].
  virtual core::Status decode_sample(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                                     std::span<const SamplingSpec> specs, std::vector<int32_t>& ids) {
    (void)seqs, (void)tokens, (void)specs, (void)ids;
    return core::Error{std::string(name()) + " backend: no sampling on the backend"};
  }
  // ids[i] = a draw from row i of host logits [specs.size(), vocab] (the token after a prefill).
  virtual core::Status sample_logits(std::span<const float> logits, std::span<const SamplingSpec> specs,
                                     std::vector<int32_t>& ids) {
    (void)logits, (void)specs, (void)ids;
    return core::Error{std::string(name()) + " backend: no sampling on the backend"};
  }
};

}  // namespace deltaflow::backend
