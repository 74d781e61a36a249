// Puts a SequenceBackend (sequence_backend.hpp) behind the step seam. Two ways:
// - paged (the backend's can_page(): CUDA): the backend allocates the engine's pools and each run binds its
//   state slot and block table; states and pages are copied on request, and a run's snapshots are copied by
//   the backend in the run's own pass (prefill_snapshots), so the prefix cache works.
// - per-sequence (tensor parallel): engine state slot i is the i-th sequence the backend hands out, a run at
//   start_pos 0 starts it afresh, and the KV of a sequence is not in the engine's pages (Pools::paged is
//   false): no page sharing, no state copies, so no prefix cache.
// Prefill runs go one by one; the decode rows of a step go together (the backend's batched decode, CUDA
// graphs on CUDA).
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "backend/sequence_backend.hpp"

namespace deltaflow::backend {

class SequenceStepper final : public Backend {
 public:
  explicit SequenceStepper(std::unique_ptr<SequenceBackend> inner);
  // Not owning: `inner` must outlive the stepper (tests that also use the backend directly).
  explicit SequenceStepper(SequenceBackend& inner);

  const model::TextConfig& config() const override { return inner_->config(); }
  const char* name() const override { return inner_->name(); }
  int32_t page_size() const override;
  size_t page_bytes() const override { return inner_->can_page() ? inner_->kv_page_bytes() : 0; }
  size_t slot_bytes() const override { return inner_->can_page() ? inner_->state_slot_bytes() : 0; }
  core::Status allocate(const PoolRequest& request) override;
  const Pools& pools() const override { return pools_; }
  core::Status step(const Step& step, StepOut& out) override;
  // On the backend when it samples, else the host reference.
  core::Expected<int32_t> draw(std::span<const float> row, const SamplingSpec& spec) override;
  core::Status copy_state(int32_t from_slot, int32_t to_slot) override;
  core::Status copy_pages(std::span<const PageCopy> copies) override;
  // Speculative decoding on a paged backend that drafts: the step's rows are kept where the engine numbers
  // them (SequenceBackend::keep_rows before each call), and its tokens for draft().
  bool can_draft() const override { return inner_->can_page() && inner_->can_draft(); }
  size_t draft_page_bytes() const override { return can_draft() ? inner_->draft_page_bytes() : 0; }
  core::Status draft(std::span<const DraftRun> runs, DraftOut& out) override;

  SequenceBackend& inner() { return *inner_; }

 private:
  core::Expected<SequenceState*> sequence_for(const SeqRun& run);
  // A prefill run (or one with snapshots, which the backend copies in the same pass); its logits rows into
  // logits_.
  core::Status prefill_run(const SeqRun& run, SequenceState* s, std::span<const int32_t> tokens);

  std::unique_ptr<SequenceBackend> owned_;
  SequenceBackend* inner_ = nullptr;
  Pools pools_;
  std::vector<std::unique_ptr<SequenceState>> seqs_;  // by state slot
  std::vector<float> logits_;
  std::vector<int32_t> ids_;
  std::vector<float> work_;
  bool draft_ = false;                // pools allocated for drafting
  std::vector<int32_t> step_tokens_;  // the last step's tokens (drafting)
  std::vector<int32_t> keep_;         // step rows of the next call's rows (drafting)
};

}  // namespace deltaflow::backend
