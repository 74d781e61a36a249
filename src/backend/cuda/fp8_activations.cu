#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstring>

#include "backend/cuda/common.cuh"
#include "backend/cuda/fp8_activations.cuh"
#include "backend/cuda/launch.cuh"

namespace deltaflow::backend::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kE4m3Max = 448.0f;

// One warp per (row, 128-column group): four elements a lane.
__global__ void __launch_bounds__(kThreads)
    kernel_quantize_1x128(const __nv_bfloat16* x, int64_t ldx, int64_t T, int64_t T8, int64_t K,
                          uint8_t* codes, float* scales) {
  pdl_enter();
  const int lane = threadIdx.x & 31;
  const int64_t groups = K / 128;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (w >= T8 * groups) return;
  const int64_t t = w / groups, j = w % groups;
  const int64_t k = j * 128 + 4 * lane;
  uint32_t packed = 0;
  float scale = 1.0f;
  if (t < T) {
    uint2 raw;
    memcpy(&raw, x + t * ldx + k, 8);
    __nv_bfloat162 p0, p1;
    memcpy(&p0, &raw.x, 4);
    memcpy(&p1, &raw.y, 4);
    const float2 a = __bfloat1622float2(p0), b = __bfloat1622float2(p1);
    float amax = fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(b.x), fabsf(b.y)));
    amax = warp_max(amax);
    scale = fmaxf(amax, 1e-10f) / kE4m3Max;
    const auto q = [&](float v) { return fminf(fmaxf(v / scale, -kE4m3Max), kE4m3Max); };
    const __nv_fp8x2_storage_t lo =
        __nv_cvt_float2_to_fp8x2(make_float2(q(a.x), q(a.y)), __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t hi =
        __nv_cvt_float2_to_fp8x2(make_float2(q(b.x), q(b.y)), __NV_SATFINITE, __NV_E4M3);
    packed = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
  memcpy(codes + t * K + k, &packed, 4);
  if (lane == 0) scales[j * T8 + t] = scale;
}

}  // namespace

cudaError_t quantize_fp8_1x128(const void* x, int64_t ldx, int64_t T, int64_t T8, int64_t K, void* codes,
                               float* scales, cudaStream_t stream) {
  if (T8 == 0) return cudaSuccess;
  if (K % 128 != 0 || T8 % 8 != 0 || T8 < T || ldx % 4 != 0) return cudaErrorInvalidValue;
  const int64_t warps = T8 * (K / 128);
  return launch(kernel_quantize_1x128, dim3(grid_1d(warps * 32, kThreads)), dim3(kThreads), 0, stream,
                static_cast<const __nv_bfloat16*>(x), ldx, T, T8, K, static_cast<uint8_t*>(codes), scales);
}

}  // namespace deltaflow::backend::cuda
