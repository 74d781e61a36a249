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

// The same logits on tensor cores (a bf16 GEMM, cuBLASLt, the caller's): x split into three bf16 parts,
// hi = bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid), whose sum is x exactly (each part takes the
// next 8 significant bits and a sign; tiny values past bf16's normal range aside). Each product of a part
// and a bf16 weight is exact in fp32, so the three GEMMs' fp32 sums, added lo + mid + hi, match the fp32
// kernel's to fp32 rounding, at a small fraction of its time on a long prefill (the SIMT kernel does
// 2 * N * K * T flops at a few TFLOP/s).
// parts: [3][T][K] bf16 (hi rows, then mid, then lo), 16-byte aligned; x: [T, ldx] fp32. The hi rows are
// bf16(x) rounded to nearest, as convert_rows writes them. With w_dot (bf16 [K]), the pass over x also writes
// dot_out[t * ld_dot] = x[t] . w_dot in fp32: the shared expert's gate, one weight row that a GEMM would
// run as a tile of its own (and whose 257th row kept cuBLASLt off its fast kernels: 257 x 2048 x 12288
// took 0.232 ms on an H100).
cudaError_t moe_router_split_activations(const float* x, int64_t ldx, int64_t T, int64_t K, void* parts,
                                         const void* w_dot, float* dot_out, int64_t ld_dot,
                                         cudaStream_t stream);
// y3: the GEMM's [3 * T, ldy] fp32 output over the parts (part p of token t at row p * T + t); writes
// out0 / out1 as moe_router_logits_tiled does.
cudaError_t moe_router_sum_parts(const float* y3, int64_t ldy, int64_t T, int64_t N, int64_t n_split,
                                 float* out0, int64_t ld0, float* out1, int64_t ld1, cudaStream_t stream);

}  // namespace deltaflow::backend::cuda
