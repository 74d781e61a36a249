#include "backend/cuda/common.cuh"
#include "backend/cuda/embedding.cuh"
#include "backend/cuda/launch.cuh"

namespace deltaflow::backend::cuda {
namespace {

template <class T>
__global__ void kernel_embedding_gather(const T* __restrict__ table, int64_t hidden,
                                        const int32_t* __restrict__ ids, float* __restrict__ out) {
  pdl_enter();
  const int64_t t = blockIdx.x;
  const T* row = table + static_cast<int64_t>(ids[t]) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) out[t * hidden + i] = to_f32(row[i]);
}

}  // namespace

cudaError_t embedding_gather_bf16(const uint16_t* table, int64_t hidden, const int32_t* ids, int64_t n,
                                  float* out, cudaStream_t stream) {
  return embedding_gather(table, core::DType::kBF16, hidden, ids, n, out, stream);
}

cudaError_t embedding_gather(const void* table, core::DType dtype, int64_t hidden, const int32_t* ids,
                             int64_t n, float* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned g = static_cast<unsigned>(n);
  switch (dtype) {
    case core::DType::kBF16:
      return launch(kernel_embedding_gather<__nv_bfloat16>, dim3(g), dim3(256), 0, stream,
                    static_cast<const __nv_bfloat16*>(table), hidden, ids, out);
    case core::DType::kF16:
      return launch(kernel_embedding_gather<__half>, dim3(g), dim3(256), 0, stream,
                    static_cast<const __half*>(table), hidden, ids, out);
    case core::DType::kF32:
      return launch(kernel_embedding_gather<float>, dim3(g), dim3(256), 0, stream,
                    static_cast<const float*>(table), hidden, ids, out);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace deltaflow::backend::cuda
