#include "model/quant/quantize.hpp"

#include <algorithm>
#include <cmath>

#include "core/dtype.hpp"
#include "model/quant/format.hpp"

namespace deltaflow::model::quant {

uint8_t f32_to_e4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::min(std::fabs(static_cast<double>(x)), 448.0);
  if (std::isnan(x)) return 0x7F;
  if (a < 0x1p-6) {  // subnormal: multiples of 2^-9 (a result of 8 is the smallest normal, code 0x08)
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::nearbyint(a * 512.0)));
  }
  int e = 0;
  const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1;                     // a = (2m) * 2^exp, 2m in [1, 2)
  int mant = static_cast<int>(std::nearbyint((2.0 * m - 1.0) * 8.0));
  if (mant == 8) {
    mant = 0;
    ++exp;
  }
  return static_cast<uint8_t>(sign | ((exp + 7) << 3) | mant);
}

void fake_quant_fp8_static(const float* x, size_t n, float input_scale, float* out) {
  if (!(input_scale > 0)) {
    if (out != x) std::copy_n(x, n, out);
    return;
  }
  // ModelOpt's order of fp32 operations: amax = input_scale * 448, scale = 448 / amax, x * scale, then the
  // code times 1 / scale.
  const float scale = 448.0f / (input_scale * 448.0f), inv = 1.0f / scale;
  for (size_t i = 0; i < n; ++i) {
    const float q = std::clamp(x[i] * scale, -448.0f, 448.0f);
    out[i] = core::f8e4m3_to_f32(f32_to_e4m3(q)) * inv;
  }
}

uint8_t e2m1_code(float x) {
  // torch.searchsorted (left) counts the bounds below |x|; the odd bounds .75, 1.75, 3.5 count when equal
  // too.
  const uint8_t sign = x < 0 ? 8 : 0;
  const float a = std::fabs(x);
  const int ord =
      (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return static_cast<uint8_t>(sign + ord);
}

float abs_max(const float* w, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(w[i]));
  return m;
}

uint8_t nvfp4_block_code(const float* blk, float s2) {
  float sb = abs_max(blk, kNvfp4Group) / (6.0f * s2);
  if (sb == 0.0f) sb = 1.0f;
  return f32_to_e4m3(std::clamp(sb, 0x1p-9f, 448.0f));
}

Nvfp4Weight quantize_nvfp4_modelopt(const float* w, int64_t N, int64_t K, float amax) {
  Nvfp4Weight out;
  const int64_t G = K / kNvfp4Group;
  out.scale_2 = amax / 2688.0f;  // E2M1_MAX * E4M3_MAX
  out.packed.assign(static_cast<size_t>(N * K / 2), 0);
  out.scale.resize(static_cast<size_t>(N * G));
  for (int64_t n = 0; n < N; ++n) {
    const float* row = w + n * K;
    for (int64_t g = 0; g < G; ++g) {
      const float* blk = row + g * kNvfp4Group;
      const uint8_t code = nvfp4_block_code(blk, out.scale_2);
      out.scale[static_cast<size_t>(n * G + g)] = code;
      const float denom = core::f8e4m3_to_f32(code) * out.scale_2;
      for (int64_t j = 0; j < kNvfp4Group; ++j) {
        const int64_t k = g * kNvfp4Group + j;
        const uint8_t q = e2m1_code(blk[j] / denom);
        out.packed[static_cast<size_t>((n * K + k) / 2)] |= static_cast<uint8_t>(k & 1 ? q << 4 : q);
      }
    }
  }
  return out;
}

Fp8TensorWeight quantize_fp8_tensor_modelopt(const float* w, size_t n) {
  Fp8TensorWeight out;
  out.scale = abs_max(w, n) / 448.0f;
  out.w.resize(n);
  for (size_t i = 0; i < n; ++i)
    out.w[i] = f32_to_e4m3(out.scale > 0 ? core::round_bf16(w[i] / out.scale) : 0.0f);
  return out;
}

Fp8BlockWeight quantize_fp8_block(const float* w, int64_t N, int64_t K) {
  Fp8BlockWeight out;
  const int64_t bn = (N + kFp8Block - 1) / kFp8Block, bk = (K + kFp8Block - 1) / kFp8Block;
  out.w.resize(static_cast<size_t>(N * K));
  out.scale.resize(static_cast<size_t>(bn * bk));
  for (int64_t i = 0; i < bn; ++i)
    for (int64_t j = 0; j < bk; ++j) {
      const int64_t n1 = std::min(N, (i + 1) * kFp8Block), k1 = std::min(K, (j + 1) * kFp8Block);
      float amax = 0;
      for (int64_t n = i * kFp8Block; n < n1; ++n)
        for (int64_t k = j * kFp8Block; k < k1; ++k) amax = std::max(amax, std::fabs(w[n * K + k]));
      const uint16_t s16 = core::f32_to_bf16(std::max(amax / 448.0f, 1e-12f));
      out.scale[static_cast<size_t>(i * bk + j)] = s16;
      const float s = core::bf16_to_f32(s16);
      for (int64_t n = i * kFp8Block; n < n1; ++n)
        for (int64_t k = j * kFp8Block; k < k1; ++k)
          out.w[static_cast<size_t>(n * K + k)] = f32_to_e4m3(std::clamp(w[n * K + k] / s, -448.0f, 448.0f));
    }
  return out;
}

}  // namespace deltaflow::model::quant
