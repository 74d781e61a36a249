#include <cmath>
#include <cstdint>

#include "backend/cuda/attention_prefill.cuh"
#include "backend/cuda/attention_tc.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/mma.cuh"

namespace deltaflow::backend::cuda {
namespace {

constexpr int kRows = 128;        // query rows per block: 16 per warp, one m16 tile each
constexpr int kKeysDefault = 64;  // keys per K/V tile (32 measured 14% slower at hd 256 on the H200)
constexpr int kWarps = kRows / 16;
constexpr int kThreads = 32 * kWarps;
constexpr int kStages = 2;  // K/V tiles in flight: tile j+1 loads while tile j is computed

// Shared memory: Q [kRows][HD], then per stage K [kKeys][HD] and V [kKeys][HD], all bf16.
template <int HD, int kKeys = kKeysDefault>
constexpr int smem_bytes() {
  return (kRows * HD + kStages * 2 * kKeys * HD) * 2;
}

using namespace attn_tc;

// Block (head h, tile of kRows query tokens); warp w owns rows 16w..16w+15 of the tile. In the mma layouts
// lane (g = lane / 4, c = lane % 4) holds rows g and g + 8, columns 2c, 2c + 1 of each 8-wide n-tile.
// Per K/V tile of kKeys keys (log2 domain, sl = scale * log2 e):
//   s = q k^T (tensor cores) ; causal mask: key > tok_pos[row] -> -inf
//   m' = max(m, max_j s_j sl) ; p_j = 2^(s_j sl - m') ; l = l 2^(m - m') + sum_j p_j
//   o = o 2^(m - m') + bf16(p) v (tensor cores)
// then out = o / l * sigmoid(gate).
template <int HD, int kKeys, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) kernel_attention_prefill_tc(AttnArgs a, float sl) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  constexpr int kChunks = HD / 8;  // 16-byte chunks per row
  constexpr int kSTiles = kKeys / 8;
  constexpr int kOTiles = HD / 8;
  constexpr int kRowBytes = HD * 2;
  constexpr int kStageBytes = 2 * kKeys * kRowBytes;
  static_assert(kKeys * kChunks % kThreads == 0 && kRows * HD / 4 % kThreads == 0,
                "tile loads divide evenly");
  __nv_bfloat16* Qs = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* KVs = Qs + kRows * HD;

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h = blockIdx.x;
  const int t0 = (gridDim.y - 1 - blockIdx.y) * kRows;  // the tiles with the most keys start first
  const int nrows = min(kRows, a.n_tokens - t0);
  const int hk = h / (a.nh / a.nkv);
  const int p_first = a.tok_pos[t0];
  const int kend = a.tok_pos[t0 + nrows - 1] + 1;  // the tile reads keys 0..kend-1
  const int n_tiles = (kend + kKeys - 1) / kKeys;
  const int row = a.tok_slot[t0];
  const __nv_bfloat16* Kg = static_cast<const __nv_bfloat16*>(a.cache.k);
  const __nv_bfloat16* Vg = static_cast<const __nv_bfloat16*>(a.cache.v);

  // Keys past kend are zero-filled (the cache there may hold anything, NaN included: 0 * NaN would poison o).
  auto load_kv = [&](int kt, int stage) {
    const int k0 = kt * kKeys;
    __nv_bfloat16* Ks = KVs + stage * 2 * kKeys * HD;
    __nv_bfloat16* Vs = Ks + kKeys * HD;
#pragma unroll
    for (int it = 0; it < kKeys * kChunks / kThreads; ++it) {
      const int i = threadIdx.x + it * kThreads;
      const int r = i / kChunks, c = i % kChunks;
      const bool ok = k0 + r < kend;
      const int64_t off = ok ? kv_offset(a.cache, row, hk, k0 + r, HD) + c * 8 : 0;
      cp_async16(shared_addr(Ks + swizzled<HD>(r, c)), Kg + off, ok);
      cp_async16(shared_addr(Vs + swizzled<HD>(r, c)), Vg + off, ok);
    }
  };

  load_kv(0, 0);
  cp_async_commit();

