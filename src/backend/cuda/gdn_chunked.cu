#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gdn_chunked.cuh"
#include "backend/cuda/gdn_chunked_mma.cuh"

namespace deltaflow::backend::cuda {
namespace {

using gdn_mma::bf16;
using gdn_mma::load_a;
using gdn_mma::load_a_trans;
using gdn_mma::load_b_kn;
using gdn_mma::load_b_nk;
using gdn_mma::mma;
using gdn_mma::store_bf16x2;

constexpr int kL = kGdnChunkLen;   // tokens per chunk
constexpr int kThreads = 128;      // prepare: four warps; warp w owns chunk rows [16w, 16w + 16)
constexpr int kColsPerBlock = 32;  // state columns per block of the sequential pass
// The sequential pass: eight warps, warp w on chunk rows [16 (w % 4), +16) and state rows [dk/4 (w % 4),
// +dk/4) of column half w / 4. With four warps on all 32 columns a chunk was a chain of dependent mma and
// shared loads on 9% of the GPU's warp slots; the halves run side by side.
constexpr int kScanThreads = 256;
constexpr int kHalfCols = kColsPerBlock / 2;

// What the prepare pass leaves for the sequential pass, one record per (sequence, chunk, value head), records
// ordered chunk-major so the heads running side by side read neighbouring memory. Padded rows (past a short
// last chunk) are zero.
struct ChunkBufs {
  bf16* W;       // [rec][L][dk]  T diag(beta exp(G)) K
  bf16* Qg;      // [rec][L][dk]  exp(G_i) q_i
  bf16* Kd;      // [rec][L][dk]  exp(G_L - G_j) k_j
  bf16* P;       // [rec][L][L]   exp(G_i - G_j) q_i.k_j for j <= i, else 0
  float* U;      // [rec][L][dv]  T diag(beta) V
  float* decay;  // [rec]         exp(G_L)
};

size_t align256(size_t n) {
  return (n + 255) / 256 * 256;
}

// The workspace carved into ChunkBufs; returns the bytes used.
size_t carve(void* base, int64_t recs, int dk, int dv, ChunkBufs* cb) {
  const size_t sizes[6] = {static_cast<size_t>(recs * kL * dk) * 2, static_cast<size_t>(recs * kL * dk) * 2,
                           static_cast<size_t>(recs * kL * dk) * 2, static_cast<size_t>(recs * kL * kL) * 2,
                           static_cast<size_t>(recs * kL * dv) * 4, static_cast<size_t>(recs) * 4};
  void* ptrs[6];
  size_t off = 0;
  for (int i = 0; i < 6; ++i) {
    ptrs[i] = base ? static_cast<uint8_t*>(base) + off : nullptr;
    off += align256(sizes[i]);
  }
  if (cb) {
    cb->W = static_cast<bf16*>(ptrs[0]);
    cb->Qg = static_cast<bf16*>(ptrs[1]);
    cb->Kd = static_cast<bf16*>(ptrs[2]);
    cb->P = static_cast<bf16*>(ptrs[3]);
    cb->U = static_cast<float*>(ptrs[4]);
    cb->decay = static_cast<float*>(ptrs[5]);
  }
  return off;
}

// acc[n] (16 x 8 tiles n = 0..NT-1 of rows [m0, m0+16)) += A[m0.., 0..16*KS) B, A row-major [M][K] and B
// given as B^T row-major [N][K] (a product with a transposed matrix, like Q K^T).
template <int KS, int NT>
__device__ __forceinline__ void warp_gemm_abt(float (&acc)[NT][4], const bf16* A, int lda, const bf16* Bt,
                                              int ldb, int m0) {
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    uint32_t af[4];
    load_a(af, A, lda, m0, kk * 16);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      load_b_nk(b, Bt, ldb, kk * 16, np * 16);
      mma(acc[2 * np], af, b[0], b[1]);
      mma(acc[2 * np + 1], af, b[2], b[3]);
    }
  }
}

