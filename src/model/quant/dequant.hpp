// Exact fp32 dequantization of a quantized weight row: the reference of record (docs/quantization.md).
//   NVFP4: W[n,k] = e2m1(q[n,k]) * (e4m3(scale[n, k/16]) * weight_scale_2)      (ModelOpt)
//          W[n,k] = e2m1(q[n,k]) * (e4m3(scale[n, k/16]) / weight_global_scale)  (compressed-tensors)
//          in fp32, in the order of the producers' own dequantizers (NVFP4QTensor.dequantize, CT's
//          dequantize), so the values are bit-identical to theirs in fp32.
//   FP8:   W[n,k] = e4m3(w[n,k]) * scale(n / block_rows, k / block_cols), one rounding.
#pragma once

#include <cstdint>

#include "model/weights.hpp"

namespace deltaflow::model::quant {

// Row r of a quantized W (W.quantized()) as fp32, W.cols values.
void dequantize_row(const Mat& W, int64_t r, float* out);

}  // namespace deltaflow::model::quant
