// linear(): y[T, N] = x[T, K] @ W^T, the hot loop of the CPU backend.
//
// Two kernels, picked once per process from the CPU (never from T or the data):
//   kAvx2      x86-64 with AVX2 and FMA. Register-blocked, 12 accumulators: bf16 weights 4 rows of x against
//              3 weight rows, widened to fp32 in registers (a shift by 16); f32 weights (and bf16 widened a
//              block at a time once T >= 24) 3 rows of x against 4 weight rows. Each load of x or W feeds
//              3-4 FMAs, so the 8 rows of a decode step cost far less than 8 one-row steps. Weight blocks
//              are prefetched one ahead; other dtypes and quantized weights are converted a block at a time.
//   kPortable  anything else: each weight row converted to fp32, then an 8-partial-sum dot per row of x.
//
// Batch invariance (tests/unit/engine_batching_test.cpp checks it bitwise): y[t, n] depends on row t of x and
// row n of W only. Every dot of a kernel, whatever block it falls in, runs the same arithmetic: one 8-lane
// accumulator (kAvx2) or 8 partial sums (kPortable) over K in order, the last partial group zero-padded, and
// one fixed horizontal sum. The blocking only decides how many dots run side by side.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backend/cpu/ops.hpp"
#include "core/threads.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define DF_LINEAR_X86 1
#else
#define DF_LINEAR_X86 0
#endif

