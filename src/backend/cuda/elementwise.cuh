// Small element-wise and row kernels of the forward pass: SwiGLU, fp32 -> 16-bit conversion for cuBLASLt,
// row gather/scatter, greedy argmax, and the random fill of synthetic weights.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.hpp"

namespace deltaflow::backend::cuda {

// out[t, i] = silu(gu[t, i]) * gu[t, I + i]   (F.silu(gate_proj(x)) * up_proj(x), the two halves of one
// matmul). gu is fp32, BF16 or F16 and out fp32 or 16-bit (from fp32 gu, or the same type as gu); the
// arithmetic is fp32 and a 16-bit out is rounded to nearest even, as convert_rows would.
cudaError_t swiglu(const void* gu, core::DType gu_type, int64_t ld_gu, int64_t T, int64_t I, void* out,
                   core::DType out_type, int64_t ld_out, cudaStream_t stream);
inline cudaError_t swiglu(const float* gu, int64_t ld_gu, int64_t T, int64_t I, float* out, int64_t ld_out,
                          cudaStream_t stream) {
  return swiglu(gu, core::DType::kF32, ld_gu, T, I, out, core::DType::kF32, ld_out, stream);
}

// out[t, k] = x[t, k] rounded to BF16 or F16 (round to nearest even); out is packed [T, K].
cudaError_t convert_rows(const float* x, int64_t ldx, int64_t T, int64_t K, void* out, core::DType dtype,
                         cudaStream_t stream);

// dst[i, :] = src[rows[i], :] for i < n.
cudaError_t gather_rows(const float* src, int64_t ld_src, const int* rows, int64_t n, int64_t cols,
                        float* dst, int64_t ld_dst, cudaStream_t stream);
// dst[rows[i], :] = src[i, :] for i < n.
cudaError_t scatter_rows(const float* src, int64_t ld_src, const int* rows, int64_t n, int64_t cols,
                         float* dst, int64_t ld_dst, cudaStream_t stream);

// out[r] = index of the largest of x[r, 0..V), ties to the lowest index (torch.argmax); NaN never wins.
cudaError_t argmax_rows(const float* x, int64_t rows, int64_t V, int* out, cudaStream_t stream);

// p[i] = shift + scale * u_i with u_i uniform in [-1, 1) from a hash of (seed, i), stored as dtype.
cudaError_t fill_random(void* p, core::DType dtype, int64_t n, uint64_t seed, float scale, float shift,
                        cudaStream_t stream);

}  // namespace deltaflow::backend::cuda
