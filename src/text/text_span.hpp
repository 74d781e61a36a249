// A byte range [begin, end) of a text.
#pragma once

#include <cstddef>

namespace deltaflow::text {

struct TextSpan {
  size_t begin = 0, end = 0;
  bool operator==(const TextSpan&) const = default;
};

}  // namespace deltaflow::text
