// A whole engine step in one forward pass (the engine's pools, bound by SequenceStepper): the decode rows
// first, then each prefill run's rows, split after its snapshots. Every matmul takes all the rows at once, so
// the weights are read once for the step, not once per run; the conv, the delta rule and attention run
// segment by segment (run_layers). The rows that reach lm_head (each run's last, when it samples or returns
// its logits) are gathered, their logits copied back as asked, and the draws made on the GPU.
#include <algorithm>
#include <string>

#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_check.hpp"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/sampling_batch.hpp"

namespace deltaflow::backend::cuda {

namespace {

bool is_decode_row(const SeqRun& r) {
  return r.n_rows == 1 && r.start_pos > 0 && r.snapshots.empty();
}

}  // namespace

bool CudaBackend::can_fuse(const Step& step) const {
  if (bound_.empty() || step.runs.size() < 2 || opt_.collective) return false;
  int64_t rows = 0, outputs = 0, decode_rows = 0;
  bool any_prefill = false;
  for (const SeqRun& r : step.runs) {
    rows += r.n_rows;
    any_prefill = any_prefill || !is_decode_row(r);
    decode_rows += is_decode_row(r);
    // Every row's logits (a speculative verification, prompt log-probabilities) only for a run that does
    // not also sample; a prompt longer than the logits buffer takes the per-run path.
    if (r.logits == RunLogits::kAll && r.sample) return false;
    if (r.sample && !r.sample->logit_bias.empty()) return false;  // drawn on the host
    outputs += r.logits == RunLogits::kAll ? r.n_rows : (r.sample != nullptr || r.logits == RunLogits::kLast);
  }
  // All-decode steps replay the graphs instead.
  // The decode rows' split-attention partials hold decode_ws_rows_ rows.
  return any_prefill && rows <= max_rows_ && outputs <= kLogitRows && decode_rows <= decode_ws_rows_;
}

core::Status CudaBackend::fused_step(const Step& step, std::span<SequenceState* const> seqs, StepOut& out) {
  if (!can_fuse(step) || seqs.size() != step.runs.size())
    return core::Error{"cuda backend: internal: a step fused_step does not take"};
  const int64_t V = config_.vocab_size, H = config_.hidden_size, R = max_rows_;
  const int64_t limit = std::min<int64_t>(config_.max_position_embeddings, plan_.max_context);
  std::vector<CudaSequenceState*> ss;
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto* cs = dynamic_cast<CudaSequenceState*>(seqs[i]);
    if (!cs || cs->owner != this || cs->slot < 0)
      return core::Error{"cuda backend: sequence state from another backend"};
    const SeqRun& r = step.runs[i];
    if (r.n_rows < 1 || r.first_row < 0 ||
        static_cast<size_t>(r.first_row) + static_cast<size_t>(r.n_rows) > step.tokens.size())
      return core::Error{"step: a run's rows are outside the step's tokens"};
    if (cs->pos + r.n_rows > limit)
      return core::Error{"sequence length " + std::to_string(cs->pos + r.n_rows) + " exceeds " +
                         std::to_string(limit)};
    DF_TRY(check_snapshots(r.snapshots, r.n_rows, cs->slot));
    ss.push_back(cs);
  }
  DF_TRY(check_ids(step.tokens));

