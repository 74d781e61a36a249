#include "backend/cpu/ops.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/quant/dequant.hpp"

namespace deltaflow::backend::cpu {

void load_row(const Mat& W, int64_t r, float* out) {
  if (W.quantized()) {
    model::quant::dequantize_row(W, r, out);  // exact fp32, weight-only (docs/quantization.md)
    return;
  }
  const void* row = W.row(r);
  switch (W.dtype) {
    case core::DType::kF32:
      std::memcpy(out, row, static_cast<size_t>(W.cols) * 4);
      return;
    case core::DType::kBF16: {
      const auto* h = static_cast<const uint16_t*>(row);
      for (int64_t i = 0; i < W.cols; ++i) out[i] = core::bf16_to_f32(h[i]);
      return;
    }
    default:
      for (int64_t i = 0; i < W.cols; ++i) out[i] = core::load_as_f32(row, W.dtype, static_cast<size_t>(i));
  }
}

std::vector<float> load_all(const Mat& W) {
  std::vector<float> out(static_cast<size_t>(W.numel()));
  for (int64_t r = 0; r < W.rows; ++r) load_row(W, r, out.data() + r * W.cols);
  return out;
}

void rmsnorm_1p(const float* x, int64_t T, int64_t n, const float* w, double eps, float* y) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * n;
    float* yr = y + t * n;
    float ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * (1.0f + w[i]);
  }
}

void rmsnorm(const float* x, int64_t T, int64_t n, const float* w, double eps, float* y) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * n;
    float* yr = y + t * n;
    float ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
    for (int64_t i = 0; i < n; ++i) yr[i] = w[i] * (xr[i] * inv);
  }
}

void l2norm(float* x, int64_t T, int64_t n, float eps) {
  for (int64_t t = 0; t < T; ++t) {
    float* r = x + t * n;
    float ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += r[i] * r[i];
    const float inv = 1.0f / std::sqrt(ss + eps);
    for (int64_t i = 0; i < n; ++i) r[i] *= inv;
  }
}

namespace {

// Rotate-half rotary over the first `rot` dims of every head; frequency i at position pos_of(i).
template <class PosOf>
void rope_rows(float* x, int64_t heads, int64_t head_dim, int64_t rot, const float* inv_freq, PosOf pos_of,
               float scaling) {
  const int64_t half = rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    // Frequencies in fp32 as transformers computes them (inv_freq @ position_ids in fp32).
    const float f = static_cast<float>(pos_of(i)) * inv_freq[i];
    const float c = std::cos(f) * scaling, s = std::sin(f) * scaling;  // yarn's attention factor
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + h * head_dim;
      const float a = v[i], b = v[i + half];
      v[i] = a * c - b * s;
      v[i + half] = b * c + a * s;
    }
  }
}

}  // namespace

void rope_neox(float* x, int64_t heads, int64_t head_dim, int64_t rot, const float* inv_freq, int64_t pos,
               float scaling) {
  rope_rows(
      x, heads, head_dim, rot, inv_freq, [pos](int64_t) { return pos; }, scaling);
}

void rope_neox_mrope(float* x, int64_t heads, int64_t head_dim, int64_t rot, const float* inv_freq,
                     const int64_t* pos, const uint8_t* axis, float scaling) {
  rope_rows(
      x, heads, head_dim, rot, inv_freq, [pos, axis](int64_t i) { return pos[axis[i]]; }, scaling);
}

void softmax(float* x, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  float s = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  for (int64_t i = 0; i < n; ++i) x[i] /= s;
}

}  // namespace deltaflow::backend::cpu
