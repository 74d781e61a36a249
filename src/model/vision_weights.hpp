// Typed views of the vision tower's tensors (`model.visual.*`, transformers 5.17 Qwen3_5VisionModel), bound
// apart from the text model's table: the text binder lists them by name only (ModelWeights::visual_tensors).
#pragma once

#include <string>
#include <vector>

#include "io/safetensors.hpp"
#include "model/vision_config.hpp"
#include "model/weights.hpp"

namespace deltaflow::model {

struct VisionBlockWeights {
  Mat norm1_w, norm1_b;  // [1, D] LayerNorm (eps 1e-6)
  Mat qkv_w, qkv_b;      // [3D, D], [1, 3D]: rows [q (D) | k (D) | v (D)], each head-major
  Mat proj_w, proj_b;    // [D, D], [1, D]
  Mat norm2_w, norm2_b;  // [1, D]
  Mat fc1_w, fc1_b;      // [I, D], [1, I]   mlp.linear_fc1
  Mat fc2_w, fc2_b;      // [D, I], [1, D]   mlp.linear_fc2
};

struct VisionWeights {
  Mat patch_embed_w;  // [D, C*T*P*P]: Conv3d [D, C, T, P, P] flattened in the pixel-value row order
  Mat patch_embed_b;  // [1, D]
  Mat pos_embed;      // [num_position_embeddings, D]: a side x side grid, row-major
  std::vector<VisionBlockWeights> blocks;
  Mat merger_norm_w, merger_norm_b;  // [1, D] LayerNorm per patch, before the 2x2 merge
  Mat merger_fc1_w, merger_fc1_b;    // [4D, 4D], [1, 4D]
  Mat merger_fc2_w, merger_fc2_b;    // [out_hidden, 4D], [1, out_hidden]
  std::string prefix;                // "model.visual." or "visual."
};

// Binds every vision tensor the config needs, with shape and dtype checks. A checkpoint without a vision
// tower is an error naming the missing tensor; a tensor under the prefix that the tower does not use is an
// error too (it would mean a different architecture).
core::Expected<VisionWeights> bind_vision_weights(const VisionConfig& config,
                                                  const io::Checkpoint& checkpoint);

}  // namespace deltaflow::model
