// The one random draw of token sampling, on the host and on the GPU: Philox4x32-10 keyed by the request's
// seed, counting the index of the token being drawn in its sequence. A draw depends on (seed, step) alone, so
// a sequence draws the same tokens alone or in a batch, with or without logprobs, and after a preemption that
// recomputed it.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DF_HOST_DEVICE __host__ __device__
#else
#define DF_HOST_DEVICE
#endif

namespace deltaflow::core {

DF_HOST_DEVICE inline uint32_t philox_first_word(uint64_t seed, uint64_t step) {
  uint32_t c0 = static_cast<uint32_t>(step), c1 = static_cast<uint32_t>(step >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c0;
}

// The draw's uniform in [0, 1): the first word's top 24 bits.
DF_HOST_DEVICE inline float philox_uniform(uint64_t seed, uint64_t step) {
  return static_cast<float>(philox_first_word(seed, step) >> 8) * (1.0f / 16777216.0f);
}

}  // namespace deltaflow::core
