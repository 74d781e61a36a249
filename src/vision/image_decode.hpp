// Image decoding from bytes: PNG (libpng), JPEG (libjpeg-turbo, as Pillow uses it), WebP (libwebp) and GIF
// (giflib, first frame), each converted to RGB exactly as Pillow's `open(...).convert("RGB")`:
//   - alpha is dropped (not composited), palette entries are looked up, grey is replicated;
//   - 16-bit PNG channels keep their high byte, except 16-bit grey without alpha, which Pillow reads as I;16
//     and clips to 255 on conversion;
//   - CMYK JPEG (Adobe, inverted) converts with Pillow's cmyk2rgb;
//   - GIF: the first frame on the logical screen, the rest filled with the transparent index (or 0).
// EXIF orientation is not applied (transformers' processors do not apply it to an already opened image).
// Corrupt, truncated, oversized or unknown input is an error value naming the format and the reason.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/status.hpp"
#include "vision/image.hpp"

namespace deltaflow::vision {

enum class ImageFormat { kUnknown, kPng, kJpeg, kWebp, kGif };

const char* image_format_name(ImageFormat f);
// From the magic bytes.
ImageFormat sniff_image_format(std::span<const uint8_t> bytes);

core::Expected<Image> decode_image(std::span<const uint8_t> bytes, const DecodeLimits& limits = {});

// Per format (the bytes must be of that format; decode_image dispatches on the magic bytes).
core::Expected<Image> decode_png(std::span<const uint8_t> bytes, const DecodeLimits& limits);
core::Expected<Image> decode_jpeg(std::span<const uint8_t> bytes, const DecodeLimits& limits);
core::Expected<Image> decode_webp(std::span<const uint8_t> bytes, const DecodeLimits& limits);
core::Expected<Image> decode_gif(std::span<const uint8_t> bytes, const DecodeLimits& limits);

// The decompression-bomb check shared by the decoders: called with the header's size, before allocation.
core::Status check_image_size(const char* format, int64_t width, int64_t height, const DecodeLimits& limits);

}  // namespace deltaflow::vision
