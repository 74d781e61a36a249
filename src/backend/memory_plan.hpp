// The device memory the CUDA backend plans at load (CudaBackend::plan_memory, and allocate_pools for the
// engine's pools), computed from the config alone so that `deltaflow inspect` can print it on a machine
// without a GPU: weights, KV cache, recurrent states, activation workspace. The same formulas as the backend;
// a gpu test holds the two equal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.hpp"
#include "model/config.hpp"

namespace deltaflow::backend {

// Positions per KV page of the CUDA backend's paged cache (CudaBackend::kPageSize).
inline constexpr int32_t kCudaPageSize = 16;

struct MemoryPlanOptions {
  // The engine's pools (allocate_pools): kv_pages > 0 pages of kCudaPageSize positions and state_slots state
  // slots, each pool with one more for scratch. kv_pages == 0: the per-sequence layout of the sequence API,
  // max_sequences + 1 slots of max_context contiguous positions.
  int64_t kv_pages = 0;
  int32_t state_slots = 0;
  int max_sequences = 4;                          // as CudaOptions
  int64_t max_context = 0;                        // 0: min(max_position_embeddings, 32768)
  int64_t prefill_chunk = 4096;                   // as CudaOptions
  bool exact = false;                             // fp32 KV cache and no 16-bit activation copies
  bool kv_fp8 = false;                            // as CudaOptions: E4M3 KV + a scale per row (not exact)
  core::DType matrix_dtype = core::DType::kBF16;  // element type of the float weight matrices
  // Quantized checkpoints (the config's quant): each linear module's scheme resolves under this text-model
  // prefix, and is sized as the CUDA backend lays it out (NVFP4 / FP8 in the kernels' layout, MoE matrices
  // widened to bf16). Empty: "model.language_model." for the multimodal layout, else "model.".
  std::string module_prefix;
  // Speculative decoding (CudaOptions::mtp): the MTP head's weights; with paged pools, its layer's KV in
  // every page, and the drafting buffers for steps of draft_step_rows rows and draft_step_seqs sequences.
  bool mtp = false;
  int64_t draft_step_rows = 0;
  int32_t draft_step_seqs = 0;
};

struct MemoryPlanEstimate {
  size_t weights = 0;    // one allocation: float matrices in matrix_dtype, quantized ones in the kernels'
                         // layout, norms and small vectors in fp32
  size_t kv = 0;         // K and V of every full-attention layer, all slots, max_context positions
  size_t states = 0;     // conv + fp32 Gated DeltaNet states, all slots
  size_t workspace = 0;  // activations for one forward of max(prefill_chunk, 32) rows, and the logits
  size_t gemm_workspace = 0;  // cuBLASLt's workspace
  size_t draft = 0;           // drafting: kept hidden rows, the head's fc input, its index lists
  int slots = 0;         // state slots (or max_sequences) + 1 scratch slot (pads the decode graph buckets)
  int64_t kv_pages = 0;  // paged: KV pages + 1 scratch page; else 0
  int64_t max_context = 0;
  bool kv_f32 = false;
  bool kv_fp8 = false;
  size_t kv_bytes_per_token = 0;        // one sequence: K and V of every full-attention layer
  size_t kv_page_bytes = 0;             // kv_bytes_per_token x kCudaPageSize (the main layers')
  size_t draft_page_bytes = 0;          // drafting: the MTP layer's KV in a page
  size_t state_bytes_per_sequence = 0;  // one sequence: conv + Gated DeltaNet states of every linear layer
  size_t total() const { return weights + kv + states + workspace + gemm_workspace + draft; }
};

// Rows the CUDA decode workspace holds (split-attention partials, logits, sampled ids) for a workspace of R
// (>= 32) rows: 32 in exact mode (the GEMV's rows), else the largest power of two up to 256 within R.
inline int64_t decode_workspace_rows(bool exact, int64_t R) {
  if (exact) return 32;
  int64_t n = 32;
  while (n * 2 <= 256 && n * 2 <= R) n *= 2;
  return n;
}

MemoryPlanEstimate estimate_memory_plan(const model::TextConfig& c, const MemoryPlanOptions& opt);

}  // namespace deltaflow::backend
