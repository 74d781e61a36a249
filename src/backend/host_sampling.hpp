// Token sampling on the host: the reference for every backend's draw (the CUDA kernel, sampling.cuh, keeps
// the same meanings). Penalties (repetition over prompt and output, then frequency and presence over the
// output, in vLLM's order), then greedy, or temperature with top-k, min-p and top-p over the candidates
// sorted by logit (ties to the lower id), drawn with the Philox uniform of (seed, step) (core/philox.hpp).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.hpp"

namespace deltaflow::backend {

// Index of the largest logit; ties go to the lowest index (as torch.argmax).
int32_t argmax(std::span<const float> logits);

// The id drawn from `logits` under `spec`. `work` is scratch (reused across calls to save allocations).
int32_t sample_row(std::span<const float> logits, const SamplingSpec& spec, std::vector<float>& work);

}  // namespace deltaflow::backend
