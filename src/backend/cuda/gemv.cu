#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/conv1d_step.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"

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
  const void* x16;  // [T, K] packed, the tensor-core kernel's activations
  int x_div;
  int T;
  float* y;
  int64_t ldy;
  int64_t n_out;  // output columns: N, or N / 2 with SwiGLU
  GemvConv conv;
};

// y[t, n] = v, and the conv1d step of column n when the launch carries one (gemv.cuh): the window is
// [state | v] (conv1d_step, as causal_conv1d_decode), and the state shifts by one.
__device__ __forceinline__ void store_out(const GemvArgs& a, float* y, int t, int64_t n, float v) {
  y[t * a.ldy + n] = v;
  const GemvConv& c = a.conv;
  if (c.w == nullptr || n >= c.C) return;
  float* st = c.states + static_cast<int64_t>(c.slots[t]) * c.slot_stride + n * (c.K - 1);
  c.out[t * c.ld_out + n] = conv1d_step(st, c.w + n * c.K, c.K, v);
}

// Output rows of a warp's weight rows: with SwiGLU the first half of the R rows are gate rows o0 + r, the
// second half the matching up rows n_out + o0 + r.
template <int R, bool SW>
__device__ __forceinline__ int64_t weight_row(int64_t o0, int r, int64_t n_out) {
  constexpr int kOut = SW ? R / 2 : R;
  const int64_t o = min64(o0 + (r % kOut), n_out - 1);
  return SW && r >= kOut ? o + n_out : o;
}

// ---- SIMT kernel
// ---------------------------------------------------------------------------------------------- A block is
// kWarps / KS row groups of KS warps; a group owns R consecutive weight rows (R/2 outputs with SwiGLU) and
// its warps take interleaved 32-vector stretches of K (lane i of warp p: vectors 32 (p + KS j) + i), U
// stretches in flight before the first use. Each weight vector meets all T <= TT activation rows while in
// registers.
template <class WT, int R, int TT, int U, int KS, bool SW>
__global__ void __launch_bounds__(kThreads) kernel_gemv_simt(GemvArgs a) {
  constexpr int kV = Vec16<WT>::kN;
  constexpr int kGroups = kWarps / KS;
  constexpr int kOut = SW ? R / 2 : R;
  __shared__ float red[kWarps][R * TT];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int grp = warp / KS, kp = warp % KS;
  const int64_t o0 = (static_cast<int64_t>(blockIdx.x) * kGroups + grp) * kOut;
  const bool active = o0 < a.n_out;
  const WT* W = static_cast<const WT*>(a.W);
  const float* x = a.x;
  float* y = a.y;
  if (a.expert) {
    pdl_wait();
    const int g = blockIdx.y;
    W += static_cast<int64_t>(a.expert[g]) * a.w_stride;
    x += static_cast<int64_t>(g / a.x_div) * a.ldx;
    y += static_cast<int64_t>(g) * a.ldy;
  }
  const int64_t nvec = a.K / kV;
  const uint4* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r)
    wr[r] = reinterpret_cast<const uint4*>(W + weight_row<R, SW>(active ? o0 : 0, r, a.n_out) * a.K);

  // Before the previous kernel has finished (launch.cuh): bring the first stretch of this warp's weights
  // into L2. The grouped form's expert ids come from that kernel, so it waits first.
  pdl_launch_dependents();
  if (active && !a.expert) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = static_cast<int64_t>(kp) * 32 + lane + static_cast<int64_t>(u) * 32 * KS;
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (i < nvec) prefetch_l2(wr[r] + i);
    }
  }
  pdl_wait();

  float acc[R][TT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < TT; ++t) acc[r][t] = 0.0f;

  if (active) {
    for (int64_t base = static_cast<int64_t>(kp) * 32 + lane; base < nvec; base += 32 * KS * U) {
      uint4 wv[U][R];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t i = base + static_cast<int64_t>(u) * 32 * KS;
#pragma unroll
        for (int r = 0; r < R; ++r)
          wv[u][r] = i < nvec ? __ldcs(wr[r] + i) : make_uint4(0, 0, 0, 0);  // read once
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t i = base + static_cast<int64_t>(u) * 32 * KS;
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
  }
  // Each warp's sums, then the group's KS parts in a fixed order.
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      const float v = warp_sum(acc[r][t]);
      if (lane == 0) red[warp][r * TT + t] = v;
    }
  __syncthreads();
  if (!active || kp != 0) return;
  for (int j = lane; j < kOut * TT; j += 32) {  // kOut * TT can exceed a warp (R = 2, TT = 32)
    const int r = j / TT, t = j % TT;
    if (t >= a.T || o0 + r >= a.n_out) continue;
    float s = 0.0f, u = 0.0f;
#pragma unroll
    for (int p = 0; p < KS; ++p) s += red[grp * KS + p][r * TT + t];
    if constexpr (SW) {
#pragma unroll
      for (int p = 0; p < KS; ++p) u += red[grp * KS + p][(r + kOut) * TT + t];
      s = silu_f(s) * u;
    }
    store_out(a, y, t, o0 + r, s);
  }
}

