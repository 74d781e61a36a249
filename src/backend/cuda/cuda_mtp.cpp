// The MTP head on the CUDA backend (qwen35-architecture.md §4): speculative decoding's drafts, the
// computation of backend/cpu/mtp_head.cpp on the GPU.
//
// Each step of pools allocated for drafting keeps its rows' final hidden states by the engine's step row
// (keep_hidden, from every path: per-run prefill, batched decode and its graphs, fused steps). draft() runs
// the head over every run's kept rows, each paired with the token after it, which writes the MTP layer's KV
// for their positions (store n_full of each page, read through a block-table row of the draft's own per
// run); then it drafts greedily round by round. The drafting runs are sorted by draft count, so those still
// drafting in round k are the first ones: every round stays on the GPU (its argmax is the next round's
// input ids, its output rows the next round's hidden rows) and the drafts come back in one copy at the end.
#include <algorithm>
#include <string>

#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_check.hpp"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/norm.cuh"

namespace deltaflow::backend::cuda {

namespace {

size_t round_up_256(size_t n) {
  return (n + 255) / 256 * 256;
}

}  // namespace

bool CudaBackend::can_draft() const {
  return mtp_.present && can_page();
}

size_t CudaBackend::draft_page_bytes() const {
  if (!mtp_.present) return 0;
  const auto& c = config_;
  // One more full-attention layer's keys and values (and their fp8 scales) per page.
  const size_t per_row = static_cast<size_t>(c.head_dim) * kv_elem_bytes() + (plan_.kv_fp8 ? 4 : 0);
  return static_cast<size_t>(2 * c.num_key_value_heads * kPageSize) * per_row;
}

void CudaBackend::free_draft_buffers() {
  if (draft_mem_) cudaFree(draft_mem_);
  if (draft_host_) cudaFreeHost(draft_host_);
  draft_mem_ = nullptr;
  draft_host_ = nullptr;
  kept_ = fc_in_ = last_h_ = nullptr;
  round_dev_ = index_dev_ = nullptr;
  draft_ = false;
  plan_.draft = 0;
  kept_rows_ = index_room_ = 0;
  draft_seqs_ = 0;
  keep_at_.clear();
}

core::Status CudaBackend::allocate_draft_buffers(int64_t step_rows, int32_t step_seqs) {
  const int64_t H = config_.hidden_size;
  if (step_seqs > max_rows_)
    return core::Error{"cuda backend: drafting for " + std::to_string(step_seqs) +
                       " sequences a step needs a workspace of as many rows (it holds " +
                       std::to_string(max_rows_) + ")"};
  kept_rows_ = step_rows;
  draft_seqs_ = step_seqs;
  // Pass rows, then a pass's lists: lm_head rows (kLogitRows at a time), or last rows and their ranks.
  index_room_ = std::max(step_rows, max_rows_) + 2 * std::max<int64_t>(step_seqs, kLogitRows);
  const size_t rounds = static_cast<size_t>(3 * kMaxDraftTokens) * static_cast<size_t>(step_seqs);
  const size_t sizes[] = {static_cast<size_t>(step_rows * H) * 4, static_cast<size_t>(max_rows_ * 2 * H) * 4,
                          static_cast<size_t>(step_seqs * H) * 4, rounds * 4,
                          static_cast<size_t>(index_room_) * 4};
  size_t total = 0;
  for (size_t b : sizes) total += round_up_256(b);
  plan_.draft = total;
  DF_TRY(device_alloc(&draft_mem_, total, "the speculative decoding buffers",
                      "lower --max-num-batched-tokens, or run without --speculative-tokens"));
  uint8_t* p = static_cast<uint8_t*>(draft_mem_);
  float** floats[] = {&kept_, &fc_in_, &last_h_};
  for (size_t i = 0; i < 3; ++i) {
    *floats[i] = reinterpret_cast<float*>(p);
    p += round_up_256(sizes[i]);
  }
  round_dev_ = reinterpret_cast<int*>(p);
  index_dev_ = reinterpret_cast<int*>(p + round_up_256(sizes[3]));
  DF_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&draft_host_),
                            (rounds + static_cast<size_t>(index_room_)) * 4, cudaHostAllocDefault));
  draft_ = true;
  return core::Status();
}

void CudaBackend::keep_rows(std::span<const int32_t> step_rows) {
  keep_at_.assign(step_rows.begin(), step_rows.end());
}

int* CudaBackend::draft_index_host() const {
  return draft_host_ + 3 * kMaxDraftTokens * static_cast<int64_t>(draft_seqs_);
}

