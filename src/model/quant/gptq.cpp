#include "model/quant/gptq.hpp"

#include <algorithm>
#include <cmath>

#include "core/dtype.hpp"
#include "core/threads.hpp"
#include "model/quant/format.hpp"
#include "model/quant/search.hpp"

namespace deltaflow::model::quant {
namespace {

// Lower Cholesky factor of A (K x K, row-major) in place; false if A is not positive definite.
bool cholesky_lower(std::vector<double>& a, int64_t K) {
  for (int64_t j = 0; j < K; ++j) {
    double d = a[j * K + j];
    for (int64_t p = 0; p < j; ++p) d -= a[j * K + p] * a[j * K + p];
    if (!(d > 0)) return false;
    d = std::sqrt(d);
    a[j * K + j] = d;
    core::parallel_for(static_cast<size_t>(K - j - 1), 64, [&](size_t b, size_t e) {
      for (size_t r = b; r < e; ++r) {
        const int64_t i = j + 1 + static_cast<int64_t>(r);
        double s = a[i * K + j];
        for (int64_t p = 0; p < j; ++p) s -= a[i * K + p] * a[j * K + p];
        a[i * K + j] = s / d;
      }
    });
    for (int64_t p = j + 1; p < K; ++p) a[j * K + p] = 0;
  }
  return true;
}

// The inverse of a lower triangular L, row by row: row i = (e_i - sum_{p<i} L[i,p] row p) / L[i,i].
std::vector<double> lower_inverse(const std::vector<double>& l, int64_t K) {
  std::vector<double> li(static_cast<size_t>(K * K), 0.0);
  for (int64_t i = 0; i < K; ++i) {
    double* row = li.data() + i * K;
    row[i] = 1.0;
    for (int64_t p = 0; p < i; ++p) {
      const double f = l[i * K + p];
      const double* rp = li.data() + p * K;
      for (int64_t c = 0; c <= p; ++c) row[c] -= f * rp[c];
    }
    const double d = l[i * K + i];
    for (int64_t c = 0; c <= i; ++c) row[c] /= d;
  }
  return li;
}

// One row's GPTQ step after column k was rounded to `d`: the error, scaled by 1 / U[k, k], taken off the
// columns after k along U's row k (in fp32, U rounded to it, as GPTQ runs).
void spread(float* row, int64_t K, int64_t k, float d, const float* U) {
  const float err = (row[k] - d) / U[k * K + k];
  const float* u = U + k * K;
  for (int64_t j = k + 1; j < K; ++j) row[j] -= err * u[j];
  row[k] = d;
}

}  // namespace

std::vector<double> gptq_factor(const std::vector<double>& gram, int64_t K, double damp) {
  std::vector<double> h = gram;
  double mean = 0;
  for (int64_t i = 0; i < K; ++i) {
    if (!(h[i * K + i] > 0)) h[i * K + i] = 1.0;
    mean += h[i * K + i];
  }
  mean /= static_cast<double>(K);
  // With P the reversal permutation and P H P = L L^T: H^-1 = (P L^-1 P)^T (P L^-1 P), and P L^-1 P is upper
  // triangular with a positive diagonal, so it is U. One factorisation and one triangular inverse.
  for (int attempt = 0; attempt < 4; ++attempt, damp *= 10) {
    std::vector<double> a(static_cast<size_t>(K * K));
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = 0; j < K; ++j) a[i * K + j] = h[(K - 1 - i) * K + (K - 1 - j)];
    for (int64_t i = 0; i < K; ++i) a[i * K + i] += damp * mean;
    if (!cholesky_lower(a, K)) continue;
    const std::vector<double> li = lower_inverse(a, K);
    std::vector<double> u(static_cast<size_t>(K * K), 0.0);
    for (int64_t i = 0; i < K; ++i)
      for (int64_t j = i; j < K; ++j) u[i * K + j] = li[(K - 1 - i) * K + (K - 1 - j)];
    return u;
  }
  return {};
}

Nvfp4Weight gptq_nvfp4(const float* w, int64_t N, int64_t K, float s2, const std::vector<double>& U,
                       const float* h) {
  Nvfp4Weight out;
  const int64_t G = K / kNvfp4Group;
  out.scale_2 = s2;
  out.packed.assign(static_cast<size_t>(N * K / 2), 0);
  out.scale.resize(static_cast<size_t>(N * G));
  const std::vector<float> uf(U.begin(), U.end());
  core::parallel_for(static_cast<size_t>(N), 4, [&](size_t b, size_t e) {
    std::vector<float> row(static_cast<size_t>(K));
    for (size_t n = b; n < e; ++n) {
      std::copy_n(w + n * static_cast<size_t>(K), K, row.begin());
      uint8_t* packed = out.packed.data() + n * static_cast<size_t>(K / 2);
      for (int64_t g = 0; g < G; ++g) {
        float* blk = row.data() + g * kNvfp4Group;
        const uint8_t code = nvfp4_search_code(blk, h ? h + g * kNvfp4Group : nullptr, s2);
        out.scale[n * static_cast<size_t>(G) + static_cast<size_t>(g)] = code;
        const float denom = core::f8e4m3_to_f32(code) * s2;
        for (int64_t j = 0; j < kNvfp4Group; ++j) {
          const int64_t k = g * kNvfp4Group + j;
          const uint8_t q = e2m1_code(row[k] / denom);
          packed[k / 2] |= static_cast<uint8_t>(k & 1 ? q << 4 : q);
          spread(row.data(), K, k, e2m1_to_f32(q) * denom, uf.data());
        }
      }
    }
  });
  return out;
}

std::vector<uint8_t> gptq_fp8(const float* w, int64_t N, int64_t K, const std::vector<float>& scales,
                              int64_t block_rows, int64_t block_cols, const std::vector<double>& U) {
  const int64_t grid_cols = (K + block_cols - 1) / block_cols;
  std::vector<uint8_t> q(static_cast<size_t>(N * K), 0);
  const std::vector<float> uf(U.begin(), U.end());
  core::parallel_for(static_cast<size_t>(N), 4, [&](size_t b, size_t e) {
    std::vector<float> row(static_cast<size_t>(K));
    for (size_t n = b; n < e; ++n) {
      std::copy_n(w + n * static_cast<size_t>(K), K, row.begin());
      const float* srow = scales.data() + (static_cast<int64_t>(n) / block_rows) * grid_cols;
      for (int64_t k = 0; k < K; ++k) {
        const float s = srow[k / block_cols];
        if (!(s > 0)) continue;  // an all-zero tensor: codes 0
        const uint8_t c = f32_to_e4m3(std::clamp(row[k] / s, -448.0f, 448.0f));
        q[n * static_cast<size_t>(K) + static_cast<size_t>(k)] = c;
        spread(row.data(), K, k, core::f8e4m3_to_f32(c) * s, uf.data());
      }
    }
  });
  return q;
}

}  // namespace deltaflow::model::quant