// Any shape and alignment: one warp per output row, lanes striding over k.
template <class WT>
__global__ void __launch_bounds__(kThreads) kernel_gemv_scalar(GemvArgs a, bool sw) {
  pdl_enter();
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (n >= a.n_out) return;
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
  const WT* up = sw ? W + (n + a.n_out) * a.K : row;
  for (int t = 0; t < a.T; ++t) {
    float acc = 0.0f, acc_u = 0.0f;
    for (int64_t k = lane; k < a.K; k += 32) {
      acc = fmaf(to_f32(row[k]), x[t * a.ldx + k], acc);
      if (sw) acc_u = fmaf(to_f32(up[k]), x[t * a.ldx + k], acc_u);
    }
    acc = warp_sum(acc);
    if (sw) acc = silu_f(acc) * warp_sum(acc_u);
    if (lane == 0) store_out(a, y, t, n, acc);
  }
}

// ---- tensor-core kernel
// --------------------------------------------------------------------------------------- A warp owns MT
// tiles of 16 weight rows (with SwiGLU: 8 gate rows over the 8 matching up rows) and TN tiles of 8 activation
// rows. Per 32-wide k block, lane (g = lane / 4, q = lane % 4) loads the 8 elements [8q, 8q + 8) of weight
// rows g and g + 8 and of activation row g: words 0-1 of each feed the first m16n8k16 and words 2-3 the
// second, as logical k {2q, 2q+1, 2q+8, 2q+9} of each. The KS warps of a group take interleaved k blocks and
// add their accumulators in shared memory in a fixed order.
template <class WT, int MT, int TN, int U, int KS, bool SW>
__global__ void __launch_bounds__(kThreads) kernel_gemv_mma(GemvArgs a) {
  constexpr int kGroups = kWarps / KS;
  constexpr int kTileOut = SW ? 8 : 16;
  constexpr int kAcc = MT * TN * 4;
  __shared__ float red[KS > 1 ? kWarps : 1][KS > 1 ? kAcc : 1][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int grp = warp / KS, kp = warp % KS;
  const int g = lane >> 2, q = lane & 3;
  const int64_t o0 = (static_cast<int64_t>(blockIdx.x) * kGroups + grp) * (kTileOut * MT);
  const bool active = o0 < a.n_out;
  const WT* W = static_cast<const WT*>(a.W);
  const WT* X = static_cast<const WT*>(a.x16);

  const uint4 *wlo[MT], *whi[MT], *xr[TN];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    int64_t lo, hi;
    if constexpr (SW) {
      lo = min64(o0 + m * 8 + g, a.n_out - 1);
      hi = lo + a.n_out;
    } else {
      lo = min64(o0 + m * 16 + g, a.N - 1);
      hi = min64(o0 + m * 16 + g + 8, a.N - 1);
    }
    wlo[m] = reinterpret_cast<const uint4*>(W + lo * a.K) + q;
    whi[m] = reinterpret_cast<const uint4*>(W + hi * a.K) + q;
  }
#pragma unroll
  for (int j = 0; j < TN; ++j)
    xr[j] = reinterpret_cast<const uint4*>(X + static_cast<int64_t>(min(j * 8 + g, a.T - 1)) * a.K) + q;

  const int64_t nblk = a.K / 32;
  pdl_launch_dependents();  // and the first k blocks of the weights into L2 (launch.cuh)
  if (active) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t blk = kp + static_cast<int64_t>(u) * KS;
#pragma unroll
      for (int m = 0; m < MT; ++m)
        if (blk < nblk) {
          prefetch_l2(wlo[m] + blk * 4);
          prefetch_l2(whi[m] + blk * 4);
        }
    }
  }
  pdl_wait();

  float acc[MT][TN][4];
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < TN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][j][e] = 0.0f;

  if (active) {
    for (int64_t b0 = kp; b0 < nblk; b0 += KS * U) {
      uint4 wl[U][MT], wh[U][MT], xv[U][TN];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t blk = b0 + static_cast<int64_t>(u) * KS;
        const bool ok = blk < nblk;
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          wl[u][m] = ok ? __ldcs(wlo[m] + blk * 4) : make_uint4(0, 0, 0, 0);
          wh[u][m] = ok ? __ldcs(whi[m] + blk * 4) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < TN; ++j) xv[u][j] = ok ? __ldg(xr[j] + blk * 4) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int j = 0; j < TN; ++j) {
            mma_m16n8k16<WT>(acc[m][j], wl[u][m].x, wh[u][m].x, wl[u][m].y, wh[u][m].y, xv[u][j].x,
                             xv[u][j].y);
            mma_m16n8k16<WT>(acc[m][j], wl[u][m].z, wh[u][m].z, wl[u][m].w, wh[u][m].w, xv[u][j].z,
                             xv[u][j].w);
          }
    }
  }
  if constexpr (KS > 1) {
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < TN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[warp][(m * TN + j) * 4 + e][lane] = acc[m][j][e];
    __syncthreads();
    if (kp != 0) return;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int j = 0; j < TN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float s = 0.0f;
#pragma unroll
          for (int p = 0; p < KS; ++p) s += red[grp * KS + p][(m * TN + j) * 4 + e][lane];
          acc[m][j][e] = s;
        }
  }
  if (!active) return;
    // Accumulator e of tile (m, j): weight row g (e < 2) or g + 8 (e >= 2), activation row 8j + 2q + (e & 1).
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int j = 0; j < TN; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int t = j * 8 + 2 * q + c;
        if (t >= a.T) continue;
        if constexpr (SW) {
          const int64_t o = o0 + m * 8 + g;
          if (o < a.n_out) a.y[t * a.ldy + o] = silu_f(acc[m][j][c]) * acc[m][j][2 + c];
        } else {
          const int64_t o = o0 + m * 16 + g;
          if (o < a.N) a.y[t * a.ldy + o] = acc[m][j][c];
          if (o + 8 < a.N) a.y[t * a.ldy + o + 8] = acc[m][j][2 + c];
        }
      }
}