// acc += A[m0.., 0..16*ks) B with B row-major [K][N]; ks a run-time count (triangular A skips zero tiles).
template <int NT>
__device__ __forceinline__ void warp_gemm_ab(float (&acc)[NT][4], const bf16* A, int lda, const bf16* B,
                                             int ldb, int m0, int ks) {
  for (int kk = 0; kk < ks; ++kk) {
    uint32_t af[4];
    load_a(af, A, lda, m0, kk * 16);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      load_b_kn(b, B, ldb, kk * 16, np * 16);
      mma(acc[2 * np], af, b[0], b[1]);
      mma(acc[2 * np + 1], af, b[2], b[3]);
    }
  }
}

// warp_gemm_ab over B's columns [n0, n0 + 8 NT).
template <int NT>
__device__ __forceinline__ void warp_gemm_ab_cols(float (&acc)[NT][4], const bf16* A, int lda, const bf16* B,
                                                  int ldb, int m0, int ks, int n0) {
  warp_gemm_ab(acc, A, lda, B + n0, ldb, m0, ks);
}

template <int NT>
__device__ __forceinline__ void zero(float (&acc)[NT][4]) {
#pragma unroll
  for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

// q's and k's tiles are dead once P and A are in registers: A (fp32) is written over them, and T after A
// when it fits there (dk 128). Four row tiles and the per-token scalars: three blocks fit an SM at dk = dv =
// 128 (the pass waits on its row loads and on the solve's dependent chain; with five tiles two fit).
template <int DK, int DV>
struct PrepareSmem {
  static constexpr int kLdK = DK + 8, kLdV = DV + 8, kLdT = kL + 8, kLdA = kL + 1;
  static constexpr size_t kQK = 2 * kL * kLdK * 2, kA = (kL * kLdA * 4 + 15) / 16 * 16, kT = kL * kLdT * 2;
  static_assert(kA <= kQK, "A fits over q and k");
  static constexpr bool kTOverQK = kA + kT <= kQK;
  static constexpr size_t kScalars = (3 * kL * kLdK + kL * kLdV) * 2;  // byte offset of G and beta
  static constexpr size_t kTOffset = kTOverQK ? kA : kScalars + 2 * kL * 4;
  static constexpr size_t kBytes = kScalars + 2 * kL * 4 + (kTOverQK ? 0 : kT);
};

// Block (chunk c, value head j, sequence s): everything of the chunk that does not depend on the state.
template <int DK, int DV>
__global__ void __launch_bounds__(kThreads) kernel_gdn_prepare(GdnArgs a, ChunkBufs cb, int n_chunks) {
  using Sm = PrepareSmem<DK, DV>;
  constexpr int LDK = Sm::kLdK, LDV = Sm::kLdV, LDT = Sm::kLdT, LDA = Sm::kLdA;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Qb = reinterpret_cast<bf16*>(smem_raw);                   // [L][LDK] l2norm(q) dk^-0.5
  bf16* Kb = Qb + kL * LDK;                                       // [L][LDK] l2norm(k)
  bf16* KBb = Kb + kL * LDK;                                      // [L][LDK] beta exp(G) k
  bf16* Vb = KBb + kL * LDK;                                      // [L][LDV] beta v
  float* Gs = reinterpret_cast<float*>(smem_raw + Sm::kScalars);  // [L] cumulative log decay
  float* Bs = Gs + kL;                                            // [L] beta
  float* Af = reinterpret_cast<float*>(smem_raw);                 // [L][LDA] A, strictly lower
  bf16* Tb = reinterpret_cast<bf16*>(smem_raw + Sm::kTOffset);    // [L][LDT] (I + A)^-1

  const int c = blockIdx.x, j = blockIdx.y, s = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g8 = lane >> 2, t4 = lane & 3;
  const int64_t t0 = static_cast<int64_t>(s) * a.tokens_per_seq + static_cast<int64_t>(c) * kL;
  const int len = min(kL, a.tokens_per_seq - c * kL);
  const int kh = j / (a.nv / a.nk);
  const int64_t rec = (static_cast<int64_t>(s) * n_chunks + c) * a.nv + j;

  // beta and g per token (zero past the chunk's end), then the inclusive scan of g over the 64 rows.
  if (tid < kL) {
    float beta = 0.0f, g = 0.0f;
    if (tid < len) {
      const int64_t r = (t0 + tid) * a.ld_proj + j;
      beta = sigmoid_f(a.b[r]);
      g = -expf(a.A_log[j]) * softplus_f(a.a[r] + a.dt_bias[j]);
    }
    Bs[tid] = beta;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, g, o);
      if (lane >= o) g += y;
    }
    Gs[tid] = g;
  }
  __syncthreads();
  if (tid >= 32 && tid < kL) Gs[tid] += Gs[31];
  __syncthreads();

  // Rows: l2norm of q and k (FLA: x * rsqrt(sum x^2 + 1e-6)), the bf16 operands, and the q / k records.
  constexpr int PK = DK / 32, PV = DV / 32;
  const int64_t kd = static_cast<int64_t>(a.nk) * DK;
  const float q_scale = 1.0f / sqrtf(static_cast<float>(DK));
  const float G_last = Gs[kL - 1];
  // A warp takes kRowsInFlight of its rows at a time, all their loads issued before the first use: one row
  // at a time left the block waiting on a global load per row (a few blocks per SM: little else to run).
  constexpr int kRowsInFlight = 4, kWarps = kThreads / 32;
  for (int i0 = warp; i0 < kL; i0 += kWarps * kRowsInFlight) {
    float q[kRowsInFlight][PK], k[kRowsInFlight][PK], v[kRowsInFlight][PV];
#pragma unroll
    for (int r = 0; r < kRowsInFlight; ++r) {
      const int i = i0 + r * kWarps;
      const bool live = i < len;
      const float* row = a.conv + (t0 + (live ? i : 0)) * a.ld_conv;
#pragma unroll
      for (int p = 0; p < PK; ++p) {
        q[r][p] = live ? row[kh * DK + lane + 32 * p] : 0.0f;
        k[r][p] = live ? row[kd + kh * DK + lane + 32 * p] : 0.0f;
      }
#pragma unroll
      for (int p = 0; p < PV; ++p)
        v[r][p] = live ? row[2 * kd + static_cast<int64_t>(j) * DV + lane + 32 * p] : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < kRowsInFlight; ++r) {
      const int i = i0 + r * kWarps;
      float sq = 0.0f, sk = 0.0f;
#pragma unroll
      for (int p = 0; p < PK; ++p) {
        sq = fmaf(q[r][p], q[r][p], sq);
        sk = fmaf(k[r][p], k[r][p], sk);
      }
      sq = warp_sum(sq);
      sk = warp_sum(sk);
      const float rq = (1.0f / sqrtf(sq + 1e-6f)) * q_scale, rk = 1.0f / sqrtf(sk + 1e-6f);
      const float G = Gs[i], beta = Bs[i], eG = expf(G), eGL = expf(G_last - G);
      bf16* Qg = cb.Qg + (rec * kL + i) * DK;
      bf16* Kd = cb.Kd + (rec * kL + i) * DK;
#pragma unroll
      for (int p = 0; p < PK; ++p) {
        const int d = lane + 32 * p;
        const float qn = q[r][p] * rq, kn = k[r][p] * rk;
        Qb[i * LDK + d] = __float2bfloat16_rn(qn);
        Kb[i * LDK + d] = __float2bfloat16_rn(kn);
        KBb[i * LDK + d] = __float2bfloat16_rn(beta * eG * kn);
        Qg[d] = __float2bfloat16_rn(eG * qn);
        Kd[d] = __float2bfloat16_rn(eGL * kn);
      }
#pragma unroll
      for (int p = 0; p < PV; ++p) Vb[i * LDV + lane + 32 * p] = __float2bfloat16_rn(beta * v[r][p]);
    }
  }
  if (tid == 0) cb.decay[rec] = expf(G_last);
  __syncthreads();

  const int m0 = warp * 16;
  {
    // P = (Q K^T) with the decay, causal (diagonal kept).
    float acc[kL / 8][4];
    zero(acc);
    warp_gemm_abt<DK / 16>(acc, Qb, LDK, Kb, LDK, m0);
    bf16* P = cb.P + rec * kL * kL;
#pragma unroll
    for (int n = 0; n < kL / 8; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = m0 + g8 + 8 * h, jj = n * 8 + 2 * t4;
        const float Gi = Gs[i];
        const float p0 = jj <= i ? expf(Gi - Gs[jj]) * acc[n][2 * h] : 0.0f;
        const float p1 = jj + 1 <= i ? expf(Gi - Gs[jj + 1]) * acc[n][2 * h + 1] : 0.0f;
        store_bf16x2(P + i * kL + jj, p0, p1);
      }
    // A = beta_i exp(G_i - G_j) k_i.k_j, strictly lower, in fp32 for the solve; written over q and k once
    // every warp is done reading them.
    zero(acc);
    warp_gemm_abt<DK / 16>(acc, Kb, LDK, Kb, LDK, m0);
    __syncthreads();
#pragma unroll
    for (int n = 0; n < kL / 8; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = m0 + g8 + 8 * h, jj = n * 8 + 2 * t4;
        const float Gi = Gs[i], bi = Bs[i];
        Af[i * LDA + jj] = jj < i ? bi * expf(Gi - Gs[jj]) * acc[n][2 * h] : 0.0f;
        Af[i * LDA + jj + 1] = jj + 1 < i ? bi * expf(Gi - Gs[jj + 1]) * acc[n][2 * h + 1] : 0.0f;
      }
  }
  __syncthreads();

  // T = (I + A)^-1 by forward substitution in fp32, thread `col` computing column col:
  //   T[i][col] = [i == col] - sum_{j < i} A[i][j] T[j][col]   (four partial sums to shorten the chain).
  if (tid < kL) {
    const int col = tid;
    float t[kL];
#pragma unroll
    for (int i = 0; i < kL; ++i) {
      float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma unroll
      for (int jj = 0; jj < i; ++jj) {
        const float x = Af[i * LDA + jj] * t[jj];
        if (jj % 4 == 0) s0 += x;
        if (jj % 4 == 1) s1 += x;
        if (jj % 4 == 2) s2 += x;
        if (jj % 4 == 3) s3 += x;
      }
      t[i] = (i == col ? 1.0f : 0.0f) - ((s0 + s1) + (s2 + s3));
    }
#pragma unroll
    for (int i = 0; i < kL; ++i) Tb[i * LDT + col] = __float2bfloat16_rn(t[i]);
  }
  __syncthreads();

  // U = T (beta V), W = T (beta exp(G) K); T is lower triangular, so warp w needs k-tiles 0..w only.
  {
    float acc[DV / 8][4];
    zero(acc);
    warp_gemm_ab(acc, Tb, LDT, Vb, LDV, m0, warp + 1);
    float* U = cb.U + rec * kL * DV;
#pragma unroll
    for (int n = 0; n < DV / 8; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = m0 + g8 + 8 * h, e = n * 8 + 2 * t4;
        *reinterpret_cast<float2*>(U + i * DV + e) = make_float2(acc[n][2 * h], acc[n][2 * h + 1]);
      }
  }
  {
    float acc[DK / 8][4];
    zero(acc);
    warp_gemm_ab(acc, Tb, LDT, KBb, LDK, m0, warp + 1);
    bf16* W = cb.W + rec * kL * DK;
#pragma unroll
    for (int n = 0; n < DK / 8; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = m0 + g8 + 8 * h, d = n * 8 + 2 * t4;
        store_bf16x2(W + i * DK + d, acc[n][2 * h], acc[n][2 * h + 1]);
      }
  }
}