  // Rows: decode rows first (one segment), then the short runs (verifications, short continuations: one
  // segment of several sequences, RowSegment::short_runs, as many as fit the decode rows' attention
  // partials beside them), then each other prefill run. row_of[i]: run i's first row in the pass.
  std::vector<int64_t> row_of(step.runs.size());
  std::vector<bool> in_short(step.runs.size(), false);
  std::vector<RowSegment> segs;
  std::vector<int32_t> step_row;  // drafting: each pass row's row of the step, where its hidden row is kept
  int64_t n = 0;
  bool row_snaps = false;
  const auto stage = [&](size_t i, int64_t j) {
    const SeqRun& r = step.runs[i];
    if (draft_) step_row.push_back(static_cast<int32_t>(r.first_row + j));
    pinned_[n] = step.tokens[static_cast<size_t>(r.first_row + j)];
    pinned_[R + n] = static_cast<int>(ss[i]->pos + j);
    pinned_[2 * R + n] = ss[i]->slot;
    ++n;
  };
  for (size_t i = 0; i < step.runs.size(); ++i)
    if (is_decode_row(step.runs[i])) {
      row_of[i] = n;
      stage(i, 0);
    }
  if (n > 0) segs.push_back({0, n, true, -1, -1});
  const int64_t short0 = n;
  int n_short = 0;
  for (size_t i = 0; i < step.runs.size(); ++i) {
    const SeqRun& r = step.runs[i];
    if (!short_runs_ || is_decode_row(r) || r.n_rows > kRowSnapshotRows || n + r.n_rows > decode_ws_rows_)
      continue;
    in_short[i] = true;
    row_of[i] = n;
    pinned_runs()[n_short++] = static_cast<int>(n - short0);
    fill_row_snapshots(n, 0, r.n_rows, r.snapshots, pinned_snap());
    for (int64_t j = 0; j < r.n_rows; ++j) {
      pinned_run0()[n] = static_cast<int>(row_of[i] - short0);
      stage(i, j);
    }
  }
  if (n_short > 0) {
    pinned_runs()[n_short] = static_cast<int>(n - short0);
    segs.push_back({short0, n - short0, false, -1, -1, true, true, n_short, 0});
    row_snaps = true;
  }
  for (size_t i = 0; i < step.runs.size(); ++i) {
    const SeqRun& r = step.runs[i];
    if (is_decode_row(r) || in_short[i]) continue;
    row_of[i] = n;
    row_snaps |= append_prefill_segments(n, 0, r.n_rows, ss[i]->slot, r.snapshots, pinned_snap(), segs);
    for (int64_t j = 0; j < r.n_rows; ++j) stage(i, j);
  }
  DF_TRY(upload_rows(n, row_snaps, n_short));
  DF_TRY(run_layers(n, segs));
  DF_TRY(keep_hidden(step_row));

  // The rows lm_head reads: the sampled runs' last rows first (the draw takes the logits buffer's first
  // rows), then those that only return logits (a kAll run's every row). Gathered into ws_.y (free after
  // the final norm). first_out[i]: run i's first row there.
  std::vector<size_t> sampled, only_logits;
  for (size_t i = 0; i < step.runs.size(); ++i) {
    if (step.runs[i].sample) {
      sampled.push_back(i);
    } else if (step.runs[i].logits != RunLogits::kNone) {
      only_logits.push_back(i);
    }
  }
  std::vector<size_t> order = sampled;
  order.insert(order.end(), only_logits.begin(), only_logits.end());
  int* rows = pinned_out_rows();
  std::vector<int64_t> first_out(step.runs.size(), 0);
  int64_t m = 0;
  for (size_t i : order) {
    const SeqRun& r = step.runs[i];
    first_out[i] = m;
    const int64_t from = r.logits == RunLogits::kAll ? 0 : r.n_rows - 1;
    for (int64_t j = from; j < r.n_rows; ++j) rows[m++] = static_cast<int>(row_of[i] + j);
  }
  if (m > 0) {
    int* d_rows = ws_.pos;  // read by every kernel above, which the stream runs first
    DF_CUDA_TRY(cudaMemcpyAsync(d_rows, rows, static_cast<size_t>(m) * 4, cudaMemcpyHostToDevice, stream_));
    DF_CUDA_TRY(gather_rows(ws_.xn, H, d_rows, m, H, ws_.y, H, stream_));
    prof_.mark("lm_head", stream_);
    DF_TRY(linear(ws_.y, H, m, lm_head_, ws_.logits, V));
  }
  // Logits as asked, before the draw penalises its rows in place; out.logits rows are in run order.
  size_t at = 0;
  for (size_t i = 0; i < step.runs.size(); ++i) {
    const SeqRun& r = step.runs[i];
    if (r.logits == RunLogits::kNone) continue;
    const int64_t rows_out = r.logits == RunLogits::kAll ? r.n_rows : 1;
    DF_CUDA_TRY(cudaMemcpyAsync(out.logits.data() + at * static_cast<size_t>(V),
                                ws_.logits + first_out[i] * V, static_cast<size_t>(rows_out * V) * 4,
                                cudaMemcpyDeviceToHost, stream_));
    at += static_cast<size_t>(rows_out);
  }
  if (!sampled.empty()) {
    if (!sampling_) sampling_ = std::make_unique<SamplingBatch>();
    std::vector<SamplingSpec> specs;
    for (size_t i : sampled) specs.push_back(*step.runs[i].sample);
    std::vector<int32_t> ids;
    DF_TRY(sampling_->run(ws_.logits, V, specs, stream_, ids));  // synchronizes
    for (size_t k = 0; k < sampled.size(); ++k) out.sampled[sampled[k]] = ids.at(k);
  } else {
    DF_CUDA_TRY(cudaStreamSynchronize(stream_));
  }
  DF_TRY(prof_.flush(stream_));
  for (size_t i = 0; i < ss.size(); ++i) ss[i]->pos += step.runs[i].n_rows;
  return core::Status();
}

}  // namespace deltaflow::backend::cuda