core::Status CudaBackend::keep_hidden(std::span<const int32_t> step_rows) {
  if (!draft_ || step_rows.empty()) return core::Status();
  const int64_t n = static_cast<int64_t>(step_rows.size()), H = config_.hidden_size;
  if (n > index_room_) return core::Error{"cuda backend: internal: more rows than the kept-row index holds"};
  int* host = draft_index_host();
  for (int64_t i = 0; i < n; ++i) {
    const int32_t r = step_rows[static_cast<size_t>(i)];
    if (r < 0 || r >= kept_rows_)
      return core::Error{"step: row " + std::to_string(r) + " is outside the step's " +
                         std::to_string(kept_rows_) + " rows"};
    host[i] = r;
  }
  // The callers synchronize before the next pass reuses the pinned index (every entry point does).
  DF_CUDA_TRY(cudaMemcpyAsync(index_dev_, host, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice, stream_));
  DF_CUDA_TRY(scatter_rows(ws_.xn, H, index_dev_, n, H, kept_, H, stream_));
  return core::Status();
}

core::Status CudaBackend::mtp_pass(int64_t n, std::span<const RowSegment> segs) {
  const int64_t H = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const size_t row = static_cast<size_t>(H) * 4;
  x16_holds_ = {};
  xq_holds_ = {};
  // fc's input: [RMSNorm1p(embed(next); pre_fc_norm_embedding) | RMSNorm1p(hidden; pre_fc_norm_hidden)].
  prof_.mark("mtp fc", stream_);
  DF_CUDA_TRY(add_rmsnorm1p(ws_.y, nullptr, n, H, mtp_.norm_hidden, eps, ws_.xn, stream_));
  DF_CUDA_TRY(cudaMemcpy2DAsync(fc_in_ + H, 2 * row, ws_.xn, row, row, static_cast<size_t>(n),
                                cudaMemcpyDeviceToDevice, stream_));
  DF_TRY(embed(n));
  DF_CUDA_TRY(add_rmsnorm1p(ws_.h, nullptr, n, H, mtp_.norm_embedding, eps, ws_.xn, stream_));
  DF_CUDA_TRY(cudaMemcpy2DAsync(fc_in_, 2 * row, ws_.xn, row, row, static_cast<size_t>(n),
                                cudaMemcpyDeviceToDevice, stream_));
  DF_TRY(linear(fc_in_, 2 * H, n, mtp_.fc, ws_.h, H));
  DF_TRY(run_layer(mtp_.layer, n, segs, nullptr));
  prof_.mark("mtp norm", stream_);
  return add_norm(ws_.y, n, mtp_.norm, nullptr);
}

