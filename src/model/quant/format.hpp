// Quantized weight formats as published (quant-formats.md §0-3): what a weight's bytes mean and how its
// scales are laid out. Only descriptions and scalar decoders here; config parsing is in quant/config.hpp and
// row dequantization in quant/dequant.hpp.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/dtype.hpp"

namespace deltaflow::model::quant {

// How a weight matrix's elements are stored.
enum class WeightFormat : uint8_t {
  kFloat,  // bf16 / f16 / f32 elements (Mat::dtype)
  kNvfp4,  // E2M1 nibbles, byte[j] = q[2j] | q[2j+1] << 4 along K; E4M3 scale per 16 elements of a row
  kFp8,    // E4M3 elements; scales per tensor, per row or per 128x128 block
};

std::string_view format_name(WeightFormat f);

// How the second-level (per-tensor) scale enters: ModelOpt's weight_scale_2 multiplies, compressed-tensors'
// weight_global_scale divides (CT stores the reciprocal, quant-formats.md §2).
enum class GlobalOp : uint8_t { kMultiply, kDivide };

// A grid of scales [rows, cols]; entry (i, j) covers weight elements [i*block_rows, (i+1)*block_rows) x
// [j*block_cols, (j+1)*block_cols) (clipped at the matrix edge). A per-tensor scale is a 1x1 grid whose block
// is the whole matrix.
struct ScaleView {
  const void* data = nullptr;
  core::DType dtype = core::DType::kF32;  // F8_E4M3, F32, BF16 or F16
  int64_t rows = 0, cols = 0;
  int64_t block_rows = 1, block_cols = 1;
  bool empty() const { return data == nullptr; }
  // Scale entry (i, j) as fp32 (exact: every allowed dtype widens exactly).
  float at(int64_t i, int64_t j) const {
    return core::load_as_f32(data, dtype, static_cast<size_t>(i * cols + j));
  }
};

// E2M1 code (low 4 bits) -> value: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (bit 3 is the sign).
inline float e2m1_to_f32(uint8_t code) {
  static constexpr float kValues[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                        -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  return kValues[code & 0xf];
}

inline constexpr int64_t kNvfp4Group = 16;  // elements per E4M3 block scale
inline constexpr int64_t kFp8Block = 128;   // Qwen / compressed-tensors FP8 block edge

}  // namespace deltaflow::model::quant
