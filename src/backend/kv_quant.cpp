#include "backend/kv_quant.hpp"

#include <algorithm>
#include <cmath>

#include "core/dtype.hpp"
#include "model/quant/quantize.hpp"

namespace deltaflow::backend {

const char* kv_cache_dtype_name(KvCacheDtype d) {
  switch (d) {
    case KvCacheDtype::kAuto:
      return "auto";
    case KvCacheDtype::kBf16:
      return "bf16";
    case KvCacheDtype::kFp8:
      return "fp8";
  }
  return "?";
}

float round_kv_row(float* x, int64_t n, KvCacheDtype dtype) {
  if (dtype == KvCacheDtype::kAuto) return 1.0f;
  if (dtype == KvCacheDtype::kBf16) {
    for (int64_t i = 0; i < n; ++i) x[i] = core::round_bf16(x[i]);
    return 1.0f;
  }
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  if (!(amax > 0)) {
    std::fill(x, x + n, 0.0f);
    return 1.0f;
  }
  const float scale = amax / 448.0f;
  for (int64_t i = 0; i < n; ++i) x[i] = core::f8e4m3_to_f32(model::quant::f32_to_e4m3(x[i] / scale)) * scale;
  return scale;
}

}  // namespace deltaflow::backend
