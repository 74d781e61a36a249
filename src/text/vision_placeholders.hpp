// The chat template writes one `<|image_pad|>` per image (`<|vision_start|><|image_pad|><|vision_end|>`); the
// processor (transformers 5.17 Qwen3VLProcessor.replace_image_token) repeats it to the image's token count,
// grid_t * grid_h * grid_w / merge^2, before the model sees the prompt.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.hpp"

namespace deltaflow::text {

// Replaces the k-th `placeholder_id` token of `ids` by tokens_per_item[k] copies of it. The number of
// placeholders must equal the number of items (an error says both counts); a count below 1 is an error.
core::Expected<std::vector<int32_t>> expand_vision_placeholders(std::span<const int32_t> ids,
                                                                int32_t placeholder_id,
                                                                std::span<const int64_t> tokens_per_item);

}  // namespace deltaflow::text
