// Embedding gather: out[t, :] = table[ids[t], :] as fp32. The first kernel of the CUDA backend.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.hpp"

namespace deltaflow::backend::cuda {

// table: [vocab, hidden] bf16 (raw uint16 bits); ids: [n] int32, each in [0, vocab); out: [n, hidden] fp32.
cudaError_t embedding_gather_bf16(const uint16_t* table, int64_t hidden, const int32_t* ids, int64_t n,
                                  float* out, cudaStream_t stream);

// The same for a table of BF16, F16 or F32 elements.
cudaError_t embedding_gather(const void* table, core::DType dtype, int64_t hidden, const int32_t* ids,
                             int64_t n, float* out, cudaStream_t stream);

}  // namespace deltaflow::backend::cuda