  // Q: fp32 -> bf16 once, rows past the last token zero.
#pragma unroll 8
  for (int it = 0; it < kRows * HD / 4 / kThreads; ++it) {
    const int i = threadIdx.x + it * kThreads;
    const int r = i / (HD / 4), d = (i % (HD / 4)) * 4;
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < nrows)
      x = *reinterpret_cast<const float4*>(a.q + (static_cast<int64_t>(t0 + r) * a.nh + h) * HD + d);
    const uint2 packed = make_uint2(pack_bf16(x.x, x.y), pack_bf16(x.z, x.w));
    *reinterpret_cast<uint2*>(Qs + swizzled<HD>(r, d >> 3) + (d & 7)) = packed;
  }

  const int g = lane >> 2, c4 = lane & 3;
  const int r_lo = warp * 16 + g, r_hi = r_lo + 8;
  // Rows past the last token take the last token's keys: finite numbers nobody stores.
  const int lim_lo = r_lo < nrows ? a.tok_pos[t0 + r_lo] : kend - 1;
  const int lim_hi = r_hi < nrows ? a.tok_pos[t0 + r_hi] : kend - 1;

  // ldmatrix lane addresses. Each operand's chunk index is 2j + b (j unrolled, b one lane bit) on a row with
  // row & 7 == lane & 7, so its swizzled chunk is (2j) ^ y with y = b ^ (lane & 7): for j = 4u + v that is
  // 8u + ((2v) ^ y), i.e. lane offset off[v] plus the constant 128u bytes.
  const int x7 = lane & 7;
  uint32_t q_off[4], k_off[4], v_off[4];
  {
    const int q_row = warp * 16 + (lane & 15), q_b = lane >> 4;
    const int k_row = x7 + ((lane >> 4) << 3), k_b = (lane >> 3) & 1;
    const int v_row = x7 + (((lane >> 3) & 1) << 3), v_b = lane >> 4;
#pragma unroll
    for (int v = 0; v < 4; ++v) {
      q_off[v] = shared_addr(Qs) + q_row * kRowBytes + (((2 * v) ^ (q_b ^ x7)) << 4);
      k_off[v] = shared_addr(KVs) + k_row * kRowBytes + (((2 * v) ^ (k_b ^ x7)) << 4);
      v_off[v] = shared_addr(KVs) + kKeys * kRowBytes + v_row * kRowBytes + (((2 * v) ^ (v_b ^ x7)) << 4);
    }
  }

  float o[kOTiles][4];
#pragma unroll
  for (int dt = 0; dt < kOTiles; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;

  for (int kt = 0; kt < n_tiles; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < n_tiles) load_kv(kt + 1, stage ^ 1);
    cp_async_commit();  // possibly empty: keeps "all but the newest group" meaning tile kt
    cp_async_wait<1>();
    __syncthreads();  // tile kt (and, the first time, Q) visible to every warp
    const uint32_t so = static_cast<uint32_t>(stage * kStageBytes);

    float s[kSTiles][4];
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t qa[4];
      ldmatrix_x4(qa, q_off[kk & 3] + (kk >> 2) * 128);
#pragma unroll
      for (int np = 0; np < kSTiles / 2; ++np) {
        uint32_t kb[4];
        ldmatrix_x4(kb, k_off[kk & 3] + so + (kk >> 2) * 128 + np * 16 * kRowBytes);
        mma_bf16(s[2 * np], qa, kb[0], kb[1]);
        mma_bf16(s[2 * np + 1], qa, kb[2], kb[3]);
      }
    }

    const int k0 = kt * kKeys;
    if (k0 + kKeys - 1 > p_first) {  // a key of this tile is past some row's limit
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = k0 + nt * 8 + 2 * c4 + (i & 1);
          if (key > (i < 2 ? lim_lo : lim_hi)) s[nt][i] = -INFINITY;
        }
    }

    // Key 0 is in every row's range, so after tile 0 each row's m is finite (a fully masked row of a later
    // tile keeps its m: correction 1, p 0).
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt) {
      mx_lo = fmaxf(mx_lo, fmaxf(s[nt][0], s[nt][1]));
      mx_hi = fmaxf(mx_hi, fmaxf(s[nt][2], s[nt][3]));
    }
    const float mn_lo = fmaxf(m_lo, quad_max(mx_lo) * sl), mn_hi = fmaxf(m_hi, quad_max(mx_hi) * sl);
    const float corr_lo = exp2_approx(m_lo - mn_lo), corr_hi = exp2_approx(m_hi - mn_hi);
    m_lo = mn_lo;
    m_hi = mn_hi;
    float sum_lo = 0.0f, sum_hi = 0.0f;
    uint32_t p[kSTiles][2];  // bf16x2: [nt][0] row lo, [nt][1] row hi
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt) {
      const float p0 = exp2_approx(fmaf(s[nt][0], sl, -mn_lo)), p1 = exp2_approx(fmaf(s[nt][1], sl, -mn_lo));
      const float p2 = exp2_approx(fmaf(s[nt][2], sl, -mn_hi)), p3 = exp2_approx(fmaf(s[nt][3], sl, -mn_hi));
      sum_lo += p0 + p1;
      sum_hi += p2 + p3;
      p[nt][0] = pack_bf16(p0, p1);
      p[nt][1] = pack_bf16(p2, p3);
    }
    l_lo = l_lo * corr_lo + sum_lo;
    l_hi = l_hi * corr_hi + sum_hi;
