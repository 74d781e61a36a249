// The residual add fused with the zero-centred RMSNorm that follows it (qwen35-architecture.md §2.2).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace deltaflow::backend::cuda {

// Per row t of n: h += y (skipped when y is null), then
//   xn = h * rsqrt(mean(h^2) + eps) * (1 + w)            (Qwen3_5RMSNorm in fp32)
// h, y, xn: [T, n] fp32, packed; w: [n] fp32. xn may not alias h.
cudaError_t add_rmsnorm1p(float* h, const float* y, int64_t T, int64_t n, const float* w, float eps,
                          float* xn, cudaStream_t stream);

}  // namespace deltaflow::backend::cuda
