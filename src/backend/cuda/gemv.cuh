// The decode matmul: a weight stream. y = x @ W.T for a few activation rows, reading each weight once with
// 16-byte loads, several weight rows per warp, fp32 activations and fp32 accumulation.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.hpp"

namespace deltaflow::backend::cuda {

// Rows of x one launch takes; the caller tiles taller inputs.
inline constexpr int kGemvMaxRows = 32;

// y[t, n] = sum_k x[t, k] * W[n, k] for t < T <= kGemvMaxRows (PyTorch: y = x @ W.T).
// W: [N, K] row-major, BF16, F16 or F32; x: [T, ldx] fp32; y: [T, ldy] fp32.
// 16-byte loads when K is a multiple of 16 / sizeof(W element), W and x are 16-byte aligned and ldx % 4 == 0;
// a scalar path otherwise.
cudaError_t gemv(const void* W, core::DType dtype, int64_t N, int64_t K, const float* x, int64_t ldx, int T,
                 float* y, int64_t ldy, cudaStream_t stream);

// The grouped form, for MoE slots: `groups` problems of one row each. Problem g multiplies the matrix at
// W + expert[g] * w_stride (elements) with x row g / x_div and writes y row g. All on the device: no host
// sync.
cudaError_t gemv_grouped(const void* W, core::DType dtype, int64_t N, int64_t K, int64_t w_stride,
                         const int* expert, int groups, const float* x, int64_t ldx, int x_div, float* y,
                         int64_t ldy, cudaStream_t stream);

}  // namespace deltaflow::backend::cuda
