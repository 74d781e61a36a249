#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/attention_decode.cuh"
#include "backend/cuda/attention_prefill.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/launch.cuh"

namespace deltaflow::backend::cuda {
namespace {

constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;
constexpr int kTileKeys = 16;  // keys staged in shared memory at a time

// Block (token, head); thread i owns dimension i.
//   x = x * rsqrt(mean(x^2) + eps) * (1 + w)
//   x[:rot] = x[:rot] * cos + rotate_half(x[:rot]) * sin,  freq_i = pos * inv_freq[i]  (fp32)
template <class KvT>
__global__ void kernel_qk_norm_rope(QkvArgs a) {
  __shared__ float buf[1024];
  __shared__ float red[32];
  pdl_enter();
  const int t = blockIdx.x, hh = blockIdx.y, i = threadIdx.x;
  const bool is_q = hh < a.nh;
  const int qw = a.gated ? 2 * a.hd : a.hd;
  const float* row = a.qkv + static_cast<int64_t>(t) * a.ld;
  const int kvh = hh - a.nh;
  const float x = is_q ? row[hh * qw + i] : row[static_cast<int64_t>(a.nh) * qw + kvh * a.hd + i];
  const float ss = block_sum(x * x, red);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(a.hd) + a.eps);
  const float* w = is_q ? a.q_norm : a.k_norm;
  float y = x * inv * (1.0f + w[i]);
  buf[i] = y;
  __syncthreads();
  const int pos = a.tok_pos[t];
  const int half = a.rot / 2;
  if (i < a.rot) {
    const int f_i = i < half ? i : i - half;
    const float f = static_cast<float>(pos) * a.inv_freq[f_i];
    const float c = cosf(f), s = sinf(f);
    const float lo = buf[f_i], hi = buf[f_i + half];
    y = i < half ? lo * c - hi * s : hi * c + lo * s;
  }
  if (is_q) {
    a.q_out[(static_cast<int64_t>(t) * a.nh + hh) * a.hd + i] = y;
    return;
  }
  const int64_t base = kv_offset(a.cache, a.tok_slot[t], kvh, pos, a.hd);
  const float v = row[static_cast<int64_t>(a.nh) * qw + static_cast<int64_t>(a.nkv) * a.hd + kvh * a.hd + i];
  if constexpr (std::is_same_v<KvT, Fp8E4m3>) {
    // One scale per (position, kv head) row: amax / 448; an all-zero (or NaN) row stores zeros, scale 1.
    const float2 amax = block_max2(fabsf(y), fabsf(v), buf);
    const float ks = amax.x > 0.0f ? amax.x / 448.0f : 1.0f, vs = amax.y > 0.0f ? amax.y / 448.0f : 1.0f;
    static_cast<uint8_t*>(a.cache.k)[base + i] = amax.x > 0.0f ? fp8_code(y, ks) : 0;
    static_cast<uint8_t*>(a.cache.v)[base + i] = amax.y > 0.0f ? fp8_code(v, vs) : 0;
    if (i == 0) {
      a.cache.k_scale[base / a.hd] = ks;
      a.cache.v_scale[base / a.hd] = vs;
    }
  } else {
    static_cast<KvT*>(a.cache.k)[base + i] = from_f32<KvT>(y);
    static_cast<KvT*>(a.cache.v)[base + i] = from_f32<KvT>(v);
  }
}

// Block (query tile, kv head, key split). The block's (query, head) pairs share the kv head; warp w takes
// pairs w, w + 8, ... (PW of them). Lane l holds dims [l*DPL, (l+1)*DPL) of q and of the running output. K/V
// tiles are staged in shared memory as fp32. Online softmax per pair (m: running max, l: running sum):
//   s = q.k * scale ; m' = max(m, s) ; l = l e^(m-m') + e^(s-m') ; acc = acc e^(m-m') + e^(s-m') v
// Writes the unnormalised acc and (m, l) of its split; attention_combine normalises.
template <class KvT, int DPL, int PW>
__global__ void __launch_bounds__(kThreads) kernel_attention(AttnArgs a, int qt, int split_keys) {
  constexpr int kHd = 32 * DPL;
  __shared__ __align__(16) float Ks[kTileKeys * kHd];
  __shared__ __align__(16) float Vs[kTileKeys * kHd];
  pdl_enter();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int hk = blockIdx.y, sp = blockIdx.z;
  const int grp = a.nh / a.nkv;
  const int t0 = blockIdx.x * qt, t1 = min(a.n_tokens, t0 + qt);
  const int npairs = (t1 - t0) * grp;
  // Decode (split_keys 0): the split size of this block's token, from its own position.
  if (split_keys == 0) split_keys = attention_split_keys(a.tok_pos[t0], launch_splits(a));
  const int64_t kbeg = static_cast<int64_t>(sp) * split_keys;
  const int64_t kend = min64(kbeg + split_keys, static_cast<int64_t>(a.tok_pos[t1 - 1]) + 1);
  if (kbeg >= kend) return;  // past the sequence: the combine step does not read this split
  const int row = a.tok_slot[t0];

  float q[PW][DPL], acc[PW][DPL], m[PW], l[PW];
  int lim[PW], tok[PW], head[PW];
#pragma unroll
  for (int i = 0; i < PW; ++i) {
    const int p = warp + kWarps * i;
    tok[i] = p < npairs ? t0 + p / grp : -1;
    head[i] = hk * grp + p % grp;
    lim[i] = tok[i] >= 0 ? a.tok_pos[tok[i]] : -1;
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < DPL; ++j) {
      q[i][j] =
          tok[i] >= 0 ? a.q[(static_cast<int64_t>(tok[i]) * a.nh + head[i]) * kHd + lane * DPL + j] : 0.0f;
      acc[i][j] = 0.0f;
    }
  }

