#include "backend/cuda/moe_router.cuh"

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

__global__ void kernel_split_activations(const float* x, int64_t ldx, int64_t T, int64_t K,
                                         __nv_bfloat16* parts) {
  const int64_t n = T * K;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / K, k = i % K;
    const float v = x[t * ldx + k];
    const __nv_bfloat16 hi = __float2bfloat16_rn(v);
    const float r1 = v - __bfloat162float(hi);
    const __nv_bfloat16 mid = __float2bfloat16_rn(r1);
    parts[i] = hi;
    parts[n + i] = mid;
    parts[2 * n + i] = __float2bfloat16_rn(r1 - __bfloat162float(mid));
  }
}

__global__ void kernel_sum_parts(const float* y3, int64_t ldy, int64_t T, int64_t N, int64_t n_split,
                                 float* out0, int64_t ld0, float* out1, int64_t ld1) {
  const int64_t total = T * N;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / N, n = i % N;
    // Smallest first: lo + mid, then hi.
    const float v = (y3[(2 * T + t) * ldy + n] + y3[(T + t) * ldy + n]) + y3[t * ldy + n];
    if (n < n_split) {
      out0[t * ld0 + n] = v;
    } else {
      out1[t * ld1 + (n - n_split)] = v;
    }
  }
}

}  // namespace

cudaError_t moe_router_split_activations(const float* x, int64_t ldx, int64_t T, int64_t K, void* parts,
                                         cudaStream_t stream) {
  if (T < 0 || K < 0 || ldx < K || !parts) return cudaErrorInvalidValue;
  if (T == 0 || K == 0) return cudaSuccess;
  kernel_split_activations<<<grid_stride_256(T * K), 256, 0, stream>>>(x, ldx, T, K,
                                                                       static_cast<__nv_bfloat16*>(parts));
  return cudaGetLastError();
}

cudaError_t moe_router_sum_parts(const float* y3, int64_t ldy, int64_t T, int64_t N, int64_t n_split,
                                 float* out0, int64_t ld0, float* out1, int64_t ld1, cudaStream_t stream) {
  if (T < 0 || N < 0 || n_split < 0 || n_split > N || ldy < N || (n_split < N && !out1) ||
      (n_split > 0 && ld0 < n_split) || (n_split < N && ld1 < N - n_split))
    return cudaErrorInvalidValue;
  if (T == 0 || N == 0) return cudaSuccess;
  kernel_sum_parts<<<grid_stride_256(T * N), 256, 0, stream>>>(y3, ldy, T, N, n_split, out0, ld0, out1, ld1);
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
