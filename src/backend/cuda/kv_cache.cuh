// Device-side addressing of the KV cache (KvCache, attention.cuh): contiguous per slot, or paged through a
// block table. Included by the kernels only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/mma.cuh"

namespace deltaflow::backend::cuda {

// Element offset of position `pos` of kv head `kvh` for table row (slot) `row`; the next positions of the
// same page follow at hd elements each.
__device__ __forceinline__ int64_t kv_offset(const KvCache& c, int row, int kvh, int pos, int hd) {
  if (c.block_table) {
    const int page = c.block_table[static_cast<int64_t>(row) * c.table_stride + (pos >> c.page_shift)];
    const int in_page = pos & ((1 << c.page_shift) - 1);
    return static_cast<int64_t>(page) * c.slot_stride +
           ((static_cast<int64_t>(kvh) << c.page_shift) + in_page) * hd;
  }
  return static_cast<int64_t>(row) * c.slot_stride + (static_cast<int64_t>(kvh) * c.max_ctx + pos) * hd;
}

// An element of an fp8 cache: an E4M3 code (its row's scale lives in KvCache::k_scale / v_scale).
struct Fp8E4m3 {
  uint8_t code;
};

// The E4M3 code of x / scale, rounded to nearest even and saturated to +-448, as backend/kv_quant.cpp.
__device__ __forceinline__ uint8_t fp8_code(float x, float scale) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3));
}

// Two E4M3 codes (lo in the low byte) as floats, exactly.
__device__ __forceinline__ float2 fp8x2_to_float2(uint16_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3);
  __half2 hh;
  memcpy(&hh, &h, 4);
  return __half22float2(hh);
}

// Two E4M3 codes as bf16x2, exactly (every E4M3 value is a bf16 value).
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint16_t two) {
  const float2 f = fp8x2_to_float2(two);
  return pack_bf16(f.x, f.y);
}

// 16 E4M3 codes as floats (code values, unscaled).
__device__ __forceinline__ void unpack16(const uint4& v, float (&out)[16], Fp8E4m3) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float2 f = fp8x2_to_float2(static_cast<uint16_t>(w[i / 2] >> (16 * (i & 1))));
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

}  // namespace deltaflow::backend::cuda
