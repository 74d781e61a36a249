// `deltaflow quantize`: a float checkpoint -> the published layout of a quantized one.
//   nvfp4:     ModelOpt W4A16_NVFP4 (hf_quant_config.json + quantization_config quant_method modelopt); the
//              weight tensors bit-identical to ModelOpt 0.47's export for the same BF16 input, fused groups
//              (q/k/v, in_proj_qkv/in_proj_z, gate/up) sharing one amax as its export does.
//   fp8-block: Qwen's FP8 layout (quant_method fp8, 128x128 weight_scale_inv in BF16).
//   nvfp4-mixed: ModelOpt MIXED_PRECISION as nvidia's Qwen3.6 NVFP4 checkpoints: attention projections
//   (q/k/v/o,
//              in_proj_qkv/z, out_proj) FP8 per tensor with static input scales from calibration (W8A8), the
//              MLP and experts W4A16 NVFP4, and an untied lm_head W4A16 NVFP4; weights bit-identical to
//              ModelOpt 0.47's export.
// All keep ModelOpt's default exclusions in bf16: embeddings, lm_head (but nvfp4-mixed's untied one),
// in_proj_a/b, the router and the shared-expert gate, norms, conv taps, mtp.* and the vision tower.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "io/safetensors.hpp"
#include "model/weights.hpp"

namespace deltaflow::model::quant {

struct QuantizedCheckpoint {
  std::vector<io::TensorToWrite> tensors;
  std::string quantization_config;  // JSON object for config.json
  std::string hf_quant_config;      // JSON text of hf_quant_config.json, empty when the format has none
};

// The largest |input| each linear module saw on calibration data, by module name (checkpoint name without
// ".weight"); nvfp4-mixed's FP8 input scales are amax / 448.
using InputAmax = std::map<std::string, float>;

// The Gram matrix X^T X of a linear module's calibration inputs (cols x cols, row-major, summed over the
// tokens), by module name: what --method gptq minimises the output error over (its diagonal weights the
// block-scale search).
struct InputGram {
  int64_t cols = 0;
  int64_t tokens = 0;
  std::vector<double> gram;
};
using InputStats = std::map<std::string, InputGram>;

// How the scales and codes are chosen (the layout is the format's either way):
//   exact: ModelOpt 0.47's recipe (and Qwen's FP8 block one), bit for bit;
//   mse:   scale search (search.hpp) on the weights alone (weighting the error by the calibration inputs'
//          mean squares measured worse on the house model: docs/quantization.md);
//   gptq:  GPTQ over `stats` (gptq.hpp) with searched scales; a module without stats falls back to mse.
struct QuantMethod {
  std::string name = "exact";
  const InputStats* stats = nullptr;
};
bool is_quant_method(const std::string& name);

// `progress(done, total)` is called after each quantized matrix. `input_amax`: needed by nvfp4-mixed.
core::Expected<QuantizedCheckpoint> quantize_checkpoint(const TextConfig& c, const ModelWeights& w,
                                                        const io::Checkpoint& ck, const std::string& format,
                                                        const std::function<void(size_t, size_t)>& progress,
                                                        const InputAmax* input_amax = nullptr,
                                                        const QuantMethod& method = {});

// Reads the float checkpoint MODEL_DIR and writes OUT_DIR: model.safetensors, config.json with its
// quantization_config, hf_quant_config.json (nvfp4), and every other file of MODEL_DIR (tokenizer, chat
// template, generation config) copied. OUT_DIR must not exist or be empty.
core::Status write_quantized_checkpoint(const std::string& model_dir, const std::string& out_dir,
                                        const std::string& format,
                                        const std::function<void(size_t, size_t)>& progress,
                                        const InputAmax* input_amax = nullptr,
                                        const QuantMethod& method = {});

// Whether the format needs calibration (input_amax).
bool needs_calibration(const std::string& format);

}  // namespace deltaflow::model::quant
