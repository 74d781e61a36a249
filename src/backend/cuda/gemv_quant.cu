#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv_quant.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/stage_f16.cuh"

namespace deltaflow::backend::cuda {
namespace {

// A block is KS x G warps: G groups (one output tile each) of KS warps splitting the tile's columns.
template <int KS, int G>
constexpr int kBlockThreads = 32 * KS* G;
constexpr float kNvfp4Unshift = 16384.0f;  // the fp16 form of an E2M1 code is its value * 2^-14

struct QArgs {
  QuantWeight w;
  const int* expert;  // grouped form when set
  int x_div;
  const __half* x;  // [T, K]
  const float* factor;
  int T;
  float* y;
  int64_t ldy;
  int64_t n_out;  // N, or N / 2 with SwiGLU
  // The tile form (MoE prefill): problem blockIdx.y is half (kTileHalf rows) of tile blockIdx.y / 2.
  const GroupedTile* tiles = nullptr;
  const int* n_tiles = nullptr;
  const int* y_rows = nullptr;  // output row of input row r (else r)
  int64_t row0 = 0;             // the problem's first input row
  // The grouped form: problems from n_routed on use expert extra_expert and activation row extra_x0 + i.
  int n_routed = 0, extra_expert = 0;
  int64_t extra_x0 = 0;
};

constexpr int kTileHalf = kQuantGemvMaxRows;
static_assert(kGroupedTileRows == 2 * kTileHalf, "a tile is two GEMV problems");

// The output row of the problem's activation row tok.
__device__ __forceinline__ int64_t out_row(const QArgs& a, int tok) {
  const int64_t r = a.row0 + tok;
  return a.y_rows ? a.y_rows[r] : r;
}

// The four fp16 pairs of one NVFP4 lane word (quant_pack.hpp): slot s's magnitudes to bits 9..11 / 25..27
// and its signs to bits 15 / 31; an fp16 with exponent field 0..3 and that mantissa bit is exactly the E2M1
// value * 2^-14 (code 1, 0.5, is the subnormal 2^-15).
__device__ __forceinline__ void nvfp4_word_to_f16(uint32_t w, uint32_t (&a)[4]) {
  const uint32_t s3 = w << 3;
  a[0] = ((w << 9) & 0x0E000E00u) | (s3 & 0x80008000u);
  a[1] = ((w << 6) & 0x0E000E00u) | ((w << 2) & 0x80008000u);
  a[2] = (s3 & 0x0E000E00u) | ((w << 1) & 0x80008000u);
  a[3] = w & 0x8E008E00u;
}

// Two E4M3 codes (the low 16 bits of v, first code lowest) as an fp16 pair: exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t v) {
  const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
  uint32_t u;
  memcpy(&u, &r, 4);
  return u;
}
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t v) {
  const uint32_t h = e4m3x2_to_f16x2(v);
  __half2 hh;
  memcpy(&hh, &h, 4);
  return __half22float2(hh);
}
__device__ __forceinline__ float e4m3_to_float(uint8_t b) {
  return e4m3x2_to_float2(b).x;
}

// An E2M1 code (sign, 2 exponent bits, 1 mantissa bit) times 2^-14: its bits placed as an fp16's sign, low
// exponent bits and top mantissa bit (E = 0 lands on the fp16 subnormals, m * 2^-15). Exact, and no table:
// a table indexed per element sits in local memory (32 bytes of stack a thread, a load per value).
__device__ __forceinline__ float e2m1_value_2m14(uint32_t code) {
  return __half2float(
      __ushort_as_half(static_cast<unsigned short>(((code & 7u) << 9) | ((code & 8u) << 12))));
}

// The matrix row of row r of NVFP4 tile t (quant_pack.cpp, nvfp4_tile_row); -1 for padding.
__device__ __forceinline__ int64_t tile_row(const QuantWeight& w, int64_t t, int r) {
  if (w.interleave) return r < 8 ? 8 * t + r : w.N / 2 + 8 * t + (r - 8);
  const int64_t n = t * 16 + r;
  return n < w.N ? n : -1;
}

