#include "backend/cuda/moe_router.cuh"

#include <algorithm>

#include "backend/cuda/common.cuh"

namespace deltaflow::backend::cuda {
namespace {

constexpr int kTokens = 64;  // tokens per block tile
constexpr int kRows = 64;    // weight rows per block tile
constexpr int kDepth = 32;   // k per shared-memory stage
constexpr int kThreads = 256;
constexpr int kPer = 4;  // tokens and rows per thread: a 4 x 4 block of sums
static_assert(kTokens / kPer * (kRows / kPer) == kThreads, "one 4x4 block of sums per thread");

struct TiledArgs {
  const void* W;
  int64_t N, n_split, K;
  const float* x;
  int64_t ldx, T;
  float* out0;
  int64_t ld0;
  float* out1;
  int64_t ld1;
};

// Block (row tile blockIdx.x, token tile blockIdx.y). Shared tiles are [k][token] and [k][row], one float of
// padding per row so the stores (k fastest, coalesced global reads) fall in distinct banks. Thread (tr, tt)
// owns rows tr + 16 j (a warp reads 16 neighbouring words, and stores neighbouring outputs) and tokens
// 4 tt + i of the tile.
template <class WT>
__global__ void __launch_bounds__(kThreads) kernel_router_logits_tiled(TiledArgs a) {
  __shared__ float xs[kDepth][kTokens + 1];
  __shared__ float ws[kDepth][kRows + 1];
  const WT* W = static_cast<const WT*>(a.W);
  const int tid = threadIdx.x, tr = tid % (kRows / kPer), tt = tid / (kRows / kPer);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kRows,
                t0 = static_cast<int64_t>(blockIdx.y) * kTokens;

  float acc[kPer][kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i)
#pragma unroll
    for (int j = 0; j < kPer; ++j) acc[i][j] = 0.0f;

  for (int64_t k0 = 0; k0 < a.K; k0 += kDepth) {
#pragma unroll
    for (int it = 0; it < kTokens * kDepth / kThreads; ++it) {
      const int e = tid + it * kThreads, r = e / kDepth, k = e % kDepth;
      const int64_t t = t0 + r, n = n0 + r, kk = k0 + k;
      xs[k][r] = t < a.T && kk < a.K ? a.x[t * a.ldx + kk] : 0.0f;
      ws[k][r] = n < a.N && kk < a.K ? to_f32(W[n * a.K + kk]) : 0.0f;
    }
    __syncthreads();
#pragma unroll 8
    for (int k = 0; k < kDepth; ++k) {
      float xv[kPer], wv[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        xv[i] = xs[k][tt * kPer + i];
        wv[i] = ws[k][tr + i * (kRows / kPer)];
      }
#pragma unroll
      for (int i = 0; i < kPer; ++i)
#pragma unroll
        for (int j = 0; j < kPer; ++j) acc[i][j] = fmaf(xv[i], wv[j], acc[i][j]);
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int64_t t = t0 + tt * kPer + i;
    if (t >= a.T) continue;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t n = n0 + tr + j * (kRows / kPer);
      if (n >= a.N) continue;
      if (n < a.n_split) {
        a.out0[t * a.ld0 + n] = acc[i][j];
      } else {
        a.out1[t * a.ld1 + (n - a.n_split)] = acc[i][j];
      }
    }
  }
}

// One block per token row (rows strided by the grid): the row's three parts, and its dot with w_dot in fp32
// (summed per thread in column order, then over the block). V = 4 when x's rows, the parts' rows and w_dot
// take 16-, 8- and 8-byte vectors.
template <int V>
__global__ void __launch_bounds__(256)
    kernel_split_activations(const float* x, int64_t ldx, int64_t T, int64_t K, __nv_bfloat16* parts,
                             const __nv_bfloat16* w_dot, float* dot_out, int64_t ld_dot) {
  __shared__ float warp_sums[256 / 32];
  const int64_t n = T * K;
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const float* xr = x + t * ldx;
    __nv_bfloat16* p = parts + t * K;
    float dot = 0.0f;
    for (int64_t k = static_cast<int64_t>(threadIdx.x) * V; k < K; k += 256 * V) {
      float v[V];
      __nv_bfloat16 hi[V], mid[V], lo[V];
      if constexpr (V == 4) {
        const float4 f = *reinterpret_cast<const float4*>(xr + k);
        v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
      } else {
        v[0] = xr[k];
      }
#pragma unroll
      for (int i = 0; i < V; ++i) {
        hi[i] = __float2bfloat16_rn(v[i]);
        const float r1 = v[i] - __bfloat162float(hi[i]);
        mid[i] = __float2bfloat16_rn(r1);
        lo[i] = __float2bfloat16_rn(r1 - __bfloat162float(mid[i]));
      }
      if constexpr (V == 4) {
        *reinterpret_cast<uint2*>(p + k) = *reinterpret_cast<const uint2*>(hi);
        *reinterpret_cast<uint2*>(p + n + k) = *reinterpret_cast<const uint2*>(mid);
        *reinterpret_cast<uint2*>(p + 2 * n + k) = *reinterpret_cast<const uint2*>(lo);
      } else {
        p[k] = hi[0], p[n + k] = mid[0], p[2 * n + k] = lo[0];
      }
      if (w_dot) {
        __nv_bfloat16 w[V];
        if constexpr (V == 4) {
          *reinterpret_cast<uint2*>(w) = *reinterpret_cast<const uint2*>(w_dot + k);
        } else {
          w[0] = w_dot[k];
        }
#pragma unroll
        for (int i = 0; i < V; ++i) dot = fmaf(v[i], __bfloat162float(w[i]), dot);
      }
    }
    if (w_dot) {  // uniform over the block: every thread takes this branch or none does
#pragma unroll
      for (int o = 16; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = dot;
      __syncthreads();
      if (threadIdx.x == 0) {
        float s = 0.0f;
#pragma unroll
        for (int w = 0; w < 256 / 32; ++w) s += warp_sums[w];
        dot_out[t * ld_dot] = s;
      }
      __syncthreads();  // warp_sums is read before the next row writes it
    }
  }
}

// One block per token row: lo + mid + hi of each of its N sums.
__global__ void __launch_bounds__(256)
    kernel_sum_parts(const float* y3, int64_t ldy, int64_t T, int64_t N, int64_t n_split, float* out0,
                     int64_t ld0, float* out1, int64_t ld1) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const float* hi = y3 + t * ldy;
    const float* mid = hi + T * ldy;
    const float* lo = mid + T * ldy;
    for (int64_t c = threadIdx.x; c < N; c += 256) {
      const float v = (lo[c] + mid[c]) + hi[c];  // smallest first
      if (c < n_split) {
        out0[t * ld0 + c] = v;
      } else {
        out1[t * ld1 + (c - n_split)] = v;
      }
    }
  }
}

}  // namespace

