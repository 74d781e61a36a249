#include "backend/quant_pack.hpp"

#include <algorithm>
#include <cstring>

#include "model/quant/format.hpp"

namespace deltaflow::backend {

using model::quant::GlobalOp;
using model::quant::WeightFormat;

namespace {

std::string name_of(const model::Mat& m) {
  return m.name ? "tensor '" + *m.name + "'" : "a quantized matrix";
}

// Where the code of (tile row r, tile column c) of the tile's lane words goes: byte offset of its word in
// the tile, and the bit of its magnitude and sign there.
struct CodeSlot {
  int word_byte, mag_bit, sign_bit;
};
CodeSlot slot_of(int r, int c) {
  const int g = r % 8, hi_row = r / 8;  // rows g and g + 8
  const int j = c / 16, q = (c % 16) / 4, e = c % 4;
  const int slot = (e >= 2 ? 2 : 0) + hi_row;
  const int half = e & 1;
  const int lane = 4 * g + q;
  return {lane * 16 + j * 4, 16 * half + 3 * slot, 16 * half + 12 + slot};
}

// Byte offset of the block scales of tile row r (0..15) in column tile kt of row tile t: 64 bytes per tile,
// rows g and g + 8's four group scales at 8g (quant_pack.hpp).
int64_t tile_scale_offset(int64_t t, int64_t kt, int64_t tiles_k, int r) {
  return (t * tiles_k + kt) * kNvfp4TileScaleBytes + 8 * (r % 8) + 4 * (r / 8);
}

}  // namespace

int64_t nvfp4_padded_rows(int64_t rows) {
  return (rows + kQuantTileRows - 1) / kQuantTileRows * kQuantTileRows;
}

bool same_kind(const model::Mat& a, const model::Mat& b) {
  return a.quantized() ? b.quantized() && a.format == b.format : !b.quantized() && a.dtype == b.dtype;
}

bool same_layout(const PackedQuant& a, const PackedQuant& b) {
  return a.format == b.format && a.interleave == b.interleave && a.rows == b.rows && a.cols == b.cols &&
         a.codes_bytes == b.codes_bytes && a.scales_bytes == b.scales_bytes &&
         a.row_scales_n == b.row_scales_n && a.grid_n == b.grid_n && a.grid_rows == b.grid_rows &&
         a.grid_cols == b.grid_cols && a.block_rows == b.block_rows && a.block_cols == b.block_cols;
}

int64_t nvfp4_scales_bytes(int64_t rows, int64_t cols) {
  return nvfp4_padded_rows(rows) * cols / 16;
}

int64_t nvfp4_tile_row(int64_t t, int r, int64_t rows, bool interleave) {
  if (interleave) {
    const int64_t I = rows / 2;
    return r < 8 ? 8 * t + r : I + 8 * t + (r - 8);
  }
  const int64_t n = t * kQuantTileRows + r;
  return n < rows ? n : -1;
}

core::Expected<PackedQuant> pack_quant(std::span<const model::Mat* const> parts, bool interleave,
                                       bool layout_only) {
  if (parts.empty()) return core::Error{"pack_quant: no matrix"};
  const model::Mat& first = *parts[0];
  PackedQuant p;
  p.format = first.format;
  p.cols = first.cols;
  p.interleave = interleave;
  for (const model::Mat* m : parts) {
    if (m->format != p.format) return core::Error{name_of(*m) + ": the parts of one matrix differ in format"};
    if (m->cols != p.cols) return core::Error{name_of(*m) + ": the parts of one matrix differ in columns"};
    p.rows += m->rows;
  }
  const int64_t R = p.rows, K = p.cols;
  if (K % kQuantTileCols != 0)
    return core::Error{name_of(first) + ": " + std::to_string(K) + " columns is not a multiple of 64"};
  if (interleave && (R % 16 != 0))
    return core::Error{name_of(first) + ": a [gate | up] matrix of " + std::to_string(R) +
                       " rows does not split into 8-row tiles"};

  if (p.format == WeightFormat::kNvfp4) {
    for (const model::Mat* m : parts) {
      const auto& s = m->scale;
      if (s.empty() || s.dtype != core::DType::kF8E4M3 || s.block_rows != 1 || s.block_cols != 16 ||
          s.rows != m->rows || s.cols != K / 16)
        return core::Error{name_of(*m) + ": NVFP4 scales are not E4M3 per 16 elements of a row"};
    }
    const int64_t tiles_r = nvfp4_padded_rows(R) / kQuantTileRows, tiles_k = K / kQuantTileCols;
    p.codes_bytes = static_cast<size_t>(tiles_r * tiles_k * kNvfp4TileBytes);
    p.scales_bytes = static_cast<size_t>(nvfp4_scales_bytes(R, K));
    p.row_scales_n = static_cast<size_t>(R);
    if (layout_only) return p;
    // Row n of the whole: its part's codes and scales.
    std::vector<const uint8_t*> row_codes(static_cast<size_t>(R)), row_group_scales(static_cast<size_t>(R));
    p.scales.assign(p.scales_bytes, 0);
    p.row_scales.resize(p.row_scales_n);
    int64_t r0 = 0;
    for (const model::Mat* m : parts) {
      for (int64_t r = 0; r < m->rows; ++r) {
        row_codes[static_cast<size_t>(r0 + r)] = static_cast<const uint8_t*>(m->row(r));
        row_group_scales[static_cast<size_t>(r0 + r)] =
            static_cast<const uint8_t*>(m->scale.data) + r * K / 16;
      }
      const float g = m->global_op == GlobalOp::kMultiply ? m->global_scale : 1.0f / m->global_scale;
      std::fill(p.row_scales.begin() + r0, p.row_scales.begin() + r0 + m->rows, g);
      r0 += m->rows;
    }
    p.codes.assign(p.codes_bytes, 0);
    auto code = [&](int64_t n, int64_t k) -> uint32_t {
      if (n < 0) return 0;
      const uint8_t b = row_codes[static_cast<size_t>(n)][k / 2];
      return k & 1 ? b >> 4 : b & 0xf;
    };
    for (int64_t t = 0; t < tiles_r; ++t) {
      int64_t rows_of[kQuantTileRows];
      for (int r = 0; r < kQuantTileRows; ++r) rows_of[r] = nvfp4_tile_row(t, r, R, interleave);
      for (int64_t kt = 0; kt < tiles_k; ++kt) {
        uint8_t* tile = p.codes.data() + (t * tiles_k + kt) * kNvfp4TileBytes;
        for (int r = 0; r < kQuantTileRows; ++r)
          if (rows_of[r] >= 0)
            std::memcpy(p.scales.data() + tile_scale_offset(t, kt, tiles_k, r),
                        row_group_scales[static_cast<size_t>(rows_of[r])] + kt * (kQuantTileCols / 16), 4);
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, q = lane % 4;
          for (int j = 0; j < 4; ++j) {
            uint32_t w = 0;
            for (int slot = 0; slot < 4; ++slot) {
              const int64_t n = rows_of[(slot & 1) ? g + 8 : g];
              const int64_t k = kt * kQuantTileCols + 16 * j + 4 * q + (slot >= 2 ? 2 : 0);
              for (int half = 0; half < 2; ++half) {
                const uint32_t c = code(n, k + half);
                w |= (c & 7) << (16 * half + 3 * slot);
                w |= (c >> 3) << (16 * half + 12 + slot);
              }
            }
            std::memcpy(tile + lane * 16 + j * 4, &w, 4);
          }
        }
      }
    }
    return p;
  }

