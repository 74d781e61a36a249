// The vision tower's configuration: `vision_config` of a Qwen3_5ForConditionalGeneration config.json plus the
// top-level vision token ids. Field names are the HF keys (transformers 5.17 configuration_qwen3_5.py,
// Qwen3_5VisionConfig and Qwen3_5Config).
#pragma once

#include <cstdint>
#include <string>

#include "core/status.hpp"

namespace deltaflow::model {

struct VisionConfig {
  int64_t depth = 27;
  int64_t hidden_size = 1152;
  std::string hidden_act = "gelu_pytorch_tanh";
  int64_t intermediate_size = 4304;
  int64_t num_heads = 16;
  int64_t in_channels = 3;
  int64_t patch_size = 16;
  int64_t spatial_merge_size = 2;
  int64_t temporal_patch_size = 2;
  int64_t out_hidden_size = 3584;
  int64_t num_position_embeddings = 2304;  // a square grid: 48 x 48
  double rope_theta = 10000.0;             // rope_parameters.rope_theta ("axial" rope)

  // Top-level token ids (Qwen3_5Config defaults).
  int64_t image_token_id = 248056;
  int64_t video_token_id = 248057;
  int64_t vision_start_token_id = 248053;
  int64_t vision_end_token_id = 248054;

  int64_t head_dim() const { return hidden_size / num_heads; }
  // in_channels * temporal_patch_size * patch_size^2: the length of one row of pixel values.
  int64_t patch_dim() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  int64_t merge_unit() const { return spatial_merge_size * spatial_merge_size; }
  int64_t num_grid_per_side() const;  // int(sqrt(num_position_embeddings))
};

// Parses config.json text. A config without `vision_config` is an error that says so (text-only model).
core::Expected<VisionConfig> parse_vision_config(const std::string& json_text, const std::string& where);
// Reads DIR/config.json.
core::Expected<VisionConfig> load_vision_config(const std::string& model_dir);

}  // namespace deltaflow::model
