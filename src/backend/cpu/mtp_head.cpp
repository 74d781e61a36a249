// The CPU backend's MTP head (qwen35-architecture.md §4): drafting for speculative decoding. For a row that
// pairs the main model's final hidden state h at position p with the embedding of the token after it:
//   u = fc([RMSNorm1p(embed(next); pre_fc_norm_embedding) | RMSNorm1p(h; pre_fc_norm_hidden)])
//   u = the MTP decoder layer (full attention over the head's own KV at positions 0..p, then its FFN)
//   h' = RMSNorm1p(u; mtp.norm), logits = lm_head(h')
// A draft chain feeds h' back in place of h, with the token just drafted, one position further.
#include <algorithm>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/ops.hpp"
#include "backend/host_sampling.hpp"

namespace deltaflow::backend::cpu {

void CpuBackend::mtp_rows(std::span<const int32_t> next_ids, const float* hidden,
                          std::span<const RunMemory> runs, float* out) {
  const auto& c = config_;
  const auto& m = weights_.mtp;
  const int64_t T = static_cast<int64_t>(next_ids.size()), H = c.hidden_size;
  std::vector<float> cat(static_cast<size_t>(T * 2 * H)), u(static_cast<size_t>(T * H)),
      xn(static_cast<size_t>(T * H)), y(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t) {
    float* row = cat.data() + t * 2 * H;
    load_row(weights_.embed_tokens, next_ids[static_cast<size_t>(t)], row);
    rmsnorm_1p(row, 1, H, mtp_norm_embedding_.data(), c.rms_norm_eps, row);  // embedding first
    rmsnorm_1p(hidden + t * H, 1, H, mtp_norm_hidden_.data(), c.rms_norm_eps, row + H);
  }
  linear(cat.data(), T, m.fc, u.data());
  const LayerConsts& k = mtp_consts_;
  rmsnorm_1p(u.data(), T, H, k.input_norm.data(), c.rms_norm_eps, xn.data());
  full_attention(m.layer, k, n_full_, xn.data(), runs, T, y.data());  // page store n_full_: the head's KV
  for (int64_t i = 0; i < T * H; ++i) u[i] += y[i];
  rmsnorm_1p(u.data(), T, H, k.post_norm.data(), c.rms_norm_eps, xn.data());
  ffn(m.layer, k, xn.data(), T, y.data());
  for (int64_t i = 0; i < T * H; ++i) u[i] += y[i];
  rmsnorm_1p(u.data(), T, H, mtp_norm_.data(), c.rms_norm_eps, out);
}

core::Status CpuBackend::draft(std::span<const DraftRun> runs, DraftOut& out) {
  out.tokens.clear();
  out.logits.clear();
  if (!draft_) return core::Error{"cpu backend: draft() needs pools allocated for drafting"};
  const auto& c = config_;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const int64_t last_rows = static_cast<int64_t>(last_tokens_.size());
  if (static_cast<int64_t>(runs.size()) > pools_.max_step_seqs)
    return core::Error{"draft: more runs than the planned sequences per step"};
  for (const auto& r : runs) {
    if (r.n_rows < 1 || r.first_row < 0 || r.first_row + r.n_rows > last_rows)
      return core::Error{"draft: rows [" + std::to_string(r.first_row) + ", " +
                         std::to_string(r.first_row + r.n_rows) + ") are not rows of the last step"};
    if (r.next_token < 0 || r.next_token >= V || r.n_draft < 0)
      return core::Error{"draft: next token " + std::to_string(r.next_token) + " or draft count " +
                         std::to_string(r.n_draft) + " out of range"};
    const int64_t end = r.start_pos + r.n_rows + std::max(r.n_draft - 1, 0);
    if (r.start_pos < 0 || end > pools_.max_context ||
        static_cast<int64_t>(r.kv_pages.size()) * pools_.page_size < end)
      return core::Error{"draft: the block table does not cover position " + std::to_string(end - 1)};
    for (int32_t p : r.kv_pages)
      if (p < 0 || p >= pools_.kv_pages) return core::Error{"draft: KV page outside the pool"};
  }

  // Every run's rows at once: row j pairs the step's hidden state with the token after it.
  std::vector<int32_t> next;
  std::vector<float> hidden;
  std::vector<RunMemory> mem;
  for (const auto& r : runs) {
    RunMemory rm;
    rm.first_row = static_cast<int64_t>(next.size());
    rm.n_rows = r.n_rows;
    rm.start_pos = r.start_pos;
    rm.mem = slot_memory(0, r.kv_pages);  // the head reads only KV (slot 0's state is not touched)
    mem.push_back(std::move(rm));
    for (int32_t j = 0; j < r.n_rows; ++j) {
      const int64_t row = r.first_row + j;
      next.push_back(j + 1 < r.n_rows ? last_tokens_[static_cast<size_t>(row + 1)] : r.next_token);
      hidden.insert(hidden.end(), last_hidden_.begin() + row * H, last_hidden_.begin() + (row + 1) * H);
    }
  }
  std::vector<float> h(hidden.size());
  mtp_rows(next, hidden.data(), mem, h.data());

  // The rows whose logits come back, and each drafting run's last row.
  std::vector<float> xs;
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i];
    const int64_t first = mem[i].first_row, rows = r.n_rows;
    if (r.logits == RunLogits::kAll) {
      xs.insert(xs.end(), h.begin() + first * H, h.begin() + (first + rows) * H);
    } else if (r.logits == RunLogits::kLast) {
      xs.insert(xs.end(), h.begin() + (first + rows - 1) * H, h.begin() + (first + rows) * H);
    }
  }
  if (!xs.empty()) {
    out.logits.resize(xs.size() / static_cast<size_t>(H) * static_cast<size_t>(V));
    linear(xs.data(), static_cast<int64_t>(xs.size()) / H, weights_.lm_head, out.logits.data());
  }

  // The draft chains, one position a round, every run that still drafts together.
  std::vector<std::vector<int32_t>> drafted(runs.size());
  std::vector<float> state(runs.size() * static_cast<size_t>(H));  // each run's latest h'
  for (size_t i = 0; i < runs.size(); ++i)
    std::copy_n(h.begin() + (mem[i].first_row + runs[i].n_rows - 1) * H, H, state.begin() + i * H);
  int32_t rounds = 0;
  for (const auto& r : runs) rounds = std::max(rounds, r.n_draft);
  std::vector<float> logits, x;
  for (int32_t k = 0; k < rounds; ++k) {
    // Round k: the logits of each run's latest h' give its (k+1)-th draft.
    std::vector<size_t> live;
    x.clear();
    for (size_t i = 0; i < runs.size(); ++i)
      if (runs[i].n_draft > k) {
        live.push_back(i);
        x.insert(x.end(), state.begin() + i * H, state.begin() + (i + 1) * H);
      }
    logits.resize(live.size() * static_cast<size_t>(V));
    linear(x.data(), static_cast<int64_t>(live.size()), weights_.lm_head, logits.data());
    for (size_t j = 0; j < live.size(); ++j)
      drafted[live[j]].push_back(
          argmax(std::span<const float>(logits.data() + j * static_cast<size_t>(V), static_cast<size_t>(V))));
    if (k + 1 == rounds) break;
    // The next h' for runs that draft again: the token just drafted, one position on.
    std::vector<int32_t> ids;
    std::vector<float> hid;
    std::vector<RunMemory> step_mem;
    std::vector<size_t> again;
    for (size_t i : live) {
      if (runs[i].n_draft <= k + 1) continue;
      again.push_back(i);
      RunMemory rm;
      rm.first_row = static_cast<int64_t>(ids.size());
      rm.n_rows = 1;
      rm.start_pos = runs[i].start_pos + runs[i].n_rows + k;
      rm.mem = mem[i].mem;
      step_mem.push_back(std::move(rm));
      ids.push_back(drafted[i].back());
      hid.insert(hid.end(), state.begin() + i * H, state.begin() + (i + 1) * H);
    }
    if (again.empty()) break;
    std::vector<float> hn(hid.size());
    mtp_rows(ids, hid.data(), step_mem, hn.data());
    for (size_t j = 0; j < again.size(); ++j)
      std::copy_n(hn.begin() + j * H, H, state.begin() + again[j] * H);
  }
  for (const auto& d : drafted) out.tokens.insert(out.tokens.end(), d.begin(), d.end());
  return core::Status();
}

std::span<const float> CpuBackend::slot_floats(int32_t slot) const {
  if (slot < 0 || slot >= pools_.state_slots) return {};
  const size_t per_slot = slot_bytes() / 4;
  return {states_.get() + per_slot * static_cast<size_t>(slot), per_slot};
}

}  // namespace deltaflow::backend::cpu
