// The MoE block at decode (qwen35-architecture.md §2.5) for T <= kGemvMaxRows tokens, as three weight streams
// after the routing (moe_route): each reads its weights once with 16-byte loads, fp32 activations, fp32
// accumulation, and each launch fills the GPU at batch 1.
//
//   moe_router_logits     [router | shared_expert_gate] @ x          (one matrix, E + 1 rows)
//   moe_route             softmax, top-k, renormalise                 (moe.cuh)
//   moe_gate_up_swiglu    silu(gate(x)) * up(x) for the K chosen experts of every token and the shared expert
//   moe_down_combine      y = sum_k w_k down_k(act_k) + sigmoid(gate_logit) down_shared(act_shared)
//
// Inputs whose rows or strides are not 16-byte aligned take a slower element-wise load path (same kernels).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.hpp"

namespace deltaflow::backend::cuda {

// out0[t, n] = x[t] . W[n] for n < n_split;  out1[t, n - n_split] = x[t] . W[n] for n_split <= n < N.
// W: [N, K] row-major (BF16, F16 or F32); x: [T, ldx] fp32, in tiles of kGemvMaxRows rows (one launch; a
// decode step is one tile). The K dimension is split over the threads of a block and reduced in shared memory
// in a fixed order (deterministic, and the same for a row whatever its tile), so a few hundred rows (the
// router) still give every SM work. out1 may be null when n_split == N.
cudaError_t moe_router_logits(const void* W, core::DType dtype, int64_t N, int64_t n_split, int64_t K,
                              const float* x, int64_t ldx, int T, float* out0, int64_t ld0, float* out1,
                              int64_t ld1, cudaStream_t stream);

// One SwiGLU expert matrix set: [2I, H] rows [gate | up] per expert, expert e at W + e * stride elements.
struct MoeGateUpWeights {
  const void* W = nullptr;
  core::DType dtype = core::DType::kBF16;
  int64_t I = 0, stride = 0;
};

// act[p, j] = silu(x[p / K] . W_e[j]) * (x[p / K] . W_e[I + j]) with e = ids[p], for the T*K slots p
// (routed: act [T*K, ld_act]); and act_shared[t, j] likewise with the shared expert's matrix for each token t
// (when shared.W is set). x: [T, ldx] with H columns. One launch when both have one dtype.
cudaError_t moe_gate_up_swiglu(const MoeGateUpWeights& routed, const int* ids, int K,
                               const MoeGateUpWeights& shared, int64_t H, const float* x, int64_t ldx, int T,
                               float* act, int64_t ld_act, float* act_shared, int64_t ld_act_shared,
                               cudaStream_t stream);

// One down-projection matrix set: [H, I] per expert, expert e at W + e * stride elements.
struct MoeDownWeights {
  const void* W = nullptr;
  core::DType dtype = core::DType::kBF16;
  int64_t I = 0, stride = 0;
};

// y[t, n] = sum_{k<K} w[t, k] * (W_{ids[t, k]}[n] . act[t*K + k])  +  sigmoid(gate_logit[t]) *
// (W_shared[n] . act_shared[t]), summed in that order (deterministic, no atomics); the shared term only when
// shared.W is set. act: [T*K, ld_act]; act_shared: [T, ld_act_shared]; y: [T, ldy] with H columns.
cudaError_t moe_down_combine(const MoeDownWeights& routed, const int* ids, const float* w, int K,
                             const MoeDownWeights& shared, const float* gate_logit, int64_t H,
                             const float* act, int64_t ld_act, const float* act_shared, int64_t ld_act_shared,
                             int T, float* y, int64_t ldy, cudaStream_t stream);

}  // namespace deltaflow::backend::cuda