namespace deltaflow::backend::cpu {
namespace {

// ---------------------------------------------------------------------------------------------------------
// Portable kernel

// fp32 dot product with 8 partial sums, so the compiler can vectorise it without -ffast-math.
float dot8(const float* a, const float* b, int64_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + tail;
}

void linear_portable(const float* x, int64_t T, const Mat& W, float* y) {
  const int64_t N = W.rows, K = W.cols;
  core::parallel_for(static_cast<size_t>(N), 16, [&](size_t b, size_t e) {
    std::vector<float> w(static_cast<size_t>(K));
    for (size_t n = b; n < e; ++n) {
      load_row(W, static_cast<int64_t>(n), w.data());
      for (int64_t t = 0; t < T; ++t) y[t * N + static_cast<int64_t>(n)] = dot8(x + t * K, w.data(), K);
    }
  });
}

// ---------------------------------------------------------------------------------------------------------
// AVX2 + FMA kernel (compiled for that target whatever the build flags; run only where the CPU has it)

#if DF_LINEAR_X86
#define DF_AVX2 __attribute__((target("avx2,fma")))

// Weight rows per block of work: one block is read (bf16 / f32) or converted (other dtypes) once and dotted
// with every row of x. bf16 blocks read in place are 12 rows (4 x 3 register blocks), f32 blocks 8 (3 x 4);
// threads split the rows in units of 24, a multiple of both.
constexpr int64_t kRowsPerBlock = 8;
constexpr int64_t kBf16RowsPerBlock = 12;
constexpr int64_t kRowsPerUnit = 24;

DF_AVX2 inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
DF_AVX2 inline __m256 load8(const uint16_t* p) {  // 8 bf16 -> 8 fp32, exactly
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// The last K % 8 elements, zero-padded to 8 (a zero product leaves the accumulator as it was).
inline float to_f32(float v) {
  return v;
}
inline float to_f32(uint16_t v) {
  return core::bf16_to_f32(v);
}
template <typename E>
DF_AVX2 inline __m256 load_tail(const E* p, int64_t n) {
  alignas(32) float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n; ++i) buf[i] = to_f32(p[i]);
  return _mm256_load_ps(buf);
}

// The one horizontal sum every dot ends with: (lo + hi), then pairs, then the last two.
DF_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// y[r * ldy + c] = dot(x row r, w row c) for r < R, c < C; x rows K apart, w rows ldw apart. With ahead != 0,
// also prefetches the same C rows `ahead` elements further on (the next block of weight rows), a cache line
// per row every 64 bytes of weights: spread through the FMAs rather than issued in one burst, which stalled
// on the L1 miss queue.
template <int R, int C, typename WT>
DF_AVX2 void block(const float* x, int64_t K, const WT* w, int64_t ldw, float* y, int64_t ldy,
                   int64_t ahead = 0) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(WT));
  __m256 acc[R][C];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 12
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    if (ahead != 0 && k % kLine == 0)
      for (int c = 0; c < C; ++c)
        _mm_prefetch(reinterpret_cast<const char*>(w + c * ldw + ahead + k), _MM_HINT_T0);
    __m256 xv[R];
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_ps(x + r * K + k);
#pragma GCC unroll 12
    for (int c = 0; c < C; ++c) {
      const __m256 wv = load8(w + c * ldw + k);
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
    }
  }
  if (k < K) {
    const int64_t n = K - k;
    __m256 wv[C];
    for (int c = 0; c < C; ++c) wv[c] = load_tail(w + c * ldw + k, n);
    for (int r = 0; r < R; ++r) {
      const __m256 xv = load_tail(x + r * K + k, n);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 12
    for (int c = 0; c < C; ++c) y[r * ldy + c] = hsum(acc[r][c]);
}

// f32 weights: rows [t0, t1) of x against the nc <= 8 weight rows at w (rows K apart), into y (row stride N,
// column 0 = the first of the nc weight rows). 3 rows of x against 4 weight rows at a time: 12 accumulators,
// and each load (3 of x, 4 of w) feeds 3-4 FMAs. The 1-2 rows left over take 8 or 4 weight rows at once.
DF_AVX2 void rows_by_block(const float* x, int64_t t0, int64_t t1, int64_t K, const float* w, int64_t nc,
                           float* y, int64_t N, int64_t ahead) {
  if (nc == kRowsPerBlock) {
    int64_t t = t0;
    for (; t + 3 <= t1; t += 3, ahead = 0)
      for (int64_t c = 0; c < 8; c += 4) block<3, 4>(x + t * K, K, w + c * K, K, y + t * N + c, N, ahead);
    if (t1 - t == 2) {
      for (int64_t c = 0; c < 8; c += 4) block<2, 4>(x + t * K, K, w + c * K, K, y + t * N + c, N, ahead);
    } else if (t1 - t == 1) {
      block<1, 8>(x + t * K, K, w, K, y + t * N, N, ahead);
    }
    return;
  }
  for (int64_t c = 0; c < nc; ++c) {
    int64_t t = t0;
    for (; t + 4 <= t1; t += 4) block<4, 1>(x + t * K, K, w + c * K, K, y + t * N + c, N);
    switch (t1 - t) {
      case 3:
        block<3, 1>(x + t * K, K, w + c * K, K, y + t * N + c, N);
        break;
      case 2:
        block<2, 1>(x + t * K, K, w + c * K, K, y + t * N + c, N);
        break;
      case 1:
        block<1, 1>(x + t * K, K, w + c * K, K, y + t * N + c, N);
        break;
      default:
        break;
    }
  }
}

// bf16 weights: rows [t0, t1) of x against the nc <= 12 weight rows at w (rows K apart), into y as above. A
// full block: 4 rows of x against 3 weight rows at a time (12 accumulators; each x load feeds 3 FMAs, each
// widened weight vector 4, so a weight is widened once per 4 rows of x); the 1-3 rows left over take 4, 6
// or 12 weight rows at once. A partial block: 4 weight rows at a time, then single rows.
DF_AVX2 void rows_by_block(const float* x, int64_t t0, int64_t t1, int64_t K, const uint16_t* w, int64_t nc,
                           float* y, int64_t N, int64_t ahead) {
  if (nc == kBf16RowsPerBlock) {
    int64_t t = t0;
    for (; t + 4 <= t1; t += 4, ahead = 0)
      for (int64_t c = 0; c < 12; c += 3) block<4, 3>(x + t * K, K, w + c * K, K, y + t * N + c, N, ahead);
    switch (t1 - t) {
      case 3:
        for (int64_t c = 0; c < 12; c += 4) block<3, 4>(x + t * K, K, w + c * K, K, y + t * N + c, N, ahead);
        break;
      case 2:
        for (int64_t c = 0; c < 12; c += 6) block<2, 6>(x + t * K, K, w + c * K, K, y + t * N + c, N, ahead);
        break;
      case 1:
        block<1, 12>(x + t * K, K, w, K, y + t * N, N, ahead);
        break;
      default:
        break;
    }
    return;
  }
  int64_t c = 0;
  for (; c + 4 <= nc; c += 4) {
    int64_t t = t0;
    for (; t + 3 <= t1; t += 3) block<3, 4>(x + t * K, K, w + c * K, K, y + t * N + c, N);
    if (t1 - t == 2) {
      block<2, 4>(x + t * K, K, w + c * K, K, y + t * N + c, N);
    } else if (t1 - t == 1) {
      block<1, 4>(x + t * K, K, w + c * K, K, y + t * N + c, N);
    }
  }
  for (; c < nc; ++c) {
    int64_t t = t0;
    for (; t + 4 <= t1; t += 4) block<4, 1>(x + t * K, K, w + c * K, K, y + t * N + c, N);
    switch (t1 - t) {
      case 3:
        block<3, 1>(x + t * K, K, w + c * K, K, y + t * N + c, N);
        break;
      case 2:
        block<2, 1>(x + t * K, K, w + c * K, K, y + t * N + c, N);
        break;
      case 1:
        block<1, 1>(x + t * K, K, w + c * K, K, y + t * N + c, N);
        break;
      default:
        break;
    }
  }
}

// Weight rows [nb, ne) read in place (bf16 or f32). Rows of x in tiles of 64 (a tile stays in L2 while the
// weight rows stream past it).
template <typename WT>
DF_AVX2 void range_direct(const float* x, int64_t T, const WT* w, int64_t K, int64_t N, int64_t nb,
                          int64_t ne, float* y) {
  constexpr int64_t kTile = 64;
  constexpr int64_t kRows = std::is_same_v<WT, uint16_t> ? kBf16RowsPerBlock : kRowsPerBlock;
  for (int64_t t0 = 0; t0 < T; t0 += kTile) {
    const int64_t t1 = std::min(T, t0 + kTile);
    for (int64_t n = nb; n < ne; n += kRows) {
      // The first pass of x over this block prefetches the next block: short row streams that the hardware
      // prefetcher is slow to pick up (decode steps ~20% faster when the weights come from DRAM).
      rows_by_block(x, t0, t1, K, w + n * K, std::min(kRows, ne - n), y + n, N,
                    n + kRows < ne ? kRows * K : 0);
    }
  }
}

// bf16 weight rows [nb, ne) at T >= kWidenRows: each block of 8 rows widened to fp32 once (into scratch, L1)
// and then run as f32 weights, instead of widened again in registers by every pass of 3 rows of x over it.
// The widening is exact and the f32 and bf16 blocks share the per-dot arithmetic, so the choice, made from T,
// changes no number.
constexpr int64_t kWidenRows = 24;

DF_AVX2 void range_widened(const float* x, int64_t T, const uint16_t* w, int64_t K, int64_t N, int64_t nb,
                           int64_t ne, float* scratch, float* y) {
  constexpr int64_t kTile = 64;
  for (int64_t t0 = 0; t0 < T; t0 += kTile) {
    const int64_t t1 = std::min(T, t0 + kTile);
    for (int64_t n = nb; n < ne; n += kRowsPerBlock) {
      const int64_t nc = std::min(kRowsPerBlock, ne - n);
      if (n + kRowsPerBlock < ne) {  // the next block, in one burst: at T >= 24 a block computes long enough
        const char* p = reinterpret_cast<const char*>(w + (n + kRowsPerBlock) * K);
        const int64_t bytes = std::min(kRowsPerBlock, ne - n - kRowsPerBlock) * K * 2;
        for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(p + i, _MM_HINT_T0);
      }
      for (int64_t c = 0; c < nc; ++c) {
        const uint16_t* src = w + (n + c) * K;
        float* dst = scratch + c * K;
        int64_t k = 0;
        for (; k + 8 <= K; k += 8) _mm256_storeu_ps(dst + k, load8(src + k));
        for (; k < K; ++k) dst[k] = core::bf16_to_f32(src[k]);
      }
      rows_by_block(x, t0, t1, K, scratch, nc, y + n, N, 0);
    }
  }
}

// Other dtypes and quantized weights: each block of weight rows converted to fp32 once (into scratch).
DF_AVX2 void range_converted(const float* x, int64_t T, const Mat& W, int64_t nb, int64_t ne, float* scratch,
                             float* y) {
  const int64_t K = W.cols, N = W.rows;
  for (int64_t n = nb; n < ne; n += kRowsPerBlock) {
    const int64_t nc = std::min(kRowsPerBlock, ne - n);
    for (int64_t c = 0; c < nc; ++c) load_row(W, n + c, scratch + c * K);
    rows_by_block(x, 0, T, K, scratch, nc, y + n, N, 0);
  }
}

void linear_avx2(const float* x, int64_t T, const Mat& W, float* y) {
  const int64_t N = W.rows, K = W.cols;
  const size_t units = static_cast<size_t>((N + kRowsPerUnit - 1) / kRowsPerUnit);
  const bool bf16 = !W.quantized() && W.dtype == core::DType::kBF16;
  const bool f32 = !W.quantized() && W.dtype == core::DType::kF32;
  core::parallel_for(units, 1, [&](size_t b, size_t e) {
    const int64_t nb = static_cast<int64_t>(b) * kRowsPerUnit;
    const int64_t ne = std::min(N, static_cast<int64_t>(e) * kRowsPerUnit);
    if (bf16 && T >= kWidenRows) {
      thread_local std::vector<float> scratch;  // one block of fp32 rows; no allocation once grown
      if (scratch.size() < static_cast<size_t>(kRowsPerBlock * K))
        scratch.resize(static_cast<size_t>(kRowsPerBlock * K));
      range_widened(x, T, static_cast<const uint16_t*>(W.data), K, N, nb, ne, scratch.data(), y);
    } else if (bf16) {
      range_direct(x, T, static_cast<const uint16_t*>(W.data), K, N, nb, ne, y);
    } else if (f32) {
      range_direct(x, T, static_cast<const float*>(W.data), K, N, nb, ne, y);
    } else {
      std::vector<float> scratch(static_cast<size_t>(kRowsPerBlock * K));
      range_converted(x, T, W, nb, ne, scratch.data(), y);
    }
  });
}

bool cpu_has_avx2_fma() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return yes;
}
#endif  // DF_LINEAR_X86

}  // namespace

LinearKernel linear_kernel() {
#if DF_LINEAR_X86
  if (cpu_has_avx2_fma()) return LinearKernel::kAvx2;
#endif
  return LinearKernel::kPortable;
}

bool linear_kernel_supported(LinearKernel k) {
  return k == LinearKernel::kPortable || k == linear_kernel();
}

void linear(const float* x, int64_t T, const Mat& W, float* y, LinearKernel k) {
  if (T <= 0 || W.rows <= 0) return;
#if DF_LINEAR_X86
  if (k == LinearKernel::kAvx2 && cpu_has_avx2_fma()) {
    linear_avx2(x, T, W, y);
    return;
  }
#endif
  (void)k;
  linear_portable(x, T, W, y);
}

void linear(const float* x, int64_t T, const Mat& W, float* y) {
  static const LinearKernel k = linear_kernel();
  linear(x, T, W, y, k);
}

}  // namespace deltaflow::backend::cpu