template <int DK>
struct ScanSmem {
  static constexpr int kLdK = DK + 8, kLdL = kL + 8, kLdB = kColsPerBlock + 8, kLdU = kColsPerBlock + 4;
  static constexpr size_t kBytes =
      (3 * kL * kLdK + kL * kLdL + DK * kLdB + kL * kLdB) * 2 + static_cast<size_t>(kL * kLdU) * 4;
};

// Block (32 state columns from e0, value head j, sequence s): the sequential pass over the chunks. The state
// slice S[:, e0..e0+32) stays in fp32 registers (warp w: rows [(w % 4) dk/4, +dk/4), columns of half w / 4);
// its bf16 copy in shared memory feeds the products. Per chunk:
//   Delta = U - W S0 ; O = Qg S0 + P Delta (written pre-norm to out) ; S = exp(G_L) S0 + Kd^T Delta
// The chunk's operands arrive by cp.async in two groups, each issued as soon as the previous chunk is done
// with its buffers: W, Qg, U (used first) and Kd, P (used after Delta).
template <int DK>
__global__ void __launch_bounds__(kScanThreads) kernel_gdn_chunk_scan(GdnArgs a, ChunkBufs cb, int n_chunks) {
  using Sm = ScanSmem<DK>;
  constexpr int LDK = Sm::kLdK, LDL = Sm::kLdL, LDB = Sm::kLdB, LDU = Sm::kLdU;
  constexpr int NT = kHalfCols / 8;  // n-tiles per warp
  constexpr int MS = DK / 64;        // 16-row state tiles per warp
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Ws = reinterpret_cast<bf16*>(smem_raw);         // [L][LDK]
  bf16* Qs = Ws + kL * LDK;                             // [L][LDK]
  bf16* Kds = Qs + kL * LDK;                            // [L][LDK]
  bf16* Ps = Kds + kL * LDK;                            // [L][LDL]
  bf16* S0b = Ps + kL * LDL;                            // [DK][LDB] the state slice in bf16
  bf16* Db = S0b + DK * LDB;                            // [L][LDB] Delta in bf16
  float* Us = reinterpret_cast<float*>(Db + kL * LDB);  // [L][LDU]

  const int e0 = blockIdx.x * kColsPerBlock, j = blockIdx.y, s = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g8 = lane >> 2, t4 = lane & 3;
  const int dv = a.dv;
  float* S = a.states + static_cast<int64_t>(a.slots[s]) * a.slot_stride + static_cast<int64_t>(j) * DK * dv;
  const int rg = warp & 3;                 // row group
  const int ec = (warp >> 2) * kHalfCols;  // this warp's first column in the block's slice
  const int sm0 = rg * (DK / 4);           // this warp's first state row
  const int m0 = rg * 16;                  // this warp's first chunk row

  auto rec_of = [&](int c) { return (static_cast<int64_t>(s) * n_chunks + c) * a.nv + j; };
  auto issue_first = [&](int c) {
    if (c < n_chunks) {
      const int64_t r = rec_of(c);
      gdn_mma::copy_tile_async(Ws, LDK, cb.W + r * kL * DK, DK, kL, DK);
      gdn_mma::copy_tile_async(Qs, LDK, cb.Qg + r * kL * DK, DK, kL, DK);
      gdn_mma::copy_tile_async(Us, LDU, cb.U + r * kL * dv + e0, dv, kL, kColsPerBlock);
    }
    gdn_mma::cp_async_commit();
  };
  auto issue_second = [&](int c) {
    if (c < n_chunks) {
      const int64_t r = rec_of(c);
      gdn_mma::copy_tile_async(Kds, LDK, cb.Kd + r * kL * DK, DK, kL, DK);
      gdn_mma::copy_tile_async(Ps, LDL, cb.P + r * kL * kL, kL, kL, kL);
    }
    gdn_mma::cp_async_commit();
  };

  float st[MS][NT][4];
#pragma unroll
  for (int m = 0; m < MS; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = sm0 + m * 16 + g8 + 8 * h, e = ec + n * 8 + 2 * t4;
        const float2 v = *reinterpret_cast<const float2*>(S + static_cast<int64_t>(r) * dv + e0 + e);
        st[m][n][2 * h] = v.x;
        st[m][n][2 * h + 1] = v.y;
        store_bf16x2(S0b + r * LDB + e, v.x, v.y);
      }
  issue_first(0);
  issue_second(0);

  for (int c = 0; c < n_chunks; ++c) {
    gdn_mma::cp_async_wait<1>();
    __syncthreads();
    const int64_t r = rec_of(c);
    const int len = min(kL, a.tokens_per_seq - c * kL);
    const int64_t t0 = static_cast<int64_t>(s) * a.tokens_per_seq + static_cast<int64_t>(c) * kL;

    // nd = W S0 - U (= -Delta) and o = Qg S0, sharing the S0 fragments.
    float nd[NT][4], o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 u = *reinterpret_cast<const float2*>(Us + (m0 + g8 + 8 * h) * LDU + ec + n * 8 + 2 * t4);
        nd[n][2 * h] = -u.x;
        nd[n][2 * h + 1] = -u.y;
      }
    zero(o);
#pragma unroll
    for (int kk = 0; kk < DK / 16; ++kk) {
      uint32_t aw[4], aq[4];
      load_a(aw, Ws, LDK, m0, kk * 16);
      load_a(aq, Qs, LDK, m0, kk * 16);
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t b[4];
        load_b_kn(b, S0b, LDB, kk * 16, ec + np * 16);
        mma(nd[2 * np], aw, b[0], b[1]);
        mma(nd[2 * np + 1], aw, b[2], b[3]);
        mma(o[2 * np], aq, b[0], b[1]);
        mma(o[2 * np + 1], aq, b[2], b[3]);
      }
    }
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        store_bf16x2(Db + (m0 + g8 + 8 * h) * LDB + ec + n * 8 + 2 * t4, -nd[n][2 * h], -nd[n][2 * h + 1]);
    gdn_mma::cp_async_wait<0>();
    __syncthreads();
    issue_first(c + 1);  // W, Qg, U are no longer read in this chunk

    // o += P Delta (P lower triangular: k-tiles 0..row group), written pre-norm.
    warp_gemm_ab_cols(o, Ps, LDL, Db, LDB, m0, rg + 1, ec);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = m0 + g8 + 8 * h;
      if (i < len) {
        float* dst = a.out + (t0 + i) * a.ld_out + static_cast<int64_t>(j) * dv + e0;
#pragma unroll
        for (int n = 0; n < NT; ++n)
          *reinterpret_cast<float2*>(dst + ec + n * 8 + 2 * t4) = make_float2(o[n][2 * h], o[n][2 * h + 1]);
      }
    }

    // S = exp(G_L) S0 + Kd^T Delta.
    const float decay = cb.decay[r];
