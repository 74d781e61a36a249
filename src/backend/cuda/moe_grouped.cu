#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gdn_chunked_mma.cuh"
#include "backend/cuda/moe_grouped.cuh"

namespace deltaflow::backend::cuda {
namespace {

using gdn_mma::bf16;
using gdn_mma::cp_async16;
using gdn_mma::cp_async_commit;
using gdn_mma::cp_async_wait;
using gdn_mma::load_a;
using gdn_mma::load_b_nk;

constexpr int kBM = kGroupedTileRows, kBN = kGroupedTileCols, kBK = kGroupedTileK;
constexpr int kThreads = 128;  // 2 x 2 warps, each 32 rows x 64 columns of the tile
constexpr int kStages = 3;     // cp.async pipeline depth over K
constexpr int kLds = kBK + 8;  // smem row stride (80 bytes: the eight rows of an ldmatrix in distinct banks)

// The tile's x rows and the expert's kBN weight rows (each clamped to the last one past `rows` / `cols`:
// computed, never stored), columns [k0, k0 + kBK), into one pipeline stage. 16-byte pieces: 2 of x, 4 of W
// per thread.
template <class WT>
__device__ __forceinline__ void load_stage(WT* As, WT* Bs, const WT* A, const WT* B, int K, int rows,
                                           int cols, int k0) {
  constexpr int kPer = 8;  // 16-bit values per piece
#pragma unroll
  for (int i = 0; i < kBM * kBK / kPer / kThreads; ++i) {
    const int p = threadIdx.x + i * kThreads, r = p / (kBK / kPer), c = (p % (kBK / kPer)) * kPer;
    cp_async16(As + r * kLds + c, A + static_cast<int64_t>(min(r, rows - 1)) * K + k0 + c);
  }
#pragma unroll
  for (int i = 0; i < kBN * kBK / kPer / kThreads; ++i) {
    const int p = threadIdx.x + i * kThreads, r = p / (kBK / kPer), c = (p % (kBK / kPer)) * kPer;
    cp_async16(Bs + r * kLds + c, B + static_cast<int64_t>(min(r, cols - 1)) * K + k0 + c);
  }
}

template <class WT, class TO>
__global__ void __launch_bounds__(kThreads)
    kernel_moe_grouped_gemm(const WT* __restrict__ W, int64_t w_stride, int N, int K,
                            const WT* __restrict__ x, const GroupedTile* __restrict__ tiles,
                            TO* __restrict__ y, int64_t ldy) {
  __shared__ __align__(128) WT As[kStages][kBM * kLds];
  __shared__ __align__(128) WT Bs[kStages][kBN * kLds];
  const GroupedTile tile = tiles[blockIdx.x];
  const int n0 = blockIdx.y * kBN;
  const WT* A = x + static_cast<int64_t>(tile.row0) * K;
  const WT* B = W + static_cast<int64_t>(tile.expert) * w_stride + static_cast<int64_t>(n0) * K;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wm = warp >> 1, wn = warp & 1;
  const int nk = K / kBK, cols = N - n0;

  float acc[2][8][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 8; ++ni) acc[mi][ni][0] = acc[mi][ni][1] = acc[mi][ni][2] = acc[mi][ni][3] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nk) load_stage(As[s], Bs[s], A, B, K, tile.rows, cols, s * kBK);
    cp_async_commit();
  }
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt is in; every warp is done with the stage the next load overwrites
    const int next = kt + kStages - 1;
    if (next < nk) load_stage(As[next % kStages], Bs[next % kStages], A, B, K, tile.rows, cols, next * kBK);
    cp_async_commit();
    const bf16* as = reinterpret_cast<const bf16*>(As[kt % kStages]);
    const bf16* bs = reinterpret_cast<const bf16*>(Bs[kt % kStages]);
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t af[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) load_a(af[mi], as, kLds, wm * 32 + mi * 16, kk);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        load_b_nk(b, bs, kLds, kk, wn * 64 + np * 16);
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
          mma_m16n8k16<WT>(acc[mi][2 * np], af[mi][0], af[mi][1], af[mi][2], af[mi][3], b[0], b[1]);
          mma_m16n8k16<WT>(acc[mi][2 * np + 1], af[mi][0], af[mi][1], af[mi][2], af[mi][3], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();

  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * 32 + mi * 16 + g + 8 * h;
      if (r >= tile.rows) continue;
      const int c0 = wn * 64 + 2 * t4;  // this thread's first column in the tile; N is even
      TO* yr = y + static_cast<int64_t>(tile.row0 + r) * ldy + n0 + c0;
#pragma unroll
      for (int ni = 0; ni < 8; ++ni) {
        if (c0 + ni * 8 >= cols) break;
        const float v[2] = {acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]};
        store_vals<2>(yr + ni * 8, v);
      }
    }
}

