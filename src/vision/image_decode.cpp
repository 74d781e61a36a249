#include "vision/image_decode.hpp"

#include <cstring>

namespace deltaflow::vision {

const char* image_format_name(ImageFormat f) {
  switch (f) {
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kWebp:
      return "WebP";
    case ImageFormat::kGif:
      return "GIF";
    case ImageFormat::kUnknown:
      break;
  }
  return "unknown";
}

ImageFormat sniff_image_format(std::span<const uint8_t> b) {
  auto starts = [&](const char* magic, size_t n, size_t at = 0) {
    return b.size() >= at + n && std::memcmp(b.data() + at, magic, n) == 0;
  };
  if (starts("\x89PNG\r\n\x1a\n", 8)) return ImageFormat::kPng;
  if (starts("\xff\xd8\xff", 3)) return ImageFormat::kJpeg;
  if (starts("RIFF", 4) && starts("WEBP", 4, 8)) return ImageFormat::kWebp;
  if (starts("GIF87a", 6) || starts("GIF89a", 6)) return ImageFormat::kGif;
  return ImageFormat::kUnknown;
}

core::Status check_image_size(const char* format, int64_t width, int64_t height, const DecodeLimits& limits) {
  const std::string f = format;
  if (width <= 0 || height <= 0)
    return core::Error{f + " image has an empty size (" + std::to_string(width) + "x" +
                       std::to_string(height) + ")"};
  if (width > limits.max_side || height > limits.max_side)
    return core::Error{f + " image is " + std::to_string(width) + "x" + std::to_string(height) +
                       ", larger than the limit of " + std::to_string(limits.max_side) + " pixels a side"};
  if (width * height > limits.max_pixels)
    return core::Error{f + " image is " + std::to_string(width) + "x" + std::to_string(height) + " (" +
                       std::to_string(width * height) + " pixels), more than the limit of " +
                       std::to_string(limits.max_pixels) + " (decompression bomb protection)"};
  return core::Status();
}

core::Expected<Image> decode_image(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  if (bytes.empty()) return core::Error{"image is empty (0 bytes)"};
  if (static_cast<int64_t>(bytes.size()) > limits.max_input_bytes)
    return core::Error{"image is " + std::to_string(bytes.size()) + " bytes, more than the limit of " +
                       std::to_string(limits.max_input_bytes)};
  switch (sniff_image_format(bytes)) {
    case ImageFormat::kPng:
      return decode_png(bytes, limits);
    case ImageFormat::kJpeg:
      return decode_jpeg(bytes, limits);
    case ImageFormat::kWebp:
      return decode_webp(bytes, limits);
    case ImageFormat::kGif:
      return decode_gif(bytes, limits);
    case ImageFormat::kUnknown:
      break;
  }
  return core::Error{"unsupported image format (expected PNG, JPEG, WebP or GIF)"};
}

}  // namespace deltaflow::vision
