#include "model/param_counts.hpp"

#include <cmath>

namespace deltaflow::model {

ParamCounts count_params(const TextConfig& c) {
  ParamCounts m;
  const double H = static_cast<double>(c.hidden_size);
  const double C = static_cast<double>(c.linear_conv_dim()), vd = static_cast<double>(c.linear_value_dim());
  const double nv = static_cast<double>(c.linear_num_value_heads);
  const double nh = static_cast<double>(c.num_attention_heads),
               nkv = static_cast<double>(c.num_key_value_heads);
  const double hd = static_cast<double>(c.head_dim), qw = c.attn_output_gate ? 2 * hd : hd;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (c.layer_types[static_cast<size_t>(i)] == LayerType::kLinearAttention) {
      m.dense += (C + vd + 2 * nv) * H + H * vd;
    } else {
      m.dense += (nh * qw + 2 * nkv * hd) * H + H * nh * hd;
      m.kv_per_token += 2 * nkv * hd;
    }
    if (c.layer_is_moe(i)) {
      const double E = static_cast<double>(c.num_experts), Im = static_cast<double>(c.moe_intermediate_size);
      const double Is = static_cast<double>(c.shared_expert_intermediate_size);
      m.dense += E * H + 3 * Is * H + H;
      m.expert = 3 * Im * H;
      m.moe_layers += 1;
    } else {
      m.dense += 3 * static_cast<double>(c.intermediate_size) * H;
    }
  }
  m.lm_head = static_cast<double>(c.vocab_size) * H;
  const double n_lin = static_cast<double>(c.count_layers(LayerType::kLinearAttention));
  m.state_bytes = n_lin *
                  (nv * static_cast<double>(c.linear_key_head_dim * c.linear_value_head_dim) +
                   C * static_cast<double>(c.linear_conv_kernel_dim - 1)) *
                  4;
  return m;
}

double distinct_experts(const TextConfig& c, double rows) {
  if (!c.is_moe() || c.num_experts <= 0) return 0.0;
  const double E = static_cast<double>(c.num_experts), K = static_cast<double>(c.num_experts_per_tok);
  return E * (1.0 - std::pow(1.0 - K / E, rows));
}

}  // namespace deltaflow::model