core::Status CudaBackend::draft_after(std::span<const DraftRun> runs, std::span<const int32_t> step_tokens,
                                      DraftOut& out) {
  out.tokens.clear();
  out.logits.clear();
  if (!draft_) return core::Error{"cuda backend: draft() needs pools allocated for drafting"};
  const int64_t H = config_.hidden_size, V = config_.vocab_size, R = max_rows_;
  const int64_t S = draft_seqs_;
  const int64_t rows_in = static_cast<int64_t>(step_tokens.size());
  if (static_cast<int64_t>(runs.size()) > S)
    return core::Error{"draft: more runs than the planned sequences per step"};
  DF_TRY(check_ids(step_tokens));
  int64_t N = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const DraftRun& r = runs[i];
    if (r.n_rows < 1 || r.first_row < 0 || r.first_row + r.n_rows > std::min(rows_in, kept_rows_))
      return core::Error{"draft: rows [" + std::to_string(r.first_row) + ", " +
                         std::to_string(r.first_row + r.n_rows) + ") are not rows of the last step"};
    if (r.next_token < 0 || r.next_token >= V || r.n_draft < 0 || r.n_draft > kMaxDraftTokens)
      return core::Error{"draft: next token " + std::to_string(r.next_token) + " or draft count " +
                         std::to_string(r.n_draft) + " out of range"};
    const int64_t end = r.start_pos + r.n_rows + std::max(r.n_draft - 1, 0);
    if (r.start_pos < 0 || end > plan_.max_context ||
        static_cast<int64_t>(r.kv_pages.size()) * kPageSize < end)
      return core::Error{"draft: the block table does not cover position " + std::to_string(end - 1)};
    DF_TRY(set_table_row(draft_table0_ + static_cast<int64_t>(i), r.kv_pages,
                         (end + kPageSize - 1) / kPageSize));
    N += r.n_rows;
  }
  if (runs.empty()) return core::Status();

  // The drafting runs, most drafts first (stable): round k's runs are order[0, live(k)).
  std::vector<int32_t> order;
  for (size_t i = 0; i < runs.size(); ++i)
    if (runs[i].n_draft > 0) order.push_back(static_cast<int32_t>(i));
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return runs[a].n_draft > runs[b].n_draft; });
  std::vector<int32_t> rank(runs.size(), -1);
  for (size_t j = 0; j < order.size(); ++j) rank[static_cast<size_t>(order[j])] = static_cast<int32_t>(j);
  const int64_t D = static_cast<int64_t>(order.size());
  const int32_t rounds = D > 0 ? runs[static_cast<size_t>(order[0])].n_draft : 0;
  // Rounds 1.. read their positions and table rows from round_dev_ (staged now, in one copy); their ids are
  // the previous round's drafts. Layout [pos | table | ids], each [kMaxDraftTokens][S].
  int* rpos = draft_host_;
  int* rtab = draft_host_ + kMaxDraftTokens * S;
  int* rids = draft_host_ + 2 * kMaxDraftTokens * S;
  for (int32_t k = 1; k < rounds; ++k)
    for (int64_t j = 0; j < D; ++j) {
      const DraftRun& r = runs[static_cast<size_t>(order[static_cast<size_t>(j)])];
      rpos[k * S + j] = static_cast<int>(r.start_pos + r.n_rows + k - 1);
      rtab[k * S + j] = static_cast<int>(draft_table0_ + order[static_cast<size_t>(j)]);
    }
  if (rounds > 1)
    DF_CUDA_TRY(cudaMemcpyAsync(round_dev_, draft_host_, static_cast<size_t>(2 * kMaxDraftTokens * S) * 4,
                                cudaMemcpyHostToDevice, stream_));

  // Round 0: every run's rows, in passes of up to R rows. Flat row t of run i, j: the hidden state of step
  // row first_row + j with the token after it, at position start_pos + j.
  std::vector<int64_t> run_at(runs.size());  // a run's first flat row
  {
    int64_t t = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
      run_at[i] = t;
      t += runs[i].n_rows;
    }
  }
  size_t logits_rows = 0;
  for (const DraftRun& r : runs)
    logits_rows += r.logits == RunLogits::kAll ? static_cast<size_t>(r.n_rows) : r.logits == RunLogits::kLast;
  out.logits.resize(logits_rows * static_cast<size_t>(V));
  size_t logits_at = 0;
  int* index = draft_index_host();
  std::vector<RowSegment> segs;
  for (int64_t p0 = 0; p0 < N; p0 += R) {
    const int64_t n = std::min(R, N - p0);
    segs.clear();
    std::vector<int> last_src, last_dst, logit_src;
    for (size_t i = 0; i < runs.size(); ++i) {
      const DraftRun& r = runs[i];
      const int64_t a = std::max(run_at[i], p0), b = std::min(run_at[i] + r.n_rows, p0 + n);
      if (a >= b) continue;
      const int table = static_cast<int>(draft_table0_ + static_cast<int64_t>(i));
      for (int64_t t = a; t < b; ++t) {
        const int64_t j = t - run_at[i], row = t - p0;
        pinned_[row] =
            j + 1 < r.n_rows ? step_tokens[static_cast<size_t>(r.first_row + j + 1)] : r.next_token;
        pinned_[R + row] = static_cast<int>(r.start_pos + j);
        pinned_[2 * R + row] = table;
        index[row] = static_cast<int>(r.first_row + j);
        if (r.logits == RunLogits::kAll || (r.logits == RunLogits::kLast && j + 1 == r.n_rows))
          logit_src.push_back(static_cast<int>(row));
      }
      if (rank[i] >= 0 && run_at[i] + r.n_rows == b) {
        last_src.push_back(static_cast<int>(b - 1 - p0));
        last_dst.push_back(rank[i]);
      }
      // A run of one row after its prompt reads its KV as a decode row (the decode rows of a pass together,
      // as many as the split-attention partials hold); longer ones as a prefill segment of its table row.
      const bool decode = r.n_rows == 1 && r.start_pos > 0;
      if (decode && !segs.empty() && segs.back().decode && segs.back().row0 + segs.back().rows == a - p0 &&
          segs.back().rows < decode_ws_rows_) {
        ++segs.back().rows;
      } else {
        segs.push_back({a - p0, b - a, decode, table, -1});
      }
    }
    const size_t b4 = static_cast<size_t>(n) * 4;
    DF_TRY(upload_rows(n, false));
    DF_CUDA_TRY(cudaMemcpyAsync(index_dev_, index, b4, cudaMemcpyHostToDevice, stream_));
    DF_CUDA_TRY(gather_rows(kept_, H, index_dev_, n, H, ws_.y, H, stream_));
    DF_TRY(mtp_pass(n, segs));
    // The head's logits asked for (evaluation), then each drafting run's last h' into last_h_ by rank.
    int* lists = index + n;
    int* d_lists = index_dev_ + n;
    for (size_t k0 = 0; k0 < logit_src.size(); k0 += static_cast<size_t>(kLogitRows)) {
      const int64_t m = std::min<int64_t>(kLogitRows, static_cast<int64_t>(logit_src.size() - k0));
      std::copy_n(logit_src.begin() + static_cast<std::ptrdiff_t>(k0), m, lists);
      DF_CUDA_TRY(
          cudaMemcpyAsync(d_lists, lists, static_cast<size_t>(m) * 4, cudaMemcpyHostToDevice, stream_));
      DF_CUDA_TRY(gather_rows(ws_.xn, H, d_lists, m, H, ws_.y, H, stream_));
      prof_.mark("lm_head", stream_);
      DF_TRY(linear(ws_.y, H, m, lm_head_, ws_.logits, V));
      DF_CUDA_TRY(cudaMemcpyAsync(out.logits.data() + logits_at * static_cast<size_t>(V), ws_.logits,
                                  static_cast<size_t>(m * V) * 4, cudaMemcpyDeviceToHost, stream_));
      logits_at += static_cast<size_t>(m);
      DF_CUDA_TRY(cudaStreamSynchronize(stream_));  // lists and d_lists are reused
    }
    if (!last_src.empty()) {
      const int64_t m = static_cast<int64_t>(last_src.size());
      std::copy(last_src.begin(), last_src.end(), lists);
      std::copy(last_dst.begin(), last_dst.end(), lists + m);
      DF_CUDA_TRY(
          cudaMemcpyAsync(d_lists, lists, static_cast<size_t>(2 * m) * 4, cudaMemcpyHostToDevice, stream_));
      DF_CUDA_TRY(gather_rows(ws_.xn, H, d_lists, m, H, ws_.y, H, stream_));
      DF_CUDA_TRY(scatter_rows(ws_.y, H, d_lists + m, m, H, last_h_, H, stream_));
    }
    if (p0 + n < N) DF_CUDA_TRY(cudaStreamSynchronize(stream_));  // the staging is reused by the next pass
  }

  // The draft rounds: round k's logits from its runs' latest h' (rows [0, live) of ws_.xn) give their
  // (k+1)-th drafts; the head then runs those tokens one position on for the next round.
  int* dids = round_dev_ + 2 * kMaxDraftTokens * S;
  if (D > 0)
    DF_CUDA_TRY(
        cudaMemcpyAsync(ws_.xn, last_h_, static_cast<size_t>(D * H) * 4, cudaMemcpyDeviceToDevice, stream_));
  for (int32_t k = 0; k < rounds; ++k) {
    int64_t live = 0;
    while (live < D && runs[static_cast<size_t>(order[static_cast<size_t>(live)])].n_draft > k) ++live;
    if (k > 0) {
      const size_t b4 = static_cast<size_t>(live) * 4;
      DF_CUDA_TRY(cudaMemcpyAsync(ws_.ids, dids + (k - 1) * S, b4, cudaMemcpyDeviceToDevice, stream_));
      DF_CUDA_TRY(cudaMemcpyAsync(ws_.pos, round_dev_ + k * S, b4, cudaMemcpyDeviceToDevice, stream_));
      DF_CUDA_TRY(cudaMemcpyAsync(ws_.slot, round_dev_ + (kMaxDraftTokens + k) * S, b4,
                                  cudaMemcpyDeviceToDevice, stream_));
      DF_CUDA_TRY(cudaMemcpyAsync(ws_.y, ws_.xn, static_cast<size_t>(live * H) * 4, cudaMemcpyDeviceToDevice,
                                  stream_));
      segs.clear();
      for (int64_t r0 = 0; r0 < live; r0 += decode_ws_rows_)
        segs.push_back({r0, std::min<int64_t>(decode_ws_rows_, live - r0), true, -1, -1});
      DF_TRY(mtp_pass(live, segs));
    }
    for (int64_t r0 = 0; r0 < live; r0 += kLogitRows) {
      const int64_t m = std::min<int64_t>(kLogitRows, live - r0);
      DF_TRY(lm_head(r0, m));
      prof_.mark("argmax", stream_);
      DF_CUDA_TRY(argmax_rows(ws_.logits, m, V, dids + k * S + r0, stream_));
    }
  }
  if (rounds > 0)
    DF_CUDA_TRY(
        cudaMemcpyAsync(rids, dids, static_cast<size_t>(rounds * S) * 4, cudaMemcpyDeviceToHost, stream_));
  DF_CUDA_TRY(cudaStreamSynchronize(stream_));
  DF_TRY(prof_.flush(stream_));
  for (size_t i = 0; i < runs.size(); ++i)
    for (int32_t k = 0; k < runs[i].n_draft; ++k) out.tokens.push_back(rids[k * S + rank[i]]);
  return core::Status();
}

}  // namespace deltaflow::backend::cuda
