// Dynamic FP8 activations for the block-scaled FP8 GEMM (gemm.hpp, Qwen's FP8 checkpoints ask for them:
// activation_scheme "dynamic", weight_block_size [128, 128]): each row's 128-column groups get their own
// scale, amax / 448, and the codes are the group's values divided by it, rounded to nearest E4M3 and
// clamped to +-448, as vLLM's per-token-group quantization does. The scales are laid out as cuBLASLt's
// VEC128_32F takes them for the B operand: [K / 128, T8], token-minor.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace deltaflow::backend::cuda {

// x: bf16 [T, ldx] (K columns used, K % 128 == 0). codes: E4M3 [T8, K] row-major, rows T..T8-1 zero codes;
// scales: fp32 [K / 128, T8], entry (j, t) the scale of row t's columns 128 j .. 128 j + 127 (1 for the
// padding rows). T8 >= T, a multiple of 8 (cuBLASLt's requirement on the 1D-scaled operand).
cudaError_t quantize_fp8_1x128(const void* x, int64_t ldx, int64_t T, int64_t T8, int64_t K, void* codes,
                               float* scales, cudaStream_t stream);

// Static FP8 activations (a checkpoint's per-tensor input_scale: ModelOpt FP8 and nvfp4-mixed's attention
// projections, compressed-tensors W8A8 static): the same codes and scale layout as quantize_fp8_1x128, with
// every group's code e4m3(clamp(x * s, +-448)) and every scale 1 / s, s = 448 / (input_scale * 448): what
// quant::fake_quant_fp8_static computes on the CPU, in its order of fp32 operations, here from x's bf16.
cudaError_t quantize_fp8_static(const void* x, int64_t ldx, int64_t T, int64_t T8, int64_t K,
                                float input_scale, void* codes, float* scales, cudaStream_t stream);

// A weight's FP8 scale grid (QuantWeight: entry (i, j) covers rows i * block_rows.., columns j *
// block_cols..) as the block-scaled GEMM's A scales: out [ceil(N / 128), K / 128], entry (i, j) the scale of
// row 128 i, column 128 j. Right for a grid constant over each 128 x 128 block (per-tensor members whose rows
// are multiples of 128: PackedQuant::input_scale's condition).
cudaError_t fp8_block_grid(const float* grid, int64_t grid_cols, int64_t block_rows, int64_t block_cols,
                           int64_t N, int64_t K, float* out, cudaStream_t stream);

// Rows rounded up to what quantize_fp8_1x128 and the FP8 GEMM take.
inline int64_t fp8_gemm_rows(int64_t T) {
  return (T + 7) / 8 * 8;
}

}  // namespace deltaflow::backend::cuda
