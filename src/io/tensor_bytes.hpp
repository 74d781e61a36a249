// Byte size of a tensor from its shape, with the overflow checks that a hostile header needs.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "core/dtype.hpp"

namespace deltaflow::io {

// numel x dtype size; nullopt if a dimension is negative or the product overflows u64 (checked left to
// right, as the reference implementation does, so [huge, huge, 0] is an overflow too).
inline std::optional<uint64_t> tensor_nbytes(const std::vector<int64_t>& shape, core::DType dtype) {
  uint64_t n = core::dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    const auto ud = static_cast<uint64_t>(d);
    if (ud != 0 && n > std::numeric_limits<uint64_t>::max() / ud) return std::nullopt;
    n *= ud;
  }
  return n;
}

}  // namespace deltaflow::io