// Points a at problem blockIdx.y of the grouped or tile form: its expert's codes and scales, its rows of x,
// factor and y. False when the problem is empty (a tile past *n_tiles, or a tile's second half it lacks).
__device__ __forceinline__ bool enter_problem(QArgs& a) {
  int64_t e;
  if (a.tiles) {
    const int p = static_cast<int>(blockIdx.y >> 1), half = static_cast<int>(blockIdx.y & 1);
    if (p >= *a.n_tiles) return false;
    const GroupedTile t = a.tiles[p];
    const int rows = min(kTileHalf, t.rows - half * kTileHalf);
    if (rows <= 0) return false;
    e = t.expert;
    a.T = rows;
    a.row0 = t.row0 + half * kTileHalf;
    a.x += a.row0 * a.w.K;
    a.factor += a.row0;
  } else {
    const int g = blockIdx.y;
    const bool routed = g < a.n_routed;
    e = routed ? a.expert[g] : a.extra_expert;
    const int64_t xr = routed ? g / a.x_div : a.extra_x0 + (g - a.n_routed);
    a.x += xr * a.w.K;
    a.factor += xr;
    a.y += static_cast<int64_t>(g) * a.ldy;
  }
  a.w.codes = static_cast<const uint8_t*>(a.w.codes) + e * a.w.codes_stride;
  if (a.w.scales) a.w.scales += e * a.w.scales_stride;
  if (a.w.row_scales) a.w.row_scales += e * a.w.row_stride;
  if (a.w.grid) a.w.grid += e * a.w.grid_stride;
  return true;
}

