#include "backend/cuda/common.cuh"
#include "backend/cuda/conv1d.cuh"
#include "backend/cuda/launch.cuh"

namespace deltaflow::backend::cuda {
namespace {

constexpr int kThreads = 256;

// Every (token, channel) output is independent: thread per output, reading the window from the input block
// or, for the first K-1 positions, from the state (which a second kernel updates afterwards).
__global__ void kernel_conv1d_prefill_out(const float* __restrict__ in, int64_t ld_in, int64_t T, int64_t C,
                                          const float* __restrict__ w, int K, const float* __restrict__ state,
                                          float* __restrict__ out, int64_t ld_out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= T * C) return;
  const int64_t t = idx / C, c = idx % C;
  const int S = K - 1;
  float acc = 0.0f;
  for (int j = 0; j < K; ++j) {
    const int64_t s = t - S + j;  // input position; < 0 reads the state
    const float x = s >= 0 ? in[s * ld_in + c] : state[c * S + (S + s)];
    acc += w[c * K + j] * x;
  }
  out[t * ld_out + c] = silu_f(acc);
}

// state = the last K-1 inputs of [state, in].
__global__ void kernel_conv1d_prefill_state(const float* __restrict__ in, int64_t ld_in, int64_t T, int64_t C,
                                            int K, float* __restrict__ state) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= C) return;
  const int S = K - 1;
  float win[kMaxConvKernel];
  for (int j = 0; j < S; ++j) {
    const int64_t p = T + j;  // index into [state (S), in (T)]
    win[j] = p < S ? state[c * S + p] : in[(p - S) * ld_in + c];
  }
  for (int j = 0; j < S; ++j) state[c * S + j] = win[j];
}

__global__ void kernel_conv1d_decode(const float* __restrict__ in, int64_t ld_in, int n, int64_t C,
                                     const float* __restrict__ w, int K, float* __restrict__ states,
                                     int64_t slot_stride, const int* __restrict__ slots,
                                     float* __restrict__ out, int64_t ld_out) {
  pdl_enter();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= static_cast<int64_t>(n) * C) return;
  const int64_t i = idx / C, c = idx % C;
  const int S = K - 1;
  float* st = states + static_cast<int64_t>(slots[i]) * slot_stride + c * S;
  float win[kMaxConvKernel];
  for (int j = 0; j < S; ++j) win[j] = st[j];
  win[S] = in[i * ld_in + c];
  float acc = 0.0f;
  for (int j = 0; j < K; ++j) acc += w[c * K + j] * win[j];
  out[i * ld_out + c] = silu_f(acc);
  for (int j = 0; j < S; ++j) st[j] = win[j + 1];
}

}  // namespace

cudaError_t causal_conv1d_prefill(const float* in, int64_t ld_in, int64_t T, int64_t C, const float* w, int K,
                                  float* state, float* out, int64_t ld_out, cudaStream_t stream) {
  if (K < 1 || K > kMaxConvKernel) return cudaErrorInvalidValue;
  if (T == 0 || C == 0) return cudaSuccess;
  kernel_conv1d_prefill_out<<<grid_1d(T * C, kThreads), kThreads, 0, stream>>>(in, ld_in, T, C, w, K, state,
                                                                               out, ld_out);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (K == 1) return cudaSuccess;
  kernel_conv1d_prefill_state<<<grid_1d(C, kThreads), kThreads, 0, stream>>>(in, ld_in, T, C, K, state);
  return cudaGetLastError();
}

cudaError_t causal_conv1d_decode(const float* in, int64_t ld_in, int n, int64_t C, const float* w, int K,
                                 float* states, int64_t slot_stride, const int* slots, float* out,
                                 int64_t ld_out, cudaStream_t stream) {
  if (K < 1 || K > kMaxConvKernel) return cudaErrorInvalidValue;
  if (n == 0 || C == 0) return cudaSuccess;
  return launch(kernel_conv1d_decode, dim3(grid_1d(static_cast<int64_t>(n) * C, kThreads)), dim3(kThreads), 0,
                stream, in, ld_in, n, C, w, K, states, slot_stride, slots, out, ld_out);
}

}  // namespace deltaflow::backend::cuda
