#include <cmath>
#include <cstdint>

#include "backend/cuda/attention_decode.cuh"
#include "backend/cuda/attention_tc.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/mma.cuh"

namespace deltaflow::backend::cuda {
namespace {

using namespace attn_tc;

constexpr int kWarps = 2;  // per block; each streams its own tiles (three blocks share an SM at hd 256)
constexpr int kThreads = 32 * kWarps;
constexpr int kTile = 16;  // keys per warp tile: one page, one k16 step of p.v
// cp.async stages per warp. Four for fp8 (its tiles are half the bytes) measured slower on the H100 than
// two (27B, 32 rows at 8K: 40.7 against 38.4 ms a step; at 128K, 21.23 against 21.11 ms): the extra shared
// memory costs a resident block per SM.
constexpr int kStages = 2;
constexpr int kMaxGroup = 16;  // q heads per kv head: the rows of one m16 tile

// Shared memory: Q [16][HD] bf16, then per warp:
// - bf16 cache: per stage K [kTile][HD] and V [kTile][HD], bf16;
// - fp8 cache: per stage K and V codes [kTile][HD] (a byte each) and their scales [kTile] (fp32), then one
//   bf16 K and V tile the codes are widened into for ldmatrix.
// After the key loop the warps' area holds their fp32 (m, l, o) for the merge.
template <int HD, bool FP8>
__host__ __device__ constexpr int warp_bytes() {
  return FP8 ? kStages * 2 * kTile * (HD + 4) + 2 * kTile * HD * 2 : kStages * 2 * kTile * HD * 2;
}
template <int HD, bool FP8>
constexpr int smem_bytes() {
  return kMaxGroup * HD * 2 + kWarps * warp_bytes<HD, FP8>();
}
template <int HD, bool FP8>
__host__ __device__ constexpr bool merge_fits() {
  return kWarps * kMaxGroup * (HD + 2) * 4 <= kWarps * warp_bytes<HD, FP8>();
}

// Block (token t, kv head hk, split sp); rows r < grp of the m16 tile are q heads hk * grp + r, the rest
// zero. Warp w takes the split's 16-key tiles w, w + kWarps, ... In the mma layouts lane (g = lane / 4, c =
// lane % 4) holds rows g and g + 8, columns 2c, 2c + 1 of each 8-wide n-tile. Per tile (log2 domain, sl =
// scale * log2 e; keys past the token's position masked to -inf):
//   s = q k^T ; m' = max(m, max_j s_j sl) ; p_j = 2^(s_j sl - m') ; l = l 2^(m - m') + sum_j p_j
//   o = o 2^(m - m') + bf16(p) v
// Merge over warps (M = max_w m_w): acc = sum_w o_w 2^(m_w - M), l = sum_w l_w 2^(m_w - M); the partial's m
// is M in natural-log units (M ln 2), as the combine step expects.
// An fp8 cache: the codes widen to bf16 exactly, so s_j = ks_j (q . code_j) and p_j v_j = (p_j vs_j) code_j:
// the key scale multiplies the scores, the value scale the weights before their bf16 rounding (l sums p).
template <int HD, bool FP8>
__global__ void __launch_bounds__(kThreads) kernel_attention_decode_tc(AttnArgs a, float sl) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  constexpr int kChunks = HD / 8;  // 16-byte chunks per row
  constexpr int kOTiles = HD / 8;
  constexpr int kRowBytes = HD * 2;
  constexpr int kStageElems = 2 * kTile * HD;
  static_assert(kTile * kChunks % 32 == 0 && merge_fits<HD, FP8>(), "tile loads divide evenly; merge fits");
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  unsigned char* warps_area = smem_raw + kMaxGroup * HD * 2;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int t = blockIdx.x, hk = blockIdx.y, sp = blockIdx.z;
  const int grp = a.nh / a.nkv;
  const int pos = a.tok_pos[t];
  const int split_keys = attention_split_keys(pos, launch_splits(a));
  const int kbeg = sp * split_keys;
  const int kend = min(kbeg + split_keys, pos + 1);
  if (kbeg >= kend) return;  // past the token's keys: the combine step does not read this split
  const int row = a.tok_slot[t];
  const int n_tiles = (kend - kbeg + kTile - 1) / kTile;
  const int my_tiles = warp < n_tiles ? (n_tiles - 1 - warp) / kWarps + 1 : 0;
  unsigned char* my_area = warps_area + warp * warp_bytes<HD, FP8>();
  // bf16: the stages themselves; fp8: the tile the codes widen into, after the stages.
  constexpr int kCodeStageBytes = 2 * kTile * (HD + 4);  // fp8: K, V codes then K, V scales
  __nv_bfloat16* wide = reinterpret_cast<__nv_bfloat16*>(my_area + kStages * kCodeStageBytes);

