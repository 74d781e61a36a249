// Standard base64 (RFC 4648, with or without padding; whitespace skipped) for image data in requests.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

namespace deltaflow::server {

// The decoded bytes, or nothing when the text is not base64.
std::optional<std::vector<uint8_t>> base64_decode(std::string_view text);

}  // namespace deltaflow::server