#pragma unroll
    for (int m = 0; m < MS; ++m) {
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int q = 0; q < 4; ++q) st[m][n][q] *= decay;
#pragma unroll
      for (int kk = 0; kk < kL / 16; ++kk) {
        uint32_t ak[4];
        load_a_trans(ak, Kds, LDK, sm0 + m * 16, kk * 16);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          uint32_t b[4];
          load_b_kn(b, Db, LDB, kk * 16, ec + np * 16);
          mma(st[m][2 * np], ak, b[0], b[1]);
          mma(st[m][2 * np + 1], ak, b[2], b[3]);
        }
      }
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          store_bf16x2(S0b + (sm0 + m * 16 + g8 + 8 * h) * LDB + ec + n * 8 + 2 * t4, st[m][n][2 * h],
                       st[m][n][2 * h + 1]);
    }
    __syncthreads();
    issue_second(c + 1);  // Kd, P are no longer read in this chunk
  }
  gdn_mma::cp_async_wait<0>();

#pragma unroll
  for (int m = 0; m < MS; ++m)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = sm0 + m * 16 + g8 + 8 * h, e = ec + n * 8 + 2 * t4;
        *reinterpret_cast<float2*>(S + static_cast<int64_t>(r) * dv + e0 + e) =
            make_float2(st[m][n][2 * h], st[m][n][2 * h + 1]);
      }
}

