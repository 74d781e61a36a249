// Small scanning helpers shared by the streaming parsers of model output (reasoning, tool calls).
#pragma once

#include <algorithm>
#include <string_view>

namespace deltaflow::text {

inline bool is_ascii_space(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

// Length of the longest proper prefix of `tag` that `s` ends with: text a stream must hold back because the
// next delta could complete the tag.
inline size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  for (size_t k = std::min(s.size(), tag.size() - 1); k > 0; --k)
    if (s.substr(s.size() - k) == tag.substr(0, k)) return k;
  return 0;
}

}  // namespace deltaflow::text
