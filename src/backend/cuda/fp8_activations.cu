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

// One warp per (row, 128-column group): four elements a lane. Dynamic: the group's scale is amax / 448 and
// a code is v / scale; static (a checkpoint's input_scale): every scale is inv and a code is v * mul.
template <bool kStatic>
__global__ void __launch_bounds__(kThreads)
    kernel_quantize_1x128(const __nv_bfloat16* x, int64_t ldx, int64_t T, int64_t T8, int64_t K,
                          uint8_t* codes, float* scales, float mul, float inv) {
  pdl_enter();
  const int lane = threadIdx.x & 31;
  const int64_t groups = K / 128;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (w >= T8 * groups) return;
  const int64_t t = w / groups, j = w % groups;
  const int64_t k = j * 128 + 4 * lane;
  uint32_t packed = 0;
  float scale = kStatic ? inv : 1.0f;
  if (t < T) {
    uint2 raw;
    memcpy(&raw, x + t * ldx + k, 8);
    __nv_bfloat162 p0, p1;
    memcpy(&p0, &raw.x, 4);
    memcpy(&p1, &raw.y, 4);
    const float2 a = __bfloat1622float2(p0), b = __bfloat1622float2(p1);
    if constexpr (!kStatic) {
      float amax = fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(b.x), fabsf(b.y)));
      amax = warp_max(amax);
      scale = fmaxf(amax, 1e-10f) / kE4m3Max;
    }
    const auto q = [&](float v) { return fminf(fmaxf(kStatic ? v * mul : v / scale, -kE4m3Max), kE4m3Max); };
    const __nv_fp8x2_storage_t lo =
        __nv_cvt_float2_to_fp8x2(make_float2(q(a.x), q(a.y)), __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t hi =
        __nv_cvt_float2_to_fp8x2(make_float2(q(b.x), q(b.y)), __NV_SATFINITE, __NV_E4M3);
    packed = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
  memcpy(codes + t * K + k, &packed, 4);
  if (lane == 0) scales[j * T8 + t] = scale;
}

__global__ void kernel_block_grid(const float* grid, int64_t grid_cols, int64_t block_rows,
                                  int64_t block_cols, int64_t N, int64_t K, float* out) {
  pdl_enter();
  const int64_t gr = (N + 127) / 128, gc = K / 128;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < gr * gc;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / gc * 128, c = i % gc * 128;
    out[i] = grid[r / block_rows * grid_cols + c / block_cols];
  }
}

}  // namespace

cudaError_t quantize_fp8_1x128(const void* x, int64_t ldx, int64_t T, int64_t T8, int64_t K, void* codes,
                               float* scales, cudaStream_t stream) {
  if (T8 == 0) return cudaSuccess;
  if (K % 128 != 0 || T8 % 8 != 0 || T8 < T || ldx % 4 != 0) return cudaErrorInvalidValue;
  const int64_t warps = T8 * (K / 128);
  return launch(kernel_quantize_1x128<false>, dim3(grid_1d(warps * 32, kThreads)), dim3(kThreads), 0, stream,
                static_cast<const __nv_bfloat16*>(x), ldx, T, T8, K, static_cast<uint8_t*>(codes), scales,
                1.0f, 1.0f);
}

cudaError_t quantize_fp8_static(const void* x, int64_t ldx, int64_t T, int64_t T8, int64_t K,
                                float input_scale, void* codes, float* scales, cudaStream_t stream) {
  if (T8 == 0) return cudaSuccess;
  if (K % 128 != 0 || T8 % 8 != 0 || T8 < T || ldx % 4 != 0 || !(input_scale > 0))
    return cudaErrorInvalidValue;
  const float mul = 448.0f / (input_scale * 448.0f), inv = 1.0f / mul;  // ModelOpt's order (quantize.hpp)
  const int64_t warps = T8 * (K / 128);
  return launch(kernel_quantize_1x128<true>, dim3(grid_1d(warps * 32, kThreads)), dim3(kThreads), 0, stream,
                static_cast<const __nv_bfloat16*>(x), ldx, T, T8, K, static_cast<uint8_t*>(codes), scales,
                mul, inv);
}

cudaError_t fp8_block_grid(const float* grid, int64_t grid_cols, int64_t block_rows, int64_t block_cols,
                           int64_t N, int64_t K, float* out, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  if (K % 128 != 0 || block_rows < 1 || block_cols < 1 || grid_cols < 1) return cudaErrorInvalidValue;
  const int64_t n = (N + 127) / 128 * (K / 128);
  return launch(kernel_block_grid, dim3(grid_stride_256(n)), dim3(256), 0, stream, grid, grid_cols,
                block_rows, block_cols, N, K, out);
}

}  // namespace deltaflow::backend::cuda
