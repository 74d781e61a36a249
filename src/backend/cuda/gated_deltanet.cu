#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gated_deltanet.cuh"
#include "backend/cuda/launch.cuh"

namespace deltaflow::backend::cuda {
namespace {

constexpr int kMaxThreads = 256;

// Lanes per state column: at dk = 128 a column split over two lanes keeps the state in registers (64 each).
template <int DK>
constexpr int kSplit = DK > 64 ? 2 : 1;

// Raw inputs of one token for this thread: q[d], k[d] for d = threadIdx.x < DK; v, z for column e; the head's
// b and a.
struct TokenIn {
  float q, k, v, z, b, a;
};

template <int DK>
__device__ __forceinline__ TokenIn load_token(const GdnArgs& a, int64_t t, int j, int kh, int e, bool col) {
  const int tid = threadIdx.x;
  const int64_t kd = static_cast<int64_t>(a.nk) * DK;
  const float* c = a.conv + t * a.ld_conv;
  TokenIn in{0, 0, 0, 0, 0, 0};
  if (tid < DK) {
    in.q = c[kh * DK + tid];
    in.k = c[kd + kh * DK + tid];
  }
  if (col) {
    in.v = c[2 * kd + static_cast<int64_t>(j) * a.dv + e];
    in.z = a.z[t * a.ld_proj + static_cast<int64_t>(j) * a.dv + e];
  }
  in.b = a.b[t * a.ld_proj + j];
  in.a = a.a[t * a.ld_proj + j];
  return in;
}

// Block (value head j, sequence i); the kSplit lanes of column e own S[:, e] (DK / kSplit rows each, in
// registers). Per token (PyTorch terms, torch_recurrent_gated_delta_rule + Qwen3_5GatedRMSNorm):
//   q = l2norm(q) * dk^-0.5 ; k = l2norm(k)                      (key head j // (nv/nk))
//   beta = sigmoid(b) ; g = -exp(A_log) * softplus(a + dt_bias)
//   S = exp(g) * S ; S += k (beta * (v - S^T k))^T ; o = S^T q
//   y = w * (o * rsqrt(mean(o^2) + eps)) * silu(z)
// The next token's inputs are loaded before the current one is computed, so the scan over a prompt is not
// latency-bound on them.
template <int DK>
__global__ void __launch_bounds__(kMaxThreads) kernel_gated_deltanet(GdnArgs a) {
  constexpr int kS = kSplit<DK>;
  constexpr int kRows = DK / kS;  // state rows per lane
  __shared__ float qs[DK], ks[DK];
  __shared__ float red[64];
  pdl_enter();
  const int j = blockIdx.x, seq = blockIdx.y, tid = threadIdx.x;
  const int e = tid / kS, part = tid % kS, d0 = part * kRows;
  const int kh = j / (a.nv / a.nk);
  const bool col = e < a.dv;
  int64_t t = a.seq_start ? a.seq_start[seq] : static_cast<int64_t>(seq) * a.tokens_per_seq;
  const int64_t t_end = a.seq_start ? a.seq_start[seq + 1] : t + a.tokens_per_seq;
  const int slot = a.seq_start ? a.slots[t] : a.slots[seq];
  float* S = a.states + static_cast<int64_t>(slot) * a.slot_stride + static_cast<int64_t>(j) * DK * a.dv;

  float st[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) st[i] = col ? S[(d0 + i) * a.dv + e] : 0.0f;

  const float neg_A = -expf(a.A_log[j]);
  const float dt_bias = a.dt_bias[j];
  const float nw = col ? a.norm_w[e] : 0.0f;
  const float q_scale = 1.0f / sqrtf(static_cast<float>(DK));

  TokenIn cur = load_token<DK>(a, t, j, kh, e, col);
  for (; t < t_end; ++t) {
    TokenIn next{0, 0, 0, 0, 0, 0};
    if (t + 1 < t_end) next = load_token<DK>(a, t + 1, j, kh, e, col);

    // FLA's l2norm: x * rsqrt(sum(x^2) + 1e-6); q also scaled by dk^-0.5.
    const float2 ss = block_sum2(cur.q * cur.q, cur.k * cur.k, red);
    if (tid < DK) {
      qs[tid] = cur.q * (1.0f / sqrtf(ss.x + 1e-6f)) * q_scale;
      ks[tid] = cur.k * (1.0f / sqrtf(ss.y + 1e-6f));
    }
    __syncthreads();
    const float beta = sigmoid_f(cur.b);
    const float decay = expf(neg_A * softplus_f(cur.a + dt_bias));

    // kv = (exp(g) S)^T k: what the decayed state predicts for this key (4 partial sums for ILP, then the
    // column's lanes combined).
    float p0 = 0.0f, p1 = 0.0f, p2 = 0.0f, p3 = 0.0f;
#pragma unroll
    for (int i = 0; i < kRows; i += 4) {
      st[i] *= decay;
      st[i + 1] *= decay;
      st[i + 2] *= decay;
      st[i + 3] *= decay;
      p0 = fmaf(st[i], ks[d0 + i], p0);
      p1 = fmaf(st[i + 1], ks[d0 + i + 1], p1);
      p2 = fmaf(st[i + 2], ks[d0 + i + 2], p2);
      p3 = fmaf(st[i + 3], ks[d0 + i + 3], p3);
    }
    float kv = (p0 + p1) + (p2 + p3);
    if constexpr (kS == 2) kv += __shfl_xor_sync(0xffffffffu, kv, 1);
    const float delta = (cur.v - kv) * beta;
    // S += k delta^T; o = S^T q.
    p0 = p1 = p2 = p3 = 0.0f;
#pragma unroll
    for (int i = 0; i < kRows; i += 4) {
      st[i] = fmaf(ks[d0 + i], delta, st[i]);
      st[i + 1] = fmaf(ks[d0 + i + 1], delta, st[i + 1]);
      st[i + 2] = fmaf(ks[d0 + i + 2], delta, st[i + 2]);
      st[i + 3] = fmaf(ks[d0 + i + 3], delta, st[i + 3]);
      p0 = fmaf(st[i], qs[d0 + i], p0);
      p1 = fmaf(st[i + 1], qs[d0 + i + 1], p1);
      p2 = fmaf(st[i + 2], qs[d0 + i + 2], p2);
      p3 = fmaf(st[i + 3], qs[d0 + i + 3], p3);
    }
    float o = (p0 + p1) + (p2 + p3);
    if constexpr (kS == 2) o += __shfl_xor_sync(0xffffffffu, o, 1);
    if (a.snap_slots && col) {
      const int to = a.snap_slots[t];
      if (to >= 0) {
        float* D = a.states + static_cast<int64_t>(to) * a.slot_stride + static_cast<int64_t>(j) * DK * a.dv;
#pragma unroll
        for (int i = 0; i < kRows; ++i) D[(d0 + i) * a.dv + e] = st[i];
      }
    }
    // Gated RMSNorm over the head's dv outputs (its barriers also retire this token's use of qs/ks).
    const float oo = block_sum(col && part == 0 ? o * o : 0.0f, red);
    if (col && part == 0) {
      const float inv = 1.0f / sqrtf(oo / static_cast<float>(a.dv) + a.eps);
      a.out[t * a.ld_out + static_cast<int64_t>(j) * a.dv + e] = nw * (o * inv) * silu_f(cur.z);
    }
    cur = next;
  }
  if (col) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) S[(d0 + i) * a.dv + e] = st[i];
  }
}

}  // namespace

cudaError_t gated_deltanet(const GdnArgs& a, cudaStream_t stream) {
  if (a.n_seqs == 0 || a.tokens_per_seq == 0) return cudaSuccess;
  if (a.nk <= 0 || a.nv % a.nk != 0 || a.dv <= 0 || a.n_seqs > 65535 || a.out16 != nullptr)
    return cudaErrorInvalidValue;
  const int split = a.dk > 64 ? 2 : 1;  // kSplit<dk>
  const int threads = (std::max(a.dv * split, a.dk) + 31) / 32 * 32;
  if (threads > kMaxThreads) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(a.nv), static_cast<unsigned>(a.n_seqs));
  switch (a.dk) {
    case 16:
      return launch(kernel_gated_deltanet<16>, grid, dim3(threads), 0, stream, a);
    case 32:
      return launch(kernel_gated_deltanet<32>, grid, dim3(threads), 0, stream, a);
    case 64:
      return launch(kernel_gated_deltanet<64>, grid, dim3(threads), 0, stream, a);
    case 128:
      return launch(kernel_gated_deltanet<128>, grid, dim3(threads), 0, stream, a);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace deltaflow::backend::cuda
