// Tensor parallelism, the model's side (issue 7): which slice of every weight rank r of N holds, and host
// views of those slices. No device code: the CUDA backend lays out what shard_weights returns exactly as it
// lays out a whole model, under the rank's local config (shard_config).
//
// The split (Megatron-style, one all-reduce after each row-parallel matmul):
//   Gated DeltaNet  value heads nv/N per rank, key heads nk/N (replicated when N is a multiple of nk: every
//                   value head of a rank then reads the same key head); in_proj rows [q k v | z | b | a] and
//                   conv channels of those heads, A_log/dt_bias per value head; out_proj columns
//                   (row-parallel).
//   attention       query heads nh/N with their per-head [q | gate] rows; KV heads nkv/N (replicated when N
//   is
//                   a multiple of nkv); o_proj columns (row-parallel).
//   dense FFN       gate/up rows and down columns of intermediate/N.
//   MoE             every expert's intermediate split the same way (gate/up rows, down columns), the shared
//                   expert too; router and shared-expert gate replicated. Each rank reads 1/N of every routed
//                   expert, so the work per rank does not depend on where the router sends a token.
//   vocab           embed_tokens and lm_head rows vocab/N per rank (vocab-parallel): the embedding is a
//   masked
//                   gather plus an all-reduce, the logits an all-gather.
// Norm weights are replicated.
#pragma once

#include <cstdint>

#include "core/status.hpp"
#include "model/config.hpp"
#include "model/weights.hpp"

namespace deltaflow::model {

struct ShardSpec {
  int rank = 0;
  int world = 1;
};

// [first, first + count) of some index space (heads, rows, vocab ids).
struct Slice {
  int64_t first = 0, count = 0;
};

// What one rank holds, in heads or elements of the full model.
struct ShardLayout {
  ShardSpec spec;
  Slice vocab;         // vocab ids
  Slice q_heads;       // attention query heads
  Slice kv_heads;      // attention KV heads
  Slice lin_k_heads;   // Gated DeltaNet key heads
  Slice lin_v_heads;   // Gated DeltaNet value heads
  Slice inter;         // dense FFN intermediate
  Slice moe_inter;     // each routed expert's intermediate
  Slice shared_inter;  // the shared expert's intermediate
};

// The layout of rank spec.rank of spec.world; an error naming the size that does not divide.
core::Expected<ShardLayout> shard_layout(const TextConfig& full, ShardSpec spec);

// The config a rank runs: head counts, intermediates and vocab_size of its slices; everything else as `full`.
TextConfig shard_config(const TextConfig& full, const ShardLayout& layout);

// Views of the rank's slices of `w` (bound under `full`). Row slices point into w's storage; column slices
// and multi-block stacks are copied into the result's `owned`. `w` must outlive the result.
core::Expected<ModelWeights> shard_weights(const TextConfig& full, const ModelWeights& w,
                                           const ShardLayout& layout);

}  // namespace deltaflow::model
