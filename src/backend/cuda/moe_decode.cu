#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe.cuh"
#include "backend/cuda/moe_decode.cuh"

namespace deltaflow::backend::cuda {
namespace {

// ---- Loads ------------------------------------------------------------------------------------------------
// Rows are cut into vectors of 16 bytes of weights (kV elements). Aligned: one 16-byte streaming load per
// vector (the weights are read once); otherwise element by element, masked at the row's end. The raw vector
// is kept until its use so that several loads are in flight.

template <class WT, bool kAligned>
struct WeightVec;

template <class WT>
struct WeightVec<WT, true> {
  static constexpr int kV = Vec16<WT>::kN;
  uint4 raw;
  __device__ __forceinline__ void load(const WT* row, int64_t i, int64_t) {
    raw = __ldcs(reinterpret_cast<const uint4*>(row) + i);
  }
  __device__ __forceinline__ void zero() { raw = make_uint4(0, 0, 0, 0); }
  __device__ __forceinline__ void unpack(float (&f)[kV]) const { unpack16(raw, f, WT{}); }
};

template <class WT>
struct WeightVec<WT, false> {
  static constexpr int kV = Vec16<WT>::kN;
  float e[kV];
  __device__ __forceinline__ void load(const WT* row, int64_t i, int64_t K) {
#pragma unroll
    for (int j = 0; j < kV; ++j) e[j] = i * kV + j < K ? to_f32(row[i * kV + j]) : 0.0f;
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int j = 0; j < kV; ++j) e[j] = 0.0f;
  }
  __device__ __forceinline__ void unpack(float (&f)[kV]) const {
#pragma unroll
    for (int j = 0; j < kV; ++j) f[j] = e[j];
  }
};

// The kV activations that meet weight vector i of a row of length K (zero past K).
template <int kV, bool kAligned>
__device__ __forceinline__ void load_x(const float* x, int64_t i, int64_t K, float (&v)[kV]) {
  if constexpr (kAligned) {
    const float4* p = reinterpret_cast<const float4*>(x + i * kV);
#pragma unroll
    for (int q = 0; q < kV / 4; ++q) {
      const float4 f = p[q];
      v[4 * q] = f.x;
      v[4 * q + 1] = f.y;
      v[4 * q + 2] = f.z;
      v[4 * q + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kV; ++j) v[j] = i * kV + j < K ? x[i * kV + j] : 0.0f;
  }
}

template <int kV>
__device__ __forceinline__ float dot(const float (&w)[kV], const float (&x)[kV], float acc) {
#pragma unroll
  for (int j = 0; j < kV; ++j) acc = fmaf(w[j], x[j], acc);
  return acc;
}

// ---- Router logits: split-K GEMV --------------------------------------------------------------------------

constexpr int kSplitThreads = 256;
constexpr int kSplitWarps = kSplitThreads / 32;
constexpr int kLogitRowsPerBlock = 2;

struct LogitsArgs {
  const void* W;
  int64_t N, n_split, K;
  const float* x;
  int64_t ldx;
  int T;
  float* out0;
  int64_t ld0;
  float* out1;
  int64_t ld1;
};

// A block owns R rows and tile blockIdx.y of TT activation rows; its threads stride together over the row's
// vectors (thread i takes vectors i, i + 256, ...), each meeting all the tile's rows, then the per-thread
// sums are reduced over the warp and, in warp order, over the block. A row's sum does not depend on TT or on
// its tile: prefill and decode route on the same logits.
template <class WT, int R, int TT, bool kAligned>
__global__ void __launch_bounds__(kSplitThreads) kernel_router_logits(LogitsArgs a) {
  using WV = WeightVec<WT, kAligned>;
  constexpr int kV = WV::kV;
  __shared__ float red[kSplitWarps][R * TT];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * R;
  const int64_t nvec = (a.K + kV - 1) / kV;
  const int t0 = static_cast<int>(blockIdx.y) * TT, Tn = min(TT, a.T - t0);
  const float* xb = a.x + static_cast<int64_t>(t0) * a.ldx;
  const WT* W = static_cast<const WT*>(a.W);
  const WT* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = W + min64(n0 + r, a.N - 1) * a.K;

  // The router's rows are read before the activations are ready (launch.cuh).
  pdl_launch_dependents();
  if constexpr (kAligned) {
    if (threadIdx.x < nvec) {
#pragma unroll
      for (int r = 0; r < R; ++r) prefetch_l2(reinterpret_cast<const uint4*>(rows[r]) + threadIdx.x);
    }
  }
  pdl_wait();

  float acc[R][TT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < TT; ++t) acc[r][t] = 0.0f;

  for (int64_t i = threadIdx.x; i < nvec; i += kSplitThreads) {
    WV wv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wv[r].load(rows[r], i, a.K);
    float wf[R][kV];
#pragma unroll
    for (int r = 0; r < R; ++r) wv[r].unpack(wf[r]);
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      if (t < Tn) {
        float xv[kV];
        load_x<kV, kAligned>(xb + t * a.ldx, i, a.K, xv);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][t] = dot(wf[r], xv, acc[r][t]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      if (t < Tn) {
        const float v = warp_sum(acc[r][t]);
        if (lane == 0) red[warp][r * TT + t] = v;
      }
    }
  __syncthreads();
  for (int j = threadIdx.x; j < R * TT; j += kSplitThreads) {
    const int r = j / TT, t = j % TT;
    const int64_t n = n0 + r;
    if (t >= Tn || n >= a.N) continue;
    float s = 0.0f;
    for (int w = 0; w < kSplitWarps; ++w) s += red[w][j];
    const int64_t tr = t0 + t;
    if (n < a.n_split) {
      a.out0[tr * a.ld0 + n] = s;
    } else {
      a.out1[tr * a.ld1 + (n - a.n_split)] = s;
    }
  }
}

template <class WT, int TT, bool kAligned>
cudaError_t launch_router_logits(const LogitsArgs& a, cudaStream_t s) {
  return launch(kernel_router_logits<WT, kLogitRowsPerBlock, TT, kAligned>,
                dim3(grid_1d(a.N, kLogitRowsPerBlock), static_cast<unsigned>((a.T + TT - 1) / TT)),
                dim3(kSplitThreads), 0, s, a);
}

template <class WT>
cudaError_t dispatch_router_logits(const LogitsArgs& a, cudaStream_t s) {
  const bool al = a.K % Vec16<WT>::kN == 0 && aligned16(a.W) && aligned16(a.x) && a.ldx % 4 == 0;
  if (!al) return launch_router_logits<WT, kGemvMaxRows, false>(a, s);
  if (a.T <= 1) return launch_router_logits<WT, 1, true>(a, s);
  if (a.T <= 2) return launch_router_logits<WT, 2, true>(a, s);
  if (a.T <= 4) return launch_router_logits<WT, 4, true>(a, s);
  if (a.T <= 8) return launch_router_logits<WT, 8, true>(a, s);
  if (a.T <= 16) return launch_router_logits<WT, 16, true>(a, s);
  return launch_router_logits<WT, 32, true>(a, s);
}

// ---- Gate/up with SwiGLU ----------------------------------------------------------------------------------

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kPairsPerWarp = 2;  // gate rows j, j+1 and up rows I+j, I+j+1
constexpr int kGateUpInFlight = 4;

struct GateUpArgs {
  const void *Wr, *Ws;
  int64_t Ir, stride_r, Is;
  const int* ids;
  int K;
  int n_routed;  // problems 0 .. n_routed-1: slot p = t*K + k; then one shared-expert problem per token
  int64_t H;
  const float* x;
  int64_t ldx;
  float *act, *act_s;
  int64_t ld_act, ld_act_s;
};

// Block (p, y): problem p (fastest, so the blocks of all tokens that read the same rows run together), a warp
// owns P gate/up row pairs of row block y and streams their 2P rows with U vectors in flight, then writes
// silu(gate) * up.
template <class WT, int P, int U, bool kAligned>
__global__ void __launch_bounds__(kThreads) kernel_gate_up_swiglu(GateUpArgs a) {
  using WV = WeightVec<WT, kAligned>;
  constexpr int kV = WV::kV;
  pdl_enter();  // the expert ids come from the kernel before
  const int p = blockIdx.x, lane = threadIdx.x & 31;
  const WT* W;
  int64_t I;
  const float* x;
  float* out;
  if (p < a.n_routed) {
    W = static_cast<const WT*>(a.Wr) + static_cast<int64_t>(a.ids[p]) * a.stride_r;
    I = a.Ir;
    x = a.x + static_cast<int64_t>(p / a.K) * a.ldx;
    out = a.act + static_cast<int64_t>(p) * a.ld_act;
  } else {
    const int64_t t = p - a.n_routed;
    W = static_cast<const WT*>(a.Ws);
    I = a.Is;
    x = a.x + t * a.ldx;
    out = a.act_s + t * a.ld_act_s;
  }
  const int64_t j0 = (static_cast<int64_t>(blockIdx.y) * kWarps + (threadIdx.x >> 5)) * P;
  if (j0 >= I) return;
  const int64_t nvec = (a.H + kV - 1) / kV;
  const WT* rows[2 * P];
#pragma unroll
  for (int q = 0; q < P; ++q) {
    const int64_t j = min64(j0 + q, I - 1);
    rows[q] = W + j * a.H;
    rows[P + q] = W + (I + j) * a.H;
  }
  float acc[2 * P];
#pragma unroll
  for (int r = 0; r < 2 * P; ++r) acc[r] = 0.0f;

  for (int64_t base = lane; base < nvec; base += 32 * U) {
    WV wv[U][2 * P];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + u * 32;
#pragma unroll
      for (int r = 0; r < 2 * P; ++r) {
        if (i < nvec) {
          wv[u][r].load(rows[r], i, a.H);
        } else {
          wv[u][r].zero();
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = base + u * 32;
      if (i < nvec) {
        float xv[kV];
        load_x<kV, kAligned>(x, i, a.H, xv);
#pragma unroll
        for (int r = 0; r < 2 * P; ++r) {
          float wf[kV];
          wv[u][r].unpack(wf);
          acc[r] = dot(wf, xv, acc[r]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2 * P; ++r) acc[r] = warp_sum(acc[r]);
  if (lane == 0) {
#pragma unroll
    for (int q = 0; q < P; ++q)
      if (j0 + q < I) out[j0 + q] = silu_f(acc[q]) * acc[P + q];
  }
}

template <class WT>
cudaError_t launch_gate_up(const GateUpArgs& a, int problems, bool aligned, cudaStream_t s) {
  const int64_t I = std::max(a.n_routed > 0 ? a.Ir : 0, problems > a.n_routed ? a.Is : 0);
  if (I == 0 || problems == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(problems), grid_1d(I, kPairsPerWarp * kWarps));
  if (aligned)
    return launch(kernel_gate_up_swiglu<WT, kPairsPerWarp, kGateUpInFlight, true>, grid, dim3(kThreads), 0, s,
                  a);
  return launch(kernel_gate_up_swiglu<WT, kPairsPerWarp, 1, false>, grid, dim3(kThreads), 0, s, a);
}

cudaError_t run_gate_up(const GateUpArgs& a, core::DType dt, int problems, bool aligned, cudaStream_t s) {
  switch (dt) {
    case core::DType::kBF16:
      return launch_gate_up<__nv_bfloat16>(a, problems, aligned, s);
    case core::DType::kF16:
      return launch_gate_up<__half>(a, problems, aligned, s);
    case core::DType::kF32:
      return launch_gate_up<float>(a, problems, aligned, s);
    default:
      return cudaErrorInvalidValue;
  }
}

// ---- Down projection and combination ----------------------------------------------------------------------

constexpr int kDownThreads = 256;
constexpr int kDownWarps = kDownThreads / 32;
constexpr int kDownRows = 4;      // output rows per block
constexpr int kDownInFlight = 3;  // items per thread loaded together (K = 8 + shared at I = 512: one round)

struct DownArgs {
  const void *Wr, *Ws;
  int64_t Ir, stride_r, Is;
  const int* ids;
  const float* w;
  int K;
  const float* gate_logit;
  int64_t H;
  const float *act, *act_s;
  int64_t ld_act, ld_act_s;
  float* y;
  int64_t ldy;
  bool accumulate;  // y += instead of y =
};

// Block (t, y) owns R output rows of row block y for token t (t fastest: the blocks of all tokens that read
// the shared expert's rows run together). The work of one row is a list of items, one per 16-byte weight
// vector of every slot: slots k < K are expert ids[t, k] weighted w[t, k] (rows of length Ir), slot K the
// shared expert weighted sigmoid(gate_logit[t]) (length Is). All the block's threads stride over that list
// together, U items each in flight for all R rows, so every expert's loads go out at once instead of one
// expert group after another; the per-thread sums are reduced over the warp and then, in warp order, over the
// block (deterministic, no atomics).
template <class WT, int R, int U, bool kAligned>
__global__ void __launch_bounds__(kDownThreads) kernel_down_combine(DownArgs a) {
  using WV = WeightVec<WT, kAligned>;
  constexpr int kV = WV::kV;
  __shared__ const WT* slot_mat[kMaxTopK + 1];
  __shared__ const float* slot_x[kMaxTopK + 1];
  __shared__ float slot_w[kMaxTopK + 1];
  __shared__ float red[kDownWarps][R];
  pdl_enter();
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * R;
  const int slots = a.K + (a.Ws ? 1 : 0);
  if (threadIdx.x < slots) {
    const int k = threadIdx.x;
    if (k < a.K) {
      const int64_t s = static_cast<int64_t>(t) * a.K + k;
      slot_mat[k] = static_cast<const WT*>(a.Wr) + static_cast<int64_t>(a.ids[s]) * a.stride_r;
      slot_x[k] = a.act + s * a.ld_act;
      slot_w[k] = a.w[s];
    } else {
      slot_mat[k] = static_cast<const WT*>(a.Ws);
      slot_x[k] = a.act_s + static_cast<int64_t>(t) * a.ld_act_s;
      slot_w[k] = sigmoid_f(a.gate_logit[t]);
    }
  }
  __syncthreads();
  int64_t n[R];
#pragma unroll
  for (int r = 0; r < R; ++r) n[r] = min64(n0 + r, a.H - 1);
  const int nv_r = static_cast<int>((a.Ir + kV - 1) / kV);
  const int nv_s = a.Ws ? static_cast<int>((a.Is + kV - 1) / kV) : 0;
  const int routed_items = a.K * nv_r, items = routed_items + nv_s;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;

  for (int f0 = threadIdx.x; f0 < items; f0 += kDownThreads * U) {
    WV wv[U][R];
    int slot[U], vec[U];
    int64_t len[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int f = f0 + u * kDownThreads;
      if (f < routed_items) {
        slot[u] = f / nv_r;
        vec[u] = f - slot[u] * nv_r;
        len[u] = a.Ir;
      } else {
        slot[u] = a.K;
        vec[u] = f - routed_items;
        len[u] = a.Is;
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (f < items) {
          wv[u][r].load(slot_mat[slot[u]] + n[r] * len[u], vec[u], len[u]);
        } else {
          wv[u][r].zero();
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (f0 + u * kDownThreads >= items) continue;
      float xv[kV];
      load_x<kV, kAligned>(slot_x[slot[u]], vec[u], len[u], xv);
      const float wk = slot_w[slot[u]];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float wf[kV];
        wv[u][r].unpack(wf);
        acc[r] = fmaf(wk, dot(wf, xv, 0.0f), acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0) red[warp][r] = v;
  }
  __syncthreads();
  if (threadIdx.x < R && n0 + threadIdx.x < a.H) {
    float s = 0.0f;
    for (int w = 0; w < kDownWarps; ++w) s += red[w][threadIdx.x];
    float* yp = a.y + static_cast<int64_t>(t) * a.ldy + n0 + threadIdx.x;
    *yp = a.accumulate ? *yp + s : s;
  }
}

template <class WT>
cudaError_t launch_down(const DownArgs& a, int T, bool aligned, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(T), grid_1d(a.H, kDownRows));
  if (aligned)
    return launch(kernel_down_combine<WT, kDownRows, kDownInFlight, true>, grid, dim3(kDownThreads), 0, s, a);
  return launch(kernel_down_combine<WT, kDownRows, 1, false>, grid, dim3(kDownThreads), 0, s, a);
}

cudaError_t run_down(const DownArgs& a, core::DType dt, int T, bool aligned, cudaStream_t s) {
  switch (dt) {
    case core::DType::kBF16:
      return launch_down<__nv_bfloat16>(a, T, aligned, s);
    case core::DType::kF16:
      return launch_down<__half>(a, T, aligned, s);
    case core::DType::kF32:
      return launch_down<float>(a, T, aligned, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t moe_router_logits(const void* W, core::DType dtype, int64_t N, int64_t n_split, int64_t K,
                              const float* x, int64_t ldx, int T, float* out0, int64_t ld0, float* out1,
                              int64_t ld1, cudaStream_t stream) {
  if (T < 0 || T > 65535 * kGemvMaxRows || n_split < 0 || n_split > N || K < 0 || (n_split < N && !out1))
    return cudaErrorInvalidValue;
  if (N == 0 || T == 0) return cudaSuccess;
  const LogitsArgs a{W, N, n_split, K, x, ldx, T, out0, ld0, out1, ld1};
  switch (dtype) {
    case core::DType::kBF16:
      return dispatch_router_logits<__nv_bfloat16>(a, stream);
    case core::DType::kF16:
      return dispatch_router_logits<__half>(a, stream);
    case core::DType::kF32:
      return dispatch_router_logits<float>(a, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t moe_gate_up_swiglu(const MoeGateUpWeights& routed, const int* ids, int K,
                               const MoeGateUpWeights& shared, int64_t H, const float* x, int64_t ldx, int T,
                               float* act, int64_t ld_act, float* act_shared, int64_t ld_act_shared,
                               cudaStream_t stream) {
  if (T < 0 || T > kGemvMaxRows || K < 0 || K > 32 || H < 0) return cudaErrorInvalidValue;
  if (T == 0 || H == 0) return cudaSuccess;
  const bool has_routed = routed.W && K > 0 && routed.I > 0, has_shared = shared.W && shared.I > 0;
  GateUpArgs a{};
  a.Wr = routed.W;
  a.Ir = routed.I;
  a.stride_r = routed.stride;
  a.ids = ids;
  a.K = K;
  a.n_routed = has_routed ? T * K : 0;
  a.Ws = has_shared ? shared.W : nullptr;
  a.Is = shared.I;
  a.H = H;
  a.x = x;
  a.ldx = ldx;
  a.act = act;
  a.ld_act = ld_act;
  a.act_s = act_shared;
  a.ld_act_s = ld_act_shared;
  const auto vec = [&](const MoeGateUpWeights& m) {
    const int kV = 16 / static_cast<int>(core::dtype_size(m.dtype));
    return H % kV == 0 && aligned16(m.W);
  };
  const bool x_al = aligned16(x) && ldx % 4 == 0;
  const bool al_r = !has_routed || vec(routed), al_s = !has_shared || vec(shared);
  if (!has_shared || (has_routed && routed.dtype == shared.dtype))
    return run_gate_up(a, has_routed ? routed.dtype : shared.dtype, a.n_routed + (has_shared ? T : 0),
                       x_al && al_r && al_s, stream);
  // Two element types: one launch each.
  if (has_routed) {
    const cudaError_t e = run_gate_up(a, routed.dtype, a.n_routed, x_al && al_r, stream);
    if (e != cudaSuccess) return e;
  }
  a.n_routed = 0;
  return run_gate_up(a, shared.dtype, T, x_al && al_s, stream);
}

cudaError_t moe_down_combine(const MoeDownWeights& routed, const int* ids, const float* w, int K,
                             const MoeDownWeights& shared, const float* gate_logit, int64_t H,
                             const float* act, int64_t ld_act, const float* act_shared, int64_t ld_act_shared,
                             int T, float* y, int64_t ldy, cudaStream_t stream) {
  if (T < 0 || T > kGemvMaxRows || K < 0 || K > 32 || H < 0) return cudaErrorInvalidValue;
  if (T == 0 || H == 0) return cudaSuccess;
  const bool has_routed = routed.W && K > 0 && routed.I > 0, has_shared = shared.W && shared.I > 0;
  if (has_shared && !gate_logit) return cudaErrorInvalidValue;
  DownArgs a{};
  a.Wr = routed.W;
  a.Ir = routed.I;
  a.stride_r = routed.stride;
  a.ids = ids;
  a.w = w;
  a.K = has_routed ? K : 0;
  a.Ws = has_shared ? shared.W : nullptr;
  a.Is = shared.I;
  a.gate_logit = gate_logit;
  a.H = H;
  a.act = act;
  a.ld_act = ld_act;
  a.act_s = act_shared;
  a.ld_act_s = ld_act_shared;
  a.y = y;
  a.ldy = ldy;
  const auto vec = [](const MoeDownWeights& m, const float* v, int64_t ld) {
    const int kV = 16 / static_cast<int>(core::dtype_size(m.dtype));
    return m.I % kV == 0 && aligned16(m.W) && aligned16(v) && ld % 4 == 0 &&
           (m.stride * static_cast<int64_t>(core::dtype_size(m.dtype))) % 16 == 0;
  };
  const bool al_r = !has_routed || vec(routed, act, ld_act);
  const bool al_s = !has_shared || vec(shared, act_shared, ld_act_shared);
  if (!has_shared || !has_routed || routed.dtype == shared.dtype)
    return run_down(a, has_routed ? routed.dtype : shared.dtype, T, al_r && al_s, stream);
  // Two element types: the routed sum, then the shared term added to it.
  const void* Ws = a.Ws;
  a.Ws = nullptr;
  cudaError_t e = run_down(a, routed.dtype, T, al_r, stream);
  if (e != cudaSuccess) return e;
  a.Ws = Ws;
  a.K = 0;
  a.accumulate = true;
  return run_down(a, shared.dtype, T, al_s, stream);
}

}  // namespace deltaflow::backend::cuda
