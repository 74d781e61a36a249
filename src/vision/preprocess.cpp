#include "vision/preprocess.hpp"

#include <algorithm>
#include <cmath>

#include "vision/resize.hpp"

namespace deltaflow::vision {

core::Expected<ImageSize> smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                       int64_t max_pixels) {
  if (height <= 0 || width <= 0)
    return core::Error{"image has an empty side (" + std::to_string(width) + "x" + std::to_string(height) +
                       ")"};
  const double h = static_cast<double>(height), w = static_cast<double>(width),
               f = static_cast<double>(factor);
  if (std::max(h, w) / std::min(h, w) > 200)
    return core::Error{"image aspect ratio must be at most 200, got " + std::to_string(width) + "x" +
                       std::to_string(height)};
  int64_t hb = static_cast<int64_t>(std::nearbyint(h / f)) * factor;
  int64_t wb = static_cast<int64_t>(std::nearbyint(w / f)) * factor;
  if (hb * wb > max_pixels) {
    const double beta = std::sqrt(h * w / static_cast<double>(max_pixels));
    hb = std::max(factor, static_cast<int64_t>(std::floor(h / beta / f)) * factor);
    wb = std::max(factor, static_cast<int64_t>(std::floor(w / beta / f)) * factor);
  } else if (hb * wb < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / (h * w));
    hb = static_cast<int64_t>(std::ceil(h * beta / f)) * factor;
    wb = static_cast<int64_t>(std::ceil(w * beta / f)) * factor;
  }
  return ImageSize{hb, wb};
}

int64_t image_token_count(const PixelValues& pv, int64_t merge_size) {
  return pv.grid_t * pv.grid_h * pv.grid_w / (merge_size * merge_size);
}

core::Expected<PixelValues> preprocess_image(const Image& image, const ProcessorConfig& c, Image* resized) {
  if (image.rgb.size() != static_cast<size_t>(image.width * image.height * 3) || image.width <= 0 ||
      image.height <= 0)
    return core::Error{"image buffer does not match its size"};
  Image img;
  const Image* src = &image;
  if (c.do_resize) {
    DF_ASSIGN(const ImageSize s,
              smart_resize(image.height, image.width, c.factor(), c.min_pixels, c.max_pixels));
    if (s.height != image.height || s.width != image.width) {
      img = resize_bicubic_antialias(image, s.width, s.height);
      src = &img;
    }
  }
  if (resized) *resized = *src;
  const int64_t P = c.patch_size, M = c.merge_size, T = c.temporal_patch_size, H = src->height,
                W = src->width;
  if (H % (P * M) != 0 || W % (P * M) != 0)
    return core::Error{"image size " + std::to_string(W) + "x" + std::to_string(H) +
                       " is not a multiple of patch_size * merge_size (" + std::to_string(P * M) + ")"};
  // Per channel: value -> fp32, exactly as the torchvision backend's fused rescale_and_normalize.
  float lut[3][256];
  for (int ch = 0; ch < 3; ++ch) {
    const float inv = static_cast<float>(1.0 / c.rescale_factor);
    const float mean = c.do_rescale && c.do_normalize ? c.image_mean[ch] * inv : c.image_mean[ch];
    const float std = c.do_rescale && c.do_normalize ? c.image_std[ch] * inv : c.image_std[ch];
    for (int v = 0; v < 256; ++v) {
      const float x = static_cast<float>(v);
      lut[ch][v] = c.do_normalize ? (x - mean) / std
                   : c.do_rescale ? x * static_cast<float>(c.rescale_factor)
                                  : x;
    }
  }
  PixelValues pv;
  pv.grid_h = H / P;
  pv.grid_w = W / P;
  pv.grid_t = 1;
  pv.rows = pv.grid_h * pv.grid_w;
  pv.patch_dim = 3 * T * P * P;
  pv.data.resize(static_cast<size_t>(pv.rows * pv.patch_dim));
  float* out = pv.data.data();
  // (grid_h/M, grid_w/M, M, M) windows, then [C, T, P, P] within a row (image_processing_qwen2_vl.py
  // patchify).
  for (int64_t bh = 0; bh < pv.grid_h / M; ++bh)
    for (int64_t bw = 0; bw < pv.grid_w / M; ++bw)
      for (int64_t mh = 0; mh < M; ++mh)
        for (int64_t mw = 0; mw < M; ++mw) {
          const int64_t y0 = (bh * M + mh) * P, x0 = (bw * M + mw) * P;
          for (int ch = 0; ch < 3; ++ch)
            for (int64_t t = 0; t < T; ++t)
              for (int64_t py = 0; py < P; ++py) {
                const uint8_t* row = src->rgb.data() + ((y0 + py) * W + x0) * 3 + ch;
                for (int64_t px = 0; px < P; ++px) *out++ = lut[ch][row[3 * px]];
              }
        }
  return pv;
}

}  // namespace deltaflow::vision
