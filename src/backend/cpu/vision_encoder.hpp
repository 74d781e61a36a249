// The vision encoder on the CPU reference: transformers 5.17 Qwen3_5VisionModel.forward, fp32 activations
// over the checkpoint's bf16/f16/f32 weights.
//
//   x = patch_embed(pixels)                         Conv3d [D, C, T, P, P] stride = kernel, i.e. a linear +
//   bias x += bilinear(pos_embed, align_corners=True)    the side x side table resampled to each image's grid
//   for each block: x += proj(attn(LN1(x)));  x += fc2(gelu_tanh(fc1(LN2(x))))
//       attention: bidirectional within each frame, scale head_dim^-0.5, 2-D rotary (rotate-half over the
//       whole head: the first half's frequencies are [h * f, w * f], f = theta^(-4j/head_dim), j <
//       head_dim/4)
//   out = fc2(gelu_erf(fc1(view(LN(x), [-1, 4D]))))  the 2x2 merger: one row per <|image_pad|>
// Qwen3.5 has no deepstack: the merger's rows are all the language model receives.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.hpp"
#include "model/mrope.hpp"
#include "model/vision_config.hpp"
#include "model/vision_weights.hpp"

namespace deltaflow::backend::cpu {

// Intermediate values for tests against the reference (each [patches, D], in pixel-row order).
struct VisionTrace {
  std::vector<float> embeddings;                  // patch embedding + interpolated positions
  std::vector<std::vector<float>> block_outputs;  // after each block
};

// pixel_values: [sum of t*h*w over grids, patch_dim] (the rows of the images one after another, as
// vision::preprocess_image writes them); grids: each image's (t, h, w) in patches. Returns the merged rows,
// [sum of t*h*w / merge^2, out_hidden_size], image after image.
core::Expected<std::vector<float>> encode_images(const model::VisionConfig& config,
                                                 const model::VisionWeights& weights,
                                                 std::span<const float> pixel_values,
                                                 std::span<const model::VisionGrid> grids,
                                                 VisionTrace* trace = nullptr);

}  // namespace deltaflow::backend::cpu
