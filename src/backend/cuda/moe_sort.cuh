// The MoE prefill's (token, choice) slots sorted by expert on the device, with the grouped GEMM's tile list
// (moe_grouped.cuh): no copy of the routing to the host and no host sync per layer.
//
//   count  a histogram of the T*K expert ids (shared-memory bins per block, then one atomic per bin)
//   plan   one block: the exclusive scan of the counts (segment offsets) and of their 64-row tile counts, and
//          every expert's tiles written in expert order: the same list grouped_tiles() builds on the host
//   place  each slot takes the next position of its expert's segment (an atomic per slot)
//
// Within a segment the order of the slots is whatever the atomics give; nothing computed depends on it (each
// row of a grouped GEMM is its own sum, the down projection writes each slot's row back through sort_slot,
// and the combine adds a token's slots in k order). Ids outside [0, E) are clamped into it (moe_route cannot
// produce them; this keeps a bad id from writing out of bounds).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/moe_grouped.cuh"

namespace deltaflow::backend::cuda {

// Scratch ints moe_sort_by_expert needs for E experts: the counts, then each segment's next position.
inline constexpr int64_t moe_sort_scratch_ints(int64_t E) {
  return 2 * E;
}

// ids: [nk] expert of slot s (token s / K). Writes sort_slot[p] and sort_tok[p] = sort_slot[p] / K for the
// nk positions (segments in expert order), tiles[0, n) and *n_tiles = n (device; max_tiles >= nk / 64 + E
// suffices). scratch: moe_sort_scratch_ints(E) ints. E <= kMaxExperts (moe.cuh), nk < 2^31.
cudaError_t moe_sort_by_expert(const int* ids, int64_t nk, int K, int E, int* scratch, int* sort_slot,
                               int* sort_tok, GroupedTile* tiles, int max_tiles, int* n_tiles,
                               cudaStream_t stream);

}  // namespace deltaflow::backend::cuda
