// The MoE block's expert matmuls at prefill as one grouped GEMM (qwen35-architecture.md §2.5): the (token,
// expert) rows sorted by expert form one segment per expert, and every 64-row tile of every segment meets its
// own expert's weights in the same launch (tensor cores, bf16 or f16 operands, fp32 accumulation). A block
// takes 64 rows x 256 columns, four warps of 64 x 64 (measured: 64 x 128 blocks of four 32 x 64 warps kept
// the tensor pipe 23% busy at the 35B-A3B shapes).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.hpp"

namespace deltaflow::backend::cuda {

inline constexpr int kGroupedTileRows = 64;   // rows of x per tile
inline constexpr int kGroupedTileCols = 256;  // output columns per block
inline constexpr int kGroupedTileK = 32;      // K granularity taken (64-wide k stages when K % 64 == 0)

// One tile: rows [row0, row0 + rows) of x (rows <= kGroupedTileRows), all of expert `expert`.
struct GroupedTile {
  int expert = 0, row0 = 0, rows = 0;
};

// Tiles of the segments of `counts` (rows of expert e are [sum counts[<e], + counts[e])), written to `out`
// (room for at most max_tiles); returns how many, or -1 when they do not fit. The host's definition of the
// list moe_sort_by_expert (moe_sort.cuh) builds on the device; the tests hold that one to it.
int grouped_tiles(const int64_t* counts, int E, GroupedTile* out, int max_tiles);

// For each tile and each column n < N: y[r, n] = sum_k x[r, k] * W_e[n, k] over the tile's rows r, with
// W_e = W + e * w_stride ([N, K] row-major, wtype BF16 or F16), x [., K] packed in wtype, y [., ldy] in fp32
// or wtype. Row r of x is x_rows[r] when x_rows is set (a gather: the sorted slots' tokens), and its output
// row y_rows[r] when that is set (a scatter back to the slots). tiles: device array. With n_live (device)
// set, the grid is sized for n_tiles and only tiles [0, *n_live) run (a tile list built on the device). N
// even, K % kGroupedTileK == 0, 16-byte aligned W, x (and w_stride) or cudaErrorInvalidValue.
cudaError_t moe_grouped_gemm(const void* W, core::DType wtype, int64_t w_stride, int N, int K, const void* x,
                             const GroupedTile* tiles, int n_tiles, void* y, core::DType ytype, int64_t ldy,
                             cudaStream_t stream, const int* x_rows = nullptr, const int* y_rows = nullptr,
                             const int* n_live = nullptr);

// Whether moe_grouped_gemm takes these shapes.
bool moe_grouped_supported(core::DType wtype, int N, int K);

}  // namespace deltaflow::backend::cuda
