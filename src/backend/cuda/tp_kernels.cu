#include "backend/cuda/common.cuh"
#include "backend/cuda/tp_kernels.cuh"

#include <algorithm>

namespace deltaflow::backend::cuda {
namespace {

template <class T>
__global__ void kernel_embedding_gather_shard(const T* __restrict__ table, int64_t rows, int64_t hidden,
                                              int64_t vocab0, const int32_t* __restrict__ ids,
                                              float* __restrict__ out) {
  const int64_t t = blockIdx.x, local = static_cast<int64_t>(ids[t]) - vocab0;
  const bool mine = local >= 0 && local < rows;
  const T* row = table + (mine ? local : 0) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
    out[t * hidden + i] = mine ? to_f32(row[i]) : 0.0f;
}

__global__ void kernel_interleave_shards(const float* __restrict__ in, int world, int64_t rows, int64_t cols,
                                         float* __restrict__ out) {
  const int64_t total = static_cast<int64_t>(world) * rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i % cols, t = (i / cols) % rows, r = i / (cols * rows);
    out[t * world * cols + r * cols + j] = in[i];
  }
}

__global__ void kernel_add_into(float* __restrict__ dst, const float* __restrict__ src, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] += src[i];
}

}  // namespace

cudaError_t embedding_gather_shard(const void* table, core::DType dtype, int64_t rows, int64_t hidden,
                                   int64_t vocab0, const int32_t* ids, int64_t n, float* out,
                                   cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned g = static_cast<unsigned>(n);
  switch (dtype) {
    case core::DType::kBF16:
      kernel_embedding_gather_shard<<<g, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(table), rows,
                                                           hidden, vocab0, ids, out);
      break;
    case core::DType::kF16:
      kernel_embedding_gather_shard<<<g, 256, 0, stream>>>(static_cast<const __half*>(table), rows, hidden,
                                                           vocab0, ids, out);
      break;
    case core::DType::kF32:
      kernel_embedding_gather_shard<<<g, 256, 0, stream>>>(static_cast<const float*>(table), rows, hidden,
                                                           vocab0, ids, out);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t interleave_shards(const float* in, int world, int64_t rows, int64_t cols, float* out,
                              cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(world) * rows * cols;
  if (total == 0) return cudaSuccess;
  kernel_interleave_shards<<<grid_stride_256(total, 4096), 256, 0, stream>>>(in, world, rows, cols, out);
  return cudaGetLastError();
}

cudaError_t add_into(float* dst, const float* src, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  kernel_add_into<<<grid_stride_256(static_cast<int64_t>(n), 4096), 256, 0, stream>>>(dst, src, n);
  return cudaGetLastError();
}

}  // namespace deltaflow::backend::cuda
