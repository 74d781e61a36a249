// Device-side addressing of the KV cache (KvCache, attention.cuh): contiguous per slot, or paged through a
// block table. Included by the kernels only.
#pragma once

#include <cstdint>

#include "backend/cuda/attention.cuh"

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

}  // namespace deltaflow::backend::cuda
