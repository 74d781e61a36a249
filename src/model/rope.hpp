// Rotary position embedding frequencies from config.json's rope_parameters, as transformers computes them
// (modeling_rope_utils.py): "default", "linear" (positions divided by `factor`) and "yarn" (NTK-by-parts
// interpolation between the original and the scaled frequencies, and cos/sin scaled by an attention factor).
#pragma once

#include <vector>

#include "model/config.hpp"

namespace deltaflow::model {

struct RopeFrequencies {
  std::vector<float> inv_freq;     // rotary_dim / 2 entries
  float attention_scaling = 1.0f;  // multiplies cos and sin
};

RopeFrequencies rope_frequencies(const TextConfig& c);

}  // namespace deltaflow::model
