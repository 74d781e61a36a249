// The decode matmul: a weight stream. y = x @ W.T for a few activation rows, reading each weight once with
// 16-byte loads, fp32 accumulation. Two kernels:
//   - SIMT: fp32 activations; each warp owns a few weight rows, and the warps of a block can split the row's
//     K between them (enough blocks to fill the GPU when N is small) and add their parts in shared memory.
//     The summation order of a row depends on the matrix shape only, never on T: a sequence decoded in a
//     batch of up to kGemvSimtRows gets the bits it gets alone.
//   - tensor cores (mma.sync m16n8k16), for T > kGemvSimtRows: activations in the weights' 16-bit type.
//     Each lane's 16-byte weight load is used as its A fragment directly: the k order inside a 32-wide block
//     is permuted the same way for the weights and the activations, which leaves the dot products unchanged.
// Either can write SwiGLU instead of the raw product: the gate rows [0, I) and up rows [I, 2I) of a [2I, K]
// matrix meet in one warp, which writes silu(gate) * up.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.hpp"

namespace deltaflow::backend::cuda {

// Rows of x one launch takes; the caller tiles taller inputs.
inline constexpr int kGemvMaxRows = 32;
// Up to this many rows the SIMT kernel runs (fp32 activations); above it the tensor-core kernel when given
// 16-bit activations.
inline constexpr int kGemvSimtRows = 4;

// The Gated DeltaNet's conv1d decode step (conv1d.cuh) done where output columns n < C are written, so
// in_proj and the conv are one launch: out[t, n] = silu(sum_j w[n, j] * [state[n] | y[t, n]]_j) and the
// state (row t's at states + slots[t] * slot_stride, [C, K-1]) shifts by one. y is written as well.
struct GemvConv {
  const float* w = nullptr;  // [C, K]; null: no conv
  int K = 0;
  int64_t C = 0;
  float* states = nullptr;
  int64_t slot_stride = 0;
  const int* slots = nullptr;
  float* out = nullptr;  // [T, ld_out]
  int64_t ld_out = 0;
};

struct GemvOut {
  float* y = nullptr;  // [T, ldy]
  int64_t ldy = 0;
  bool swiglu = false;  // y[t, i] = silu(p[t, i]) * p[t, N/2 + i] for i < N/2, p = x @ W.T
  GemvConv conv;        // not with swiglu, nor on the tensor-core kernel (x16 with T > kGemvSimtRows)
};

// y[t, n] = sum_k x[t, k] * W[n, k] for t < T <= kGemvMaxRows (PyTorch: y = x @ W.T).
// W: [N, K] row-major, BF16, F16 or F32; x: [T, ldx] fp32. x16 (optional): the same rows in W's 16-bit type,
// packed [T, K]; with it and T > kGemvSimtRows the tensor-core kernel runs (K % 32 == 0, 16-byte aligned).
// 16-byte loads when K is a multiple of 16 / sizeof(W element), W and x are 16-byte aligned and ldx % 4 == 0;
// a scalar path otherwise.
cudaError_t gemv(const void* W, core::DType dtype, int64_t N, int64_t K, const float* x, int64_t ldx,
                 const void* x16, int T, const GemvOut& out, cudaStream_t stream);

// The plain form: y = x @ W.T with fp32 activations.
inline cudaError_t gemv(const void* W, core::DType dtype, int64_t N, int64_t K, const float* x, int64_t ldx,
                        int T, float* y, int64_t ldy, cudaStream_t stream) {
  return gemv(W, dtype, N, K, x, ldx, nullptr, T, GemvOut{y, ldy, false, {}}, stream);
}

// The grouped form, for MoE slots: `groups` problems of one row each. Problem g multiplies the matrix at
// W + expert[g] * w_stride (elements) with x row g / x_div and writes y row g. All on the device: no host
// sync.
cudaError_t gemv_grouped(const void* W, core::DType dtype, int64_t N, int64_t K, int64_t w_stride,
                         const int* expert, int groups, const float* x, int64_t ldx, int x_div, float* y,
                         int64_t ldy, cudaStream_t stream);

// Tuning and tests: the launch shapes the dispatcher chooses from, by index (rows per warp, vectors in
// flight, warps splitting K; for the tensor-core kernel m16 tiles per warp instead of rows). -1: the
// dispatcher's own choice.
int gemv_simt_plans();
int gemv_mma_plans();
const char* gemv_plan_name(bool mma, int plan);
cudaError_t gemv_with_plan(const void* W, core::DType dtype, int64_t N, int64_t K, const float* x,
                           int64_t ldx, const void* x16, int T, const GemvOut& out, int plan,
                           cudaStream_t stream);

}  // namespace deltaflow::backend::cuda
