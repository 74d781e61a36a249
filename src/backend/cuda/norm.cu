#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv_quant.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/norm.cuh"
#include "backend/cuda/stage_f16.cuh"

namespace deltaflow::backend::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row. The sum of squares is a block reduction; each thread rereads only what it wrote.
template <class TO>
__global__ void __launch_bounds__(kThreads)
    kernel_add_rmsnorm1p(float* __restrict__ h, const float* __restrict__ y, int64_t n,
                         const float* __restrict__ w, float eps, TO* __restrict__ xn) {
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
  TO* xr = xn + t * n;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) xr[i] = from_f32<TO>(hr[i] * inv * (1.0f + w[i]));
}

// The same, for rows that are a whole number of 16-byte vectors: 512 threads, each holding up to NV float4 of
// the row in registers between the sum and the scaling, so the row is read once and every load of a thread is
// in flight together (a decode step has one row per token: latency, not bandwidth, sets its time).
constexpr int kVecThreads = 512;
constexpr int kMaxVecPerThread = 4;

// With xh set (TO float), the row is staged for a quantized GEMV as well (stage_f16.cuh): xh = xn * 2^-e in
// fp16 and factor = 2^e, from the same fp32 values, so bit for bit what stage_activations_f16 makes of xn.
template <int NV, class TO>
__global__ void __launch_bounds__(kVecThreads)
    kernel_add_rmsnorm1p_vec(float* __restrict__ h, const float* __restrict__ y, int64_t n,
                             const float* __restrict__ w, float eps, TO* __restrict__ xn,
                             __half* __restrict__ xh = nullptr, float* __restrict__ factor = nullptr) {
  __shared__ float red[32];
  pdl_enter();
  const int64_t t = blockIdx.x, nv = n / 4;
  float4* hr = reinterpret_cast<float4*>(h + t * n);
  const float4* yr = y ? reinterpret_cast<const float4*>(y + t * n) : nullptr;
  float4 v[NV];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kVecThreads;
    v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < nv) {
      v[j] = hr[i];
      if (yr) {
        const float4 b = yr[i];
        v[j].x += b.x;
        v[j].y += b.y;
        v[j].z += b.z;
        v[j].w += b.w;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kVecThreads;
    if (yr && i < nv) hr[i] = v[j];
    ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  const float4* wr = reinterpret_cast<const float4*>(w);
  TO* xr = xn + t * n;
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kVecThreads;
    if (i < nv) {
      const float4 g = wr[i];
      const float o[4] = {v[j].x * inv * (1.0f + g.x), v[j].y * inv * (1.0f + g.y),
                          v[j].z * inv * (1.0f + g.z), v[j].w * inv * (1.0f + g.w)};
      store_vals<4>(xr + 4 * i, o);
      v[j] = make_float4(o[0], o[1], o[2], o[3]);
      amax = fmaxf(amax, fmaxf(fmaxf(fabsf(o[0]), fabsf(o[1])), fmaxf(fabsf(o[2]), fabsf(o[3]))));
    }
  }
  if (!xh) return;
  amax = block_max(amax, red);
  const int e = f16_stage_exponent(amax);
  const float down = ldexpf(1.0f, -e);
  if (threadIdx.x == 0) factor[t] = ldexpf(1.0f, e);
  __half2* xhr = reinterpret_cast<__half2*>(xh + t * n);
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * kVecThreads;
    if (i < nv) {
      xhr[2 * i] = __halves2half2(__float2half_rn(v[j].x * down), __float2half_rn(v[j].y * down));
      xhr[2 * i + 1] = __halves2half2(__float2half_rn(v[j].z * down), __float2half_rn(v[j].w * down));
    }
  }
}

// xh, factor: staged as well (kernel_add_rmsnorm1p_vec; TO float only); false when the row shape needs the
// unstaged kernel.
template <class TO>
bool vec_shape(const float* h, const float* y, int64_t n, const float* w, const TO* xn) {
  const int64_t per_thread = (n / 4 + kVecThreads - 1) / kVecThreads;
  return n % 4 == 0 && per_thread <= kMaxVecPerThread && aligned16(h) && aligned16(y) && aligned16(w) &&
         aligned16(xn);
}

template <class TO>
cudaError_t add_rmsnorm1p_typed(float* h, const float* y, int64_t T, int64_t n, const float* w, float eps,
                                TO* xn, cudaStream_t stream, __half* xh = nullptr, float* factor = nullptr) {
  if (vec_shape(h, y, n, w, xn)) {
    const int64_t per_thread = (n / 4 + kVecThreads - 1) / kVecThreads;
    const dim3 grid(static_cast<unsigned>(T)), block(kVecThreads);
    switch (per_thread) {
      case 0:
      case 1:
        return launch(kernel_add_rmsnorm1p_vec<1, TO>, grid, block, 0, stream, h, y, n, w, eps, xn, xh,
                      factor);
      case 2:
        return launch(kernel_add_rmsnorm1p_vec<2, TO>, grid, block, 0, stream, h, y, n, w, eps, xn, xh,
                      factor);
      case 3:
        return launch(kernel_add_rmsnorm1p_vec<3, TO>, grid, block, 0, stream, h, y, n, w, eps, xn, xh,
                      factor);
      default:
        return launch(kernel_add_rmsnorm1p_vec<4, TO>, grid, block, 0, stream, h, y, n, w, eps, xn, xh,
                      factor);
    }
  }
  if (xh) return cudaErrorInvalidValue;
  return launch(kernel_add_rmsnorm1p<TO>, dim3(static_cast<unsigned>(T)), dim3(kThreads), 0, stream, h, y, n,
                w, eps, xn);
}

}  // namespace

cudaError_t add_rmsnorm1p(float* h, const float* y, int64_t T, int64_t n, const float* w, float eps,
                          float* xn, cudaStream_t stream) {
  if (T == 0) return cudaSuccess;
  return add_rmsnorm1p_typed(h, y, T, n, w, eps, xn, stream);
}

cudaError_t add_rmsnorm1p_staged(float* h, const float* y, int64_t T, int64_t n, const float* w, float eps,
                                 float* xn, void* xh, float* factor, cudaStream_t stream) {
  if (T == 0) return cudaSuccess;
  if (!xh || !factor || reinterpret_cast<uintptr_t>(xh) % 8 != 0) return cudaErrorInvalidValue;
  if (vec_shape(h, y, n, w, xn))
    return add_rmsnorm1p_typed(h, y, T, n, w, eps, xn, stream, static_cast<__half*>(xh), factor);
  const cudaError_t e = add_rmsnorm1p_typed(h, y, T, n, w, eps, xn, stream);
  if (e != cudaSuccess) return e;
  return stage_activations_f16(xn, n, static_cast<int>(T), n, xh, factor, stream);
}

cudaError_t add_rmsnorm1p_16(float* h, const float* y, int64_t T, int64_t n, const float* w, float eps,
                             void* xn16, core::DType dtype, cudaStream_t stream) {
  if (T == 0) return cudaSuccess;
  if (dtype == core::DType::kBF16)
    return add_rmsnorm1p_typed(h, y, T, n, w, eps, static_cast<__nv_bfloat16*>(xn16), stream);
  if (dtype == core::DType::kF16)
    return add_rmsnorm1p_typed(h, y, T, n, w, eps, static_cast<__half*>(xn16), stream);
  return cudaErrorInvalidValue;
}

}  // namespace deltaflow::backend::cuda
