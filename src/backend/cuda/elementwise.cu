#include <algorithm>
#include <cmath>

#include "backend/cuda/common.cuh"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/launch.cuh"

namespace deltaflow::backend::cuda {
namespace {

constexpr int kThreads = 256;

// Thread per V columns of a row; rows along y (a grid-stride loop past 65535 rows).
template <class TI, class TO, int V>
__global__ void __launch_bounds__(kThreads) kernel_swiglu(const TI* __restrict__ gu, int64_t ld_gu, int64_t T,
                                                          int64_t I, TO* __restrict__ out, int64_t ld_out) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * V;
  if (i >= I) return;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float g[V], u[V], o[V];
    load_vals<V>(gu + t * ld_gu + i, g);
    load_vals<V>(gu + t * ld_gu + I + i, u);
#pragma unroll
    for (int q = 0; q < V; ++q) o[q] = silu_f(g[q]) * u[q];
    store_vals<V>(out + t * ld_out + i, o);
  }
}

template <class TI, class TO>
cudaError_t swiglu_typed(const void* gu, int64_t ld_gu, int64_t T, int64_t I, void* out, int64_t ld_out,
                         cudaStream_t stream) {
  const auto* g = static_cast<const TI*>(gu);
  auto* o = static_cast<TO*>(out);
  const auto aligned = [](const void* p, size_t elem) {
    return reinterpret_cast<uintptr_t>(p) % (4 * elem) == 0;
  };
  const bool vec =
      I % 4 == 0 && ld_gu % 4 == 0 && ld_out % 4 == 0 && aligned(gu, sizeof(TI)) && aligned(out, sizeof(TO));
  const int V = vec ? 4 : 1;
  const dim3 grid(grid_1d((I + V - 1) / V, kThreads), static_cast<unsigned>(std::min<int64_t>(T, 65535)));
  if (vec)
    kernel_swiglu<TI, TO, 4><<<grid, kThreads, 0, stream>>>(g, ld_gu, T, I, o, ld_out);
  else
    kernel_swiglu<TI, TO, 1><<<grid, kThreads, 0, stream>>>(g, ld_gu, T, I, o, ld_out);
  return cudaGetLastError();
}

// Thread per V columns of a row, rows along y (a grid-stride loop past 65535 rows): no index division.
template <class T, int V>
__global__ void __launch_bounds__(kThreads)
    kernel_convert(const float* __restrict__ x, int64_t ldx, int64_t rows, int64_t K, T* __restrict__ out) {
  pdl_enter();
  const int64_t k = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * V;
  if (k >= K) return;
  for (int64_t t = blockIdx.y; t < rows; t += gridDim.y) {
    float v[V];
    load_vals<V>(x + t * ldx + k, v);
    store_vals<V>(out + t * K + k, v);
  }
}

template <class T>
cudaError_t convert_typed(const float* x, int64_t ldx, int64_t T_, int64_t K, void* out,
                          cudaStream_t stream) {
  const bool vec = K % 4 == 0 && ldx % 4 == 0 && aligned16(x) && reinterpret_cast<uintptr_t>(out) % 8 == 0;
  const int V = vec ? 4 : 1;
  const dim3 grid(grid_1d((K + V - 1) / V, kThreads), static_cast<unsigned>(std::min<int64_t>(T_, 65535)));
  if (vec)
    return launch(kernel_convert<T, 4>, grid, dim3(kThreads), 0, stream, x, ldx, T_, K, static_cast<T*>(out));
  return launch(kernel_convert<T, 1>, grid, dim3(kThreads), 0, stream, x, ldx, T_, K, static_cast<T*>(out));
}

__global__ void kernel_gather(const float* __restrict__ src, int64_t ld_src, const int* __restrict__ rows,
                              int64_t cols, float* __restrict__ dst, int64_t ld_dst) {
  const int64_t i = blockIdx.x;
  const float* s = src + static_cast<int64_t>(rows[i]) * ld_src;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) dst[i * ld_dst + c] = s[c];
}

__global__ void kernel_scatter(const float* __restrict__ src, int64_t ld_src, const int* __restrict__ rows,
                               int64_t cols, float* __restrict__ dst, int64_t ld_dst) {
  const int64_t i = blockIdx.x;
  float* d = dst + static_cast<int64_t>(rows[i]) * ld_dst;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) d[c] = src[i * ld_src + c];
}

// (value, index) pairs: larger value wins, then lower index; NaN is below everything.
__device__ __forceinline__ bool better(float v, int64_t i, float bv, int64_t bi) {
  if (isnan(v)) return false;
  if (isnan(bv)) return true;
  return v > bv || (v == bv && i < bi);
}

constexpr int kArgmaxThreads = 1024;
constexpr int kArgmaxInFlight = 4;

