// Any bytes must give either an image or an error value: no crash, no sanitizer report, no exception. What a
// decoder accepts must have a buffer of exactly width * height * 3 bytes within the limits. Small limits keep
// each input cheap (the bomb check runs before allocation).
#include <cstddef>
#include <cstdint>

#include "vision/image_decode.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  deltaflow::vision::DecodeLimits limits;
  limits.max_pixels = 1 << 20;
  limits.max_side = 4096;
  auto r = deltaflow::vision::decode_image({data, size}, limits);
  if (r.is_ok()) {
    if (r->width <= 0 || r->height <= 0 || r->width * r->height > limits.max_pixels ||
        r->rgb.size() != static_cast<size_t>(r->width * r->height * 3))
      __builtin_trap();
  }
  return 0;
}
