// The engine's pools on the CUDA backend (sequence_backend.hpp's paged calls): state slots and KV pages
// allocated once, each slot's block table mirrored in pinned memory and uploaded where a bind changes it.
#include <algorithm>
#include <string>

#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_check.hpp"

namespace deltaflow::backend::cuda {

using model::LayerType;

size_t CudaBackend::kv_elem_bytes() const {
  return plan_.kv_f32 ? 4 : plan_.kv_fp8 ? 1 : 2;
}

size_t CudaBackend::kv_code_bytes() const {
  return static_cast<size_t>(plan_.kv_pages > 0 ? plan_.kv_pages : plan_.slots) *
         static_cast<size_t>(kv_slot_) * kv_elem_bytes();
}

size_t CudaBackend::kv_page_bytes() const {
  const auto& c = config_;
  // Keys and values of every full-attention layer; fp8 adds a 4-byte scale per (position, kv head).
  const size_t per_row = static_cast<size_t>(c.head_dim) * kv_elem_bytes() + (plan_.kv_fp8 ? 4 : 0);
  return static_cast<size_t>(2 * c.count_layers(LayerType::kFullAttention) * c.num_key_value_heads *
                             kPageSize) *
         per_row;
}

size_t CudaBackend::state_slot_bytes() const {
  return static_cast<size_t>(conv_slot_ + gdn_slot_) * 4;
}

core::Status CudaBackend::allocate_pools(const PoolRequest& r, Pools& pools) {
  if (!can_page()) return core::Error{"cuda backend: no paged KV with tensor parallelism"};
  if (r.state_slots < 1 || r.kv_pages < 1) return core::Error{"cuda backend: the pools must not be empty"};
  if (r.draft && !can_draft())
    return core::Error{"cuda backend: speculative decoding needs the checkpoint's MTP head (mtp.*) loaded"};
  if (r.draft && (r.max_step_rows < 1 || r.max_step_seqs < 1))
    return core::Error{"cuda backend: drafting needs the rows and sequences of a step"};
  bound_.clear();
  slot_used_.clear();
  free_draft_buffers();
  // One more slot and page than asked: the scratch ones a graph bucket's padding rows use. Drafting: a
  // block-table row per sequence of a step, for the MTP layer's attention.
  DF_TRY(allocate_states(r.state_slots + 1, r.kv_pages + 1, r.draft ? r.max_step_seqs : 0));
  if (r.draft) DF_TRY(allocate_draft_buffers(r.max_step_rows, r.max_step_seqs));
  for (int32_t i = 0; i < r.state_slots; ++i) {
    auto s = std::make_unique<CudaSequenceState>();
    s->slot = i;
    s->owner = this;
    bound_.push_back(std::move(s));
  }
  DF_TRY(capture_graphs());
  pools.page_size = kPageSize;
  pools.kv_pages = r.kv_pages;
  pools.state_slots = r.state_slots;
  pools.max_step_rows = r.max_step_rows;
  pools.max_step_seqs = r.max_step_seqs;
  pools.max_context = std::min<int64_t>(plan_.max_context, r.kv_pages * kPageSize);
  pools.paged = true;
  pools.page_bytes = kv_page_bytes() + (r.draft ? draft_page_bytes() : 0);
  pools.slot_bytes = state_slot_bytes();
  return core::Status();
}

core::Expected<SequenceState*> CudaBackend::bind(int32_t slot, int64_t start_pos, int64_t end_pos,
                                                 std::span<const int32_t> pages) {
  if (slot < 0 || static_cast<size_t>(slot) >= bound_.size())
    return core::Error{"step: state slot " + std::to_string(slot) + " is outside the pool"};
  if (start_pos < 0 || end_pos < start_pos || end_pos > plan_.max_context)
    return core::Error{"step: positions [" + std::to_string(start_pos) + ", " + std::to_string(end_pos) +
                       ") are outside the cache of " + std::to_string(plan_.max_context)};
  const int64_t need = (end_pos + kPageSize - 1) / kPageSize;
  if (static_cast<int64_t>(pages.size()) < need)
    return core::Error{"step: slot " + std::to_string(slot) + " has " + std::to_string(pages.size()) +
                       " KV pages for " + std::to_string(end_pos) + " positions"};
  DF_TRY(set_table_row(slot, pages, need));
  if (start_pos == 0) {
    DF_CUDA_TRY(cudaMemsetAsync(conv_states_ + static_cast<int64_t>(slot) * conv_slot_, 0,
                                static_cast<size_t>(conv_slot_) * 4, stream_));
    DF_CUDA_TRY(cudaMemsetAsync(gdn_states_ + static_cast<int64_t>(slot) * gdn_slot_, 0,
                                static_cast<size_t>(gdn_slot_) * 4, stream_));
  }
  CudaSequenceState* s = bound_[static_cast<size_t>(slot)].get();
  s->pos = start_pos;
  return s;
}

core::Status CudaBackend::set_table_row(int64_t table_row, std::span<const int32_t> pages, int64_t need) {
  // Upload the table entries that changed, as one copy of the span between the first and last of them.
  int* row = table_host_ + table_row * table_stride_;
  int64_t lo = need, hi = -1;
  for (int64_t i = 0; i < need; ++i) {
    const int32_t p = pages[static_cast<size_t>(i)];
    if (p < 0 || p >= plan_.kv_pages - 1)
      return core::Error{"step: KV page " + std::to_string(p) + " is outside the pool"};
    if (row[i] != p) {
      row[i] = p;
      lo = std::min(lo, i);
      hi = i;
    }
  }
  if (hi >= lo)
    DF_CUDA_TRY(cudaMemcpyAsync(block_table_ + table_row * table_stride_ + lo, row + lo,
                                static_cast<size_t>(hi - lo + 1) * 4, cudaMemcpyHostToDevice, stream_));
  return core::Status();
}

core::Status CudaBackend::copy_state(int32_t from, int32_t to) {
  const int32_t n = static_cast<int32_t>(bound_.size());
  if (from < 0 || to < 0 || from >= n || to >= n)
    return core::Error{"copy_state: slot " + std::to_string(from) + " -> " + std::to_string(to) +
                       " is outside the pool"};
  if (from == to) return core::Status();
  DF_CUDA_TRY(cudaMemcpyAsync(conv_states_ + static_cast<int64_t>(to) * conv_slot_,
                              conv_states_ + static_cast<int64_t>(from) * conv_slot_,
                              static_cast<size_t>(conv_slot_) * 4, cudaMemcpyDeviceToDevice, stream_));
  DF_CUDA_TRY(cudaMemcpyAsync(gdn_states_ + static_cast<int64_t>(to) * gdn_slot_,
                              gdn_states_ + static_cast<int64_t>(from) * gdn_slot_,
                              static_cast<size_t>(gdn_slot_) * 4, cudaMemcpyDeviceToDevice, stream_));
  return core::Status();
}

core::Status CudaBackend::copy_pages(std::span<const PageCopy> copies) {
  const size_t bytes = static_cast<size_t>(kv_slot_) * kv_elem_bytes();  // one page of every layer, k or v
  const size_t scale_bytes = static_cast<size_t>(kv_slot_ / config_.head_dim) * 4;  // fp8: its scales
  for (const PageCopy& c : copies) {
    if (c.from < 0 || c.to < 0 || c.from >= plan_.kv_pages - 1 || c.to >= plan_.kv_pages - 1)
      return core::Error{"copy_pages: page " + std::to_string(c.from) + " -> " + std::to_string(c.to) +
                         " is outside the pool"};
    for (void* base : {k_cache_, v_cache_}) {
      auto* b = static_cast<uint8_t*>(base);
      DF_CUDA_TRY(cudaMemcpyAsync(b + static_cast<size_t>(c.to) * bytes,
                                  b + static_cast<size_t>(c.from) * bytes, bytes, cudaMemcpyDeviceToDevice,
                                  stream_));
    }
    if (!plan_.kv_fp8) continue;
    for (float* base : {k_scale_, v_scale_}) {
      auto* b = reinterpret_cast<uint8_t*>(base);
      DF_CUDA_TRY(cudaMemcpyAsync(b + static_cast<size_t>(c.to) * scale_bytes,
                                  b + static_cast<size_t>(c.from) * scale_bytes, scale_bytes,
                                  cudaMemcpyDeviceToDevice, stream_));
    }
  }
  return core::Status();
}

}  // namespace deltaflow::backend::cuda
