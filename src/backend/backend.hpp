// The one seam between the engine and the compute backends (DESIGN.md §2-3): two entry points, prefill and
// decode, over several sequences at once. A backend owns the weights it runs and the per-sequence state it
// creates.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
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
};

}  // namespace deltaflow::backend
