// The text model's configuration, read from a Hugging Face config.json. Field names are the HF keys so that
// loading is a straight copy; see qwen35-architecture.md §1 and transformers' configuration_qwen3_5*.py.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "model/quant/config.hpp"

namespace deltaflow::model {

enum class Architecture { kQwen35Dense, kQwen35Moe, kQwen3Next };
enum class LayerType { kLinearAttention, kFullAttention };

const char* architecture_name(Architecture a);

// rope_parameters' scaling (model/rope.hpp): rope_type "default", "linear" or "yarn" and their fields, with
// transformers' defaults.
struct RopeScaling {
  std::string type = "default";
  double factor = 1.0;
  double attention_factor = 0;  // yarn; 0: derived from factor (and mscale / mscale_all_dim)
  double beta_fast = 32, beta_slow = 1;
  double mscale = 0, mscale_all_dim = 0;
  int64_t original_max_position_embeddings = 0;
  bool truncate = true;
};

struct TextConfig {
  Architecture architecture = Architecture::kQwen35Dense;
  std::string model_type;          // the top-level model_type as written ("qwen3_5", "qwen3_5_moe_text", ...)
  bool multimodal_layout = false;  // text fields nested under text_config (Qwen3_5ForConditionalGeneration)

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // dense FFN; also the dense layers of Qwen3-Next (mlp_only_layers)
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 256;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 32768;
  bool attn_output_gate = true;

  // Gated DeltaNet ("linear_attention") layers.
  int64_t linear_num_key_heads = 16;
  int64_t linear_num_value_heads = 32;
  int64_t linear_key_head_dim = 128;
  int64_t linear_value_head_dim = 128;
  int64_t linear_conv_kernel_dim = 4;

  std::vector<LayerType> layer_types;  // from `layer_types`, else `full_attention_interval`

  // rope_parameters.
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double partial_rotary_factor = 0.25;
  std::vector<int64_t> mrope_section;  // [t, h, w] frequency counts; empty when absent
  bool mrope_interleaved = false;

  // MoE (qwen3_5_moe, qwen3_next).
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;
  bool norm_topk_prob = true;       // Qwen3.5-MoE always renormalises; Qwen3-Next reads the key
  int64_t decoder_sparse_step = 1;  // Qwen3-Next only
  std::vector<int64_t> mlp_only_layers;

  int64_t mtp_num_hidden_layers = 0;

  // quantization_config (config.json) or hf_quant_config.json; convention kNone for float checkpoints.
  quant::QuantConfig quant;
  std::vector<int64_t> eos_token_ids;

  // Derived sizes.
  int64_t linear_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int64_t linear_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  int64_t linear_conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }
  int64_t rotary_dim() const {
    return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
  }
  bool is_moe() const { return architecture != Architecture::kQwen35Dense; }
  // Whether layer i's FFN is the sparse MoE block (Qwen3NextDecoderLayer / Qwen3_5MoeDecoderLayer).
  bool layer_is_moe(int64_t i) const;
  int64_t count_layers(LayerType t) const;
};

// Parses config.json text. `where` names the file in errors.
core::Expected<TextConfig> parse_text_config(const std::string& json_text, const std::string& where);
// Reads DIR/config.json.
core::Expected<TextConfig> load_text_config(const std::string& model_dir);

}  // namespace deltaflow::model
