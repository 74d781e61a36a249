#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv.cuh"

namespace deltaflow::backend::cuda {
namespace {

constexpr int kThreads = 128;  // 4 warps per block
constexpr int kWarps = kThreads / 32;

struct GemvArgs {
  const void* W;
  int64_t N, K, w_stride;
  const int* expert;  // grouped form when set
  const float* x;
  int64_t ldx;
  int x_div;
  int T;
  float* y;
  int64_t ldy;
};

// Each warp owns R consecutive weight rows and streams them in 16-byte vectors (lane i takes vectors i, i+32,
// ...), U vectors per row in flight before the first use. Each weight vector meets all T <= TT activation
// rows while in registers, so the weights are read once however many rows x has.
//   y[t, n0 + r] = sum_k W[n0 + r, k] * x[t, k]
template <class WT, int R, int TT, int U>
__global__ void __launch_bounds__(kThreads) kernel_gemv_vec(GemvArgs a) {
  constexpr int kV = Vec16<WT>::kN;
  const int lane = threadIdx.x & 31;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * R;
  if (n0 >= a.N) return;
  const WT* W = static_cast<const WT*>(a.W);
  const float* x = a.x;
  float* y = a.y;
  if (a.expert) {
    const int g = blockIdx.y;
    W += static_cast<int64_t>(a.expert[g]) * a.w_stride;
    x += static_cast<int64_t>(g / a.x_div) * a.ldx;
    y += static_cast<int64_t>(g) * a.ldy;
  }
  const int64_t nvec = a.K / kV;
  const uint4* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = reinterpret_cast<const uint4*>(W + min(n0 + r, a.N - 1) * a.K);

  float acc[R][TT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < TT; ++t) acc[r][t] = 0.0f;

  for (int64_t base = lane; base < nvec; base += 32 * U) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + u * 32;
#pragma unroll
      for (int r = 0; r < R; ++r)
        wv[u][r] = i < nvec ? __ldcs(wr[r] + i) : make_uint4(0, 0, 0, 0);  // read once
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + u * 32;
      if (i < nvec) {
        float wf[R][kV];
#pragma unroll
        for (int r = 0; r < R; ++r) unpack16(wv[u][r], wf[r], WT{});
#pragma unroll
        for (int t = 0; t < TT; ++t) {
          if (t < a.T) {
            const float4* xp = reinterpret_cast<const float4*>(x + t * a.ldx + i * kV);
            float xv[kV];
#pragma unroll
            for (int q = 0; q < kV / 4; ++q) {
              const float4 f = xp[q];
              xv[4 * q] = f.x;
              xv[4 * q + 1] = f.y;
              xv[4 * q + 2] = f.z;
              xv[4 * q + 3] = f.w;
            }
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
              for (int j = 0; j < kV; ++j) acc[r][t] = fmaf(wf[r][j], xv[j], acc[r][t]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      if (t < a.T) {
        const float v = warp_sum(acc[r][t]);
        if (lane == 0 && n0 + r < a.N) y[t * a.ldy + n0 + r] = v;
      }
    }
}

// Any shape and alignment: one warp per weight row, lanes striding over k.
template <class WT>
__global__ void __launch_bounds__(kThreads) kernel_gemv_scalar(GemvArgs a) {
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (n >= a.N) return;
  const WT* W = static_cast<const WT*>(a.W);
  const float* x = a.x;
  float* y = a.y;
  if (a.expert) {
    const int g = blockIdx.y;
    W += static_cast<int64_t>(a.expert[g]) * a.w_stride;
    x += static_cast<int64_t>(g / a.x_div) * a.ldx;
    y += static_cast<int64_t>(g) * a.ldy;
  }
  const WT* row = W + n * a.K;
  for (int t = 0; t < a.T; ++t) {
    float acc = 0.0f;
    for (int64_t k = lane; k < a.K; k += 32) acc = fmaf(to_f32(row[k]), x[t * a.ldx + k], acc);
    acc = warp_sum(acc);
    if (lane == 0) y[t * a.ldy + n] = acc;
  }
}

template <class WT, int R, int TT, int U>
cudaError_t launch_vec(const GemvArgs& a, int groups, cudaStream_t s) {
  const dim3 grid(grid_1d(a.N, R * kWarps), static_cast<unsigned>(groups));
  kernel_gemv_vec<WT, R, TT, U><<<grid, kThreads, 0, s>>>(a);
  return cudaGetLastError();
}

// Rows per warp and vectors in flight shrink as the activation rows grow, to keep the accumulators in
// registers.
template <class WT>
cudaError_t dispatch(const GemvArgs& a, int groups, cudaStream_t s) {
  constexpr int kV = Vec16<WT>::kN;
  const bool vec = a.K % kV == 0 && reinterpret_cast<uintptr_t>(a.W) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && a.ldx % 4 == 0 &&
                   (a.expert == nullptr || (a.w_stride * static_cast<int64_t>(sizeof(WT))) % 16 == 0);
  if (!vec) {
    const dim3 grid(grid_1d(a.N, kWarps), static_cast<unsigned>(groups));
    kernel_gemv_scalar<WT><<<grid, kThreads, 0, s>>>(a);
    return cudaGetLastError();
  }
  if (a.T <= 1) return launch_vec<WT, 4, 1, 4>(a, groups, s);
  if (a.T <= 2) return launch_vec<WT, 4, 2, 4>(a, groups, s);
  if (a.T <= 4) return launch_vec<WT, 4, 4, 2>(a, groups, s);
  if (a.T <= 8) return launch_vec<WT, 2, 8, 2>(a, groups, s);
  if (a.T <= 16) return launch_vec<WT, 2, 16, 1>(a, groups, s);
  return launch_vec<WT, 2, 32, 1>(a, groups, s);
}

cudaError_t run(const GemvArgs& a, core::DType dtype, int groups, cudaStream_t s) {
  if (a.N == 0 || a.T == 0 || groups == 0) return cudaSuccess;
  if (a.T < 0 || a.T > kGemvMaxRows || groups > 65535 || a.x_div <= 0) return cudaErrorInvalidValue;
  switch (dtype) {
    case core::DType::kBF16:
      return dispatch<__nv_bfloat16>(a, groups, s);
    case core::DType::kF16:
      return dispatch<__half>(a, groups, s);
    case core::DType::kF32:
      return dispatch<float>(a, groups, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t gemv(const void* W, core::DType dtype, int64_t N, int64_t K, const float* x, int64_t ldx, int T,
                 float* y, int64_t ldy, cudaStream_t stream) {
  return run(GemvArgs{W, N, K, 0, nullptr, x, ldx, 1, T, y, ldy}, dtype, 1, stream);
}

cudaError_t gemv_grouped(const void* W, core::DType dtype, int64_t N, int64_t K, int64_t w_stride,
                         const int* expert, int groups, const float* x, int64_t ldx, int x_div, float* y,
                         int64_t ldy, cudaStream_t stream) {
  if (!expert) return cudaErrorInvalidValue;
  return run(GemvArgs{W, N, K, w_stride, expert, x, ldx, x_div, 1, y, ldy}, dtype, groups, stream);
}

}  // namespace deltaflow::backend::cuda
