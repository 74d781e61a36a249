// Scale search (`deltaflow quantize --method mse`): the same published layouts as quantize.hpp's exact
// recipes (ModelOpt NVFP4: E2M1 codes, E4M3 scale per 16, fp32 weight_scale_2; FP8 per tensor; Qwen FP8
// block 128 with BF16 weight_scale_inv), with each scale chosen to lower the quantization error
//   err = sum_k h[k] * (w[n,k] - dequant(q)[n,k])^2
// instead of derived from the amax. `h` weights input channel k (the mean squared calibration input of the
// column, so that the error approximates the output's; null: every column 1). The exact recipe's scale is
// always a candidate and wins ties, so no group's (or block's, or tensor's) error is ever above the exact
// method's. The elements are rounded as the exact recipes round them, given the chosen scale.
#pragma once

#include <cstdint>
#include <vector>

#include "model/quant/quantize.hpp"

namespace deltaflow::model::quant {

// The error of one NVFP4 group of 16 (w, h: 16 values) quantized with E4M3 block-scale code `code` under
// global scale s2: the codes e2m1(w / (e4m3(code) * s2)) dequantized as e2m1 * (e4m3(code) * s2).
double nvfp4_group_error(const float* w, const float* h, float s2, uint8_t code);
// ModelOpt's block-scale code for the group (the exact recipe), and the searched one: the code of lowest
// error among those from 0.6x to 1.1x the exact scale (every E4M3 value in between), the exact one on ties.
uint8_t nvfp4_exact_code(const float* w, float s2);
uint8_t nvfp4_search_code(const float* w, const float* h, float s2);

// W [N, K] in ModelOpt's NVFP4 layout with weight_scale_2 `s2` and searched block scales. `err` (optional)
// receives the total error.
Nvfp4Weight quantize_nvfp4_search(const float* w, int64_t N, int64_t K, float s2, const float* h,
                                  double* err = nullptr);
// A fused group's members (one shared weight_scale_2, as ModelOpt exports them): the shared scale is searched
// too, over amax / 2688 * 2^(i/32), i = 0..3 (shifts of the E4M3 grid the block scales are read from; never
// below the amax's, so no block scale passes 448), by the members' summed error.
std::vector<Nvfp4Weight> quantize_nvfp4_search_group(const std::vector<const float*>& w,
                                                     const std::vector<int64_t>& rows, int64_t K, float amax,
                                                     const float* h);

// The error of FP8 E4M3 codes q with per-tensor scale s (dequantized as e4m3(q) * s).
double fp8_tensor_error(const float* w, const uint8_t* q, int64_t N, int64_t K, float s, const float* h);
// FP8 per tensor (ModelOpt FP8, nvfp4-mixed's attention): the lowest-error of ModelOpt's own quantization and
// the codes e4m3(clamp(w / s)) for the fp32 scales s = amax / 448 * 2^(-i/64), i = 0..24 (clipping the
// largest elements for finer steps elsewhere).
Fp8TensorWeight quantize_fp8_tensor_search(const float* w, int64_t N, int64_t K, const float* h);

// FP8 block 128 (Qwen's layout): each block's BF16 scale searched over the BF16 values from 0.75x to 1.06x
// the exact one (blk_amax / 448), by the block's error.
Fp8BlockWeight quantize_fp8_block_search(const float* w, int64_t N, int64_t K, const float* h);

}  // namespace deltaflow::model::quant
