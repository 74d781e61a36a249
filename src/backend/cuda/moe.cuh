// The MoE block's routing and combination (qwen35-architecture.md §2.5); the expert matmuls are gemv_grouped
// (decode) or per-expert linears over tokens sorted by expert (prefill).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace deltaflow::backend::cuda {

inline constexpr int kMaxExperts = 1024;
inline constexpr int kMaxTopK = 32;

// Per token t:  p = softmax(logits[t, :E]) in fp32;  (w, ids) = topk(p, K) with ties to the lower expert;
// w /= sum(w) when renorm. ids, weights: [T, K], largest first.
cudaError_t moe_route(const float* logits, int64_t ld, int64_t T, int E, int K, bool renorm, int* ids,
                      float* weights, cudaStream_t stream);

// out[t, :] = sum_k w[t, k] * y[t*K + k, :]  +  sigmoid(gate_logit[t]) * shared[t, :]   (shared part when
// given) y: [T*K, H]; shared, out: [T, H]; gate_logit: [T].
cudaError_t moe_combine(const float* y, const float* w, int64_t T, int K, int64_t H, const float* shared,
                        const float* gate_logit, float* out, cudaStream_t stream);

}  // namespace deltaflow::backend::cuda