cudaError_t moe_router_split_activations(const float* x, int64_t ldx, int64_t T, int64_t K, void* parts,
                                         const void* w_dot, float* dot_out, int64_t ld_dot,
                                         cudaStream_t stream) {
  if (T < 0 || K < 0 || ldx < K || !parts || (w_dot && (!dot_out || ld_dot < 1)))
    return cudaErrorInvalidValue;
  if (T == 0 || K == 0) return cudaSuccess;
  const auto at = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  const bool vec = K % 4 == 0 && ldx % 4 == 0 && at(x, 16) && at(parts, 8) && (!w_dot || at(w_dot, 8));
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(T, 65535));
  auto* p = static_cast<__nv_bfloat16*>(parts);
  const auto* w = static_cast<const __nv_bfloat16*>(w_dot);
  if (vec) {
    kernel_split_activations<4><<<grid, 256, 0, stream>>>(x, ldx, T, K, p, w, dot_out, ld_dot);
  } else {
    kernel_split_activations<1><<<grid, 256, 0, stream>>>(x, ldx, T, K, p, w, dot_out, ld_dot);
  }
  return cudaGetLastError();
}

cudaError_t moe_router_sum_parts(const float* y3, int64_t ldy, int64_t T, int64_t N, int64_t n_split,
                                 float* out0, int64_t ld0, float* out1, int64_t ld1, cudaStream_t stream) {
  if (T < 0 || N < 0 || n_split < 0 || n_split > N || ldy < N || (n_split < N && !out1) ||
      (n_split > 0 && ld0 < n_split) || (n_split < N && ld1 < N - n_split))
    return cudaErrorInvalidValue;
  if (T == 0 || N == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(T, 65535));
  kernel_sum_parts<<<grid, 256, 0, stream>>>(y3, ldy, T, N, n_split, out0, ld0, out1, ld1);
  return cudaGetLastError();
}

cudaError_t moe_router_logits_tiled(const void* W, core::DType dtype, int64_t N, int64_t n_split, int64_t K,
                                    const float* x, int64_t ldx, int64_t T, float* out0, int64_t ld0,
                                    float* out1, int64_t ld1, cudaStream_t stream) {
  if (T < 0 || N < 0 || K < 0 || n_split < 0 || n_split > N || (n_split < N && !out1) || ldx < K ||
      (n_split > 0 && ld0 < n_split) || (n_split < N && ld1 < N - n_split))
    return cudaErrorInvalidValue;
  const int64_t row_tiles = (N + kRows - 1) / kRows, token_tiles = (T + kTokens - 1) / kTokens;
  if (row_tiles > 0x7fffffff || token_tiles > 65535) return cudaErrorInvalidValue;
  if (T == 0 || N == 0) return cudaSuccess;
  const TiledArgs a{W, N, n_split, K, x, ldx, T, out0, ld0, out1, ld1};
  const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(token_tiles));
  switch (dtype) {
    case core::DType::kBF16:
      kernel_router_logits_tiled<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(a);
      break;
    case core::DType::kF16:
      kernel_router_logits_tiled<__half><<<grid, kThreads, 0, stream>>>(a);
      break;
    case core::DType::kF32:
      kernel_router_logits_tiled<float><<<grid, kThreads, 0, stream>>>(a);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace deltaflow::backend::cuda