  // A tile starts at a multiple of 16 positions (split_keys is), so its keys are consecutive in one page.
  // Keys past kend are zero-filled (the cache there may hold anything, NaN included: 0 * NaN would poison o).
  auto load_kv = [&](int i, int stage) {
    const int k0 = kbeg + (warp + i * kWarps) * kTile;
    const int64_t base = kv_offset(a.cache, row, hk, k0, HD);
    if constexpr (FP8) {
      constexpr int kCodeChunks = HD / 16;  // 16 codes per 16-byte chunk
      unsigned char* Kc = my_area + stage * kCodeStageBytes;
      unsigned char* Vc = Kc + kTile * HD;
      float* sc = reinterpret_cast<float*>(Vc + kTile * HD);  // K scales [kTile], V scales [kTile]
      const auto* Kg = static_cast<const unsigned char*>(a.cache.k);
      const auto* Vg = static_cast<const unsigned char*>(a.cache.v);
#pragma unroll
      for (int it = 0; it < kTile * kCodeChunks / 32; ++it) {
        const int idx = lane + it * 32;
        const int r = idx / kCodeChunks, c = idx % kCodeChunks;
        const bool ok = k0 + r < kend;
        const int64_t off = ok ? base + static_cast<int64_t>(r) * HD + c * 16 : 0;
        cp_async16(shared_addr(Kc + r * HD + c * 16), Kg + off, ok);
        cp_async16(shared_addr(Vc + r * HD + c * 16), Vg + off, ok);
      }
      if (lane < 8) {  // 4 chunks of 4 scales each for K (lanes 0-3) and V (lanes 4-7)
        const int c = lane & 3;
        const bool ok = k0 + 4 * c < kend;  // a partial chunk reads scales of the same page: masked below
        const float* src = (lane < 4 ? a.cache.k_scale : a.cache.v_scale) + (ok ? base / HD + 4 * c : 0);
        cp_async16(shared_addr(sc + (lane < 4 ? 0 : kTile) + 4 * c), src, ok);
      }
    } else {
      __nv_bfloat16* Ks = reinterpret_cast<__nv_bfloat16*>(my_area) + stage * kStageElems;
      __nv_bfloat16* Vs = Ks + kTile * HD;
      const __nv_bfloat16* Kg = static_cast<const __nv_bfloat16*>(a.cache.k);
      const __nv_bfloat16* Vg = static_cast<const __nv_bfloat16*>(a.cache.v);
#pragma unroll
      for (int it = 0; it < kTile * kChunks / 32; ++it) {
        const int idx = lane + it * 32;
        const int r = idx / kChunks, c = idx % kChunks;
        const bool ok = k0 + r < kend;
        const int64_t off = ok ? base + static_cast<int64_t>(r) * HD + c * 8 : 0;
        cp_async16(shared_addr(Ks + swizzled<HD>(r, c)), Kg + off, ok);
        cp_async16(shared_addr(Vs + swizzled<HD>(r, c)), Vg + off, ok);
      }
    }
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < my_tiles) load_kv(i, i);
    cp_async_commit();
  }

