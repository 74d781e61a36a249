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
constexpr int kWarps = 4;  // warp w: all kBM rows x columns [64 w, 64 w + 64) of the tile
constexpr int kThreads = 32 * kWarps;
constexpr int kWarpCols = kBN / kWarps;
constexpr int kMT = kBM / 16, kNT = kWarpCols / 8;  // m16 and n8 tiles per warp
// k per stage and stages of the cp.async pipeline; smem rows padded by 8 (80 or 144 bytes: the eight rows of
// an ldmatrix in distinct banks).
template <int BK, int ST>
struct Pipe {
  static constexpr int kLds = BK + 8, kStageElems = (kBM + kBN) * kLds, kPieces = BK / 8;
  static constexpr int kAPieces = kBM * kPieces / kThreads;  // x pieces per thread per stage
  static constexpr size_t kSmemBytes = static_cast<size_t>(ST) * kStageElems * 2;
};
static_assert(kWarpCols == 64 && kBM == 64, "a 64 x 64 warp tile: 32 mma per 16-wide k step, 8 ldmatrix");

// Where x row r of a tile comes from, and where its output goes: the row itself, or through a map (the sorted
// slots' tokens for gate/up, the slots for down).
__device__ __forceinline__ int64_t mapped(const int* map, int row) {
  return map ? map[row] : row;
}

// The tile's x rows and the expert's kBN weight rows (each clamped to the last one past `rows` / `cols`:
// computed, never stored), columns [k0, k0 + BK), into one pipeline stage. 16-byte pieces: BK / 16 of x, BK /
// 4 of W per thread. a_row: the global row of each of this thread's x pieces.
template <int BK, class WT, int NA>
__device__ __forceinline__ void load_stage(WT* As, WT* Bs, const WT* x, const int64_t (&a_row)[NA],
                                           const WT* B, int K, int cols, int k0) {
  constexpr int kPer = 8;  // 16-bit values per piece
  constexpr int kPieces = BK / kPer, kLds = BK + 8;
#pragma unroll
  for (int i = 0; i < kBM * kPieces / kThreads; ++i) {
    const int p = threadIdx.x + i * kThreads, r = p / kPieces, c = (p % kPieces) * kPer;
    cp_async16(As + r * kLds + c, x + a_row[i] * K + k0 + c);
  }
#pragma unroll
  for (int i = 0; i < kBN * kPieces / kThreads; ++i) {
    const int p = threadIdx.x + i * kThreads, r = p / kPieces, c = (p % kPieces) * kPer;
    cp_async16(Bs + r * kLds + c, B + static_cast<int64_t>(min(r, cols - 1)) * K + k0 + c);
  }
}

