#include "text/vision_placeholders.hpp"

#include <string>

namespace deltaflow::text {

core::Expected<std::vector<int32_t>> expand_vision_placeholders(std::span<const int32_t> ids,
                                                                int32_t placeholder_id,
                                                                std::span<const int64_t> tokens_per_item) {
  size_t found = 0;
  int64_t extra = 0;
  for (int32_t id : ids)
    if (id == placeholder_id) {
      if (found < tokens_per_item.size()) {
        if (tokens_per_item[found] < 1)
          return core::Error{"image " + std::to_string(found + 1) + " has no tokens"};
        extra += tokens_per_item[found] - 1;
      }
      ++found;
    }
  if (found != tokens_per_item.size())
    return core::Error{"the prompt has " + std::to_string(found) + " image placeholders but " +
                       std::to_string(tokens_per_item.size()) + " images were given"};
  std::vector<int32_t> out;
  out.reserve(ids.size() + static_cast<size_t>(extra));
  size_t k = 0;
  for (int32_t id : ids) {
    if (id != placeholder_id) {
      out.push_back(id);
      continue;
    }
    out.insert(out.end(), static_cast<size_t>(tokens_per_item[k++]), placeholder_id);
  }
  return out;
}

}  // namespace deltaflow::text