// ---- plans and dispatch
// ---------------------------------------------------------------------------------------
struct SimtPlan {
  int R, U, KS;
};
struct MmaPlan {
  int MT, U, KS;
};
constexpr SimtPlan kSimtPlans[] = {{4, 4, 1}, {2, 4, 1}, {4, 4, 2}, {2, 4, 2}, {4, 4, 4},
                                   {2, 4, 4}, {2, 8, 4}, {4, 2, 4}, {2, 2, 4}};
constexpr MmaPlan kMmaPlans[] = {{1, 4, 1}, {1, 4, 2}, {1, 4, 4}, {2, 2, 4}, {2, 4, 2}, {1, 2, 4}, {2, 2, 2}};
constexpr int kNumSimt = sizeof(kSimtPlans) / sizeof(kSimtPlans[0]);
constexpr int kNumMma = sizeof(kMmaPlans) / sizeof(kMmaPlans[0]);

// The dispatcher's plans, from the timing sweep on the H200 (cuda_gemv_test.cpp, DISABLED_TimingSweep27B,
// Qwen3.6-27B shapes): SIMT "R4 U2 KS4" was within 3% of the best plan on every shape at T = 1 and 4
// (3.0-4.5 TB/s); tensor cores "MT1 U2 KS4" up to 16 rows and "MT2 U2 KS4" at 32. One SIMT plan for every
// T keeps the batch invariance above.
int default_simt_plan(bool grouped) {
  return grouped ? 0 : 7;
}
int default_mma_plan(int T) {
  return T > 16 ? 3 : 5;
}

template <class WT, int R, int TT, int U, int KS>
cudaError_t launch_simt(const GemvArgs& a, bool sw, int groups, cudaStream_t s) {
  constexpr int kGroups = kWarps / KS;
  const int out_per_warp = sw ? R / 2 : R;
  const dim3 grid(grid_1d(a.n_out, out_per_warp * kGroups), static_cast<unsigned>(groups));
  if (sw) {
    if constexpr (R >= 2) {
      return launch(kernel_gemv_simt<WT, R, TT, U, KS, true>, grid, dim3(kThreads), 0, s, a);
    } else {
      return cudaErrorInvalidValue;
    }
  }
  return launch(kernel_gemv_simt<WT, R, TT, U, KS, false>, grid, dim3(kThreads), 0, s, a);
}

