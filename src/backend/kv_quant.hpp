// The KV cache's storage rounding (KvCacheDtype, backend.hpp): what a key or value row of one KV head reads
// back as after it was written. The CPU reference applies it as it writes; the CUDA kernels store the E4M3
// codes and scales and must read back the same numbers.
#pragma once

#include <cstdint>

#include "backend/backend.hpp"

namespace deltaflow::backend {

// Rounds x[0..n) in place as the cache stores one (position, KV head) row; returns the row's scale (1 for
// kAuto and kBf16).
float round_kv_row(float* x, int64_t n, KvCacheDtype dtype);

}  // namespace deltaflow::backend
