// Gated full attention (qwen35-architecture.md §2.4, §3): the per-head q/k (1+w) RMSNorm with partial NeoX
// RoPE and the KV-cache write; then causal GQA attention over the cache, split over keys (decode) or tiled
// over queries (prefill), with the sigmoid output gate applied when the splits are combined.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace deltaflow::backend::cuda {

// The KV cache of one layer, fp32 or bf16, in one of two layouts:
// - contiguous (block_table null): [slots, nkv, max_ctx, head_dim]; slot s starts at s * slot_stride.
// - paged: pages of 2^page_shift positions, page p at p * slot_stride elements holding [nkv, page, head_dim]
//   of this layer; position i of table row s lives in page block_table[s * table_stride + (i >> page_shift)].
//   The row is the token's slot (tok_slot). Pages hold at least 16 positions (a decode key tile).
// kv_offset (kv_cache.cuh) computes the element offset of (row, kv head, position) in either.
// Elements are fp32 (f32), bf16, or fp8 (E4M3 codes, one byte each): then k_scale / v_scale hold one fp32
// scale per (position, kv head) row at kv_offset / head_dim, and an element reads back as code * scale
// (backend/kv_quant.hpp: scale = amax of the row / 448).
struct KvCache {
  void* k = nullptr;
  void* v = nullptr;
  bool f32 = false;
  int64_t slot_stride = 0;  // elements: between slots (contiguous) or pages (paged)
  int64_t max_ctx = 0;      // contiguous: positions per slot
  const int* block_table = nullptr;
  int64_t table_stride = 0;  // ints per table row
  int page_shift = 0;
  bool fp8 = false;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
};

struct QkvArgs {
  // The q/k/v projection output, [tokens, ld]: nh heads of [q (hd) | gate (hd)] (gate only when gated), then
  // k (nkv*hd), then v (nkv*hd).
  const float* qkv = nullptr;
  int64_t ld = 0;
  int n_tokens = 0, nh = 0, nkv = 0, hd = 0, rot = 0;
  bool gated = true;
  const float* q_norm = nullptr;  // [hd]
  const float* k_norm = nullptr;  // [hd]
  float eps = 1e-6f;
  const float* inv_freq = nullptr;  // [rot / 2]
  const int* tok_pos = nullptr;     // [tokens]
  const int* tok_slot = nullptr;    // [tokens]
  float* q_out = nullptr;           // [tokens, nh, hd]
  KvCache cache;
};

// q = rope(rmsnorm1p(q; q_norm)) -> q_out; k = rope(rmsnorm1p(k; k_norm)) and v -> the cache at (slot,
// position). hd <= 1024.
cudaError_t qk_norm_rope_store(const QkvArgs& args, cudaStream_t stream);

// Keys per split in decode: each block covers at least this many cache positions of one (sequence, kv head),
// and at most kAttnMaxSplits blocks share a sequence's keys. Up to 64 x 128 = 8192 positions the splits are
// 64 keys; beyond, a token's splits grow with its own position (attention_split_keys), so the partials'
// workspace stays [rows, nh, kAttnMaxSplits, hd] at any context and a row's numbers do not depend on the
// others in its batch.
inline constexpr int kAttnSplitKeys = 64;
inline constexpr int kAttnMaxSplits = 128;

struct AttnArgs {
  const float* q = nullptr;  // [tokens, nh, hd], normed and rotated
  KvCache cache;
  int n_tokens = 0, nh = 0, nkv = 0, hd = 0;
  const int* tok_pos = nullptr;   // [tokens]: token t sees cache positions 0..tok_pos[t]
  const int* tok_slot = nullptr;  // [tokens]
  // prefill: the tokens are one sequence at consecutive positions (blocks take tiles of queries, no split);
  // decode: one token per sequence, keys split over max_splits blocks (attention_split_keys each).
  bool prefill = false;
  int max_splits = 1;  // the partials' stride: at most this many splits per token
  // Splits this decode launch divides each token's keys into (1..max_splits; 0: attention() chooses,
  // attention_decode_splits, for the tensor-core kernel, and max_splits for the fp32 one).
  int splits = 0;
  float scale = 1.0f;
  float* part_acc = nullptr;  // workspace [tokens, nh, max_splits, hd]
  float* part_ml = nullptr;   // workspace [tokens, nh, max_splits, 2]
  // Output gate: out *= sigmoid(gate[t * gate_ld + h * gate_head_stride + d]) when gate is set.
  const float* gate = nullptr;
  int64_t gate_ld = 0, gate_head_stride = 0;
  float* out = nullptr;  // [tokens, nh * hd]
  // fp8 cache, prefill: scratch of attention_dequant_elems(positions the prefill reads, nkv, hd) bf16.
  void* dequant = nullptr;
  int64_t dequant_elems = 0;
};

// softmax(q k^T * scale, causal) v, GQA (q head h reads kv head h / (nh / nkv)), then the gate.
// hd in {32, 64, 128, 256}. An fp8 cache: decode runs where attention_decode_tc_supports; prefill reads the
// sequence's keys dequantized to bf16 in args.dequant (attention_dequant_elems of them, k then v).
cudaError_t attention(const AttnArgs& args, cudaStream_t stream);

// bf16 elements of AttnArgs.dequant a prefill over an fp8 cache needs for keys 0..max_ctx-1: k and v.
inline int64_t attention_dequant_elems(int64_t max_ctx, int nkv, int hd) {
  return 2 * max_ctx * nkv * hd;
}

// Rows up to which a decode launch splits every token's keys by its own position alone (max_splits splits),
// so such a row gets the same bits whatever batch it is in, as the SIMT GEMV's rows do (gemv.cuh).
inline constexpr int kAttnInvariantRows = 4;

// Splits a tensor-core decode launch of n_tokens rows uses when AttnArgs::splits is 0: max_splits up to
// kAttnInvariantRows rows; above, about 16 blocks per SM (five or six waves of the three that fit, so the
// last wave's idle share stays small) and no more, so each block streams a long run of keys and the partials
// the combine reads shrink as the batch grows (64 rows of the 27B at 8K: 9 splits of 912 keys instead of
// 128 of 64).
int attention_decode_splits(int n_tokens, int nkv, int max_splits);

// The splits of a launch: AttnArgs::splits, or max_splits where it is 0.
__host__ __device__ inline int launch_splits(const AttnArgs& a) {
  return a.splits > 0 ? a.splits : a.max_splits;
}

// Splits a decode launch needs for a cache of max_ctx positions.
inline int attention_max_splits(int64_t max_ctx) {
  const int64_t n = (max_ctx + kAttnSplitKeys - 1) / kAttnSplitKeys;
  return static_cast<int>(n < kAttnMaxSplits ? n : kAttnMaxSplits);
}

// Keys per split of a decode token at position pos (it sees pos + 1 keys) over max_splits splits: at least
// kAttnSplitKeys, a multiple of 16 (a key tile), and few enough splits to fit max_splits.
__host__ __device__ inline int attention_split_keys(int pos, int max_splits) {
  const int per = (pos + max_splits) / max_splits;  // ceil((pos + 1) / max_splits)
  const int tiles = (per + 15) / 16 * 16;
  return tiles > kAttnSplitKeys ? tiles : kAttnSplitKeys;
}

}  // namespace deltaflow::backend::cuda
