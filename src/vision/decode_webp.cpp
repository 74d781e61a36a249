// WebP through libwebp: a still image decodes straight to RGB; an animated one gives its first frame through
// the animation decoder (a canvas, transparent where the frame does not reach), with alpha dropped.
#include <webp/decode.h>
#include <webp/demux.h>

#include <cstring>

#include "vision/image_decode.hpp"

namespace deltaflow::vision {

core::Expected<Image> decode_webp(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  WebPBitstreamFeatures f;
  const VP8StatusCode st = WebPGetFeatures(bytes.data(), bytes.size(), &f);
  if (st != VP8_STATUS_OK)
    return core::Error{st == VP8_STATUS_NOT_ENOUGH_DATA ? "invalid WebP: truncated data"
                                                        : "invalid WebP: bad header (status " +
                                                              std::to_string(static_cast<int>(st)) + ")"};
  DF_TRY(check_image_size("WebP", f.width, f.height, limits));
  Image img;
  img.width = f.width;
  img.height = f.height;
  img.rgb.resize(static_cast<size_t>(img.width * img.height * 3));
  if (!f.has_animation) {
    if (!WebPDecodeRGBInto(bytes.data(), bytes.size(), img.rgb.data(), img.rgb.size(),
                           static_cast<int>(img.width * 3)))
      return core::Error{"invalid WebP: the image data does not decode"};
    return img;
  }
  WebPData data{bytes.data(), bytes.size()};
  WebPAnimDecoderOptions opts;
  if (!WebPAnimDecoderOptionsInit(&opts)) return core::Error{"WebP: decoder version mismatch"};
  opts.color_mode = MODE_RGBA;
  opts.use_threads = 0;
  WebPAnimDecoder* dec = WebPAnimDecoderNew(&data, &opts);
  if (!dec) return core::Error{"invalid WebP: the animation does not parse"};
  struct Cleanup {
    WebPAnimDecoder* d;
    ~Cleanup() { WebPAnimDecoderDelete(d); }
  } cleanup{dec};
  WebPAnimInfo info;
  if (!WebPAnimDecoderGetInfo(dec, &info) || static_cast<int64_t>(info.canvas_width) != img.width ||
      static_cast<int64_t>(info.canvas_height) != img.height)
    return core::Error{"invalid WebP: inconsistent canvas size"};
  uint8_t* rgba = nullptr;
  int timestamp = 0;
  if (!WebPAnimDecoderHasMoreFrames(dec) || !WebPAnimDecoderGetNext(dec, &rgba, &timestamp) || !rgba)
    return core::Error{"invalid WebP: the first frame does not decode"};
  for (int64_t i = 0; i < img.width * img.height; ++i) std::memcpy(img.rgb.data() + 3 * i, rgba + 4 * i, 3);
  return img;
}

}  // namespace deltaflow::vision