  // Q: the group's rows, fp32 -> bf16 once; rows past the group zero.
  for (int i = threadIdx.x; i < kMaxGroup * HD / 4; i += kThreads) {
    const int r = i / (HD / 4), d = (i % (HD / 4)) * 4;
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < grp)
      x = *reinterpret_cast<const float4*>(a.q + (static_cast<int64_t>(t) * a.nh + hk * grp + r) * HD + d);
    const uint2 packed = make_uint2(pack_bf16(x.x, x.y), pack_bf16(x.z, x.w));
    *reinterpret_cast<uint2*>(Qs + swizzled<HD>(r, d >> 3) + (d & 7)) = packed;
  }
  __syncthreads();

  const int g = lane >> 2, c4 = lane & 3;
  // ldmatrix lane addresses (as attention_prefill.cu): chunk 2j + b of a row with row & 7 == lane & 7 is
  // stored at 8u + ((2v) ^ (b ^ (lane & 7))) for j = 4u + v.
  const int x7 = lane & 7;
  uint32_t q_off[4], k_off[4], v_off[4];
  {
    const int q_row = lane & 15, q_b = lane >> 4;
    const int k_row = x7 + ((lane >> 4) << 3), k_b = (lane >> 3) & 1;
    const int v_row = x7 + (((lane >> 3) & 1) << 3), v_b = lane >> 4;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      q_off[v] = shared_addr(Qs) + q_row * kRowBytes + (((2 * v) ^ (q_b ^ x7)) << 4);
      k_off[v] = k_row * kRowBytes + (((2 * v) ^ (k_b ^ x7)) << 4);
      v_off[v] = kTile * kRowBytes + v_row * kRowBytes + (((2 * v) ^ (v_b ^ x7)) << 4);
    }
  }

  float o[kOTiles][4];
#pragma unroll
  for (int dt = 0; dt < kOTiles; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;

  for (int i = 0; i < my_tiles; ++i) {
    const int stage = i % kStages;
    if (i + kStages - 1 < my_tiles) load_kv(i + kStages - 1, (i + kStages - 1) % kStages);
    cp_async_commit();  // possibly empty: keeps "all but the newest kStages - 1 groups" meaning tile i
    cp_async_wait<kStages - 1>();
    __syncwarp();  // every lane's copies of tile i visible to the warp
    uint32_t so;
    const float* ksc = nullptr;  // fp8: the tile's key and value scales
    if constexpr (FP8) {
      // Widen the codes to bf16 (exact) in the swizzled layout ldmatrix reads: 8 codes per 16-byte chunk.
      const unsigned char* Kc = my_area + stage * kCodeStageBytes;
      ksc = reinterpret_cast<const float*>(Kc + 2 * kTile * HD);
#pragma unroll
      for (int it = 0; it < 2 * kTile * kChunks / 32; ++it) {
        const int idx = lane + it * 32;
        const int kv = idx / (kTile * kChunks), r = (idx / kChunks) % kTile, c = idx % kChunks;
        const uint2 codes = *reinterpret_cast<const uint2*>(Kc + kv * kTile * HD + r * HD + c * 8);
        const uint4 w = make_uint4(fp8x2_to_bf16x2(static_cast<uint16_t>(codes.x)),
                                   fp8x2_to_bf16x2(static_cast<uint16_t>(codes.x >> 16)),
                                   fp8x2_to_bf16x2(static_cast<uint16_t>(codes.y)),
                                   fp8x2_to_bf16x2(static_cast<uint16_t>(codes.y >> 16)));
        *reinterpret_cast<uint4*>(wide + kv * kTile * HD + swizzled<HD>(r, c)) = w;
      }
      __syncwarp();
      so = shared_addr(wide);
    } else {
      so = shared_addr(reinterpret_cast<__nv_bfloat16*>(my_area) + stage * kStageElems);
    }

    float s[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t qa[4], kb[4];
      ldmatrix_x4(qa, q_off[kk & 3] + (kk >> 2) * 128);
      ldmatrix_x4(kb, so + k_off[kk & 3] + (kk >> 2) * 128);
      mma_bf16(s[0], qa, kb[0], kb[1]);
      mma_bf16(s[1], qa, kb[2], kb[3]);
    }

    const int k0 = kbeg + (warp + i * kWarps) * kTile;
    float vsc[2][2];  // fp8: the value scales of this lane's keys (0 past kend, where p is 0 too)
    if constexpr (FP8) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = nt * 8 + 2 * c4 + e;
          const bool ok = k0 + j < kend;
          const float ks = ok ? ksc[j] : 0.0f;
          vsc[nt][e] = ok ? ksc[kTile + j] : 0.0f;
          s[nt][e] *= ks;
          s[nt][2 + e] *= ks;
        }
    }
    if (k0 + kTile > kend) {  // the last tile: keys past the token's position
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (k0 + nt * 8 + 2 * c4 + (e & 1) >= kend) s[nt][e] = -INFINITY;
    }
    // Key k0 is in range, so each row's tile max is finite.
    const float mx_lo = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
    const float mx_hi = fmaxf(fmaxf(s[0][2], s[0][3]), fmaxf(s[1][2], s[1][3]));
    const float mn_lo = fmaxf(m_lo, quad_max(mx_lo) * sl), mn_hi = fmaxf(m_hi, quad_max(mx_hi) * sl);
    const float corr_lo = exp2_approx(m_lo - mn_lo), corr_hi = exp2_approx(m_hi - mn_hi);
    m_lo = mn_lo;
    m_hi = mn_hi;
    uint32_t pa[4];
    float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const float p0 = exp2_approx(fmaf(s[nt][0], sl, -mn_lo)), p1 = exp2_approx(fmaf(s[nt][1], sl, -mn_lo));
      const float p2 = exp2_approx(fmaf(s[nt][2], sl, -mn_hi)), p3 = exp2_approx(fmaf(s[nt][3], sl, -mn_hi));
      sum_lo += p0 + p1;
      sum_hi += p2 + p3;
      if constexpr (FP8) {
        pa[2 * nt] = pack_bf16(p0 * vsc[nt][0], p1 * vsc[nt][1]);
        pa[2 * nt + 1] = pack_bf16(p2 * vsc[nt][0], p3 * vsc[nt][1]);
      } else {
        pa[2 * nt] = pack_bf16(p0, p1);      // A fragment: reg 0 (row g) / 2 (row g, keys 8..15)
        pa[2 * nt + 1] = pack_bf16(p2, p3);  // reg 1 (row g + 8) / 3
      }
    }
    l_lo = l_lo * corr_lo + sum_lo;
    l_hi = l_hi * corr_hi + sum_hi;