template <class WT, class TO>
cudaError_t launch_typed(const void* W, int64_t w_stride, int N, int K, const void* x,
                         const GroupedTile* tiles, int n_tiles, void* y, int64_t ldy, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>((N + kBN - 1) / kBN));
  kernel_moe_grouped_gemm<WT, TO><<<grid, kThreads, 0, stream>>>(
      static_cast<const WT*>(W), w_stride, N, K, static_cast<const WT*>(x), tiles, static_cast<TO*>(y), ldy);
  return cudaGetLastError();
}

template <class WT>
cudaError_t launch_out(const void* W, int64_t w_stride, int N, int K, const void* x, const GroupedTile* tiles,
                       int n_tiles, void* y, core::DType ytype, int64_t ldy, cudaStream_t stream) {
  if (ytype == core::DType::kF32)
    return launch_typed<WT, float>(W, w_stride, N, K, x, tiles, n_tiles, y, ldy, stream);
  return launch_typed<WT, WT>(W, w_stride, N, K, x, tiles, n_tiles, y, ldy, stream);
}

}  // namespace

int grouped_tiles(const int64_t* counts, int E, GroupedTile* out, int max_tiles) {
  int n = 0;
  int64_t row = 0;
  for (int e = 0; e < E; ++e) {
    for (int64_t r = 0; r < counts[e]; r += kBM) {
      if (n == max_tiles) return -1;
      out[n++] =
          GroupedTile{e, static_cast<int>(row + r), static_cast<int>(std::min<int64_t>(kBM, counts[e] - r))};
    }
    row += counts[e];
  }
  return n;
}

bool moe_grouped_supported(core::DType wtype, int N, int K) {
  return (wtype == core::DType::kBF16 || wtype == core::DType::kF16) && N > 0 && K > 0 && N % 2 == 0 &&
         K % kBK == 0 && N <= 65535 * kBN;
}

cudaError_t moe_grouped_gemm(const void* W, core::DType wtype, int64_t w_stride, int N, int K, const void* x,
                             const GroupedTile* tiles, int n_tiles, void* y, core::DType ytype, int64_t ldy,
                             cudaStream_t stream) {
  if (!moe_grouped_supported(wtype, N, K) || (ytype != core::DType::kF32 && ytype != wtype) ||
      !aligned16(W) || !aligned16(x) || w_stride % 8 != 0 || ldy % 2 != 0 ||
      reinterpret_cast<uintptr_t>(y) % (ytype == core::DType::kF32 ? 8 : 4) != 0 || n_tiles < 0)
    return cudaErrorInvalidValue;
  if (n_tiles == 0) return cudaSuccess;
  if (wtype == core::DType::kBF16)
    return launch_out<__nv_bfloat16>(W, w_stride, N, K, x, tiles, n_tiles, y, ytype, ldy, stream);
  return launch_out<__half>(W, w_stride, N, K, x, tiles, n_tiles, y, ytype, ldy, stream);
}

}  // namespace deltaflow::backend::cuda
