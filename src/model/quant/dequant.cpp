#include "model/quant/dequant.hpp"

#include <algorithm>
#include <array>

namespace deltaflow::model::quant {
namespace {

// The block scale combined with the global one first, as both producers' own dequantizers do (ModelOpt
// NVFP4QTensor.dequantize: scale * double_scale; compressed-tensors: scale / global_scale).
inline float combined(float block, const Mat& W) {
  return W.global_op == GlobalOp::kMultiply ? block * W.global_scale : block / W.global_scale;
}

}  // namespace

void dequantize_row(const Mat& W, int64_t r, float* out) {
  const auto* src = static_cast<const uint8_t*>(W.row(r));
  const ScaleView& s = W.scale;
  const int64_t si = r / s.block_rows;
  if (W.format == WeightFormat::kNvfp4) {
    for (int64_t k0 = 0; k0 < W.cols; k0 += s.block_cols) {
      const float sb = combined(s.at(si, k0 / s.block_cols), W);
      const int64_t k1 = std::min(W.cols, k0 + s.block_cols);
      for (int64_t k = k0; k < k1; ++k) {
        const uint8_t byte = src[k >> 1];
        const float q = e2m1_to_f32(k & 1 ? byte >> 4 : byte & 0xf);
        out[k] = q * sb;
      }
    }
    return;
  }
  // FP8 E4M3.
  static const auto lut = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = core::f8e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  for (int64_t k0 = 0; k0 < W.cols; k0 += s.block_cols) {
    const float sc = combined(s.at(si, k0 / s.block_cols), W);
    const int64_t k1 = std::min(W.cols, k0 + s.block_cols);
    for (int64_t k = k0; k < k1; ++k) out[k] = lut[src[k]] * sc;
  }
}

}  // namespace deltaflow::model::quant
