// The CPU reference ops: plain loops over fp32 activations with fp32 accumulation, weights read as
// bf16/f16/f32 or dequantized exactly to fp32 from NVFP4 / FP8 (model/quant/dequant.hpp; weight-only: the
// activations stay fp32 whatever the checkpoint's activation scheme). Row-major everywhere: an activation
// block is [T, n] with T tokens.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "model/weights.hpp"

namespace deltaflow::backend::cpu {

using model::Mat;

// y[T, W.rows] = x[T, W.cols] @ W^T. Threads split the output columns (each weight row is read once).
// y[t, n] is bit-identical whatever T, the other rows of x and the thread split (the engine's batch
// invariance): every dot runs the same arithmetic. linear.cpp has the kernels.
void linear(const float* x, int64_t T, const Mat& W, float* y);

// The kernels linear() can run. It runs linear_kernel(), fixed per process by the CPU: kAvx2 on x86-64 with
// AVX2 and FMA, else kPortable. The two round differently; each alone keeps the invariance above.
enum class LinearKernel { kPortable, kAvx2 };
LinearKernel linear_kernel();
bool linear_kernel_supported(LinearKernel k);
// linear() with kernel k (for tests; an unsupported k runs kPortable).
void linear(const float* x, int64_t T, const Mat& W, float* y, LinearKernel k);

// Row r of W as fp32 (quantized formats dequantized exactly).
void load_row(const Mat& W, int64_t r, float* out);
// All of a [1, n] or [rows, cols] weight as fp32.
std::vector<float> load_all(const Mat& W);

// Zero-centred RMSNorm: y = x * rsqrt(mean(x^2) + eps) * (1 + w), per row of n. In-place allowed.
void rmsnorm_1p(const float* x, int64_t T, int64_t n, const float* w, double eps, float* y);
// Plain RMSNorm with weight w (the gated norm of the Gated DeltaNet), per row of n.
void rmsnorm(const float* x, int64_t T, int64_t n, const float* w, double eps, float* y);
// x * rsqrt(sum(x^2) + eps) (FLA's l2norm, eps 1e-6), per row of n, in place.
void l2norm(float* x, int64_t T, int64_t n, float eps);

inline float silu(float x) {
  return x / (1.0f + std::exp(-x));
}
inline float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
// torch.nn.functional.softplus(beta=1, threshold=20).
inline float softplus(float x) {
  return x > 20.0f ? x : std::log1p(std::exp(x));
}

// NeoX rotate-half RoPE on the first `rot` dims of each of `heads` vectors of `head_dim`, at position `pos`.
// inv_freq has rot/2 entries.
void rope_neox(float* x, int64_t heads, int64_t head_dim, int64_t rot, const float* inv_freq, int64_t pos,
               float scaling = 1.0f);
// M-RoPE (model/mrope.hpp): as rope_neox, frequency i at position pos[axis[i]] (pos: t, h, w). With three
// equal positions it computes exactly what rope_neox does at that position.
void rope_neox_mrope(float* x, int64_t heads, int64_t head_dim, int64_t rot, const float* inv_freq,
                     const int64_t* pos, const uint8_t* axis, float scaling);

// In-place softmax over n values (max-subtracted).
void softmax(float* x, int64_t n);

}  // namespace deltaflow::backend::cpu