// y = w * (o * rsqrt(mean(o^2) + eps)) * silu(z) over each (token, head) row of dv, in place on out, or into
// out16 (packed [tokens, nv*dv], rounded to TO) when it is set; one warp per row.
template <int DV, class TO>
__global__ void __launch_bounds__(256) kernel_gdn_gated_norm(GdnArgs a, int64_t rows) {
  constexpr int PV = DV / 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const int64_t t = row / a.nv;
  const int j = static_cast<int>(row % a.nv);
  float* o = a.out + t * a.ld_out + static_cast<int64_t>(j) * DV;
  const float* z = a.z + t * a.ld_proj + static_cast<int64_t>(j) * DV;
  float v[PV], ss = 0.0f;
#pragma unroll
  for (int p = 0; p < PV; ++p) {
    v[p] = o[lane + 32 * p];
    ss = fmaf(v[p], v[p], ss);
  }
  ss = warp_sum(ss);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(DV) + a.eps);
  TO* y = std::is_same_v<TO, float> ? reinterpret_cast<TO*>(o)
                                    : static_cast<TO*>(a.out16) + t * static_cast<int64_t>(a.nv) * DV +
                                          static_cast<int64_t>(j) * DV;
#pragma unroll
  for (int p = 0; p < PV; ++p) {
    const int e = lane + 32 * p;
    y[e] = from_f32<TO>(a.norm_w[e] * (v[p] * inv) * silu_f(z[e]));
  }
}

