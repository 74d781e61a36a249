#include "backend/cpu/vision_encoder.hpp"

#include <cmath>
#include <string>

#include "backend/cpu/ops.hpp"
#include "core/threads.hpp"

namespace deltaflow::backend::cpu {
namespace {

using model::Mat;
using model::VisionConfig;
using model::VisionGrid;

void add_bias(float* y, int64_t T, const std::vector<float>& b) {
  const int64_t n = static_cast<int64_t>(b.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < n; ++i) y[t * n + i] += b[static_cast<size_t>(i)];
}

// y = x W^T + b for T rows.
std::vector<float> affine(const float* x, int64_t T, const Mat& W, const Mat& b) {
  std::vector<float> y(static_cast<size_t>(T * W.rows));
  linear(x, T, W, y.data());
  add_bias(y.data(), T, load_all(b));
  return y;
}

// nn.LayerNorm(eps): biased variance, fp32 output.
void layer_norm(const float* x, int64_t T, int64_t n, const std::vector<float>& w,
                const std::vector<float>& b, double eps, float* y) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * n;
    double mean = 0;
    for (int64_t i = 0; i < n; ++i) mean += xr[i];
    mean /= static_cast<double>(n);
    double var = 0;
    for (int64_t i = 0; i < n; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= static_cast<double>(n);
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < n; ++i)
      y[t * n + i] =
          static_cast<float>((xr[i] - mean) * inv) * w[static_cast<size_t>(i)] + b[static_cast<size_t>(i)];
  }
}

inline float gelu_tanh(float x) {       // gelu_pytorch_tanh
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}
inline float gelu_erf(float x) {  // nn.GELU()
  return 0.5f * x * (1.0f + std::erf(x * 0.7071067811865476f));
}

// (row, col) of patch k of a frame in merge-window order (vision_utils.get_vision_position_ids).
void patch_row_col(int64_t k, int64_t w, int64_t merge, int64_t& row, int64_t& col) {
  const int64_t blocks_w = w / merge;
  const int64_t in_col = k % merge, in_row = (k / merge) % merge;
  const int64_t block_col = (k / (merge * merge)) % blocks_w, block_row = k / (merge * merge * blocks_w);
  row = block_row * merge + in_row;
  col = block_col * merge + in_col;
}

// Bilinear, align_corners=True taps on one axis, in fp32 as _interpolation_axis_taps_weights computes them.
void axis_taps(int64_t index, int64_t size, int64_t side, int64_t tap[2], float wt[2]) {
  const float src = static_cast<float>(index) * static_cast<float>(side - 1) /
                    static_cast<float>(std::max<int64_t>(size - 1, 1));
  const float fl = std::floor(src);
  for (int o = 0; o < 2; ++o) {
    const int64_t raw = static_cast<int64_t>(fl) + o;
    tap[o] = std::min(std::max<int64_t>(raw, 0), side - 1);
    const float d = std::fabs(src - fl - static_cast<float>(o));
    wt[o] = std::max(1.0f - d, 0.0f);
  }
}

}  // namespace

