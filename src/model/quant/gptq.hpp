// GPTQ (Frantar et al. 2022, `deltaflow quantize --method gptq`): a matrix's columns are quantized in order,
// each column's rounding error spread over the columns not yet quantized so that the layer's output on the
// calibration inputs moves least, through the upper Cholesky factor U of (X^T X + damping)^-1. The rows are
// independent (they share U). The output keeps the published layouts: NVFP4 block scales are searched
// (search.hpp) on each group's updated weights when the group starts, under a fixed weight_scale_2; FP8
// scales (per tensor or per 128x128 block) are fixed before the columns run.
#pragma once

#include <cstdint>
#include <vector>

#include "model/quant/quantize.hpp"

namespace deltaflow::model::quant {

// U (K x K, row-major, upper triangular) from the Gram matrix X^T X of the calibration inputs (K x K,
// row-major): columns no input reached get 1 on the diagonal, then `damp` times the mean diagonal is added
// (ten times more, up to 3 times, while the matrix is not positive definite). Empty if it never is. The
// default 0.1 (GPTQ's paper uses 0.01) measured best on the house model: NVFP4 +0.0089 nats/token at 0.01,
// +0.0077 at 0.03, +0.0064 at 0.1, +0.0092 at 0.3 (64 KB of calibration text; with 12 KB, on a 740-token
// slice of the text, 0.01 was worse than no GPTQ at all, 0.1 better: docs/quantization.md).
std::vector<double> gptq_factor(const std::vector<double>& gram, int64_t K, double damp = 0.1);

// W [N, K] in ModelOpt's NVFP4 layout with weight_scale_2 s2. h: the per-column weights of the block-scale
// search (diag of the Gram matrix), or null.
Nvfp4Weight gptq_nvfp4(const float* w, int64_t N, int64_t K, float s2, const std::vector<double>& U,
                       const float* h);

// W [N, K] as E4M3 codes of w / scale, the scale of element (n, k) being scales[(n / block_rows) * grid_cols
// + k / block_cols] (a per-tensor scale: one entry, blocks of N x K).
std::vector<uint8_t> gptq_fp8(const float* w, int64_t N, int64_t K, const std::vector<float>& scales,
                              int64_t block_rows, int64_t block_cols, const std::vector<double>& U);

}  // namespace deltaflow::model::quant