template <class Kernel>
cudaError_t allow_smem(Kernel k, size_t bytes) {
  return cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

template <int DK, int DV>
cudaError_t launch(const GdnArgs& a, const ChunkBufs& cb, int n_chunks, cudaStream_t stream) {
  static const cudaError_t prep_ok = allow_smem(kernel_gdn_prepare<DK, DV>, PrepareSmem<DK, DV>::kBytes);
  static const cudaError_t scan_ok = allow_smem(kernel_gdn_chunk_scan<DK>, ScanSmem<DK>::kBytes);
  if (prep_ok != cudaSuccess) return prep_ok;
  if (scan_ok != cudaSuccess) return scan_ok;
  const dim3 prep_grid(static_cast<unsigned>(n_chunks), static_cast<unsigned>(a.nv),
                       static_cast<unsigned>(a.n_seqs));
  kernel_gdn_prepare<DK, DV><<<prep_grid, kThreads, PrepareSmem<DK, DV>::kBytes, stream>>>(a, cb, n_chunks);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const dim3 scan_grid(static_cast<unsigned>(DV / kColsPerBlock), static_cast<unsigned>(a.nv),
                       static_cast<unsigned>(a.n_seqs));
  kernel_gdn_chunk_scan<DK><<<scan_grid, kScanThreads, ScanSmem<DK>::kBytes, stream>>>(a, cb, n_chunks);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const int64_t rows = static_cast<int64_t>(a.n_seqs) * a.tokens_per_seq * a.nv;
  if (a.out16 == nullptr)
    kernel_gdn_gated_norm<DV, float><<<grid_1d(rows, 8), 256, 0, stream>>>(a, rows);
  else if (a.out16_type == core::DType::kBF16)
    kernel_gdn_gated_norm<DV, __nv_bfloat16><<<grid_1d(rows, 8), 256, 0, stream>>>(a, rows);
  else
    kernel_gdn_gated_norm<DV, __half><<<grid_1d(rows, 8), 256, 0, stream>>>(a, rows);
  return cudaGetLastError();
}

}  // namespace

