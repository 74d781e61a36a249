// Walks the bound weights (every Mat of a ModelWeights, with its role) and sums what one decoded token reads.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "model/weights.hpp"

namespace deltaflow::model {

// Calls f(role, mat) for every bound matrix and vector, in model order; role is e.g. "layers.3.mlp.down_proj"
// or "layers.5.moe.experts.7.up_proj". A tied lm_head is visited once, as embed_tokens.
void for_each_weight(const TextConfig& c, const ModelWeights& w,
                     const std::function<void(const std::string& role, const Mat& m)>& f);

// The first quantized matrix, or nullptr: what a backend without quantized kernels must refuse.
const Mat* first_quantized(const TextConfig& c, const ModelWeights& w);

// Bytes one decoded token reads from the weights (batch 1): every dense matrix whole (elements and scales),
// one embedding row, the router and shared expert of each MoE layer and num_experts_per_tok experts (their
// mean size), and lm_head.
uint64_t bytes_per_decoded_token(const TextConfig& c, const ModelWeights& w);

// "NVFP4 (E2M1, E4M3 g16 scales x 1/global)", "FP8 (E4M3, 128x128 block scales)", "BF16", ...
std::string describe_format(const Mat& m);

}  // namespace deltaflow::model
