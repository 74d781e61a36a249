#include "backend/cuda/common.cuh"
#include "backend/cuda/conv1d.cuh"
#include "backend/cuda/conv1d_step.cuh"
#include "backend/cuda/launch.cuh"

namespace deltaflow::backend::cuda {
namespace {

constexpr int kThreads = 256;

// Every (token, channel) output is independent: thread per output, reading the window from the input block
// or, for the first K-1 positions, from the state (which a second kernel updates afterwards).
__global__ void kernel_conv1d_prefill_out(const float* __restrict__ in, int64_t ld_in, int64_t T, int64_t C,
                                          const float* __restrict__ w, int K,
                                          const float* __restrict__ states, int64_t slot_stride,
                                          const int* __restrict__ slot, float* __restrict__ out,
                                          int64_t ld_out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= T * C) return;
  const float* state = states + static_cast<int64_t>(*slot) * slot_stride;
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

// The same for channels in 16-byte groups (C, ld_in, ld_out multiples of 4, aligned rows): a thread owns 4
// channels over a run of kConvRun (16) tokens and slides the window down it in registers, so each input is
// read about once (the one-thread-per-output form reads it K times and divides 64-bit indices). Same order of
// summation (j = 0 .. K-1) as the kernel above and conv1d_step.
constexpr int kConvRun = 16;

template <int K>
__global__ void __launch_bounds__(kThreads)
    kernel_conv1d_prefill_out_vec(const float* __restrict__ in, int64_t ld_in, int64_t T, int64_t C,
                                  const float* __restrict__ w, const float* __restrict__ states,
                                  int64_t slot_stride, const int* __restrict__ slot, float* __restrict__ out,
                                  int64_t ld_out) {
  constexpr int S = K - 1;
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) * 4;
  if (c >= C) return;
  const float* state = states + static_cast<int64_t>(*slot) * slot_stride;
  const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kConvRun, t1 = min64(t0 + kConvRun, T);
  float wk[K][4];
#pragma unroll
  for (int q = 0; q < 4; ++q)
#pragma unroll
    for (int j = 0; j < K; ++j) wk[j][q] = w[(c + q) * K + j];
  float4 win[K];  // win[j]: the input at position t - S + j
#pragma unroll
  for (int j = 0; j < S; ++j) {
    const int64_t s = t0 - S + j;
    if (s >= 0) {
      win[j] = *reinterpret_cast<const float4*>(in + s * ld_in + c);
    } else {
      const int64_t p = S + s;  // into the state
      win[j] = make_float4(state[c * S + p], state[(c + 1) * S + p], state[(c + 2) * S + p],
                           state[(c + 3) * S + p]);
    }
  }
#pragma unroll 4
  for (int64_t t = t0; t < t1; ++t) {
    win[S] = *reinterpret_cast<const float4*>(in + t * ld_in + c);
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int j = 0; j < K; ++j) {
      acc.x += wk[j][0] * win[j].x;
      acc.y += wk[j][1] * win[j].y;
      acc.z += wk[j][2] * win[j].z;
      acc.w += wk[j][3] * win[j].w;
    }
    *reinterpret_cast<float4*>(out + t * ld_out + c) =
        make_float4(silu_f(acc.x), silu_f(acc.y), silu_f(acc.z), silu_f(acc.w));
#pragma unroll
    for (int j = 0; j < S; ++j) win[j] = win[j + 1];
  }
}

// state = the last K-1 inputs of [state, in].
__global__ void kernel_conv1d_prefill_state(const float* __restrict__ in, int64_t ld_in, int64_t T, int64_t C,
                                            int K, float* __restrict__ states, int64_t slot_stride,
                                            const int* __restrict__ slot) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= C) return;
  float* state = states + static_cast<int64_t>(*slot) * slot_stride;
  const int S = K - 1;
  float win[kMaxConvKernel];
  for (int j = 0; j < S; ++j) {
    const int64_t p = T + j;  // index into [state (S), in (T)]
    win[j] = p < S ? state[c * S + p] : in[(p - S) * ld_in + c];
  }
  for (int j = 0; j < S; ++j) state[c * S + j] = win[j];
}

// Block row t: when snap[t] >= 0, the state after token t (the K-1 inputs of [state, in] ending at t) into
// states + snap[t] * slot_stride. Reads the state as it was before the segment.
__global__ void kernel_conv1d_snapshots(const float* __restrict__ in, int64_t ld_in, int64_t C, int K,
                                        float* __restrict__ states, int64_t slot_stride,
                                        const int* __restrict__ slot, const int* __restrict__ snap) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t t = blockIdx.y;
  const int to = snap[t];
  if (c >= C || to < 0) return;
  const float* state = states + static_cast<int64_t>(*slot) * slot_stride;
  const int S = K - 1;
  float* dst = states + static_cast<int64_t>(to) * slot_stride + c * S;
  for (int j = 0; j < S; ++j) {
    const int64_t p = t + 1 + j;  // index into [state (S), in (T)]
    dst[j] = p < S ? state[c * S + p] : in[(p - S) * ld_in + c];
  }
}

