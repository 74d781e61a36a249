// Limits on the images a request may carry (`deltaflow serve` flags; server/image_inputs.hpp applies them).
#pragma once

#include <cstdint>
#include <string>

namespace deltaflow::server {

struct ImageOptions {
  std::string allowed_local_media_path;  // --allowed-local-media-path: image files under it; empty: none
  int64_t max_image_pixels = 0;   // --max-image-pixels: decoded width * height at most; 0: the decoder's
  int64_t limit_per_prompt = 16;  // --limit-mm-per-prompt: images per request at most
};

}  // namespace deltaflow::server
