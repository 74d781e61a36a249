// Image -> pixel values, as Qwen2VLImageProcessorFast (transformers 5.17, torchvision backend) computes them:
// smart_resize to multiples of patch * merge within [min_pixels, max_pixels], bicubic antialiased resize in
// uint8, rescale + normalise fused to (v - mean/r) / (std/r) in fp32, then patchify: rows in 2x2 merge-window
// order, each row [C, T, P, P] with the still image repeated over the T temporal copies.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.hpp"
#include "vision/image.hpp"
#include "vision/processor_config.hpp"

namespace deltaflow::vision {

struct ImageSize {
  int64_t height = 0, width = 0;
};

// smart_resize(height, width, factor, min_pixels, max_pixels) of image_processing_qwen2_vl.py (Python's
// round() is round-half-even). An aspect ratio above 200 or an empty side is an error.
core::Expected<ImageSize> smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                       int64_t max_pixels);

struct PixelValues {
  std::vector<float> data;                     // [rows, patch_dim]
  int64_t rows = 0;                            // grid_t * grid_h * grid_w
  int64_t patch_dim = 0;                       // 3 * temporal_patch_size * patch_size^2
  int64_t grid_t = 1, grid_h = 0, grid_w = 0;  // image_grid_thw, in patches
};

// Rows of the encoder's output for this grid: the `<|image_pad|>` count of the image.
int64_t image_token_count(const PixelValues& pv, int64_t merge_size);

// The whole pipeline for one image. `resized`, when given, receives the uint8 image after resize.
core::Expected<PixelValues> preprocess_image(const Image& image, const ProcessorConfig& config,
                                             Image* resized = nullptr);

}  // namespace deltaflow::vision