  if (p.format != WeightFormat::kFp8) return core::Error{name_of(first) + ": not a quantized format"};
  if (interleave) return core::Error{name_of(first) + ": FP8 matrices are not interleaved"};
  // One grid for all parts: stacked when every part's blocks have the same shape and start on a block row
  // of the whole, else widened to one grid row per matrix row (same block columns).
  const int64_t bc = std::min<int64_t>(first.scale.block_cols, K);
  bool stack = true;
  int64_t r0 = 0;
  for (const model::Mat* m : parts) {
    const auto& s = m->scale;
    if (s.empty()) return core::Error{name_of(*m) + ": FP8 without scales"};
    if (std::min<int64_t>(s.block_cols, K) != bc)
      return core::Error{name_of(*m) + ": the parts' scale blocks differ in columns"};
    if (bc < K && bc % kQuantTileCols != 0)
      return core::Error{name_of(*m) + ": FP8 scale blocks of " + std::to_string(bc) +
                         " columns (the kernels take multiples of 64)"};
    const int64_t br = std::min<int64_t>(s.block_rows, m->rows);
    if (br != std::min<int64_t>(first.scale.block_rows, first.rows) || r0 % br != 0) stack = false;
    r0 += m->rows;
  }
  const int64_t br = stack ? std::min<int64_t>(first.scale.block_rows, first.rows) : 1;
  p.input_scale = first.input_scale;
  for (const model::Mat* m : parts) {
    const bool per_tensor = m->scale.block_rows >= m->rows && m->scale.block_cols >= K;
    if (!per_tensor || m->rows % 128 != 0 || K % 128 != 0 || !(m->input_scale > 0) ||
        m->input_scale != first.input_scale)
      p.input_scale = 0.0f;
  }
  p.block_rows = br;
  p.block_cols = bc;
  p.grid_rows = (R + br - 1) / br;
  p.grid_cols = (K + bc - 1) / bc;
  p.codes_bytes = static_cast<size_t>(R * K);
  p.grid_n = static_cast<size_t>(p.grid_rows * p.grid_cols);
  if (layout_only) return p;
  p.codes.resize(p.codes_bytes);
  p.grid.resize(p.grid_n);
  r0 = 0;
  for (const model::Mat* m : parts) {
    std::memcpy(p.codes.data() + r0 * K, m->data, static_cast<size_t>(m->rows * K));
    const auto& s = m->scale;
    for (int64_t n = 0; n < m->rows; n += (stack ? br : 1))
      for (int64_t j = 0; j < p.grid_cols; ++j) {
        const float v = s.at(n / s.block_rows, j * bc / s.block_cols);
        const float c = m->global_op == GlobalOp::kMultiply ? v * m->global_scale : v / m->global_scale;
        p.grid[static_cast<size_t>(((r0 + n) / br) * p.grid_cols + j)] = c;
      }
    r0 += m->rows;
  }
  return p;
}

