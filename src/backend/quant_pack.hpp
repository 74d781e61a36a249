// The CUDA backend's device layouts of quantized weights (backend/cuda/gemv_quant.cuh reads them), built on
// the host at load. Host code only, so CI checks the layouts without a GPU (tests/unit/quant_pack_test.cpp).
//
// NVFP4 codes are re-tiled for the tensor-core GEMV: tiles of 16 rows x 64 columns, 512 bytes each, ordered
// [row tile][column tile]. Lane l = 4g + q of a warp reads bytes [16 l, 16 l + 16) of a tile: word j (j < 4)
// holds the 8 codes that lane feeds into the m16n8k16 of scale group j (columns 16 j .. 16 j + 15 of the
// tile), as four fp16 pairs ("slots"):
//   slot 0: tile row g,     columns 16j + 4q + {0, 1}     slot 1: tile row g + 8, the same columns
//   slot 2: tile row g,     columns 16j + 4q + {2, 3}     slot 3: tile row g + 8, the same columns
// The first code of slot s sits in the low half-word (magnitude bits 3s..3s+2, sign bit 12+s), the second
// in the high half (magnitude 16+3s.., sign 28+s): then a shift and a mask make each slot's fp16 pair
// (value * 2^-14). The E4M3 block scales follow the same tiles: 64 bytes per (row tile, column tile), in the
// codes' order, where bytes [8g, 8g + 4) are the four group scales of tile row g and [8g + 4, 8g + 8) those
// of tile row g + 8 (zero for padding rows). Lane 4g + q loads its 8 bytes at 8g, so one warp's scale load
// is 64 contiguous bytes (row-major [rows, cols / 16] scales put its 16 rows in 16 different cache lines).
// With `interleave` (a [gate | up] matrix of 2I rows), tile t holds gate rows 8t..8t+7 over up rows
// I+8t..I+8t+7, so one tile's accumulators meet in SwiGLU; otherwise tile t holds rows 16t..16t+15 (rows past
// the matrix are zero codes).
//
// FP8 E4M3 codes stay row-major [rows, cols]; their scales become one fp32 grid (the global scale folded in).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "model/weights.hpp"

namespace deltaflow::backend {

inline constexpr int64_t kQuantTileRows = 16;
inline constexpr int64_t kQuantTileCols = 64;
inline constexpr int64_t kNvfp4TileBytes = kQuantTileRows * kQuantTileCols / 2;
inline constexpr int64_t kNvfp4TileScaleBytes = kQuantTileRows * kQuantTileCols / 16;

struct PackedQuant {
  model::quant::WeightFormat format = model::quant::WeightFormat::kFloat;
  int64_t rows = 0, cols = 0;
  bool interleave = false;
  std::vector<uint8_t> codes;     // NVFP4: tiles (above); FP8: [rows, cols]
  std::vector<uint8_t> scales;    // NVFP4: E4M3, tiled (above)
  std::vector<float> row_scales;  // NVFP4: [rows], the second-level scale as a multiplier
  std::vector<float> grid;        // FP8: [grid_rows, grid_cols], entry (i, j) covers rows i*block_rows..,
  int64_t grid_rows = 0, grid_cols = 0, block_rows = 1, block_cols = 1;  // columns j*block_cols..
  // The sizes of the four arrays (also when layout_only left them empty).
  size_t codes_bytes = 0, scales_bytes = 0, row_scales_n = 0, grid_n = 0;
  // FP8: the parts' static activation scale (Mat::input_scale) when prefill may run them as one FP8 GEMM
  // with static activations: every part per-tensor, rows and columns multiples of 128 (so the grid is one
  // value over each 128 x 128 block), one input_scale > 0 for all (q/k/v calibrated on the same input).
  // Else 0 (the weight-only path).
  float input_scale = 0.0f;
};

// Rows the NVFP4 tiles hold (the matrix's rows rounded up to whole tiles).
int64_t nvfp4_padded_rows(int64_t rows);
// The matrix row of row r (0..15) of tile t; -1 for padding.
int64_t nvfp4_tile_row(int64_t t, int r, int64_t rows, bool interleave);
// Bytes of the tiled block scales: one per 16 elements of the padded rows.
int64_t nvfp4_scales_bytes(int64_t rows, int64_t cols);

// Whether two members of a projection group can share one matrix: the same quantized format, or both float
// of one dtype (the runs a group of mixed formats is split into).
bool same_kind(const model::Mat& a, const model::Mat& b);

// Whether two packed matrices have one layout (format, shape, array sizes and scale grids): what a stack of
// experts needs.
bool same_layout(const PackedQuant& a, const PackedQuant& b);

// The quantized matrices `parts` (one format, the same columns) stacked as one matrix in the device layout.
// An error says why they cannot be one (a shape the kernels do not take, formats or scale grids that differ),
// and the caller keeps them apart or widens them to bf16.
// layout_only: the checks and sizes, no arrays (a load's sizing pass).
core::Expected<PackedQuant> pack_quant(std::span<const model::Mat* const> parts, bool interleave,
                                       bool layout_only = false);

// The code (E2M1, 4 bits) of element (n, k) read back from NVFP4 tiles: the layout's reference.
uint8_t nvfp4_tile_code(const uint8_t* tiles, int64_t rows, int64_t cols, bool interleave, int64_t n,
                        int64_t k);
// The E4M3 block scale of element (n, k) read back from the tiled scales; 0xff for a row the tiles lack.
uint8_t nvfp4_tile_scale(const uint8_t* scales, int64_t rows, int64_t cols, bool interleave, int64_t n,
                         int64_t k);

}  // namespace deltaflow::backend