#pragma unroll
    for (int dp = 0; dp < HD / 16; ++dp) {
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, so + v_off[dp & 3] + (dp >> 2) * 128);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        o[2 * dp][e] *= e < 2 ? corr_lo : corr_hi;
        o[2 * dp + 1][e] *= e < 2 ? corr_lo : corr_hi;
      }
      mma_bf16(o[2 * dp], pa, vb[0], vb[1]);
      mma_bf16(o[2 * dp + 1], pa, vb[2], vb[3]);
    }
    __syncwarp();  // the warp is done reading this stage before a later iteration refills it
  }

  // Merge the warps through shared memory (the stage area is free once every warp has left its loop).
  cp_async_wait<0>();
  __syncthreads();
  float* Ms = reinterpret_cast<float*>(warps_area);  // [kWarps][16]
  float* Ls = Ms + kWarps * kMaxGroup;               // [kWarps][16]
  float* Os = Ls + kWarps * kMaxGroup;               // [kWarps][16][HD]
  l_lo = quad_sum(l_lo);
  l_hi = quad_sum(l_hi);
  if (c4 == 0) {
    Ms[warp * kMaxGroup + g] = m_lo;
    Ms[warp * kMaxGroup + g + 8] = m_hi;
    Ls[warp * kMaxGroup + g] = l_lo;
    Ls[warp * kMaxGroup + g + 8] = l_hi;
  }
