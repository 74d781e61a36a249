// A decoded image: 8-bit RGB, row-major, 3 bytes a pixel, as Pillow's `Image.convert("RGB")` leaves it (the
// form transformers' image processors start from).
#pragma once

#include <cstdint>
#include <vector>

namespace deltaflow::vision {

struct Image {
  int64_t width = 0, height = 0;
  std::vector<uint8_t> rgb;  // [height, width, 3]
  int64_t pixels() const { return width * height; }
};

// Limits applied while decoding untrusted bytes, before any pixel buffer is allocated.
struct DecodeLimits {
  // Decoded width * height. Pillow's default MAX_IMAGE_PIXELS is 89,478,485 (a warning; twice that is an
  // error); we refuse above it outright: such an image is resized far down anyway and costs ~270 MB to
  // decode.
  int64_t max_pixels = 89'478'485;
  int64_t max_side = 65'535;                    // width and height each
  int64_t max_input_bytes = int64_t{64} << 20;  // encoded size
};

}  // namespace deltaflow::vision
