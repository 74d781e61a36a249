// The Gated DeltaNet's depthwise causal conv1d + SiLU with carried state (qwen35-architecture.md §2.3):
//   out[t, c] = silu(sum_j w[c, j] * x[t - (K-1) + j, c]),  x[< 0] from the state (the K-1 inputs before)
// The state is [C, K-1] fp32, oldest input first, and ends as the last K-1 inputs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace deltaflow::backend::cuda {

inline constexpr int kMaxConvKernel = 8;

// T tokens of one sequence, whose state is states + slot[0] * slot_stride (slot: on the device, so a captured
// graph serves any sequence). in: [T, ld_in] (channels in columns 0..C-1); w: [C, K]; out: [T, ld_out].
cudaError_t causal_conv1d_prefill(const float* in, int64_t ld_in, int64_t T, int64_t C, const float* w, int K,
                                  float* states, int64_t slot_stride, const int* slot, float* out,
                                  int64_t ld_out, cudaStream_t stream);

// Before causal_conv1d_prefill of the same T tokens (it reads the state as it was): for each token t with
// snap[t] >= 0 (a device array of T), the state after it into states + snap[t] * slot_stride.
cudaError_t causal_conv1d_snapshots(const float* in, int64_t ld_in, int64_t T, int64_t C, int K,
                                    float* states, int64_t slot_stride, const int* slot, const int* snap,
                                    cudaStream_t stream);

// Short runs of several sequences, n rows: row r belongs to the run whose first row is run0[r], its state
// at states + slots[r] * slot_stride; where snap[r] >= 0 the state after row r also goes to that slot (all
// on the device). Each run's state ends as its last K-1 inputs.
cudaError_t causal_conv1d_runs(const float* in, int64_t ld_in, int64_t n, int64_t C, const float* w, int K,
                               float* states, int64_t slot_stride, const int* slots, const int* run0,
                               const int* snap, float* out, int64_t ld_out, cudaStream_t stream);

// One token for each of n sequences; row i's state is states + slots[i] * slot_stride.
cudaError_t causal_conv1d_decode(const float* in, int64_t ld_in, int n, int64_t C, const float* w, int K,
                                 float* states, int64_t slot_stride, const int* slots, float* out,
                                 int64_t ld_out, cudaStream_t stream);

}  // namespace deltaflow::backend::cuda