  constexpr int kPerVec = 16 / static_cast<int>(sizeof(KvT));
  constexpr int kVecs = kTileKeys * kHd / kPerVec;
  for (int64_t j0 = kbeg; j0 < kend; j0 += kTileKeys) {
    const int nk = static_cast<int>(min64(kTileKeys, kend - j0));
    // The tile's keys are consecutive in the cache: a page holds a whole number of tiles (j0 % 16 == 0).
    const int64_t tile = kv_offset(a.cache, row, hk, static_cast<int>(j0), kHd);
    const KvT* K = static_cast<const KvT*>(a.cache.k) + tile;
    const KvT* V = static_cast<const KvT*>(a.cache.v) + tile;
    __syncthreads();
    for (int vi = threadIdx.x; vi < kVecs; vi += kThreads) {
      const int r = vi * kPerVec / kHd;
      float kf[kPerVec], vf[kPerVec];
      if (r < nk) {
        const uint4 kr = *reinterpret_cast<const uint4*>(K + static_cast<int64_t>(vi) * kPerVec);
        const uint4 vr = *reinterpret_cast<const uint4*>(V + static_cast<int64_t>(vi) * kPerVec);
        unpack16(kr, kf, KvT{});
        unpack16(vr, vf, KvT{});
        if constexpr (std::is_same_v<KvT, Fp8E4m3>) {  // code * its row's scale, as the CPU reads it
          const float ks = a.cache.k_scale[tile / kHd + r], vs = a.cache.v_scale[tile / kHd + r];
#pragma unroll
          for (int c = 0; c < kPerVec; ++c) {
            kf[c] *= ks;
            vf[c] *= vs;
          }
        }
      } else {
#pragma unroll
        for (int c = 0; c < kPerVec; ++c) kf[c] = vf[c] = 0.0f;
      }
#pragma unroll
      for (int c = 0; c < kPerVec; ++c) {
        Ks[vi * kPerVec + c] = kf[c];
        Vs[vi * kPerVec + c] = vf[c];
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < PW; ++i) {
      if (tok[i] < 0) continue;
      const int nvalid = static_cast<int>(min64(nk, static_cast<int64_t>(lim[i]) - j0 + 1));  // causal
      for (int r = 0; r < nvalid; ++r) {
        const float* kr = Ks + r * kHd + lane * DPL;
        const float* vr = Vs + r * kHd + lane * DPL;
        float d = 0.0f;
#pragma unroll
        for (int j = 0; j < DPL; ++j) d = fmaf(q[i][j], kr[j], d);
        const float s = warp_sum(d) * a.scale;
        const float mn = fmaxf(m[i], s);
        const float corr = expf(m[i] - mn);
        const float p = expf(s - mn);
        l[i] = l[i] * corr + p;
#pragma unroll
        for (int j = 0; j < DPL; ++j) acc[i][j] = fmaf(acc[i][j], corr, p * vr[j]);
        m[i] = mn;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < PW; ++i) {
    if (tok[i] < 0) continue;
    const int64_t at = (static_cast<int64_t>(tok[i]) * a.nh + head[i]) * a.max_splits + sp;
#pragma unroll
    for (int j = 0; j < DPL; ++j) a.part_acc[at * kHd + lane * DPL + j] = acc[i][j];
    if (lane == 0) {
      a.part_ml[at * 2] = m[i];
      a.part_ml[at * 2 + 1] = l[i];
    }
  }
}

// Block (token, head), thread per dim: merge the splits the token's keys fall in, normalise, gate.
//   o = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M) ;  o *= sigmoid(gate)
__global__ void kernel_attention_combine(AttnArgs a, int split_keys) {
  pdl_enter();
  const int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  if (split_keys == 0) split_keys = attention_split_keys(a.tok_pos[t], launch_splits(a));
  const int ns = a.prefill ? 1 : (a.tok_pos[t] + split_keys) / split_keys;
  const int64_t at = (static_cast<int64_t>(t) * a.nh + h) * a.max_splits;
  float M = -INFINITY;
  for (int s = 0; s < ns; ++s) M = fmaxf(M, a.part_ml[(at + s) * 2]);
  float L = 0.0f, o = 0.0f;
  for (int s = 0; s < ns; ++s) {
    const float w = expf(a.part_ml[(at + s) * 2] - M);
    L += a.part_ml[(at + s) * 2 + 1] * w;
    o += a.part_acc[(at + s) * a.hd + d] * w;
  }
  o /= L;
  if (a.gate)
    o *= sigmoid_f(
        a.gate[static_cast<int64_t>(t) * a.gate_ld + static_cast<int64_t>(h) * a.gate_head_stride + d]);
  a.out[static_cast<int64_t>(t) * a.nh * a.hd + static_cast<int64_t>(h) * a.hd + d] = o;
}

cudaError_t combine(const AttnArgs& a, int split_keys, cudaStream_t s) {
  return launch(kernel_attention_combine,
                dim3(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.nh)), dim3(a.hd), 0, s, a,
                split_keys);
}

template <class KvT, int DPL>
cudaError_t launch_attention(const AttnArgs& a, cudaStream_t s) {
  const int grp = a.nh / a.nkv;
  int qt, split_keys;
  dim3 grid;
  cudaError_t e = cudaSuccess;
  if (a.prefill) {
    // Up to 4 pairs per warp: as many query tokens per block as fill 32 pairs.
    constexpr int kPW = 4;
    qt = std::max(1, kWarps * kPW / grp);
    split_keys = 1 << 30;  // one split over every key
    grid = dim3(static_cast<unsigned>((a.n_tokens + qt - 1) / qt), static_cast<unsigned>(a.nkv), 1);
    if (grp > kWarps * kPW) return cudaErrorInvalidValue;
    e = launch(kernel_attention<KvT, DPL, kPW>, grid, dim3(kThreads), 0, s, a, qt, split_keys);
  } else {
    qt = 1;
    split_keys = 0;  // each token's own (attention_split_keys)
    grid = dim3(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.nkv),
                static_cast<unsigned>(launch_splits(a)));
    if (grp <= kWarps) {
      e = launch(kernel_attention<KvT, DPL, 1>, grid, dim3(kThreads), 0, s, a, qt, split_keys);
    } else if (grp <= 2 * kWarps) {
      e = launch(kernel_attention<KvT, DPL, 2>, grid, dim3(kThreads), 0, s, a, qt, split_keys);
    } else if (grp <= 4 * kWarps) {
      e = launch(kernel_attention<KvT, DPL, 4>, grid, dim3(kThreads), 0, s, a, qt, split_keys);
    } else {
      return cudaErrorInvalidValue;
    }
  }
  if (e != cudaSuccess) return e;
  return combine(a, split_keys, s);
}

// The prefill's keys of an fp8 cache as bf16 (code * scale, rounded to nearest even) in the contiguous
// scratch k [nkv][cap][hd], v after it: positions 0..tok_pos[last] of slot tok_slot[0], thread per 8
// elements.
__global__ void kernel_dequant_kv(AttnArgs a, __nv_bfloat16* dk, __nv_bfloat16* dv, int64_t cap) {
  pdl_enter();
  const int64_t kend = min64(static_cast<int64_t>(a.tok_pos[a.n_tokens - 1]) + 1, cap);
  const int row = a.tok_slot[0];
  const int per_row = a.hd / 8;
  const int64_t total = kend * a.nkv * per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(i % per_row);
    const int64_t pr = i / per_row;
    const int kvh = static_cast<int>(pr % a.nkv), pos = static_cast<int>(pr / a.nkv);
    const int64_t off = kv_offset(a.cache, row, kvh, pos, a.hd);
    const int64_t to = (static_cast<int64_t>(kvh) * cap + pos) * a.hd + c * 8;
    for (int kv = 0; kv < 2; ++kv) {
      const uint8_t* src = static_cast<const uint8_t*>(kv ? a.cache.v : a.cache.k) + off + c * 8;
      const float sc = (kv ? a.cache.v_scale : a.cache.k_scale)[off / a.hd];
      const uint2 codes = *reinterpret_cast<const uint2*>(src);
      const uint32_t w[2] = {codes.x, codes.y};
      uint32_t out[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = fp8x2_to_float2(static_cast<uint16_t>(w[j / 2] >> (16 * (j & 1))));
        out[j] = pack_bf16(f.x * sc, f.y * sc);
      }
      *reinterpret_cast<uint4*>((kv ? dv : dk) + to) = make_uint4(out[0], out[1], out[2], out[3]);
    }
  }
}

