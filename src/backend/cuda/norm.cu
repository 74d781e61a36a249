#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/norm.cuh"

namespace deltaflow::backend::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row. The sum of squares is a block reduction; each thread rereads only what it wrote.
__global__ void __launch_bounds__(kThreads)
    kernel_add_rmsnorm1p(float* __restrict__ h, const float* __restrict__ y, int64_t n,
                         const float* __restrict__ w, float eps, float* __restrict__ xn) {
  __shared__ float red[32];
  pdl_enter();
  const int64_t t = blockIdx.x;
  float* hr = h + t * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    float v = hr[i];
    if (y) {
      v += y[t * n + i];  // h = h + y
      hr[i] = v;
    }
    ss += v * v;
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  float* xr = xn + t * n;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) xr[i] = hr[i] * inv * (1.0f + w[i]);
}

}  // namespace

cudaError_t add_rmsnorm1p(float* h, const float* y, int64_t T, int64_t n, const float* w, float eps,
                          float* xn, cudaStream_t stream) {
  if (T == 0) return cudaSuccess;
  return launch(kernel_add_rmsnorm1p, dim3(static_cast<unsigned>(T)), dim3(kThreads), 0, stream, h, y, n, w,
                eps, xn);
}

}  // namespace deltaflow::backend::cuda