// The KS warps of a group add their accumulators in a fixed order; true in the warp that then holds the sum.
template <int TN, int KS>
__device__ __forceinline__ bool reduce_k_split(float (&acc)[TN][4], float (*red)[TN * 4][32], int warp,
                                               int lane) {
  if constexpr (KS == 1) {
    return true;
  } else {
    const int grp = warp / KS, kp = warp % KS;
#pragma unroll
    for (int j = 0; j < TN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[warp][j * 4 + e][lane] = acc[j][e];
    __syncthreads();
    if (kp != 0) return false;
#pragma unroll
    for (int j = 0; j < TN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float s = 0.0f;
#pragma unroll
        for (int p = 0; p < KS; ++p) s += red[grp * KS + p][j * 4 + e][lane];
        acc[j][e] = s;
      }
    return true;
  }
}

// One warp per 16-row tile (KS warps splitting its column tiles), TN tiles of 8 activation rows, U column
// tiles' codes in flight.
template <int TN, int U, int KS, int G, bool SW>
__global__ void __launch_bounds__(kBlockThreads<KS, G>) kernel_gemv_nvfp4(QArgs a) {
  constexpr int kGroups = G;
  __shared__ float red[KS > 1 ? KS * G : 1][TN * 4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int grp = warp / KS, kp = warp % KS;
  const int g = lane >> 2, q = lane & 3;
  const int64_t tiles_r = (a.w.N + 15) / 16, tiles_k = a.w.K / 64;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kGroups + grp;
  const bool active = t < tiles_r;
  if (a.expert || a.tiles) {
    pdl_wait();
    if (!enter_problem(a)) return;
  }
  const int64_t r_lo = active ? tile_row(a.w, t, g) : -1, r_hi = active ? tile_row(a.w, t, g + 8) : -1;
  const uint4* wt = reinterpret_cast<const uint4*>(a.w.codes) + (active ? t : 0) * tiles_k * 32 + lane;
  // The tile's scales (quant_pack.hpp): rows g and g + 8, 8 bytes; the warp's 64 bytes are contiguous.
  const uint2* st = reinterpret_cast<const uint2*>(a.w.scales) + (active ? t : 0) * tiles_k * 8 + g;
  const __half* xr[TN];
#pragma unroll
  for (int j = 0; j < TN; ++j) xr[j] = a.x + static_cast<int64_t>(min(j * 8 + g, a.T - 1)) * a.w.K + 4 * q;

  pdl_launch_dependents();
  if (active && !a.expert && !a.tiles) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (kp + u * KS < tiles_k) prefetch_l2(wt + (kp + u * KS) * 32);
  }
  pdl_wait();

  float acc[TN][4];
#pragma unroll
  for (int j = 0; j < TN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

  if (active) {
    for (int64_t k0 = kp; k0 < tiles_k; k0 += KS * U) {
      uint4 wv[U];
      uint2 sv[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t kt = k0 + static_cast<int64_t>(u) * KS;
        const bool ok = kt < tiles_k;
        wv[u] = ok ? __ldcs(wt + kt * 32) : make_uint4(0, 0, 0, 0);
        sv[u] = ok ? __ldcs(st + kt * 8) : make_uint2(0, 0);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t kt = k0 + static_cast<int64_t>(u) * KS;
        if (kt >= tiles_k) continue;
        const uint32_t words[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
#pragma unroll
        for (int jg = 0; jg < 4; ++jg) {
          uint32_t av[4];
          nvfp4_word_to_f16(words[jg], av);
          const float2 s = e4m3x2_to_float2(__byte_perm(sv[u].x, sv[u].y, jg | ((jg + 4) << 4)));
#pragma unroll
          for (int j = 0; j < TN; ++j) {
            const uint2 b = __ldg(reinterpret_cast<const uint2*>(xr[j] + kt * 64 + jg * 16));
            float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            mma_m16n8k16<__half>(part, av[0], av[1], av[2], av[3], b.x, b.y);
            acc[j][0] = fmaf(s.x, part[0], acc[j][0]);
            acc[j][1] = fmaf(s.x, part[1], acc[j][1]);
            acc[j][2] = fmaf(s.y, part[2], acc[j][2]);
            acc[j][3] = fmaf(s.y, part[3], acc[j][3]);
          }
        }
      }
    }
  }
  if (!reduce_k_split<TN, KS>(acc, red, warp, lane) || !active) return;
  const float rs_lo = r_lo < 0 ? 0.0f : a.w.row_scales[r_lo] * kNvfp4Unshift;
  const float rs_hi = r_hi < 0 ? 0.0f : a.w.row_scales[r_hi] * kNvfp4Unshift;
#pragma unroll
  for (int j = 0; j < TN; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int tok = j * 8 + 2 * q + c;
      if (tok >= a.T) continue;
      const float f = a.factor[tok];
      const float lo = acc[j][c] * rs_lo * f, hi = acc[j][2 + c] * rs_hi * f;
      if constexpr (SW) {
        a.y[out_row(a, tok) * a.ldy + 8 * t + g] = silu_f(lo) * hi;
      } else {
        float* yr = a.y + out_row(a, tok) * a.ldy;
        if (r_lo >= 0) yr[r_lo] = lo;
        if (r_hi >= 0) yr[r_hi] = hi;
      }
    }
}

// FP8: one warp per 16 weight rows (with SwiGLU 8 gate rows over the matching 8 up rows), read row-major.
template <int TN, int U, int KS, int G, bool SW>
__global__ void __launch_bounds__(kBlockThreads<KS, G>) kernel_gemv_fp8(QArgs a) {
  constexpr int kGroups = G;
  constexpr int kTileOut = SW ? 8 : 16;
  __shared__ float red[KS > 1 ? KS * G : 1][TN * 4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int grp = warp / KS, kp = warp % KS;
  const int g = lane >> 2, q = lane & 3;
  const int64_t tiles_k = a.w.K / 64;
  const int64_t o0 = (static_cast<int64_t>(blockIdx.x) * kGroups + grp) * kTileOut;
  const bool active = o0 < a.n_out;
  if (a.expert || a.tiles) {
    pdl_wait();
    if (!enter_problem(a)) return;
  }
  int64_t r_lo, r_hi;
  if constexpr (SW) {
    r_lo = min64(o0 + g, a.n_out - 1);
    r_hi = r_lo + a.n_out;
  } else {
    r_lo = min64(o0 + g, a.w.N - 1);
    r_hi = min64(o0 + g + 8, a.w.N - 1);
  }
  const uint8_t* codes = static_cast<const uint8_t*>(a.w.codes);
  const uint4* wl = reinterpret_cast<const uint4*>(codes + r_lo * a.w.K) + q;
  const uint4* wh = reinterpret_cast<const uint4*>(codes + r_hi * a.w.K) + q;
  const float* g_lo = a.w.grid + (r_lo / a.w.block_rows) * a.w.grid_cols;
  const float* g_hi = a.w.grid + (r_hi / a.w.block_rows) * a.w.grid_cols;
  const uint4* xr[TN];
#pragma unroll
  for (int j = 0; j < TN; ++j)
    xr[j] =
        reinterpret_cast<const uint4*>(a.x + static_cast<int64_t>(min(j * 8 + g, a.T - 1)) * a.w.K) + 2 * q;

  pdl_launch_dependents();
  if (active && !a.expert && !a.tiles) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (kp + u * KS < tiles_k) {
        prefetch_l2(wl + (kp + u * KS) * 4);
        prefetch_l2(wh + (kp + u * KS) * 4);
      }
  }
  pdl_wait();

  float acc[TN][4];
#pragma unroll
  for (int j = 0; j < TN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

  if (active) {
    for (int64_t k0 = kp; k0 < tiles_k; k0 += KS * U) {
      uint4 vl[U], vh[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t kt = k0 + static_cast<int64_t>(u) * KS;
        const bool ok = kt < tiles_k;
        vl[u] = ok ? __ldcs(wl + kt * 4) : make_uint4(0, 0, 0, 0);
        vh[u] = ok ? __ldcs(wh + kt * 4) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t kt = k0 + static_cast<int64_t>(u) * KS;
        if (kt >= tiles_k) continue;
        const int64_t gc = (kt * 64) / a.w.block_cols;
        const float sc_lo = __ldg(g_lo + gc), sc_hi = __ldg(g_hi + gc);
        const uint32_t lo[4] = {vl[u].x, vl[u].y, vl[u].z, vl[u].w};
        const uint32_t hi[4] = {vh[u].x, vh[u].y, vh[u].z, vh[u].w};
#pragma unroll
        for (int j = 0; j < TN; ++j) {
          const uint4 xa = __ldg(xr[j] + kt * 8), xb = __ldg(xr[j] + kt * 8 + 1);
          const uint32_t xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
          float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int jg = 0; jg < 4; ++jg)
            mma_m16n8k16<__half>(part, e4m3x2_to_f16x2(lo[jg]), e4m3x2_to_f16x2(hi[jg]),
                                 e4m3x2_to_f16x2(lo[jg] >> 16), e4m3x2_to_f16x2(hi[jg] >> 16), xw[2 * jg],
                                 xw[2 * jg + 1]);
          acc[j][0] = fmaf(sc_lo, part[0], acc[j][0]);
          acc[j][1] = fmaf(sc_lo, part[1], acc[j][1]);
          acc[j][2] = fmaf(sc_hi, part[2], acc[j][2]);
          acc[j][3] = fmaf(sc_hi, part[3], acc[j][3]);
        }
      }
    }
  }
  if (!reduce_k_split<TN, KS>(acc, red, warp, lane) || !active) return;
#pragma unroll
  for (int j = 0; j < TN; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int tok = j * 8 + 2 * q + c;
      if (tok >= a.T) continue;
      const float f = a.factor[tok];
      const float lo = acc[j][c] * f, hi = acc[j][2 + c] * f;
      if constexpr (SW) {
        const int64_t o = o0 + g;
        if (o < a.n_out) a.y[out_row(a, tok) * a.ldy + o] = silu_f(lo) * hi;
      } else {
        const int64_t o = o0 + g;
        float* yr = a.y + out_row(a, tok) * a.ldy;
        if (o < a.w.N) yr[o] = lo;
        if (o + 8 < a.w.N) yr[o + 8] = hi;
      }
    }
}

template <int TN, int U, int KS>
cudaError_t launch_q(const QArgs& a, bool sw, int groups, cudaStream_t s) {
  constexpr int G = KS >= 4 ? 1 : 4 / KS;  // at least 4 warps a block
  constexpr int kThreads = kBlockThreads<KS, G>;
  if (a.w.nvfp4) {
    const int64_t tiles = (a.w.N + 15) / 16;
    const dim3 grid(grid_1d(tiles, G), static_cast<unsigned>(groups));
    if (sw) return launch(kernel_gemv_nvfp4<TN, U, KS, G, true>, grid, dim3(kThreads), 0, s, a);
    return launch(kernel_gemv_nvfp4<TN, U, KS, G, false>, grid, dim3(kThreads), 0, s, a);
  }
  constexpr int U8 = U / 2 ? U / 2 : 1;  // an FP8 k-tile is twice an NVFP4 one's bytes
  const int64_t per = sw ? 8 : 16;
  const dim3 grid(grid_1d((a.n_out + per - 1) / per, G), static_cast<unsigned>(groups));
  if (sw) return launch(kernel_gemv_fp8<TN, U8, KS, G, true>, grid, dim3(kThreads), 0, s, a);
  return launch(kernel_gemv_fp8<TN, U8, KS, G, false>, grid, dim3(kThreads), 0, s, a);
}

// DELTAFLOW_QGEMV_KS (1, 2, 4 or 8: the column split) and DELTAFLOW_QGEMV_U (4 or 8: NVFP4 column tiles a
// warp loads at once, FP8 half as many) fix the choice, for sweeps with `bench --gemv`; unset: chosen.
int env_choice(const char* name, std::initializer_list<int> allowed) {
  const char* e = std::getenv(name);
  const int v = e ? std::atoi(e) : 0;
  for (int a : allowed)
    if (v == a) return v;
  return 0;
}
int forced_split() {
  static const int ks = env_choice("DELTAFLOW_QGEMV_KS", {1, 2, 4, 8});
  return ks;
}
int forced_unroll() {
  static const int u = env_choice("DELTAFLOW_QGEMV_U", {4, 8});
  return u;
}

template <int TN, int U>
cudaError_t by_split_u(const QArgs& a, bool sw, int groups, int ks, cudaStream_t s) {
  switch (ks) {
    case 1:
      return launch_q<TN, U, 1>(a, sw, groups, s);
    case 2:
      return launch_q<TN, U, 2>(a, sw, groups, s);
    case 4:
      return launch_q<TN, U, 4>(a, sw, groups, s);
    case 8:
      return launch_q<TN, U, 8>(a, sw, groups, s);
    default:
      return cudaErrorInvalidValue;
  }
}

// Warps splitting K (KS): up to 16 rows, 8 (one output tile a block) whenever there are 8 column tiles. On
// an H100 (bench --gemv) that streams 17408x5120, 5120x17408 and 34816x5120 fastest of 1, 2, 4, 8 and 16
// at 1 to 8 rows: a 4-bit GEMV's warp holds only U x 512 bytes in flight, so the launch wants many short
// warps (NVFP4 at one row: 68%, 74%, 78% of the copy rate, against 58%, 37%, 71% with a split only for few
// row tiles; U = 8 was slower). At 16 rows 8 was faster than the old choice too (NVFP4 37% and 34% of the
// copy rate against 28% and 23%); at 32 rows each warp's activation loads dominate and 8 took up to 1.5x
// longer than 4.
template <int TN>
cudaError_t by_split(const QArgs& a, bool sw, int groups, int split, cudaStream_t s) {
  const int64_t tiles_k = a.w.K / 64;
  int ks = split ? split : forced_split();
  if (ks == 0) {
    ks = TN <= 2 ? 8 : 4;
    while (ks > 1 && tiles_k < ks) ks /= 2;
  }
  if (forced_unroll() == 8) return by_split_u<TN, 8>(a, sw, groups, ks, s);
  return by_split_u<TN, 4>(a, sw, groups, ks, s);
}

cudaError_t run(const QArgs& a0, bool sw, int groups, int split, cudaStream_t s) {
  QArgs a = a0;
  const QuantWeight& w = a.w;
  if (w.N == 0 || a.T == 0 || groups == 0) return cudaSuccess;
  if (a.T < 0 || a.T > kQuantGemvMaxRows || w.K % 64 != 0 || groups > 65535 || a.x_div <= 0 ||
      (sw && w.N % 16 != 0) || (sw && w.nvfp4 && !w.interleave) ||
      (!w.nvfp4 && (!w.grid || w.block_cols < 64)) || (w.nvfp4 && (!w.scales || !w.row_scales)))
    return cudaErrorInvalidValue;
  a.n_out = sw ? w.N / 2 : w.N;
  if (a.T <= 8) return by_split<1>(a, sw, groups, split, s);
  if (a.T <= 16) return by_split<2>(a, sw, groups, split, s);
  return by_split<4>(a, sw, groups, split, s);
}

// ---- staging, dequantization, random fill

__global__ void __launch_bounds__(256)
    kernel_stage(const float* x, int64_t ldx, const int* rows, int64_t K, __half* xh, float* factor) {
  pdl_enter();
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const float* row = x + (rows ? rows[t] : t) * ldx;
  float m = 0.0f;
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) m = fmaxf(m, fabsf(row[k]));
  m = warp_max(m);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  if (l == 0) red[w] = m;
  __syncthreads();
  float amax = 0.0f;
  for (int i = 0; i < (blockDim.x >> 5); ++i) amax = fmaxf(amax, red[i]);
  const int e = f16_stage_exponent(amax);
  const float down = ldexpf(1.0f, -e);
  if (threadIdx.x == 0) factor[t] = ldexpf(1.0f, e);
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) xh[t * K + k] = __float2half_rn(row[k] * down);
}

// The grouped form's matrix blockIdx.y (expert e of a stacked set: its codes, scales and grid at the
// strides, its values at out + e * N * K); a no-op for one matrix (strides 0, one grid row).
__device__ __forceinline__ void enter_matrix(QuantWeight& w, __nv_bfloat16*& out) {
  const int64_t e = blockIdx.y;
  w.codes = static_cast<const uint8_t*>(w.codes) + e * w.codes_stride;
  if (w.scales) w.scales += e * w.scales_stride;
  if (w.row_scales) w.row_scales += e * w.row_stride;
  if (w.grid) w.grid += e * w.grid_stride;
  out += e * w.N * w.K;
}

// One thread per 8 consecutive columns of one row: their codes sit in two lane words of the row's tile (the
// row's half of each word's slots, quant_pack.hpp), all under one block scale; the 8 bf16 values go out as
// one 16-byte store, so a warp writes 512 contiguous bytes of the row.
// Index is uint32_t where N * K / 8 fits it (every matrix of the family): a 64-bit division per 8 values
// costs more than the values' decode.
template <typename Index>
__global__ void kernel_dequant_nvfp4(QuantWeight w, __nv_bfloat16* out) {
  enter_matrix(w, out);
  const Index chunks = static_cast<Index>(w.K / 8), total = static_cast<Index>(w.N) * chunks;
  const int64_t tiles_k = w.K / 64;
  const uint32_t* codes = static_cast<const uint32_t*>(w.codes);
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const int64_t n = i / chunks, k = static_cast<int64_t>(i % chunks) * 8;
    // The tile and tile row of matrix row n (tile_row's inverse).
    int64_t t;
    int r;
    if (w.interleave) {
      const int64_t half_rows = w.N / 2, m = n < half_rows ? n : n - half_rows;
      t = m / 8;
      r = static_cast<int>(m % 8) + (n < half_rows ? 0 : 8);
    } else {
      t = n / 16;
      r = static_cast<int>(n % 16);
    }
    const int g = r % 8, hi = r / 8;
    const int64_t kt = k / 64;
    const int kc = static_cast<int>(k % 64), j = kc / 16, q0 = (kc % 16) / 4;
    const uint32_t* tile = codes + (t * tiles_k + kt) * 128;
    const float sb =
        e4m3_to_float(w.scales[(t * tiles_k + kt) * 64 + 8 * g + 4 * hi + j]) * w.row_scales[n] * 16384.0f;
    float v[8];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t word = tile[(4 * g + q0 + h) * 4 + j];  // lane 4g + q, word j: columns 4q .. 4q + 3
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int slot = (e >= 2 ? 2 : 0) + hi, half = e & 1;
        const uint32_t code =
            ((word >> (16 * half + 3 * slot)) & 7) | (((word >> (16 * half + 12 + slot)) & 1) << 3);
        v[4 * h + e] = e2m1_value_2m14(code) * sb;
      }
    }
    uint4 o;
    __nv_bfloat162 b[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) b[e] = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
    memcpy(&o, b, 16);
    *reinterpret_cast<uint4*>(out + n * w.K + k) = o;
  }
}

