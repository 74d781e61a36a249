#include "model/rope.hpp"

#include <algorithm>
#include <cmath>

namespace deltaflow::model {

RopeFrequencies rope_frequencies(const TextConfig& c) {
  RopeFrequencies r;
  const int64_t dim = c.rotary_dim();
  const RopeScaling& s = c.rope_scaling;
  if (s.type == "default" || s.type == "linear") {
    // 1 / theta^(2i / rot) (and / factor for linear), the reciprocal in double.
    const double factor = s.type == "linear" ? s.factor : 1.0;
    for (int64_t i = 0; i < dim / 2; ++i)
      r.inv_freq.push_back(static_cast<float>(
          1.0 /
          std::pow(c.rope_theta, static_cast<double>(static_cast<float>(2 * i) / static_cast<float>(dim))) /
          factor));
    return r;
  }
  // yarn (_compute_yarn_parameters).
  // base^(2i / dim) in fp32 as torch computes `base ** (arange(0, dim, 2).float() / dim)`.
  std::vector<float> pos_freqs;
  for (int64_t i = 0; i < dim / 2; ++i)
    pos_freqs.push_back(static_cast<float>(
        std::pow(c.rope_theta, static_cast<double>(static_cast<float>(2 * i) / static_cast<float>(dim)))));
  const double factor = s.factor;
  auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
  double attention = s.attention_factor;
  if (attention <= 0)
    attention = s.mscale != 0 && s.mscale_all_dim != 0
                    ? get_mscale(factor, s.mscale) / get_mscale(factor, s.mscale_all_dim)
                    : get_mscale(factor, 1.0);
  r.attention_scaling = static_cast<float>(attention);
  const double base = c.rope_theta, d = static_cast<double>(dim);
  const double orig = static_cast<double>(s.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return (d * std::log(orig / (rotations * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, d - 1);
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float p = pos_freqs[static_cast<size_t>(i)];
    const float extrapolation = 1.0f / p, interpolation = 1.0f / (static_cast<float>(factor) * p);
    // The ramp in fp32: (i - low) / (high - low), clamped to [0, 1].
    const float ramp = std::clamp((static_cast<float>(i) - static_cast<float>(low)) /
                                      (static_cast<float>(high) - static_cast<float>(low)),
                                  0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    r.inv_freq.push_back(interpolation * (1.0f - extrapolation_factor) +
                         extrapolation * extrapolation_factor);
  }
  return r;
}

}  // namespace deltaflow::model