bool gdn_chunked_supported(int nk, int nv, int dk, int dv) {
  return nk > 0 && nv > 0 && nv % nk == 0 && (dk == 64 || dk == 128) && (dv == 64 || dv == 128);
}

size_t gdn_chunked_workspace_bytes(int n_seqs, int tokens_per_seq, int nv, int dk, int dv) {
  const int64_t n_chunks = (static_cast<int64_t>(tokens_per_seq) + kL - 1) / kL;
  return carve(nullptr, static_cast<int64_t>(n_seqs) * n_chunks * nv, dk, dv, nullptr);
}

cudaError_t gated_deltanet_chunked(const GdnArgs& a, void* workspace, size_t workspace_bytes,
                                   cudaStream_t stream) {
  if (a.n_seqs == 0 || a.tokens_per_seq == 0) return cudaSuccess;
  if (!gdn_chunked_supported(a.nk, a.nv, a.dk, a.dv) || a.n_seqs > 65535 || a.nv > 65535 ||
      a.ld_out % 2 != 0 || reinterpret_cast<uintptr_t>(a.out) % 8 != 0 ||
      reinterpret_cast<uintptr_t>(a.states) % 8 != 0 || a.slot_stride % 2 != 0)
    return cudaErrorInvalidValue;
  if ((a.out16 && a.out16_type != core::DType::kBF16 && a.out16_type != core::DType::kF16) || a.snap_slots ||
      a.seq_start)
    return cudaErrorInvalidValue;
  if (workspace == nullptr ||
      workspace_bytes < gdn_chunked_workspace_bytes(a.n_seqs, a.tokens_per_seq, a.nv, a.dk, a.dv))
    return cudaErrorInvalidValue;
  const int n_chunks = (a.tokens_per_seq + kL - 1) / kL;
  ChunkBufs cb;
  carve(workspace, static_cast<int64_t>(a.n_seqs) * n_chunks * a.nv, a.dk, a.dv, &cb);
  if (a.dk == 64 && a.dv == 64) return launch<64, 64>(a, cb, n_chunks, stream);
  if (a.dk == 64 && a.dv == 128) return launch<64, 128>(a, cb, n_chunks, stream);
  if (a.dk == 128 && a.dv == 64) return launch<128, 64>(a, cb, n_chunks, stream);
  return launch<128, 128>(a, cb, n_chunks, stream);
}

}  // namespace deltaflow::backend::cuda