template <class WT, class TO, int BK, int ST>
__global__ void __launch_bounds__(kThreads)
    kernel_moe_grouped_gemm(const WT* __restrict__ W, int64_t w_stride, int N, int K,
                            const WT* __restrict__ x, const int* __restrict__ x_rows,
                            const GroupedTile* __restrict__ tiles, TO* __restrict__ y, int64_t ldy,
                            const int* __restrict__ y_rows, const int* __restrict__ n_live) {
  if (n_live && static_cast<int>(blockIdx.x) >= *n_live) return;  // a grid sized for the most tiles
  extern __shared__ __align__(128) unsigned char smem_raw[];
  WT* smem = reinterpret_cast<WT*>(smem_raw);
  const GroupedTile tile = tiles[blockIdx.x];
  const int n0 = blockIdx.y * kBN;
  const WT* B = W + static_cast<int64_t>(tile.expert) * w_stride + static_cast<int64_t>(n0) * K;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  using P = Pipe<BK, ST>;
  constexpr int kLds = P::kLds, kStageElems = P::kStageElems, kPieces = P::kPieces, kStages = ST;
  const int nk = K / BK, cols = N - n0;
  int64_t a_row[P::kAPieces];
#pragma unroll
  for (int i = 0; i < P::kAPieces; ++i) {
    const int r = (threadIdx.x + i * kThreads) / kPieces;
    a_row[i] = mapped(x_rows, tile.row0 + min(r, tile.rows - 1));
  }

  float acc[kMT][kNT][4];
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
    for (int ni = 0; ni < kNT; ++ni) acc[mi][ni][0] = acc[mi][ni][1] = acc[mi][ni][2] = acc[mi][ni][3] = 0.0f;

  auto stage_a = [&](int s) { return smem + s * kStageElems; };
  auto stage_b = [&](int s) { return smem + s * kStageElems + kBM * kLds; };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < nk) load_stage<BK>(stage_a(s), stage_b(s), x, a_row, B, K, cols, s * BK);
    cp_async_commit();
  }
  for (int kt = 0; kt < nk; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt is in; every warp is done with the stage the next load overwrites
    const int next = kt + kStages - 1;
    if (next < nk)
      load_stage<BK>(stage_a(next % kStages), stage_b(next % kStages), x, a_row, B, K, cols, next * BK);
    cp_async_commit();
    const bf16* as = reinterpret_cast<const bf16*>(stage_a(kt % kStages));
    const bf16* bs = reinterpret_cast<const bf16*>(stage_b(kt % kStages));
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      uint32_t af[kMT][4];
#pragma unroll
      for (int mi = 0; mi < kMT; ++mi) load_a(af[mi], as, kLds, mi * 16, kk);
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t b[4];
        load_b_nk(b, bs, kLds, kk, warp * kWarpCols + np * 16);
#pragma unroll
        for (int mi = 0; mi < kMT; ++mi) {
          mma_m16n8k16<WT>(acc[mi][2 * np], af[mi][0], af[mi][1], af[mi][2], af[mi][3], b[0], b[1]);
          mma_m16n8k16<WT>(acc[mi][2 * np + 1], af[mi][0], af[mi][1], af[mi][2], af[mi][3], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();

  const int g = lane >> 2, t4 = lane & 3;
  const int c0 = warp * kWarpCols + 2 * t4;  // this thread's first column in the tile; N is even
#pragma unroll
  for (int mi = 0; mi < kMT; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = mi * 16 + g + 8 * h;
      if (r >= tile.rows) continue;
      TO* yr = y + mapped(y_rows, tile.row0 + r) * ldy + n0 + c0;
#pragma unroll
      for (int ni = 0; ni < kNT; ++ni) {
        if (c0 + ni * 8 >= cols) break;
        const float v[2] = {acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]};
        store_vals<2>(yr + ni * 8, v);
      }
    }
}

template <class WT, class TO, int BK, int ST>
cudaError_t launch_pipe(const void* W, int64_t w_stride, int N, int K, const void* x, const int* x_rows,
                        const GroupedTile* tiles, int n_tiles, void* y, int64_t ldy, const int* y_rows,
                        const int* n_live, cudaStream_t stream) {
  constexpr size_t bytes = Pipe<BK, ST>::kSmemBytes;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel_moe_grouped_gemm<WT, TO, BK, ST>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (attr != cudaSuccess) return attr;
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>((N + kBN - 1) / kBN));
  kernel_moe_grouped_gemm<WT, TO, BK, ST><<<grid, kThreads, bytes, stream>>>(
      static_cast<const WT*>(W), w_stride, N, K, static_cast<const WT*>(x), x_rows, tiles,
      static_cast<TO*>(y), ldy, y_rows, n_live);
  return cudaGetLastError();
}

template <class WT, class TO>
cudaError_t launch_typed(const void* W, int64_t w_stride, int N, int K, const void* x, const int* x_rows,
                         const GroupedTile* tiles, int n_tiles, void* y, int64_t ldy, const int* y_rows,
                         const int* n_live, cudaStream_t stream) {
  // 64-wide k stages, two of them, where K allows (35B-A3B, H200: gate_up + down 'moe experts' 132 -> 116 ms
  // of an 8K prefill against 32 x 3; 32 x 4 no better, 32 x 2 worse).
  if (K % 64 == 0)
    return launch_pipe<WT, TO, 64, 2>(W, w_stride, N, K, x, x_rows, tiles, n_tiles, y, ldy, y_rows, n_live,
                                      stream);
  return launch_pipe<WT, TO, 32, 3>(W, w_stride, N, K, x, x_rows, tiles, n_tiles, y, ldy, y_rows, n_live,
                                    stream);
}

template <class WT>
cudaError_t launch_out(const void* W, int64_t w_stride, int N, int K, const void* x, const int* x_rows,
                       const GroupedTile* tiles, int n_tiles, void* y, core::DType ytype, int64_t ldy,
                       const int* y_rows, const int* n_live, cudaStream_t stream) {
  if (ytype == core::DType::kF32)
    return launch_typed<WT, float>(W, w_stride, N, K, x, x_rows, tiles, n_tiles, y, ldy, y_rows, n_live,
                                   stream);
  return launch_typed<WT, WT>(W, w_stride, N, K, x, x_rows, tiles, n_tiles, y, ldy, y_rows, n_live, stream);
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
                             cudaStream_t stream, const int* x_rows, const int* y_rows, const int* n_live) {
  if (!moe_grouped_supported(wtype, N, K) || (ytype != core::DType::kF32 && ytype != wtype) ||
      !aligned16(W) || !aligned16(x) || w_stride % 8 != 0 || ldy % 2 != 0 ||
      reinterpret_cast<uintptr_t>(y) % (ytype == core::DType::kF32 ? 8 : 4) != 0 || n_tiles < 0)
    return cudaErrorInvalidValue;
  if (n_tiles == 0) return cudaSuccess;
  if (wtype == core::DType::kBF16)
    return launch_out<__nv_bfloat16>(W, w_stride, N, K, x, x_rows, tiles, n_tiles, y, ytype, ldy, y_rows,
                                     n_live, stream);
  return launch_out<__half>(W, w_stride, N, K, x, x_rows, tiles, n_tiles, y, ytype, ldy, y_rows, n_live,
                            stream);
}

}  // namespace deltaflow::backend::cuda