template <typename Index>
__global__ void kernel_dequant_fp8(QuantWeight w, __nv_bfloat16* out) {
  enter_matrix(w, out);
  const Index quads_per_row = static_cast<Index>(w.K / 4), quads = static_cast<Index>(w.N) * quads_per_row;
  const uint32_t* codes = static_cast<const uint32_t*>(w.codes);
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < quads;
       i += static_cast<Index>(gridDim.x) * blockDim.x) {
    const int64_t n = i / quads_per_row, k = static_cast<int64_t>(i % quads_per_row) * 4;
    const float sc = w.grid[(n / w.block_rows) * w.grid_cols + k / w.block_cols];
    const uint32_t v = codes[i];
    const float2 a = e4m3x2_to_float2(v), b = e4m3x2_to_float2(v >> 16);
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(out + n * w.K + k);
    o[0] = __floats2bfloat162_rn(a.x * sc, a.y * sc);
    o[1] = __floats2bfloat162_rn(b.x * sc, b.y * sc);
  }
}

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return static_cast<uint32_t>(x ^ (x >> 31));
}

// kind 0: any byte (E2M1 pairs), 1: E4M3 codes but NaN, 2: E4M3 in [0.5, 1); fp32 entries: value.
__global__ void kernel_fill_bytes(uint8_t* p, int64_t n, uint64_t seed, int kind) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint8_t b = static_cast<uint8_t>(hash32(seed * 0x100000001B3ull + static_cast<uint64_t>(i)));
    if (kind == 1 && (b & 0x7f) == 0x7f) b ^= 1;
    if (kind == 2) b = 0x30 | (b & 7);
    p[i] = b;
  }
}
__global__ void kernel_fill_value(float* p, int64_t n, float v) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = v;
}

}  // namespace

