// The MoE router at prefill: [router | shared_expert_gate] logits of many tokens as one register-tiled fp32
// matmul. The decode kernel (moe_router_logits, moe_decode.cuh) splits K over a block so that a few hundred
// weight rows fill the GPU for a few tokens; over thousands of tokens each of its blocks re-read 32 whole
// activation rows for two weight rows (4 GB of L2 traffic per 4096-token layer). Here a block keeps a
// 64-token by 64-row tile of both operands in shared memory and each thread 4 x 4 sums in registers.
//
// fp32 activations and fp32 sums (a near tie between experts must not flip on rounding), summed over k in
// order: not the decode kernel's order, so prefill and decode logits agree to fp32 rounding, not bit for bit
// (the backend keeps the decode kernel in exact mode, where they must).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.hpp"

namespace deltaflow::backend::cuda {

// out0[t, n] = x[t] . W[n] for n < n_split;  out1[t, n - n_split] = x[t] . W[n] for n_split <= n < N.
// W: [N, K] row-major, BF16, F16 or F32; x: [T, ldx] fp32; any K, strides and alignment. out1 may be null
// when n_split == N.
cudaError_t moe_router_logits_tiled(const void* W, core::DType dtype, int64_t N, int64_t n_split, int64_t K,
                                    const float* x, int64_t ldx, int64_t T, float* out0, int64_t ld0,
                                    float* out1, int64_t ld1, cudaStream_t stream);

}  // namespace deltaflow::backend::cuda
