// Matmuls over quantized weights (backend/quant_pack.hpp has the layouts), weight-only: the activations go in
// as fp16 with a power-of-two factor per row (stage_activations_f16), the products accumulate in fp32 on the
// tensor cores (mma.sync m16n8k16), and the scales multiply the fp32 partial sums:
//   NVFP4: each 16-column group's m16n8k16 gets its own partial, times E4M3 block scale x the row's
//          second-level scale (the code's fp16 form is value * 2^-14; the 2^14 is folded into that product).
//   FP8:   E4M3 codes widened to fp16 exactly (cvt e4m3x2), the partial of each 64-column tile times its
//   scale
//          grid entry (per tensor, per row or per 128 x 128 block).
// gemv_quant takes up to kQuantGemvMaxRows rows (the caller tiles taller inputs, up to the decode buckets);
// longer prefill chunks dequantize the weight to bf16 (dequantize_bf16) for cuBLASLt.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/moe_grouped.cuh"
#include "core/dtype.hpp"

namespace deltaflow::backend::cuda {

inline constexpr int kQuantGemvMaxRows = 32;

// A quantized matrix on the device, [N, K] logically (K % 64 == 0).
struct QuantWeight {
  bool nvfp4 = true;  // else FP8
  const void* codes = nullptr;
  const uint8_t* scales = nullptr;    // NVFP4: E4M3, one per 16 elements, tiled (quant_pack.hpp)
  const float* row_scales = nullptr;  // NVFP4: [N]
  const float* grid = nullptr;        // FP8: [grid_rows, grid_cols]
  int64_t grid_cols = 1, block_rows = 1, block_cols = 1;
  int64_t N = 0, K = 0;
  bool interleave = false;  // NVFP4 [gate | up] tiles (quant_pack.hpp)
  // The grouped form (MoE experts): expert e's codes, scales, row scales and grid at these strides.
  int64_t codes_stride = 0, scales_stride = 0, row_stride = 0, grid_stride = 0;
};

// xh[t, k] = x[t, k] * 2^-e_t as fp16 and factor[t] = 2^e_t, e_t >= 0 the least that keeps the row's largest
// magnitude below 2^15 (0 for every ordinary row): fp16's range without losing a row to overflow.
cudaError_t stage_activations_f16(const float* x, int64_t ldx, int T, int64_t K, void* xh, float* factor,
                                  cudaStream_t stream);
// The same for rows rows[0, T) of x (device ids): staged row t is x row rows[t] (a gather).
cudaError_t stage_activations_f16_rows(const float* x, int64_t ldx, const int* rows, int T, int64_t K,
                                       void* xh, float* factor, cudaStream_t stream);

// y[t, n] = factor[t] * sum_k xh[t, k] * W[n, k], t < T <= kQuantGemvMaxRows; xh [T, K] packed.
// swiglu (W interleaved, or FP8 [gate | up]): y[t, i] = silu(p[t, i]) * p[t, N/2 + i], i < N / 2.
// split: the warps splitting each output tile's columns (1, 2, 4 or 8); 0 chooses (DELTAFLOW_QGEMV_KS
// overrides the choice). Every split gives the same sums to rounding.
cudaError_t gemv_quant(const QuantWeight& W, const void* xh, const float* factor, int T, float* y,
                       int64_t ldy, bool swiglu, cudaStream_t stream, int split = 0);

// Problems of one fixed expert after a grouped form's routed ones (the MoE's shared expert as expert E of
// the stack): problem groups + i multiplies expert `expert` with activation row x0 + i, writes y row
// groups + i.
struct GroupedExtra {
  int problems = 0;
  int expert = 0;
  int64_t x0 = 0;
};

// The grouped form, for MoE slots: problem g multiplies expert expert[g] with activation row g / x_div and
// writes y row g (one row each); all on the device. Then extra.problems more (above), in the same launch.
cudaError_t gemv_quant_grouped(const QuantWeight& W, const int* expert, int groups, const void* xh,
                               const float* factor, int x_div, float* y, int64_t ldy, bool swiglu,
                               cudaStream_t stream, int split = 0, const GroupedExtra& extra = {});

// The MoE prefill's form: for each tile p < *n_tiles of `tiles` (device; moe_sort.cuh's list: expert, row0,
// rows <= kGroupedTileRows), rows [row0, row0 + rows) of xh (the slots in sorted order, [., K] packed) times
// that expert; input row r's output goes to y row y_rows[r] (device), or row r when y_rows is null.
// max_tiles: the room the launch covers (tiles past *n_tiles exit at once), at most 32767.
cudaError_t gemv_quant_tiles(const QuantWeight& W, const GroupedTile* tiles, int max_tiles,
                             const int* n_tiles, const void* xh, const float* factor, float* y, int64_t ldy,
                             const int* y_rows, bool swiglu, cudaStream_t stream);

// out [N, K] row-major in bf16 (natural row order, interleaved tiles undone): W's values, for cuBLASLt.
cudaError_t dequantize_bf16(const QuantWeight& W, void* out, cudaStream_t stream);

// The grouped form: the `groups` matrices of a stacked set (MoE experts, at W's strides), matrix e's values
// at out + e * N * K.
cudaError_t dequantize_bf16_grouped(const QuantWeight& W, int groups, void* out, cudaStream_t stream);

// Random codes and scales of W's shape (benchmarks): codes uniform, E4M3 block scales in [0.5, 1), row or
// grid scales `scale` / (6 or 448) so values stay near U(-scale, scale).
cudaError_t fill_quant_random(const QuantWeight& W, uint64_t seed, float scale, cudaStream_t stream);

}  // namespace deltaflow::backend::cuda
