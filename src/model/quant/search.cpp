#include "model/quant/search.hpp"

#include <algorithm>
#include <cmath>

#include "core/dtype.hpp"
#include "core/threads.hpp"
#include "model/quant/format.hpp"

namespace deltaflow::model::quant {
namespace {

double sq(double x) {
  return x * x;
}

// Block-scale candidates of the search: every E4M3 code from lo * sb to hi * sb (positive codes are ordered
// as their values), within [2^-9, 448].
constexpr float kNvfp4Lo = 0.6f, kNvfp4Hi = 1.1f;

// Packs a row group's codes (16 nibbles, element k at nibble k of the row).
void pack_group(const float* w, float denom, uint8_t* packed_row, int64_t g) {
  for (int64_t j = 0; j < kNvfp4Group; ++j) {
    const int64_t k = g * kNvfp4Group + j;
    const uint8_t q = e2m1_code(w[j] / denom);
    packed_row[k / 2] |= static_cast<uint8_t>(k & 1 ? q << 4 : q);
  }
}

// The error of FP8 codes e4m3(clamp(w / s)) dequantized as e4m3 * s, over rows [n0, n1) x cols [k0, k1).
double fp8_error(const float* w, int64_t K, int64_t n0, int64_t n1, int64_t k0, int64_t k1, const float* h,
                 float s) {
  double e = 0;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t k = k0; k < k1; ++k) {
      const float x = w[n * K + k];
      const float d = core::f8e4m3_to_f32(f32_to_e4m3(std::clamp(x / s, -448.0f, 448.0f))) * s;
      e += (h ? h[k] : 1.0) * sq(static_cast<double>(x) - d);
    }
  return e;
}

}  // namespace

double nvfp4_group_error(const float* w, const float* h, float s2, uint8_t code) {
  const float scale = core::f8e4m3_to_f32(code) * s2;
  double e = 0;
  for (int64_t j = 0; j < kNvfp4Group; ++j) {
    const float d = e2m1_to_f32(e2m1_code(w[j] / scale)) * scale;
    e += (h ? h[j] : 1.0) * sq(static_cast<double>(w[j]) - d);
  }
  return e;
}

uint8_t nvfp4_exact_code(const float* w, float s2) {
  return nvfp4_block_code(w, s2);
}

uint8_t nvfp4_search_code(const float* w, const float* h, float s2) {
  const uint8_t exact = nvfp4_exact_code(w, s2);
  const float sb = abs_max(w, kNvfp4Group) / (6.0f * s2);
  if (sb == 0.0f) return exact;  // an all-zero group: every scale is exact
  const uint8_t lo = std::max<uint8_t>(1, f32_to_e4m3(std::clamp(sb * kNvfp4Lo, 0x1p-9f, 448.0f)));
  const uint8_t hi = f32_to_e4m3(std::clamp(sb * kNvfp4Hi, 0x1p-9f, 448.0f));
  uint8_t best = exact;
  double best_err = nvfp4_group_error(w, h, s2, exact);
  for (int c = lo; c <= hi && best_err > 0; ++c) {
    if (c == exact) continue;
    const double e = nvfp4_group_error(w, h, s2, static_cast<uint8_t>(c));
    if (e < best_err) {
      best_err = e;
      best = static_cast<uint8_t>(c);
    }
  }
  return best;
}

Nvfp4Weight quantize_nvfp4_search(const float* w, int64_t N, int64_t K, float s2, const float* h,
                                  double* err) {
  Nvfp4Weight out;
  const int64_t G = K / kNvfp4Group;
  out.scale_2 = s2;
  out.packed.assign(static_cast<size_t>(N * K / 2), 0);
  out.scale.resize(static_cast<size_t>(N * G));
  std::vector<double> row_err(static_cast<size_t>(N), 0.0);
  core::parallel_for(static_cast<size_t>(N), 8, [&](size_t b, size_t e) {
    for (size_t n = b; n < e; ++n) {
      const float* row = w + n * static_cast<size_t>(K);
      for (int64_t g = 0; g < G; ++g) {
        const float* blk = row + g * kNvfp4Group;
        const float* hb = h ? h + g * kNvfp4Group : nullptr;
        const uint8_t code = nvfp4_search_code(blk, hb, s2);
        out.scale[n * static_cast<size_t>(G) + static_cast<size_t>(g)] = code;
        pack_group(blk, core::f8e4m3_to_f32(code) * s2, out.packed.data() + n * static_cast<size_t>(K / 2),
                   g);
        if (err) row_err[n] += nvfp4_group_error(blk, hb, s2, code);
      }
    }
  });
  if (err) {
    *err = 0;
    for (double e : row_err) *err += e;
  }
  return out;
}

