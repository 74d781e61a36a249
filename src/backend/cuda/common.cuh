// Device-side helpers shared by the kernels (included by .cu files only): element conversions, 16-byte vector
// unpacking, warp and block reductions, and the launch-error check every launcher ends with.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.hpp"

namespace deltaflow::backend::cuda {

__device__ __forceinline__ float to_f32(float x) {
  return x;
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float to_f32(__half x) {
  return __half2float(x);
}

template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);  // round to nearest even, as torch's .to(torch.bfloat16)
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) {
  return __float2half_rn(x);
}

// A 16-byte vector of weights, unpacked to fp32: 8 bf16 / 8 f16 / 4 f32 elements.
template <class T>
struct Vec16 {
  static constexpr int kN = 16 / static_cast<int>(sizeof(T));
};

__device__ __forceinline__ void unpack16(const uint4& v, float (&out)[8], __nv_bfloat16) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = __uint_as_float(w[i] << 16);              // low half: element 2i
    out[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);  // high half: element 2i+1
  }
}
__device__ __forceinline__ void unpack16(const uint4& v, float (&out)[8], __half) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    __half2 h;
    memcpy(&h, &w[i], 4);
    const float2 f = __half22float2(h);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void unpack16(const uint4& v, float (&out)[4], float) {
  out[0] = __uint_as_float(v.x);
  out[1] = __uint_as_float(v.y);
  out[2] = __uint_as_float(v.z);
  out[3] = __uint_as_float(v.w);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// The warp's largest v, ties to the lowest index i; every lane ends with the winner.
template <class Index>
__device__ __forceinline__ void warp_argmax(float& v, Index& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const Index oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) {
      v = ov;
      i = oi;
    }
  }
}

// Sum over the block, returned to every thread. `red` is shared scratch of at least 32 floats. Starts with a
// barrier so the scratch can be reused by back-to-back calls.
__device__ __forceinline__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (l == 0) red[w] = v;
  __syncthreads();
  float t = 0.0f;
  for (int i = 0; i < nw; ++i) t += red[i];
  return t;
}
// The block's largest v, as block_sum.
__device__ __forceinline__ float block_max(float v, float* red) {
  v = warp_max(v);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (l == 0) red[w] = v;
  __syncthreads();
  float t = red[0];
  for (int i = 1; i < nw; ++i) t = fmaxf(t, red[i]);
  return t;
}
// Two sums at once; `red` holds at least 64 floats.
__device__ __forceinline__ float2 block_sum2(float a, float b, float* red) {
  a = warp_sum(a);
  b = warp_sum(b);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (l == 0) {
    red[w] = a;
    red[32 + w] = b;
  }
  __syncthreads();
  float ta = 0.0f, tb = 0.0f;
  for (int i = 0; i < nw; ++i) {
    ta += red[i];
    tb += red[32 + i];
  }
  return make_float2(ta, tb);
}
// Two maxima at once, as block_sum2; `red` holds at least 64 floats.
__device__ __forceinline__ float2 block_max2(float a, float b, float* red) {
  a = warp_max(a);
  b = warp_max(b);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (l == 0) {
    red[w] = a;
    red[32 + w] = b;
  }
  __syncthreads();
  float ta = red[0], tb = red[32];
  for (int i = 1; i < nw; ++i) {
    ta = fmaxf(ta, red[i]);
    tb = fmaxf(tb, red[32 + i]);
  }
  return make_float2(ta, tb);
}

// V consecutive values of a row: 16-byte (fp32) or 8-byte (16-bit) accesses when V == 4.
template <int V, class T>
__device__ __forceinline__ void load_vals(const T* p, float (&v)[V]) {
  if constexpr (V == 4 && std::is_same_v<T, float>) {
    const float4 f = *reinterpret_cast<const float4*>(p);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else if constexpr (V == 4) {
    alignas(8) T h[4];
    *reinterpret_cast<uint2*>(h) = *reinterpret_cast<const uint2*>(p);
#pragma unroll
    for (int q = 0; q < 4; ++q) v[q] = to_f32(h[q]);
  } else {
#pragma unroll
    for (int q = 0; q < V; ++q) v[q] = to_f32(p[q]);
  }
}

template <int V, class T>
__device__ __forceinline__ void store_vals(T* p, const float (&v)[V]) {
  if constexpr (V == 4 && std::is_same_v<T, float>) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else if constexpr (V == 4) {
    alignas(8) T h[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) h[q] = from_f32<T>(v[q]);
    *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(h);
  } else {
#pragma unroll
    for (int q = 0; q < V; ++q) p[q] = from_f32<T>(v[q]);
  }
}

// The reference's scalar functions (backend/cpu/ops.hpp), with the accurate (not fast-math) intrinsics.
__device__ __forceinline__ float silu_f(float x) {
  return x / (1.0f + expf(-x));
}
__device__ __forceinline__ float sigmoid_f(float x) {
  return 1.0f / (1.0f + expf(-x));
}
__device__ __forceinline__ float softplus_f(float x) {
  return x > 20.0f ? x : log1pf(expf(x));
}

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// Whether p may be read with 16-byte vector loads.
__host__ __device__ inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

inline unsigned grid_1d(int64_t n, int threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// Blocks of 256 threads for a grid-stride loop over n items: one item a thread, up to `cap` blocks.
inline unsigned grid_stride_256(int64_t n, int64_t cap = 8192) {
  const int64_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < cap ? blocks : cap);
}

// An attribute of the current device, or `fallback` when it cannot be read (the error is cleared). Callers
// keep the answer in a function-local static: it is asked once per process.
inline int current_device_attribute(cudaDeviceAttr attr, int fallback) {
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess) {
    cudaGetLastError();
    return fallback;
  }
  return v;
}

}  // namespace deltaflow::backend::cuda
