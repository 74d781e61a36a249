// The per-sequence API of the CUDA and tensor-parallel backends: each sequence a state slot with the KV
// cache of max_context positions beside it, or (can_page) the engine's pools with the KV in pages named by a
// block table. SequenceStepper (sequence_stepper.hpp) puts such a backend behind the engine's step seam
// (backend.hpp). Tests also use it to run the CPU reference and the CUDA backend side by side.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "core/status.hpp"
#include "model/config.hpp"

namespace deltaflow::backend {

// Per-sequence state: the KV cache of the full-attention layers, and the conv + fp32 Gated DeltaNet state of
// the linear layers. Opaque to callers; each backend defines its own.
class SequenceState {
 public:
  virtual ~SequenceState() = default;
  virtual int64_t length() const = 0;  // tokens consumed so far
};

struct PrefillItem {
  SequenceState* state = nullptr;
  std::span<const int32_t> tokens;  // appended after the tokens the state already holds
  bool all_logits = false;          // logits for every token (teacher forcing) instead of the last only
  // After `rows` of these tokens the recurrent state is also copied to `slot` (ascending rows; a backend
  // whose prefill_snapshots() is true; others get none).
  std::span<const StateSnapshot> snapshots = {};
};

class SequenceBackend {
 public:
  virtual ~SequenceBackend() = default;
  virtual const model::TextConfig& config() const = 0;
  virtual const char* name() const = 0;

  virtual std::unique_ptr<SequenceState> new_sequence() = 0;
  // Sequences new_sequence can hand out at once, and positions each may hold.
  virtual int max_sequences() const = 0;
  virtual int64_t max_context() const = 0;

  // Runs each item's tokens (chunked Gated DeltaNet, attention over the whole prompt). `logits` receives, in
  // item order, one row of vocab_size floats per requested position.
  virtual core::Status prefill(std::span<const PrefillItem> items, std::vector<float>& logits) = 0;

  // One token per sequence (recurrent Gated DeltaNet step, attention over the cache). logits: [n, vocab].
  virtual core::Status decode(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                              std::vector<float>& logits) = 0;

  // Sampling on the backend, so that no logits cross to the host. A backend that returns true implements
  // both calls below; otherwise the caller samples the logits on the host (host_sampling.hpp).
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

  // Engine-owned memory (backend.hpp's pools), for a backend that can keep its KV in the engine's pages. A
  // backend that returns true from can_page implements every call below; SequenceStepper then serves the
  // step seam with paged KV, state copies and snapshots (so the engine's prefix cache works on it), and the
  // per-sequence calls above hand out no new sequence after allocate_pools.
  virtual bool can_page() const { return false; }
  // Whether prefill takes PrefillItem::snapshots (copies the state mid-run, in the same pass).
  virtual bool prefill_snapshots() const { return false; }
  // A whole step in one forward pass (decode rows and prefill runs together, each weight read once), for
  // the steps can_fuse accepts; seqs[i] is run i's bound sequence.
  virtual bool can_fuse(const Step& step) const {
    (void)step;
    return false;
  }
  virtual core::Status fused_step(const Step& step, std::span<SequenceState* const> seqs, StepOut& out) {
    (void)step, (void)seqs, (void)out;
    return core::Error{std::string(name()) + " backend: no fused steps"};
  }
  virtual int32_t kv_page_size() const { return 0; }
  virtual size_t kv_page_bytes() const { return 0; }
  virtual size_t state_slot_bytes() const { return 0; }
  virtual core::Status allocate_pools(const PoolRequest& request, Pools& pools) {
    (void)request, (void)pools;
    return core::Error{std::string(name()) + " backend: no paged KV"};
  }
  // The sequence in state `slot`, holding start_pos tokens, about to run up to end_pos; `pages` is its block
  // table (covering end_pos). start_pos 0 zeroes the slot's recurrent state. The pointer stays valid until
  // the next allocate_pools.
  virtual core::Expected<SequenceState*> bind(int32_t slot, int64_t start_pos, int64_t end_pos,
                                              std::span<const int32_t> pages) {
    (void)slot, (void)start_pos, (void)end_pos, (void)pages;
    return core::Error{std::string(name()) + " backend: no paged KV"};
  }
  virtual core::Status copy_state(int32_t from_slot, int32_t to_slot) {
    (void)from_slot, (void)to_slot;
    return core::Error{std::string(name()) + " backend: no paged KV"};
  }
  virtual core::Status copy_pages(std::span<const PageCopy> copies) {
    (void)copies;
    return core::Error{std::string(name()) + " backend: no paged KV"};
  }

  // Speculative decoding with the checkpoint's MTP head (backend.hpp's DraftRun), for a paged backend whose
  // pools were allocated with PoolRequest::draft: whether it can draft (the head was loaded), and the bytes
  // the MTP layer's KV adds to one page.
  virtual bool can_draft() const { return false; }
  virtual size_t draft_page_bytes() const { return 0; }
  // Where the next prefill or decode call keeps its rows' final hidden states for draft(): at these rows of
  // the engine's step (a prefill: one per token, in order; a decode: one per sequence). fused_step keeps
  // them at its runs' own rows, and a step starts afresh.
  virtual void keep_rows(std::span<const int32_t> step_rows) { (void)step_rows; }
  // Backend::draft, after a step whose token rows were `step_tokens`.
  virtual core::Status draft_after(std::span<const DraftRun> runs, std::span<const int32_t> step_tokens,
                                   DraftOut& out) {
    (void)runs, (void)step_tokens;
    out = {};
    return core::Error{std::string(name()) + " backend: drafting with the MTP head is not supported"};
  }
};

}  // namespace deltaflow::backend