core::Expected<std::vector<float>> encode_images(const VisionConfig& c, const model::VisionWeights& W,
                                                 std::span<const float> pixels,
                                                 std::span<const VisionGrid> grids, VisionTrace* trace) {
  const int64_t D = c.hidden_size, M = c.spatial_merge_size, nh = c.num_heads, hd = c.head_dim();
  const int64_t pd = c.patch_dim(), side = c.num_grid_per_side();
  int64_t N = 0;
  for (const auto& g : grids) {
    if (g.t <= 0 || g.h <= 0 || g.w <= 0 || g.h % M || g.w % M)
      return core::Error{"vision encoder: grid " + std::to_string(g.t) + "x" + std::to_string(g.h) + "x" +
                         std::to_string(g.w) + " is not a positive multiple of the merge size " +
                         std::to_string(M)};
    N += g.t * g.h * g.w;
  }
  if (static_cast<int64_t>(pixels.size()) != N * pd)
    return core::Error{"vision encoder: " + std::to_string(pixels.size()) + " pixel values, the grids need " +
                       std::to_string(N) + " rows of " + std::to_string(pd)};
  if (N == 0) return std::vector<float>{};

  // 1. Patch embedding + interpolated learned positions.
  std::vector<float> x = affine(pixels.data(), N, W.patch_embed_w, W.patch_embed_b);
  std::vector<int64_t> prow(static_cast<size_t>(N)), pcol(static_cast<size_t>(N));
  std::vector<int64_t> seg_start;  // attention segments: one per frame
  {
    std::vector<float> row(static_cast<size_t>(D));
    int64_t p = 0;
    for (const auto& g : grids)
      for (int64_t f = 0; f < g.t; ++f) {
        seg_start.push_back(p);
        for (int64_t k = 0; k < g.h * g.w; ++k, ++p) {
          int64_t r, col;
          patch_row_col(k, g.w, M, r, col);
          prow[static_cast<size_t>(p)] = r;
          pcol[static_cast<size_t>(p)] = col;
          int64_t ht[2], wt[2];
          float hw[2], ww[2];
          axis_taps(r, g.h, side, ht, hw);
          axis_taps(col, g.w, side, wt, ww);
          float* xp = x.data() + p * D;
          std::vector<float> pos(static_cast<size_t>(D), 0.0f);
          for (int a = 0; a < 2; ++a)
            for (int b = 0; b < 2; ++b) {
              load_row(W.pos_embed, ht[a] * side + wt[b], row.data());
              const float wgt = hw[a] * ww[b];
              for (int64_t i = 0; i < D; ++i)
                pos[static_cast<size_t>(i)] += row[static_cast<size_t>(i)] * wgt;
            }
          for (int64_t i = 0; i < D; ++i) xp[i] += pos[static_cast<size_t>(i)];
        }
      }
    seg_start.push_back(N);
  }
  if (trace) trace->embeddings = x;

  // 2. 2-D rotary tables: cos/sin [N, hd], halves [h freqs | w freqs] repeated twice.
  const int64_t q4 = hd / 4;
  std::vector<float> inv_freq(static_cast<size_t>(q4));
  for (int64_t j = 0; j < q4; ++j) {
    const float e = static_cast<float>(2 * j) / static_cast<float>(hd / 2);
    inv_freq[static_cast<size_t>(j)] = 1.0f / std::pow(static_cast<float>(c.rope_theta), e);
  }
  std::vector<float> cosv(static_cast<size_t>(N * hd)), sinv(static_cast<size_t>(N * hd));
  for (int64_t p = 0; p < N; ++p)
    for (int64_t j = 0; j < q4; ++j) {
      const float fh = static_cast<float>(prow[static_cast<size_t>(p)]) * inv_freq[static_cast<size_t>(j)];
      const float fw = static_cast<float>(pcol[static_cast<size_t>(p)]) * inv_freq[static_cast<size_t>(j)];
      for (int64_t rep = 0; rep < 2; ++rep) {
        cosv[static_cast<size_t>(p * hd + rep * hd / 2 + j)] = std::cos(fh);
        sinv[static_cast<size_t>(p * hd + rep * hd / 2 + j)] = std::sin(fh);
        cosv[static_cast<size_t>(p * hd + rep * hd / 2 + q4 + j)] = std::cos(fw);
        sinv[static_cast<size_t>(p * hd + rep * hd / 2 + q4 + j)] = std::sin(fw);
      }
    }
  auto rotate = [&](float* v, int64_t p) {  // one head vector at patch p
    const float* cs = cosv.data() + p * hd;
    const float* sn = sinv.data() + p * hd;
    const int64_t half = hd / 2;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cs[i] - b * sn[i];
      v[i + half] = b * cs[i + half] + a * sn[i + half];
    }
  };

  // 3. Blocks.
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> h(static_cast<size_t>(N * D)), attn(static_cast<size_t>(N * D));
  for (size_t bi = 0; bi < W.blocks.size(); ++bi) {
    const auto& B = W.blocks[bi];
    layer_norm(x.data(), N, D, load_all(B.norm1_w), load_all(B.norm1_b), 1e-6, h.data());
    std::vector<float> qkv = affine(h.data(), N, B.qkv_w, B.qkv_b);  // [N, 3D]: [q | k | v], head-major
    for (int64_t p = 0; p < N; ++p)
      for (int64_t hh = 0; hh < nh; ++hh) {
        rotate(qkv.data() + p * 3 * D + hh * hd, p);
        rotate(qkv.data() + p * 3 * D + D + hh * hd, p);
      }
    for (size_t s = 0; s + 1 < seg_start.size(); ++s) {
      const int64_t s0 = seg_start[s], len = seg_start[s + 1] - s0;
      core::parallel_for(static_cast<size_t>(len * nh), 4, [&](size_t b, size_t e) {
        std::vector<float> sc(static_cast<size_t>(len));
        for (size_t idx = b; idx < e; ++idx) {
          const int64_t i = static_cast<int64_t>(idx) / nh, hh = static_cast<int64_t>(idx) % nh;
          const float* q = qkv.data() + (s0 + i) * 3 * D + hh * hd;
          for (int64_t j = 0; j < len; ++j) {
            const float* k = qkv.data() + (s0 + j) * 3 * D + D + hh * hd;
            float d = 0;
            for (int64_t u = 0; u < hd; ++u) d += q[u] * k[u];
            sc[static_cast<size_t>(j)] = d * scale;
          }
          softmax(sc.data(), len);
          float* o = attn.data() + (s0 + i) * D + hh * hd;
          for (int64_t u = 0; u < hd; ++u) o[u] = 0;
          for (int64_t j = 0; j < len; ++j) {
            const float* v = qkv.data() + (s0 + j) * 3 * D + 2 * D + hh * hd;
            const float pj = sc[static_cast<size_t>(j)];
            for (int64_t u = 0; u < hd; ++u) o[u] += pj * v[u];
          }
        }
      });
    }
    std::vector<float> proj = affine(attn.data(), N, B.proj_w, B.proj_b);
    for (int64_t i = 0; i < N * D; ++i) x[static_cast<size_t>(i)] += proj[static_cast<size_t>(i)];
    layer_norm(x.data(), N, D, load_all(B.norm2_w), load_all(B.norm2_b), 1e-6, h.data());
    std::vector<float> f1 = affine(h.data(), N, B.fc1_w, B.fc1_b);
    for (auto& v : f1) v = gelu_tanh(v);
    std::vector<float> f2 = affine(f1.data(), N, B.fc2_w, B.fc2_b);
    for (int64_t i = 0; i < N * D; ++i) x[static_cast<size_t>(i)] += f2[static_cast<size_t>(i)];
    if (trace) trace->block_outputs.push_back(x);
  }

  // 4. Merger: LayerNorm per patch, then each window of M*M consecutive rows as one row of M*M*D.
  layer_norm(x.data(), N, D, load_all(W.merger_norm_w), load_all(W.merger_norm_b), 1e-6, h.data());
  const int64_t rows = N / (M * M);
  std::vector<float> m1 = affine(h.data(), rows, W.merger_fc1_w, W.merger_fc1_b);
  for (auto& v : m1) v = gelu_erf(v);
  return affine(m1.data(), rows, W.merger_fc2_w, W.merger_fc2_b);
}

}  // namespace deltaflow::backend::cpu
