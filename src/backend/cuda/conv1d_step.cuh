// Device code shared by the conv1d kernels (conv1d.cu) and the GEMV's conv epilogue (gemv.cu): one decode
// step of one channel of the causal conv1d + SiLU (conv1d.cuh), so both sum the window in the same order.
#pragma once

#include "backend/cuda/common.cuh"
#include "backend/cuda/conv1d.cuh"

namespace deltaflow::backend::cuda {

// st: the channel's K-1 previous inputs, oldest first; w: its K taps. The window [st | x] is summed in order
// (j = 0 .. K-1), the state shifts by one (x becomes its newest entry), and silu(sum) is returned. The
// unrolled loop keeps the window in registers.
__device__ __forceinline__ float conv1d_step(float* st, const float* w, int K, float x) {
  const int S = K - 1;
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) {
    if (j < K) {
      const float xj = j < S ? st[j] : x;
      acc += w[j] * xj;
      if (j > 0) st[j - 1] = xj;
    }
  }
  return silu_f(acc);
}

}  // namespace deltaflow::backend::cuda