template <class KvT>
cudaError_t dispatch_hd(const AttnArgs& a, cudaStream_t s) {
  switch (a.hd) {
    case 32:
      return launch_attention<KvT, 1>(a, s);
    case 64:
      return launch_attention<KvT, 2>(a, s);
    case 128:
      return launch_attention<KvT, 4>(a, s);
    case 256:
      return launch_attention<KvT, 8>(a, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

int attention_decode_splits(int n_tokens, int nkv, int max_splits) {
  if (n_tokens <= kAttnInvariantRows) return max_splits;
  static const int sms = current_device_attribute(cudaDevAttrMultiProcessorCount, 132);
  // DELTAFLOW_ATTN_BLOCKS_PER_SM (1..256) replaces the 16, for sweeps with `bench`; unset: 16.
  static const int per_sm = [] {
    const char* e = std::getenv("DELTAFLOW_ATTN_BLOCKS_PER_SM");
    const int v = e ? std::atoi(e) : 0;
    return v >= 1 && v <= 256 ? v : 16;
  }();
  const int64_t pairs = static_cast<int64_t>(n_tokens) * std::max(nkv, 1);
  const int64_t want = (static_cast<int64_t>(per_sm) * sms + pairs - 1) / pairs;
  return static_cast<int>(std::clamp<int64_t>(want, 1, max_splits));
}

cudaError_t qk_norm_rope_store(const QkvArgs& a, cudaStream_t stream) {
  if (a.n_tokens == 0) return cudaSuccess;
  if (a.hd <= 0 || a.hd > 1024 || a.rot > a.hd || a.rot % 2 != 0) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.nh + a.nkv));
  if (a.cache.f32) return launch(kernel_qk_norm_rope<float>, grid, dim3(a.hd), 0, stream, a);
  if (a.cache.fp8) {
    if (!a.cache.k_scale || !a.cache.v_scale) return cudaErrorInvalidValue;
    return launch(kernel_qk_norm_rope<Fp8E4m3>, grid, dim3(a.hd), 0, stream, a);
  }
  return launch(kernel_qk_norm_rope<__nv_bfloat16>, grid, dim3(a.hd), 0, stream, a);
}

cudaError_t attention(const AttnArgs& a, cudaStream_t stream) {
  if (a.n_tokens == 0) return cudaSuccess;
  if (a.nkv <= 0 || a.nh % a.nkv != 0 || a.n_tokens > 65535 * 32) return cudaErrorInvalidValue;
  if (!a.prefill && (a.max_splits < 1 || a.max_splits > 65535 || a.splits < 0 || a.splits > a.max_splits))
    return cudaErrorInvalidValue;
  if (a.cache.block_table && (a.cache.page_shift < 4 || a.cache.page_shift > 20))
    return cudaErrorInvalidValue;
  if (a.cache.fp8 && (!a.cache.k_scale || !a.cache.v_scale)) return cudaErrorInvalidValue;
  AttnArgs b = a;
  // Prefill over an fp8 cache: the sequence's keys dequantized to bf16 once, then read as a bf16 cache of one
  // slot (slot_stride 0: every token's row lands on it).
  if (b.cache.fp8 && b.prefill && b.dequant && b.hd % 8 == 0 && aligned16(b.dequant)) {
    const int64_t cap = b.dequant_elems / (2 * static_cast<int64_t>(b.nkv) * b.hd);
    if (cap < 1) return cudaErrorInvalidValue;
    auto* dk = static_cast<__nv_bfloat16*>(b.dequant);
    auto* dv = dk + cap * b.nkv * b.hd;
    const cudaError_t e = launch(kernel_dequant_kv, dim3(1024), dim3(256), 0, stream, b, dk, dv, cap);
    if (e != cudaSuccess) return e;
    b.cache = KvCache{dk, dv, false, 0, cap};
  }
  // Prefill and decode over a bf16 or fp8 cache ("fast" mode) run on the tensor cores; the fp32 cache
  // ("exact" mode) and shapes those kernels do not take stay on the fp32 SIMT kernel below.
  if (attention_prefill_tc_supports(b)) return attention_prefill_tc(b, stream);
  if (attention_decode_tc_supports(b)) {
    if (b.splits == 0) b.splits = attention_decode_splits(b.n_tokens, b.nkv, b.max_splits);
    const cudaError_t e = attention_decode_tc(b, stream);
    return e != cudaSuccess ? e : combine(b, 0, stream);
  }
  // The fp32 kernel splits by position alone at any batch (exact mode's rows are batch-invariant).
  b.splits = b.max_splits;
  if (b.prefill) b.max_splits = b.splits = 1;  // one split: the partial buffers are [tokens, nh, 1, hd]
  if (b.cache.f32) return dispatch_hd<float>(b, stream);
  return b.cache.fp8 ? dispatch_hd<Fp8E4m3>(b, stream) : dispatch_hd<__nv_bfloat16>(b, stream);
}

}  // namespace deltaflow::backend::cuda