#pragma unroll
  for (int dt = 0; dt < kOTiles; ++dt) {
    const int d = dt * 8 + 2 * c4;
    *reinterpret_cast<float2*>(Os + (warp * kMaxGroup + g) * HD + d) = make_float2(o[dt][0], o[dt][1]);
    *reinterpret_cast<float2*>(Os + (warp * kMaxGroup + g + 8) * HD + d) = make_float2(o[dt][2], o[dt][3]);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < grp * HD; i += kThreads) {
    const int r = i / HD, d = i % HD;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, Ms[w * kMaxGroup + r]);  // warp 0 has a tile: finite
    float acc = 0.0f, L = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float e = exp2_approx(Ms[w * kMaxGroup + r] - M);  // 0 for a warp without tiles (m = -inf)
      acc = fmaf(Os[(w * kMaxGroup + r) * HD + d], e, acc);
      L = fmaf(Ls[w * kMaxGroup + r], e, L);
    }
    const int64_t at = (static_cast<int64_t>(t) * a.nh + hk * grp + r) * a.max_splits + sp;
    a.part_acc[at * HD + d] = acc;
    if (d == 0) {
      a.part_ml[at * 2] = M * 0.6931471805599453f;
      a.part_ml[at * 2 + 1] = L;
    }
  }
}

template <int HD, bool FP8>
cudaError_t launch(const AttnArgs& a, cudaStream_t stream) {
  constexpr int bytes = smem_bytes<HD, FP8>();
  static const cudaError_t attr = cudaFuncSetAttribute(kernel_attention_decode_tc<HD, FP8>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (attr != cudaSuccess) return attr;
  const dim3 grid(static_cast<unsigned>(a.n_tokens), static_cast<unsigned>(a.nkv),
                  static_cast<unsigned>(launch_splits(a)));
  kernel_attention_decode_tc<HD, FP8><<<grid, kThreads, bytes, stream>>>(a, a.scale * 1.4426950408889634f);
  return cudaGetLastError();
}

template <int HD>
cudaError_t launch_hd(const AttnArgs& a, cudaStream_t stream) {
  return a.cache.fp8 ? launch<HD, true>(a, stream) : launch<HD, false>(a, stream);
}

}  // namespace

bool attention_decode_tc_supports(const AttnArgs& a) {
  if (a.prefill || a.cache.f32 || a.n_tokens < 1 || a.nkv <= 0 || a.nh % a.nkv != 0) return false;
  if (a.nh / a.nkv > kMaxGroup || a.max_splits < 1 || a.max_splits > 65535 || a.nkv > 65535 || a.splits < 0 ||
      a.splits > a.max_splits)
    return false;
  const bool f8 = a.cache.fp8;
  int bytes = 0;
  switch (a.hd) {
    case 64:
      bytes = f8 ? smem_bytes<64, true>() : smem_bytes<64, false>();
      break;
    case 128:
      bytes = f8 ? smem_bytes<128, true>() : smem_bytes<128, false>();
      break;
    case 256:
      bytes = f8 ? smem_bytes<256, true>() : smem_bytes<256, false>();
      break;
    default:
      return false;
  }
  // 16-byte vectors: q rows, cache rows (cp.async) and the slot / page offsets; fp8: a tile's 16 scales in
  // four 16-byte pieces (a page's rows of one kv head are 16 consecutive scales; a contiguous cache needs
  // max_ctx a multiple of 4 for the same).
  if (!aligned16(a.q) || !aligned16(a.cache.k) || !aligned16(a.cache.v) || a.cache.slot_stride % 16 != 0)
    return false;
  if (f8 && (!aligned16(a.cache.k_scale) || !aligned16(a.cache.v_scale) ||
             (!a.cache.block_table && a.cache.max_ctx % 4 != 0)))
    return false;
  return bytes <= max_smem_optin();
}

cudaError_t attention_decode_tc(const AttnArgs& a, cudaStream_t stream) {
  if (!attention_decode_tc_supports(a)) return cudaErrorInvalidValue;
  switch (a.hd) {
    case 64:
      return launch_hd<64>(a, stream);
    case 128:
      return launch_hd<128>(a, stream);
    default:
      return launch_hd<256>(a, stream);
  }
}

}  // namespace deltaflow::backend::cuda