cudaError_t stage_activations_f16(const float* x, int64_t ldx, int T, int64_t K, void* xh, float* factor,
                                  cudaStream_t stream) {
  if (T == 0) return cudaSuccess;
  return launch(kernel_stage, dim3(static_cast<unsigned>(T)), dim3(256), 0, stream, x, ldx,
                static_cast<const int*>(nullptr), K, static_cast<__half*>(xh), factor);
}

cudaError_t stage_activations_f16_rows(const float* x, int64_t ldx, const int* rows, int T, int64_t K,
                                       void* xh, float* factor, cudaStream_t stream) {
  if (T == 0) return cudaSuccess;
  if (!rows) return cudaErrorInvalidValue;
  return launch(kernel_stage, dim3(static_cast<unsigned>(T)), dim3(256), 0, stream, x, ldx, rows, K,
                static_cast<__half*>(xh), factor);
}

cudaError_t gemv_quant(const QuantWeight& W, const void* xh, const float* factor, int T, float* y,
                       int64_t ldy, bool swiglu, cudaStream_t stream, int split) {
  QArgs a{W, nullptr, 1, static_cast<const __half*>(xh), factor, T, y, ldy, 0};
  return run(a, swiglu, 1, split, stream);
}

cudaError_t gemv_quant_grouped(const QuantWeight& W, const int* expert, int groups, const void* xh,
                               const float* factor, int x_div, float* y, int64_t ldy, bool swiglu,
                               cudaStream_t stream, int split, const GroupedExtra& extra) {
  if (!expert || groups < 0 || extra.problems < 0 || extra.expert < 0 || extra.x0 < 0)
    return cudaErrorInvalidValue;
  QArgs a{W, expert, x_div, static_cast<const __half*>(xh), factor, 1, y, ldy, 0};
  a.n_routed = groups;
  a.extra_expert = extra.expert;
  a.extra_x0 = extra.x0;
  return run(a, swiglu, groups + extra.problems, split, stream);
}