template <class WT, int TT>
cudaError_t simt_by_plan(const GemvArgs& a, bool sw, int groups, int plan, cudaStream_t s) {
  // Fewer vectors in flight as the activation rows grow, to keep the accumulators in registers.
  constexpr int kShrink = TT >= 4 ? 2 : 1;
  switch (plan) {
#define DF_SIMT_PLAN(i)                                                                                    \
  case i:                                                                                                  \
    return launch_simt<WT, kSimtPlans[i].R, TT,                                                            \
                       (kSimtPlans[i].U / kShrink > 0 ? kSimtPlans[i].U / kShrink : 1), kSimtPlans[i].KS>( \
        a, sw, groups, s);
    DF_SIMT_PLAN(0)
    DF_SIMT_PLAN(1)
    DF_SIMT_PLAN(2)
    DF_SIMT_PLAN(3)
    DF_SIMT_PLAN(4)
    DF_SIMT_PLAN(5)
    DF_SIMT_PLAN(6)
    DF_SIMT_PLAN(7)
    DF_SIMT_PLAN(8)
#undef DF_SIMT_PLAN
    default:
      return cudaErrorInvalidValue;
  }
}

template <class WT, int MT, int TN, int U, int KS>
cudaError_t launch_mma(const GemvArgs& a, bool sw, cudaStream_t s) {
  constexpr int kGroups = kWarps / KS;
  const int out_per_warp = (sw ? 8 : 16) * MT;
  const dim3 grid(grid_1d(a.n_out, out_per_warp * kGroups));
  if (sw) return launch(kernel_gemv_mma<WT, MT, TN, U, KS, true>, grid, dim3(kThreads), 0, s, a);
  return launch(kernel_gemv_mma<WT, MT, TN, U, KS, false>, grid, dim3(kThreads), 0, s, a);
}

template <class WT, int TN>
cudaError_t mma_by_plan(const GemvArgs& a, bool sw, int plan, cudaStream_t s) {
  switch (plan) {
#define DF_MMA_PLAN(i) \
  case i:              \
    return launch_mma<WT, kMmaPlans[i].MT, TN, kMmaPlans[i].U, kMmaPlans[i].KS>(a, sw, s);
    DF_MMA_PLAN(0)
    DF_MMA_PLAN(1)
    DF_MMA_PLAN(2)
    DF_MMA_PLAN(3)
    DF_MMA_PLAN(4)
    DF_MMA_PLAN(5)
    DF_MMA_PLAN(6)
#undef DF_MMA_PLAN
    default:
      return cudaErrorInvalidValue;
  }
}

template <class WT>
bool simt_vectorizable(const GemvArgs& a) {
  constexpr int kV = Vec16<WT>::kN;
  return a.K % kV == 0 && aligned16(a.W) && aligned16(a.x) && a.ldx % 4 == 0 &&
         (a.expert == nullptr || (a.w_stride * static_cast<int64_t>(sizeof(WT))) % 16 == 0);
}

template <class WT>
cudaError_t dispatch(const GemvArgs& a, bool sw, int groups, int plan, bool want_mma, cudaStream_t s) {
  if constexpr (sizeof(WT) == 2) {
    const bool mma_ok = a.x16 != nullptr && a.expert == nullptr && a.T > kGemvSimtRows && a.K % 32 == 0 &&
                        aligned16(a.W) && aligned16(a.x16);
    if (mma_ok && want_mma) {
      if (a.conv.w) return cudaErrorInvalidValue;  // the conv epilogue is on the SIMT and scalar kernels only
      const int p = plan >= 0 ? plan : default_mma_plan(a.T);
      if (a.T <= 8) return mma_by_plan<WT, 1>(a, sw, p, s);
      if (a.T <= 16) return mma_by_plan<WT, 2>(a, sw, p, s);
      return mma_by_plan<WT, 4>(a, sw, p, s);
    }
    if (want_mma && plan >= 0) return cudaErrorInvalidValue;  // a tuning run asked for what cannot run
  }
  if (!simt_vectorizable<WT>(a)) {
    const dim3 grid(grid_1d(a.n_out, kWarps), static_cast<unsigned>(groups));
    return launch(kernel_gemv_scalar<WT>, grid, dim3(kThreads), 0, s, a, sw);
  }
  const int p = plan >= 0 ? plan : default_simt_plan(a.expert != nullptr);
  if (a.T <= 1) return simt_by_plan<WT, 1>(a, sw, groups, p, s);
  if (a.T <= 2) return simt_by_plan<WT, 2>(a, sw, groups, p, s);
  if (a.T <= 4) return simt_by_plan<WT, 4>(a, sw, groups, p, s);
  if (a.T <= 8) return launch_simt<WT, 2, 8, 2, 1>(a, sw, groups, s);
  if (a.T <= 16) return launch_simt<WT, 2, 16, 1, 1>(a, sw, groups, s);
  return launch_simt<WT, 2, 32, 1, 1>(a, sw, groups, s);
}

