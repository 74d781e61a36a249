// `deltaflow make-tiny`: complete HF-format checkpoints with random weights in the real architecture, small
// enough for CI. The same preset and seed give the same bytes on every machine (own PRNG, own normal
// sampler).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.hpp"

namespace deltaflow::model {

// Preset names: dense, moe, tied, multimodal, next, vl (Qwen3_5ForConditionalGeneration with a vision tower
// and preprocessor_config.json): the presets with transformers goldens, which tests iterate over.
const std::vector<std::string>& tiny_presets();
// Those and "long": 2 layers (Gated DeltaNet, then full attention with one 16-dim head) and 65,536
// positions, for long-context tests on the CPU; it has no goldens of its own.
const std::vector<std::string>& all_tiny_presets();

// Writes config.json, model.safetensors (or shards + index), generation_config.json and tokenizer files to
// out_dir.
core::Status write_tiny_checkpoint(const std::string& preset, uint64_t seed, const std::string& out_dir);

}  // namespace deltaflow::model
