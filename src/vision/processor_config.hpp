// preprocessor_config.json of a Qwen3.5 checkpoint (Qwen2VLImageProcessorFast in transformers 5.17,
// models/qwen2_vl/image_processing_qwen2_vl.py), field names as the HF keys.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "core/status.hpp"

namespace deltaflow::vision {

struct ProcessorConfig {
  int64_t patch_size = 16;
  int64_t temporal_patch_size = 2;
  int64_t merge_size = 2;
  int64_t min_pixels = 56 * 56;         // size.shortest_edge (or the legacy min_pixels key)
  int64_t max_pixels = 28 * 28 * 1280;  // size.longest_edge (or the legacy max_pixels key)
  std::array<float, 3> image_mean = {0.48145466f, 0.4578275f, 0.40821073f};  // OPENAI_CLIP_MEAN
  std::array<float, 3> image_std = {0.26862954f, 0.26130258f, 0.27577711f};  // OPENAI_CLIP_STD
  double rescale_factor = 1.0 / 255.0;
  bool do_resize = true, do_rescale = true, do_normalize = true, do_convert_rgb = true;

  int64_t factor() const { return patch_size * merge_size; }
};

// Parses the JSON text; `where` names the file in errors. Only bicubic resampling (resample 3) is supported.
core::Expected<ProcessorConfig> parse_processor_config(const std::string& json_text,
                                                       const std::string& where);
// Reads DIR/preprocessor_config.json; a missing file is an error naming it.
core::Expected<ProcessorConfig> load_processor_config(const std::string& model_dir);

}  // namespace deltaflow::vision