#pragma unroll
    for (int dt = 0; dt < kOTiles; ++dt) {
      o[dt][0] *= corr_lo;
      o[dt][1] *= corr_lo;
      o[dt][2] *= corr_hi;
      o[dt][3] *= corr_hi;
    }

#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint32_t pa[4] = {p[2 * kk][0], p[2 * kk][1], p[2 * kk + 1][0], p[2 * kk + 1][1]};
#pragma unroll
      for (int dp = 0; dp < HD / 16; ++dp) {
        uint32_t vb[4];
        ldmatrix_x4_trans(vb, v_off[dp & 3] + so + (dp >> 2) * 128 + kk * 16 * kRowBytes);
        mma_bf16(o[2 * dp], pa, vb[0], vb[1]);
        mma_bf16(o[2 * dp + 1], pa, vb[2], vb[3]);
      }
    }
    __syncthreads();  // every warp is done with this stage before the next iteration refills it
  }

  const float inv_lo = 1.0f / quad_sum(l_lo), inv_hi = 1.0f / quad_sum(l_hi);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = half ? r_hi : r_lo;
    if (r >= nrows) continue;
    const float inv = half ? inv_hi : inv_lo;
    const int64_t t = t0 + r;
    float* out = a.out + t * a.nh * HD + static_cast<int64_t>(h) * HD;
    const float* gate =
        a.gate ? a.gate + t * a.gate_ld + static_cast<int64_t>(h) * a.gate_head_stride : nullptr;
#pragma unroll
    for (int dt = 0; dt < kOTiles; ++dt) {
      const int d = dt * 8 + 2 * c4;
      float2 y = make_float2(o[dt][2 * half] * inv, o[dt][2 * half + 1] * inv);
      if (gate) {
        y.x *= sigmoid_f(gate[d]);
        y.y *= sigmoid_f(gate[d + 1]);
      }
      *reinterpret_cast<float2*>(out + d) = y;
    }
  }
}

template <int HD, int kMinBlocks, int kKeys = kKeysDefault>
cudaError_t launch(const AttnArgs& a, cudaStream_t stream) {
  constexpr int bytes = smem_bytes<HD, kKeys>();
  static const cudaError_t attr = cudaFuncSetAttribute(kernel_attention_prefill_tc<HD, kKeys, kMinBlocks>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (attr != cudaSuccess) return attr;
  const dim3 grid(static_cast<unsigned>(a.nh), static_cast<unsigned>((a.n_tokens + kRows - 1) / kRows));
  kernel_attention_prefill_tc<HD, kKeys, kMinBlocks>
      <<<grid, kThreads, bytes, stream>>>(a, a.scale * 1.4426950408889634f);
  return cudaGetLastError();
}

}  // namespace

bool attention_prefill_tc_supports(const AttnArgs& a) {
  if (!a.prefill || a.cache.f32 || a.cache.fp8 || a.n_tokens < 1 || a.nkv <= 0 || a.nh % a.nkv != 0)
    return false;
  if ((a.n_tokens + kRows - 1) / kRows > 65535) return false;
  int bytes = 0;
  switch (a.hd) {
    case 64:
      bytes = smem_bytes<64>();
      break;
    case 128:
      bytes = smem_bytes<128>();
      break;
    case 256:
      bytes = smem_bytes<256>();
      break;
    default:
      return false;
  }
  // 16-byte vectors: q rows, cache rows (cp.async) and the slot / kv-head offsets.
  if (!aligned16(a.q) || !aligned16(a.cache.k) || !aligned16(a.cache.v) || a.cache.slot_stride % 8 != 0 ||
      reinterpret_cast<uintptr_t>(a.out) % 8 != 0)
    return false;
  return bytes <= max_smem_optin();
}

cudaError_t attention_prefill_tc(const AttnArgs& a, cudaStream_t stream) {
  if (!attention_prefill_tc_supports(a)) return cudaErrorInvalidValue;
  switch (a.hd) {
    case 64:
      return launch<64, 2>(a, stream);
    case 128:
      return launch<128, 1>(a, stream);
    default:
      return launch<256, 1>(a, stream);
  }
}

}  // namespace deltaflow::backend::cuda
