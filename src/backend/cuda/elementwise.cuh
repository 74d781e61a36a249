// Small element-wise and row kernels of the forward pass: SwiGLU, fp32 -> 16-bit conversion for cuBLASLt,
// row gather/scatter, greedy argmax, and the random fill of synthetic weights.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.hpp"

namespace deltaflow::backend::cuda {

// out[t, i] = silu(gu[t, i]) * gu[t, I + i]   (F.silu(gate_proj(x)) * up_proj(x), the two halves of one
// matmul)
cudaError_t swiglu(const float* gu, int64_t ld_gu, int64_t T, int64_t I, float* out, int64_t ld_out,
                   cudaStream_t stream);

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
