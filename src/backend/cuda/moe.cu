#include <cmath>

#include "backend/cuda/common.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/moe.cuh"

namespace deltaflow::backend::cuda {
namespace {

// One warp per token. Lane l holds experts l, l+32, ... (PL of them, E <= 32 PL); top-k is K rounds of a
// warp-wide argmax over the experts not yet taken. Lane k keeps the k-th pick in registers and writes it
// once.
template <int PL>
__global__ void kernel_moe_route(const float* __restrict__ logits, int64_t ld, int64_t T, int E, int K,
                                 bool renorm, int* __restrict__ ids, float* __restrict__ weights) {
  pdl_enter();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (t >= T) return;
  const int lane = threadIdx.x & 31;
  const float* row = logits + t * ld;
  float p[PL];
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < PL; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < E ? row[e] : -INFINITY;
    m = fmaxf(m, p[i]);
  }
  m = warp_max(m);
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < PL; ++i) {
    p[i] = lane + 32 * i < E ? expf(p[i] - m) : 0.0f;
    s += p[i];
  }
  s = warp_sum(s);
#pragma unroll
  for (int i = 0; i < PL; ++i) p[i] /= s;

  uint32_t taken = 0;
  float sum = 0.0f, my_w = 0.0f;
  int my_id = 0;
  for (int k = 0; k < K; ++k) {
    float bv = -1.0f;
    int be = kMaxExperts;
#pragma unroll
    for (int i = 0; i < PL; ++i) {
      const int e = lane + 32 * i;
      if (e < E && !(taken & (1u << i)) && (p[i] > bv || (p[i] == bv && e < be))) {
        bv = p[i];
        be = e;
      }
    }
    warp_argmax(bv, be);
    if ((be & 31) == lane) taken |= 1u << (be >> 5);
    sum += bv;  // in rank order, as the reference sums the top-k
    if (lane == k) {
      my_id = be;
      my_w = bv;
    }
  }
  if (lane < K) {
    ids[t * K + lane] = my_id;
    weights[t * K + lane] = renorm ? my_w / sum : my_w;
  }
}

constexpr int kCombineThreads = 256;

__global__ void kernel_moe_combine(const float* __restrict__ y, const float* __restrict__ w, int K, int64_t H,
                                   const float* __restrict__ shared, const float* __restrict__ gate_logit,
                                   float* __restrict__ out) {
  const int64_t t = blockIdx.x;
  const float g = shared ? sigmoid_f(gate_logit[t]) : 0.0f;
  for (int64_t i = threadIdx.x; i < H; i += kCombineThreads) {
    float acc = 0.0f;
    for (int k = 0; k < K; ++k) acc += w[t * K + k] * y[(t * K + k) * H + i];
    if (shared) acc += g * shared[t * H + i];
    out[t * H + i] = acc;
  }
}

}  // namespace

cudaError_t moe_route(const float* logits, int64_t ld, int64_t T, int E, int K, bool renorm, int* ids,
                      float* weights, cudaStream_t stream) {
  if (E < 1 || E > kMaxExperts || K < 1 || K > E || K > kMaxTopK) return cudaErrorInvalidValue;
  if (T == 0) return cudaSuccess;
  constexpr int kWarps = 4;
  const dim3 grid(grid_1d(T, kWarps)), block(kWarps * 32);
  // Experts per lane: the fewest that hold E, so a round scans only real experts.
  if (E <= 64)
    return launch(kernel_moe_route<2>, grid, block, 0, stream, logits, ld, T, E, K, renorm, ids, weights);
  if (E <= 128)
    return launch(kernel_moe_route<4>, grid, block, 0, stream, logits, ld, T, E, K, renorm, ids, weights);
  if (E <= 256)
    return launch(kernel_moe_route<8>, grid, block, 0, stream, logits, ld, T, E, K, renorm, ids, weights);
  if (E <= 512)
    return launch(kernel_moe_route<16>, grid, block, 0, stream, logits, ld, T, E, K, renorm, ids, weights);
  return launch(kernel_moe_route<32>, grid, block, 0, stream, logits, ld, T, E, K, renorm, ids, weights);
}

cudaError_t moe_combine(const float* y, const float* w, int64_t T, int K, int64_t H, const float* shared,
                        const float* gate_logit, float* out, cudaStream_t stream) {
  if (T == 0) return cudaSuccess;
  kernel_moe_combine<<<static_cast<unsigned>(T), kCombineThreads, 0, stream>>>(y, w, K, H, shared, gate_logit,
                                                                               out);
  return cudaGetLastError();
}

}  // namespace deltaflow::backend::cuda