__global__ void __launch_bounds__(kArgmaxThreads)
    kernel_argmax(const float* __restrict__ x, int64_t V, int* out) {
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  pdl_enter();
  const float* row = x + static_cast<int64_t>(blockIdx.x) * V;
  float bv = NAN;  // "none yet": any number beats NaN
  int64_t bi = V;
  const auto take = [&](float v, int64_t i) {
    if (better(v, i, bv, bi)) {
      bv = v;
      bi = i;
    }
  };
  if (V % 4 == 0 && aligned16(x)) {
    // One block reads the whole row (a vocabulary of 1 MB): 16-byte loads, kArgmaxInFlight of them in flight
    // per thread, or the scan is latency-bound. The order of the scan does not matter: better() is a total
    // order.
    const float4* r4 = reinterpret_cast<const float4*>(row);
    const int64_t n4 = V / 4;
    for (int64_t i0 = threadIdx.x; i0 < n4; i0 += kArgmaxThreads * kArgmaxInFlight) {
      float4 v[kArgmaxInFlight];
#pragma unroll
      for (int u = 0; u < kArgmaxInFlight; ++u) {
        const int64_t i = i0 + static_cast<int64_t>(u) * kArgmaxThreads;
        v[u] = i < n4 ? r4[i] : make_float4(NAN, NAN, NAN, NAN);
      }
#pragma unroll
      for (int u = 0; u < kArgmaxInFlight; ++u) {
        const int64_t i = 4 * (i0 + static_cast<int64_t>(u) * kArgmaxThreads);
        take(v[u].x, i);
        take(v[u].y, i + 1);
        take(v[u].z, i + 2);
        take(v[u].w, i + 3);
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < V; i += kArgmaxThreads) take(row[i], i);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (better(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  if (l == 0) {
    sv[w] = bv;
    si[w] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int j = 1; j < kArgmaxThreads / 32; ++j)
      if (better(sv[j], si[j], bv, bi)) {
        bv = sv[j];
        bi = si[j];
      }
    out[blockIdx.x] = bi < V ? static_cast<int>(bi) : 0;  // all NaN: 0
  }
}

__device__ __forceinline__ uint64_t mix64(uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

template <class T>
__global__ void kernel_fill(T* __restrict__ p, int64_t n, uint64_t seed, float scale, float shift) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const uint64_t h = mix64(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i));
    const float u = static_cast<float>(h >> 40) * (2.0f / 16777216.0f) - 1.0f;  // [-1, 1)
    p[i] = from_f32<T>(shift + scale * u);
  }
}

}  // namespace

cudaError_t swiglu(const void* gu, core::DType gu_type, int64_t ld_gu, int64_t T, int64_t I, void* out,
                   core::DType out_type, int64_t ld_out, cudaStream_t stream) {
  using core::DType;
  if (T * I == 0) return cudaSuccess;
  if (gu_type == DType::kF32) {
    if (out_type == DType::kF32) return swiglu_typed<float, float>(gu, ld_gu, T, I, out, ld_out, stream);
    if (out_type == DType::kBF16)
      return swiglu_typed<float, __nv_bfloat16>(gu, ld_gu, T, I, out, ld_out, stream);
    if (out_type == DType::kF16) return swiglu_typed<float, __half>(gu, ld_gu, T, I, out, ld_out, stream);
  } else if (gu_type == out_type) {
    if (gu_type == DType::kBF16)
      return swiglu_typed<__nv_bfloat16, __nv_bfloat16>(gu, ld_gu, T, I, out, ld_out, stream);
    if (gu_type == DType::kF16) return swiglu_typed<__half, __half>(gu, ld_gu, T, I, out, ld_out, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t convert_rows(const float* x, int64_t ldx, int64_t T, int64_t K, void* out, core::DType dtype,
                         cudaStream_t stream) {
  if (T * K == 0) return cudaSuccess;
  if (dtype == core::DType::kBF16) return convert_typed<__nv_bfloat16>(x, ldx, T, K, out, stream);
  if (dtype == core::DType::kF16) return convert_typed<__half>(x, ldx, T, K, out, stream);
  return cudaErrorInvalidValue;
}

cudaError_t gather_rows(const float* src, int64_t ld_src, const int* rows, int64_t n, int64_t cols,
                        float* dst, int64_t ld_dst, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  kernel_gather<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(src, ld_src, rows, cols, dst, ld_dst);
  return cudaGetLastError();
}

cudaError_t scatter_rows(const float* src, int64_t ld_src, const int* rows, int64_t n, int64_t cols,
                         float* dst, int64_t ld_dst, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  kernel_scatter<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(src, ld_src, rows, cols, dst, ld_dst);
  return cudaGetLastError();
}

cudaError_t argmax_rows(const float* x, int64_t rows, int64_t V, int* out, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return launch(kernel_argmax, dim3(static_cast<unsigned>(rows)), dim3(kArgmaxThreads), 0, stream, x, V, out);
}

cudaError_t fill_random(void* p, core::DType dtype, int64_t n, uint64_t seed, float scale, float shift,
                        cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const unsigned g = static_cast<unsigned>(std::min<int64_t>(grid_1d(n, kThreads), 65536));
  switch (dtype) {
    case core::DType::kBF16:
      kernel_fill<<<g, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(p), n, seed, scale, shift);
      break;
    case core::DType::kF16:
      kernel_fill<<<g, kThreads, 0, stream>>>(static_cast<__half*>(p), n, seed, scale, shift);
      break;
    case core::DType::kF32:
      kernel_fill<<<g, kThreads, 0, stream>>>(static_cast<float*>(p), n, seed, scale, shift);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace deltaflow::backend::cuda
