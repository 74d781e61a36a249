#include "backend/sequence_stepper.hpp"

#include <algorithm>

#include "backend/host_sampling.hpp"

namespace deltaflow::backend {

SequenceStepper::SequenceStepper(std::unique_ptr<SequenceBackend> inner)
    : owned_(std::move(inner)), inner_(owned_.get()) {
  pools_.paged = inner_->can_page();
  pools_.max_context = inner_->max_context();
}

SequenceStepper::SequenceStepper(SequenceBackend& inner) : inner_(&inner) {
  pools_.paged = inner_->can_page();
  pools_.max_context = inner_->max_context();
}

int32_t SequenceStepper::page_size() const {
  if (inner_->can_page()) return inner_->kv_page_size();
  // The engine still counts positions in pages; one page is the whole per-sequence cache.
  return static_cast<int32_t>(std::min<int64_t>(inner_->max_context(), 1 << 30));
}

core::Status SequenceStepper::allocate(const PoolRequest& r) {
  seqs_.clear();
  draft_ = false;
  step_tokens_.clear();
  if (r.draft && !can_draft())
    return core::Error{std::string(name()) + " backend: drafting with the MTP head needs paged KV and the " +
                       "checkpoint's head loaded"};
  if (inner_->can_page()) {
    DF_TRY(inner_->allocate_pools(r, pools_));
    draft_ = r.draft;
    return core::Status();
  }
  if (r.state_slots > inner_->max_sequences())
    return core::Error{std::string(name()) + " backend: " + std::to_string(r.state_slots) +
                       " sequences asked for, it was loaded for " + std::to_string(inner_->max_sequences())};
  seqs_.resize(static_cast<size_t>(r.state_slots));
  pools_.page_size = page_size();
  pools_.kv_pages = r.state_slots;  // one "page" per sequence: its own cache
  pools_.state_slots = r.state_slots;
  pools_.max_step_rows = r.max_step_rows;
  pools_.max_step_seqs = r.max_step_seqs;
  pools_.max_context = inner_->max_context();
  pools_.paged = false;
  return core::Status();
}

core::Expected<SequenceState*> SequenceStepper::sequence_for(const SeqRun& run) {
  if (inner_->can_page())
    return inner_->bind(run.state_slot, run.start_pos, run.start_pos + run.n_rows, run.kv_pages);
  if (run.state_slot < 0 || static_cast<size_t>(run.state_slot) >= seqs_.size())
    return core::Error{"step: state slot " + std::to_string(run.state_slot) + " is outside the pool"};
  if (!run.snapshots.empty()) return core::Error{std::string(name()) + " backend: no state snapshots"};
  auto& s = seqs_[static_cast<size_t>(run.state_slot)];
  if (run.start_pos == 0) {
    s.reset();  // frees the backend's slot before taking one
    s = inner_->new_sequence();
  }
  if (!s || s->length() != run.start_pos)
    return core::Error{"step: slot " + std::to_string(run.state_slot) + " holds " +
                       std::to_string(s ? s->length() : 0) + " tokens, the run starts at " +
                       std::to_string(run.start_pos)};
  return s.get();
}

core::Status SequenceStepper::prefill_run(const SeqRun& r, SequenceState* s,
                                          std::span<const int32_t> tokens) {
  int32_t prev = 0;
  for (const StateSnapshot& snap : r.snapshots) {
    if (snap.rows < 1 || snap.rows > r.n_rows || snap.rows < prev)
      return core::Error{"step: snapshot rows must ascend within the run"};
    prev = snap.rows;
  }
  // Snapshots reach only a paged backend (sequence_for refuses them otherwise); it copies the states in the
  // same pass.
  if (!r.snapshots.empty() && !inner_->prefill_snapshots())
    return core::Error{std::string(name()) + " backend: no state snapshots"};
  logits_.clear();
  PrefillItem item{s, tokens, r.logits == RunLogits::kAll, r.snapshots};
  return inner_->prefill(std::span<const PrefillItem>(&item, 1), logits_);
}

core::Expected<int32_t> SequenceStepper::draw(std::span<const float> row, const SamplingSpec& spec) {
  if (static_cast<int64_t>(row.size()) != config().vocab_size)
    return core::Error{"draw: a logits row of " + std::to_string(row.size()) +
                       " floats, the vocabulary has " + std::to_string(config().vocab_size)};
  // Plain greedy is the argmax on both (ties to the lowest id): no copy to the device for it.
  if (!inner_->can_sample() || !spec.logit_bias.empty() || spec.is_plain_greedy())
    return sample_row(row, spec, work_);
  DF_TRY(inner_->sample_logits(row, std::span<const SamplingSpec>(&spec, 1), ids_));
  return ids_.at(0);
}

core::Status SequenceStepper::step(const Step& step, StepOut& out) {
  for (const auto& r : step.runs)
    if (r.has_images())
      return core::Error{std::string(name()) + " backend: runs with image rows are not supported here"};
  const size_t V = static_cast<size_t>(config().vocab_size);
  out.logits.clear();
  out.sampled.assign(step.runs.size(), -1);
  // Decode rows (one token, no snapshot) go together; prefill runs one by one. Outputs stay in run order.
  std::vector<SequenceState*> dec_seqs;
  std::vector<int32_t> dec_tokens;
  std::vector<size_t> dec_runs;
  std::vector<size_t> offsets(step.runs.size());
  size_t rows_out = 0;
  for (size_t i = 0; i < step.runs.size(); ++i) {
    const auto& r = step.runs[i];
    offsets[i] = rows_out;
    rows_out += r.logits == RunLogits::kAll ? static_cast<size_t>(r.n_rows) : r.logits == RunLogits::kLast;
  }
  out.logits.resize(rows_out * V);
  if (draft_) step_tokens_.assign(step.tokens.begin(), step.tokens.end());
  if (inner_->can_page() && inner_->can_fuse(step)) {
    std::vector<SequenceState*> seqs;
    for (const auto& r : step.runs) {
      DF_ASSIGN(SequenceState * s, sequence_for(r));
      seqs.push_back(s);
    }
    return inner_->fused_step(step, seqs, out);
  }
  for (size_t i = 0; i < step.runs.size(); ++i) {
    const auto& r = step.runs[i];
    DF_ASSIGN(SequenceState * s, sequence_for(r));
    const auto tokens = step.tokens.subspan(static_cast<size_t>(r.first_row), static_cast<size_t>(r.n_rows));
    if (r.n_rows == 1 && r.start_pos > 0 && r.snapshots.empty()) {
      dec_seqs.push_back(s);
      dec_tokens.push_back(tokens[0]);
      dec_runs.push_back(i);
      continue;
    }
    if (draft_) {
      keep_.resize(static_cast<size_t>(r.n_rows));
      for (int32_t j = 0; j < r.n_rows; ++j) keep_[static_cast<size_t>(j)] = r.first_row + j;
      inner_->keep_rows(keep_);
    }
    DF_TRY(prefill_run(r, s, tokens));
    if (r.logits != RunLogits::kNone)
      std::copy(logits_.begin(), logits_.end(),
                out.logits.begin() + static_cast<std::ptrdiff_t>(offsets[i] * V));
    if (r.sample) {
      const std::span<const float> last(logits_.data() + logits_.size() - V, V);
      DF_ASSIGN(out.sampled[i], draw(last, *r.sample));
    }
  }
  if (dec_seqs.empty()) return core::Status();
  if (draft_) {
    keep_.clear();
    for (size_t i : dec_runs) keep_.push_back(step.runs[i].first_row);
    inner_->keep_rows(keep_);
  }
  // The decode rows: sampled on the backend when every row samples and none reads its logits.
  bool all_sample = inner_->can_sample(), any_logits = false;
  for (size_t i : dec_runs) {
    all_sample = all_sample && step.runs[i].sample != nullptr && step.runs[i].sample->logit_bias.empty();
    any_logits = any_logits || step.runs[i].logits != RunLogits::kNone;
  }
  if (all_sample && !any_logits) {
    std::vector<SamplingSpec> specs;
    for (size_t i : dec_runs) specs.push_back(*step.runs[i].sample);
    DF_TRY(inner_->decode_sample(dec_seqs, dec_tokens, specs, ids_));
    for (size_t k = 0; k < dec_runs.size(); ++k) out.sampled[dec_runs[k]] = ids_[k];
    return core::Status();
  }
  DF_TRY(inner_->decode(dec_seqs, dec_tokens, logits_));
  for (size_t k = 0; k < dec_runs.size(); ++k) {
    const size_t i = dec_runs[k];
    const auto& r = step.runs[i];
    const std::span<const float> row(logits_.data() + k * V, V);
    if (r.logits != RunLogits::kNone)
      std::copy(row.begin(), row.end(), out.logits.begin() + static_cast<std::ptrdiff_t>(offsets[i] * V));
    if (r.sample) {
      DF_ASSIGN(out.sampled[i], draw(row, *r.sample));
    }
  }
  return core::Status();
}

core::Status SequenceStepper::draft(std::span<const DraftRun> runs, DraftOut& out) {
  if (!draft_) {
    out = {};
    return core::Error{std::string(name()) + " backend: draft() needs pools allocated for drafting"};
  }
  return inner_->draft_after(runs, step_tokens_, out);
}

core::Status SequenceStepper::copy_state(int32_t from_slot, int32_t to_slot) {
  if (inner_->can_page()) return inner_->copy_state(from_slot, to_slot);
  return core::Error{std::string(name()) + " backend: states are not copied (no paged KV)"};
}

core::Status SequenceStepper::copy_pages(std::span<const PageCopy> copies) {
  if (inner_->can_page()) return inner_->copy_pages(copies);
  return core::Error{std::string(name()) + " backend: no paged KV"};
}

}  // namespace deltaflow::backend