// Short runs (causal_conv1d_runs): thread per (row, channel), the output as kernel_conv1d_prefill_out sums
// it, and the row's snapshot; both read the states as they were before the rows.
__global__ void kernel_conv1d_runs_out(const float* __restrict__ in, int64_t ld_in, int64_t n, int64_t C,
                                       const float* __restrict__ w, int K, float* __restrict__ states,
                                       int64_t slot_stride, const int* __restrict__ slots,
                                       const int* __restrict__ run0, const int* __restrict__ snap,
                                       float* __restrict__ out, int64_t ld_out) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= n * C) return;
  const int64_t r = idx / C, c = idx % C;
  const int S = K - 1;
  const int64_t first = run0[r], t = r - first;  // t: the row's index in its run
  const float* state = states + static_cast<int64_t>(slots[r]) * slot_stride;
  float acc = 0.0f;
  for (int j = 0; j < K; ++j) {
    const int64_t s = t - S + j;  // input position in the run; < 0 reads the state
    const float x = s >= 0 ? in[(first + s) * ld_in + c] : state[c * S + (S + s)];
    acc += w[c * K + j] * x;
  }
  out[r * ld_out + c] = silu_f(acc);
  const int to = snap[r];
  if (to < 0) return;
  float* dst = states + static_cast<int64_t>(to) * slot_stride + c * S;
  for (int j = 0; j < S; ++j) {
    const int64_t p = t + 1 + j;  // index into [state (S), the run's inputs]
    dst[j] = p < S ? state[c * S + p] : in[(first + p - S) * ld_in + c];
  }
}

// Each run's last row (thread per channel of it): the run's state = its last K-1 inputs.
__global__ void kernel_conv1d_runs_state(const float* __restrict__ in, int64_t ld_in, int64_t n, int64_t C,
                                         int K, float* __restrict__ states, int64_t slot_stride,
                                         const int* __restrict__ slots, const int* __restrict__ run0) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (idx >= n * C) return;
  const int64_t r = idx / C, c = idx % C;
  if (r + 1 < n && run0[r + 1] == run0[r]) return;  // not its run's last row
  const int S = K - 1;
  const int64_t first = run0[r], T = r - first + 1;
  float* state = states + static_cast<int64_t>(slots[r]) * slot_stride;
  float win[kMaxConvKernel];
  for (int j = 0; j < S; ++j) {
    const int64_t p = T + j;
    win[j] = p < S ? state[c * S + p] : in[(first + p - S) * ld_in + c];
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
  float* st = states + static_cast<int64_t>(slots[i]) * slot_stride + c * (K - 1);
  out[i * ld_out + c] = conv1d_step(st, w + c * K, K, in[i * ld_in + c]);
}

}  // namespace

cudaError_t causal_conv1d_prefill(const float* in, int64_t ld_in, int64_t T, int64_t C, const float* w, int K,
                                  float* states, int64_t slot_stride, const int* slot, float* out,
                                  int64_t ld_out, cudaStream_t stream) {
  if (K < 1 || K > kMaxConvKernel) return cudaErrorInvalidValue;
  if (T == 0 || C == 0) return cudaSuccess;
  const bool vec = C % 4 == 0 && ld_in % 4 == 0 && ld_out % 4 == 0 && aligned16(in) && aligned16(out);
  const dim3 vgrid(grid_1d(C / 4, kThreads), static_cast<unsigned>((T + kConvRun - 1) / kConvRun));
  if (vec && K == 4 && vgrid.y <= 65535) {
    kernel_conv1d_prefill_out_vec<4>
        <<<vgrid, kThreads, 0, stream>>>(in, ld_in, T, C, w, states, slot_stride, slot, out, ld_out);
  } else if (vec && K == 2 && vgrid.y <= 65535) {
    kernel_conv1d_prefill_out_vec<2>
        <<<vgrid, kThreads, 0, stream>>>(in, ld_in, T, C, w, states, slot_stride, slot, out, ld_out);
  } else {
    kernel_conv1d_prefill_out<<<grid_1d(T * C, kThreads), kThreads, 0, stream>>>(
        in, ld_in, T, C, w, K, states, slot_stride, slot, out, ld_out);
  }
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (K == 1) return cudaSuccess;
  kernel_conv1d_prefill_state<<<grid_1d(C, kThreads), kThreads, 0, stream>>>(in, ld_in, T, C, K, states,
                                                                             slot_stride, slot);
  return cudaGetLastError();
}

cudaError_t causal_conv1d_snapshots(const float* in, int64_t ld_in, int64_t T, int64_t C, int K,
                                    float* states, int64_t slot_stride, const int* slot, const int* snap,
                                    cudaStream_t stream) {
  if (K < 1 || K > kMaxConvKernel || T > 65535) return cudaErrorInvalidValue;
  if (T == 0 || C == 0 || K == 1) return cudaSuccess;
  kernel_conv1d_snapshots<<<dim3(grid_1d(C, kThreads), static_cast<unsigned>(T)), kThreads, 0, stream>>>(
      in, ld_in, C, K, states, slot_stride, slot, snap);
  return cudaGetLastError();
}

cudaError_t causal_conv1d_runs(const float* in, int64_t ld_in, int64_t n, int64_t C, const float* w, int K,
                               float* states, int64_t slot_stride, const int* slots, const int* run0,
                               const int* snap, float* out, int64_t ld_out, cudaStream_t stream) {
  if (K < 1 || K > kMaxConvKernel) return cudaErrorInvalidValue;
  if (n == 0 || C == 0) return cudaSuccess;
  kernel_conv1d_runs_out<<<grid_1d(n * C, kThreads), kThreads, 0, stream>>>(
      in, ld_in, n, C, w, K, states, slot_stride, slots, run0, snap, out, ld_out);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (K == 1) return cudaSuccess;
  kernel_conv1d_runs_state<<<grid_1d(n * C, kThreads), kThreads, 0, stream>>>(in, ld_in, n, C, K, states,
                                                                              slot_stride, slots, run0);
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