cudaError_t gemv_quant_tiles(const QuantWeight& W, const GroupedTile* tiles, int max_tiles,
                             const int* n_tiles, const void* xh, const float* factor, float* y, int64_t ldy,
                             const int* y_rows, bool swiglu, cudaStream_t stream) {
  if (!tiles || !n_tiles || max_tiles < 0 || max_tiles > 65535 / 2) return cudaErrorInvalidValue;
  QArgs a{W, nullptr, 1, static_cast<const __half*>(xh), factor, kTileHalf, y, ldy, 0};
  a.tiles = tiles;
  a.n_tiles = n_tiles;
  a.y_rows = y_rows;
  return run(a, swiglu, 2 * max_tiles, 0, stream);
}

cudaError_t dequantize_bf16(const QuantWeight& W, void* out, cudaStream_t stream) {
  QuantWeight one = W;
  one.codes_stride = one.scales_stride = one.row_stride = one.grid_stride = 0;
  return dequantize_bf16_grouped(one, 1, out, stream);
}

cudaError_t dequantize_bf16_grouped(const QuantWeight& W, int groups, void* out, cudaStream_t stream) {
  if (W.N == 0 || groups == 0) return cudaSuccess;
  if (W.K % 64 != 0 || groups < 0 || groups > 65535) return cudaErrorInvalidValue;
  auto* o = static_cast<__nv_bfloat16*>(out);
  // The grid-stride index, past the last item by at most one launch's threads, stays below 2^32.
  const auto fits_u32 = [](int64_t items) {
    return items + static_cast<int64_t>(grid_stride_256(items)) * 256 < (int64_t{1} << 32);
  };
  // Fewer blocks per matrix when there are many: the whole set is one launch of about the same size.
  const auto per = [&](int64_t n) {
    return dim3(std::max(1u, grid_stride_256(n) / static_cast<unsigned>(std::min(groups, 64))),
                static_cast<unsigned>(groups));
  };
  if (W.nvfp4) {
    if (reinterpret_cast<uintptr_t>(out) % 16 != 0) return cudaErrorInvalidValue;
    if (fits_u32(W.N * (W.K / 8)))
      kernel_dequant_nvfp4<uint32_t><<<per(W.N * W.K / 8), 256, 0, stream>>>(W, o);
    else
      kernel_dequant_nvfp4<int64_t><<<per(W.N * W.K / 8), 256, 0, stream>>>(W, o);
  } else {
    if (W.K % 4 != 0) return cudaErrorInvalidValue;
    if (fits_u32(W.N * (W.K / 4)))
      kernel_dequant_fp8<uint32_t><<<per(W.N * W.K / 4), 256, 0, stream>>>(W, o);
    else
      kernel_dequant_fp8<int64_t><<<per(W.N * W.K / 4), 256, 0, stream>>>(W, o);
  }
  return cudaGetLastError();
}