std::vector<Nvfp4Weight> quantize_nvfp4_search_group(const std::vector<const float*>& w,
                                                     const std::vector<int64_t>& rows, int64_t K, float amax,
                                                     const float* h) {
  std::vector<Nvfp4Weight> best;
  double best_err = 0;
  for (int i = 0; i < 4; ++i) {
    const float s2 = amax / 2688.0f * std::exp2(static_cast<float>(i) / 32.0f);
    std::vector<Nvfp4Weight> cand;
    double total = 0;
    for (size_t m = 0; m < w.size(); ++m) {
      double e = 0;
      cand.push_back(quantize_nvfp4_search(w[m], rows[m], K, s2, h, &e));
      total += e;
    }
    if (best.empty() || total < best_err) {
      best = std::move(cand);
      best_err = total;
    }
  }
  return best;
}

double fp8_tensor_error(const float* w, const uint8_t* q, int64_t N, int64_t K, float s, const float* h) {
  double e = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const size_t i = static_cast<size_t>(n * K + k);
      e += (h ? h[k] : 1.0) * sq(static_cast<double>(w[i]) - core::f8e4m3_to_f32(q[i]) * s);
    }
  return e;
}

Fp8TensorWeight quantize_fp8_tensor_search(const float* w, int64_t N, int64_t K, const float* h) {
  Fp8TensorWeight best = quantize_fp8_tensor_modelopt(w, static_cast<size_t>(N * K));
  const float s0 = best.scale;
  if (!(s0 > 0)) return best;
  const double exact_err = fp8_tensor_error(w, best.w.data(), N, K, s0, h);
  std::vector<double> errs(25, 0.0);
  core::parallel_for(errs.size(), 1, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i)
      errs[i] = fp8_error(w, K, 0, N, 0, K, h, s0 * std::exp2(-static_cast<float>(i) / 64.0f));
  });
  size_t pick = 0;
  for (size_t i = 1; i < errs.size(); ++i)
    if (errs[i] < errs[pick]) pick = i;
  if (!(errs[pick] < exact_err)) return best;
  best.scale = s0 * std::exp2(-static_cast<float>(pick) / 64.0f);
  for (size_t i = 0; i < best.w.size(); ++i)
    best.w[i] = f32_to_e4m3(std::clamp(w[i] / best.scale, -448.0f, 448.0f));
  return best;
}

Fp8BlockWeight quantize_fp8_block_search(const float* w, int64_t N, int64_t K, const float* h) {
  Fp8BlockWeight out = quantize_fp8_block(w, N, K);  // the exact scales: the first candidates
  const int64_t bn = (N + kFp8Block - 1) / kFp8Block, bk = (K + kFp8Block - 1) / kFp8Block;
  core::parallel_for(static_cast<size_t>(bn * bk), 1, [&](size_t b, size_t e) {
    for (size_t blk = b; blk < e; ++blk) {
      const int64_t i = static_cast<int64_t>(blk) / bk, j = static_cast<int64_t>(blk) % bk;
      const int64_t n0 = i * kFp8Block, n1 = std::min(N, n0 + kFp8Block);
      const int64_t k0 = j * kFp8Block, k1 = std::min(K, k0 + kFp8Block);
      const uint16_t exact = out.scale[blk];
      const float s0 = core::bf16_to_f32(exact);
      uint16_t best = exact;
      double best_err = fp8_error(w, K, n0, n1, k0, k1, h, s0);
      const uint16_t lo = core::f32_to_bf16(s0 * 0.75f), hi = core::f32_to_bf16(s0 * 1.06f);
      for (uint32_t c = lo; c <= hi && best_err > 0; ++c) {
        if (c == exact || !(core::bf16_to_f32(static_cast<uint16_t>(c)) > 0)) continue;
        const double err = fp8_error(w, K, n0, n1, k0, k1, h, core::bf16_to_f32(static_cast<uint16_t>(c)));
        if (err < best_err) {
          best_err = err;
          best = static_cast<uint16_t>(c);
        }
      }
      if (best == exact) continue;
      out.scale[blk] = best;
      const float s = core::bf16_to_f32(best);
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t k = k0; k < k1; ++k)
          out.w[static_cast<size_t>(n * K + k)] = f32_to_e4m3(std::clamp(w[n * K + k] / s, -448.0f, 448.0f));
    }
  });
  return out;
}

}  // namespace deltaflow::model::quant
