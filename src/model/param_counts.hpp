// What the matmuls of one token meet, counted from the config alone (elements, not bytes): the figures the
// benchmarks' rooflines are built from (`bench --batches`, `bench --requests`).
#pragma once

#include "model/config.hpp"

namespace deltaflow::model {

struct ParamCounts {
  double dense = 0;       // non-expert matmul weights of all layers (attention, DeltaNet, dense FFN, router,
                          // shared expert)
  double expert = 0;      // one routed expert of one layer (gate + up + down)
  double moe_layers = 0;  // layers with routed experts
  double lm_head = 0;
  double kv_per_token = 0;  // KV-cache elements per token of context (all full-attention layers, K and V)
  double state_bytes = 0;   // conv + GDN state bytes of one sequence (fp32)
};

ParamCounts count_params(const TextConfig& c);

// The routed experts a step of `rows` tokens reads per MoE layer, expected when each token picks
// num_experts_per_tok of num_experts uniformly: E (1 - (1 - K/E)^rows). 0 for a dense model.
double distinct_experts(const TextConfig& c, double rows);

}  // namespace deltaflow::model