cudaError_t run(GemvArgs a, core::DType dtype, bool sw, int groups, int plan, bool want_mma, cudaStream_t s) {
  if (a.N == 0 || a.T == 0 || groups == 0) return cudaSuccess;
  if (a.T < 0 || a.T > kGemvMaxRows || groups > 65535 || a.x_div <= 0 || (sw && a.N % 2 != 0))
    return cudaErrorInvalidValue;
  if (a.conv.w && (sw || a.expert || a.conv.K < 1 || a.conv.K > kMaxConvKernel || a.conv.C > a.N ||
                   !a.conv.states || !a.conv.slots || !a.conv.out))
    return cudaErrorInvalidValue;
  a.n_out = sw ? a.N / 2 : a.N;
  switch (dtype) {
    case core::DType::kBF16:
      return dispatch<__nv_bfloat16>(a, sw, groups, plan, want_mma, s);
    case core::DType::kF16:
      return dispatch<__half>(a, sw, groups, plan, want_mma, s);
    case core::DType::kF32:
      if (want_mma && plan >= 0) return cudaErrorInvalidValue;
      return dispatch<float>(a, sw, groups, plan, false, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t gemv(const void* W, core::DType dtype, int64_t N, int64_t K, const float* x, int64_t ldx,
                 const void* x16, int T, const GemvOut& out, cudaStream_t stream) {
  return run(GemvArgs{W, N, K, 0, nullptr, x, ldx, x16, 1, T, out.y, out.ldy, 0, out.conv}, dtype, out.swiglu,
             1, -1, true, stream);
}

cudaError_t gemv_grouped(const void* W, core::DType dtype, int64_t N, int64_t K, int64_t w_stride,
                         const int* expert, int groups, const float* x, int64_t ldx, int x_div, float* y,
                         int64_t ldy, cudaStream_t stream) {
  if (!expert) return cudaErrorInvalidValue;
  return run(GemvArgs{W, N, K, w_stride, expert, x, ldx, nullptr, x_div, 1, y, ldy, 0, {}}, dtype, false,
             groups, -1, false, stream);
}

int gemv_simt_plans() {
  return kNumSimt;
}
int gemv_mma_plans() {
  return kNumMma;
}
const char* gemv_plan_name(bool mma, int plan) {
  static const char* simt[] = {"simt R4 U4 KS1", "simt R2 U4 KS1", "simt R4 U4 KS2",
                               "simt R2 U4 KS2", "simt R4 U4 KS4", "simt R2 U4 KS4",
                               "simt R2 U8 KS4", "simt R4 U2 KS4", "simt R2 U2 KS4"};
  static const char* mmas[] = {"mma MT1 U4 KS1", "mma MT1 U4 KS2", "mma MT1 U4 KS4", "mma MT2 U2 KS4",
                               "mma MT2 U4 KS2", "mma MT1 U2 KS4", "mma MT2 U2 KS2"};
  static_assert(sizeof(simt) / sizeof(simt[0]) == kNumSimt && sizeof(mmas) / sizeof(mmas[0]) == kNumMma);
  if (plan < 0) return "default";
  return mma ? (plan < kNumMma ? mmas[plan] : "?") : (plan < kNumSimt ? simt[plan] : "?");
}

cudaError_t gemv_with_plan(const void* W, core::DType dtype, int64_t N, int64_t K, const float* x,
                           int64_t ldx, const void* x16, int T, const GemvOut& out, int plan,
                           cudaStream_t stream) {
  const bool mma = x16 != nullptr;
  return run(GemvArgs{W, N, K, 0, nullptr, x, ldx, x16, 1, T, out.y, out.ldy, 0, out.conv}, dtype, out.swiglu,
             1, plan, mma, stream);
}

}  // namespace deltaflow::backend::cuda
