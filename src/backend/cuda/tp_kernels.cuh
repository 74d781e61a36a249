// Kernels of tensor parallelism (issue 7): the vocab-parallel embedding, the logits' shard order, and the
// sum the same-device collective uses.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.hpp"

namespace deltaflow::backend::cuda {

// out[t, :] = table[ids[t] - vocab0, :] as fp32 when vocab0 <= ids[t] < vocab0 + rows, else 0 (another rank
// holds that row; the all-reduce that follows fills it in). table: [rows, hidden], BF16, F16 or F32.
cudaError_t embedding_gather_shard(const void* table, core::DType dtype, int64_t rows, int64_t hidden,
                                   int64_t vocab0, const int32_t* ids, int64_t n, float* out,
                                   cudaStream_t stream);

// out[t, r * cols + j] = in[r][t][j]: the all-gathered [world][rows][cols] slices as [rows][world * cols].
cudaError_t interleave_shards(const float* in, int world, int64_t rows, int64_t cols, float* out,
                              cudaStream_t stream);

// dst[i] += src[i], n floats.
cudaError_t add_into(float* dst, const float* src, size_t n, cudaStream_t stream);

}  // namespace deltaflow::backend::cuda
