// The residual add fused with the zero-centred RMSNorm that follows it (qwen35-architecture.md §2.2).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.hpp"

namespace deltaflow::backend::cuda {

// Per row t of n: h += y (skipped when y is null), then
//   xn = h * rsqrt(mean(h^2) + eps) * (1 + w)            (Qwen3_5RMSNorm in fp32)
// h, y, xn: [T, n] fp32, packed; w: [n] fp32. xn may not alias h.
cudaError_t add_rmsnorm1p(float* h, const float* y, int64_t T, int64_t n, const float* w, float eps,
                          float* xn, cudaStream_t stream);
// The same, and xn's rows staged for a quantized GEMV in one pass: xh [T, n] fp16 and factor [T], bit for bit
// what stage_activations_f16 (gemv_quant.cuh) makes of xn. xh 8-byte aligned.
cudaError_t add_rmsnorm1p_staged(float* h, const float* y, int64_t T, int64_t n, const float* w, float eps,
                                 float* xn, void* xh, float* factor, cudaStream_t stream);
// The same with xn in BF16 or F16 (the fp32 value rounded to nearest even, as convert_rows would round it):
// a prefill matmul's input, written once.
cudaError_t add_rmsnorm1p_16(float* h, const float* y, int64_t T, int64_t n, const float* w, float eps,
                             void* xn16, core::DType dtype, cudaStream_t stream);

}  // namespace deltaflow::backend::cuda