namespace {

// The tile and tile row that hold matrix row n (nvfp4_tile_row's inverse); t = -1 for a row past the matrix.
struct TilePlace {
  int64_t t = -1;
  int r = 0;
};
TilePlace tile_of_row(int64_t n, int64_t rows, bool interleave) {
  if (n < 0 || n >= rows) return {};
  if (!interleave) return {n / kQuantTileRows, static_cast<int>(n % kQuantTileRows)};
  const int64_t half = rows / 2, m = n < half ? n : n - half;
  return {m / 8, static_cast<int>(m % 8) + (n < half ? 0 : 8)};
}

}  // namespace

uint8_t nvfp4_tile_code(const uint8_t* tiles, int64_t rows, int64_t cols, bool interleave, int64_t n,
                        int64_t k) {
  const TilePlace at = tile_of_row(n, rows, interleave);
  if (at.t < 0) return 0xff;
  const int64_t tiles_k = cols / kQuantTileCols, kt = k / kQuantTileCols;
  const CodeSlot sl = slot_of(at.r, static_cast<int>(k % kQuantTileCols));
  uint32_t w;
  std::memcpy(&w, tiles + (at.t * tiles_k + kt) * kNvfp4TileBytes + sl.word_byte, 4);
  return static_cast<uint8_t>(((w >> sl.mag_bit) & 7) | (((w >> sl.sign_bit) & 1) << 3));
}

uint8_t nvfp4_tile_scale(const uint8_t* scales, int64_t rows, int64_t cols, bool interleave, int64_t n,
                         int64_t k) {
  const TilePlace at = tile_of_row(n, rows, interleave);
  if (at.t < 0) return 0xff;
  const int64_t tiles_k = cols / kQuantTileCols, kt = k / kQuantTileCols;
  return scales[tile_scale_offset(at.t, kt, tiles_k, at.r) + (k % kQuantTileCols) / 16];
}

}  // namespace deltaflow::backend
