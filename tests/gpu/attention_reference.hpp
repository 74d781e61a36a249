// The float64 reference the attention kernel tests hold CUDA against: GQA softmax attention of one query
// head over a sequence's first n keys, then the sigmoid output gate. Header-only, for the gpu tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace deltaflow::gpu_test {

// out[0..hd) = sigmoid(gate) * sum_j softmax_j(q . k_j / sqrt(hd)) v_j over keys j < n of kv head kvh;
// k and v are [keys, nkv, hd], q and gate [hd], all the values the kernel reads.
inline void reference_attention_head(const float* q, const float* k, const float* v, int n, int nkv, int kvh,
                                     int hd, const float* gate, float* out) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> s(static_cast<size_t>(n)), o(static_cast<size_t>(hd), 0.0);
  double mx = -INFINITY;
  for (int j = 0; j < n; ++j) {
    const float* kj = k + (static_cast<size_t>(j) * nkv + kvh) * hd;
    double d = 0;
    for (int i = 0; i < hd; ++i) d += static_cast<double>(q[i]) * kj[i];
    s[static_cast<size_t>(j)] = d * scale;
    mx = std::max(mx, s[static_cast<size_t>(j)]);
  }
  double l = 0;
  for (int j = 0; j < n; ++j) {
    const double w = std::exp(s[static_cast<size_t>(j)] - mx);
    l += w;
    const float* vj = v + (static_cast<size_t>(j) * nkv + kvh) * hd;
    for (int i = 0; i < hd; ++i) o[static_cast<size_t>(i)] += w * vj[i];
  }
  for (int i = 0; i < hd; ++i)
    out[i] =
        static_cast<float>(o[static_cast<size_t>(i)] / l / (1.0 + std::exp(-static_cast<double>(gate[i]))));
}

}  // namespace deltaflow::gpu_test