cudaError_t fill_quant_random(const QuantWeight& W, uint64_t seed, float scale, cudaStream_t stream) {
  auto* codes = const_cast<uint8_t*>(static_cast<const uint8_t*>(W.codes));
  if (W.nvfp4) {
    const int64_t bytes = (W.N + 15) / 16 * 16 * W.K / 2, sb = (W.N + 15) / 16 * 16 * W.K / 16;
    kernel_fill_bytes<<<grid_stride_256(bytes), 256, 0, stream>>>(codes, bytes, seed, 0);
    kernel_fill_bytes<<<grid_stride_256(sb), 256, 0, stream>>>(const_cast<uint8_t*>(W.scales), sb, seed + 1,
                                                               2);
    kernel_fill_value<<<grid_stride_256(W.N), 256, 0, stream>>>(const_cast<float*>(W.row_scales), W.N,
                                                                scale / 6.0f * 1.33f);
  } else {
    const int64_t gr = (W.N + W.block_rows - 1) / W.block_rows;
    kernel_fill_bytes<<<grid_stride_256(W.N * W.K), 256, 0, stream>>>(codes, W.N * W.K, seed, 1);
    kernel_fill_value<<<grid_stride_256(gr * W.grid_cols), 256, 0, stream>>>(
        const_cast<float*>(W.grid), gr * W.grid_cols, scale / 448.0f);
  }
  return cudaGetLastError();
}

}  // namespace deltaflow::backend::cuda
