// Gated DeltaNet prefill in the chunked (WY) form on tensor cores (qwen35-architecture.md §2.3): the same
// function as gated_deltanet() (gated_deltanet.cuh) over sequences of many tokens, with the work of each
// chunk of kGdnChunkLen tokens done as bf16 matrix products with fp32 accumulation. With G the in-chunk
// cumulative log decay and S0 the state at the chunk's start:
//   A_ij = beta_i exp(G_i - G_j) k_i.k_j (j < i) ; T = (I + A)^-1             (fp32 forward substitution)
//   U = T diag(beta) V ; W = T diag(beta exp(G)) K ; Delta = U - W S0
//   o_i = exp(G_i) S0^T q_i + sum_{j<=i} exp(G_i - G_j) (q_i.k_j) Delta_j
//   S = exp(G_L) S0 + sum_j exp(G_L - G_j) k_j Delta_j^T                        (S fp32 between chunks)
// Three launches: a prepare pass over all (chunk, head) pairs at once (everything that does not depend on S),
// the sequential pass over chunks (one block per value head and 32 state columns), and the gated RMSNorm.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "backend/cuda/gated_deltanet.cuh"

namespace deltaflow::backend::cuda {

inline constexpr int kGdnChunkLen = 64;

// Whether the chunked kernels take this shape: dk and dv in {64, 128}, nv a multiple of nk.
bool gdn_chunked_supported(int nk, int nv, int dk, int dv);

// Device workspace bytes for n_seqs sequences of tokens_per_seq tokens (256-byte aligned).
size_t gdn_chunked_workspace_bytes(int n_seqs, int tokens_per_seq, int nv, int dk, int dv);

// Same inputs and outputs as gated_deltanet(): reads each sequence's state from its slot and writes the final
// state back. cudaErrorInvalidValue for an unsupported shape or a workspace smaller than
// gdn_chunked_workspace_bytes().
cudaError_t gated_deltanet_chunked(const GdnArgs& args, void* workspace, size_t workspace_bytes,
                                   cudaStream_t stream);

}  // namespace deltaflow::backend::cuda
