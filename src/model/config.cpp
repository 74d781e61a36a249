#include "model/config.hpp"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace deltaflow::model {
namespace {

using nlohmann::json;

// Reads an optional key with type checking; a present key of the wrong type is an error naming it.
template <class T>
core::Status read_opt(const json& obj, const char* key, T& out, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return core::Status();
  try {
    if constexpr (std::is_same_v<T, bool>) {
      if (!it->is_boolean()) throw std::runtime_error("not a boolean");
    } else if constexpr (std::is_integral_v<T>) {
      if (!it->is_number_integer()) throw std::runtime_error("not an integer");
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!it->is_number()) throw std::runtime_error("not a number");
    }
    out = it->get<T>();
  } catch (const std::exception& e) {
    return core::Error{where + ": field '" + key + "': " + e.what()};
  }
  return core::Status();
}

template <class T>
core::Status read_req(const json& obj, const char* key, T& out, const std::string& where) {
  if (!obj.contains(key) || obj[key].is_null()) return core::Error{where + ": missing field '" + key + "'"};
  return read_opt(obj, key, out, where);
}

core::Expected<std::vector<int64_t>> read_int_list(const json& v, const char* key, const std::string& where) {
  std::vector<int64_t> out;
  if (v.is_number_integer()) return std::vector<int64_t>{v.get<int64_t>()};
  if (!v.is_array()) return core::Error{where + ": field '" + key + "' must be a list of integers"};
  for (const auto& x : v) {
    if (!x.is_number_integer())
      return core::Error{where + ": field '" + key + "' must be a list of integers"};
    out.push_back(x.get<int64_t>());
  }
  return out;
}

}  // namespace

const char* architecture_name(Architecture a) {
  switch (a) {
    case Architecture::kQwen35Dense:
      return "qwen3_5 (dense)";
    case Architecture::kQwen35Moe:
      return "qwen3_5_moe";
    case Architecture::kQwen3Next:
      return "qwen3_next";
  }
  return "?";
}

bool TextConfig::layer_is_moe(int64_t i) const {
  if (architecture == Architecture::kQwen35Dense) return false;
  if (architecture == Architecture::kQwen35Moe) return true;  // every layer is MoE
  for (int64_t m : mlp_only_layers)
    if (m == i) return false;
  return num_experts > 0 && decoder_sparse_step > 0 && (i + 1) % decoder_sparse_step == 0;
}

int64_t TextConfig::count_layers(LayerType t) const {
  int64_t n = 0;
  for (auto lt : layer_types) n += lt == t;
  return n;
}

core::Expected<TextConfig> parse_text_config(const std::string& json_text, const std::string& where) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    return core::Error{where + ": invalid JSON: " + e.what()};
  }
  if (!root.is_object()) return core::Error{where + ": not a JSON object"};

  TextConfig c;
  std::string top_type;
  DF_TRY(read_req(root, "model_type", top_type, where));
  c.model_type = top_type;
  const json* text = &root;
  std::string text_type = top_type;
  if (top_type == "qwen3_5" || top_type == "qwen3_5_moe") {
    if (!root.contains("text_config") || !root["text_config"].is_object())
      return core::Error{where + ": model_type '" + top_type + "' needs a 'text_config' object"};
    text = &root["text_config"];
    c.multimodal_layout = true;
    text_type = top_type + "_text";
    if (text->contains("model_type") && (*text)["model_type"].is_string()) text_type = (*text)["model_type"];
  }
  if (text_type == "qwen3_5_text") {
    c.architecture = Architecture::kQwen35Dense;
  } else if (text_type == "qwen3_5_moe_text") {
    c.architecture = Architecture::kQwen35Moe;
  } else if (text_type == "qwen3_next") {
    c.architecture = Architecture::kQwen3Next;
  } else {
    return core::Error{where + ": unsupported model_type '" + text_type +
                       "' (expected qwen3_5, qwen3_5_moe, qwen3_5_text, qwen3_5_moe_text or qwen3_next)"};
  }
  const json& t = *text;
  const std::string w = c.multimodal_layout ? where + ": text_config" : where;

  DF_TRY(read_req(t, "vocab_size", c.vocab_size, w));
  DF_TRY(read_req(t, "hidden_size", c.hidden_size, w));
  DF_TRY(read_req(t, "num_hidden_layers", c.num_hidden_layers, w));
  DF_TRY(read_req(t, "num_attention_heads", c.num_attention_heads, w));
  DF_TRY(read_req(t, "num_key_value_heads", c.num_key_value_heads, w));
  DF_TRY(read_opt(t, "head_dim", c.head_dim, w));
  DF_TRY(read_opt(t, "rms_norm_eps", c.rms_norm_eps, w));
  DF_TRY(read_opt(t, "max_position_embeddings", c.max_position_embeddings, w));
  DF_TRY(read_opt(t, "attn_output_gate", c.attn_output_gate, w));
  DF_TRY(read_opt(t, "linear_num_key_heads", c.linear_num_key_heads, w));
  DF_TRY(read_opt(t, "linear_num_value_heads", c.linear_num_value_heads, w));
  DF_TRY(read_opt(t, "linear_key_head_dim", c.linear_key_head_dim, w));
  DF_TRY(read_opt(t, "linear_value_head_dim", c.linear_value_head_dim, w));
  DF_TRY(read_opt(t, "linear_conv_kernel_dim", c.linear_conv_kernel_dim, w));
  DF_TRY(read_opt(t, "mtp_num_hidden_layers", c.mtp_num_hidden_layers, w));
  // tie_word_embeddings may sit at either level (the multimodal config repeats it at the top).
  DF_TRY(read_opt(root, "tie_word_embeddings", c.tie_word_embeddings, where));
  DF_TRY(read_opt(t, "tie_word_embeddings", c.tie_word_embeddings, w));

  if (c.architecture == Architecture::kQwen35Dense) {
    DF_TRY(read_req(t, "intermediate_size", c.intermediate_size, w));
  } else {
    DF_TRY(read_opt(t, "intermediate_size", c.intermediate_size, w));
    DF_TRY(read_req(t, "num_experts", c.num_experts, w));
    DF_TRY(read_req(t, "num_experts_per_tok", c.num_experts_per_tok, w));
    DF_TRY(read_req(t, "moe_intermediate_size", c.moe_intermediate_size, w));
    DF_TRY(read_req(t, "shared_expert_intermediate_size", c.shared_expert_intermediate_size, w));
    if (c.architecture == Architecture::kQwen3Next) {
      DF_TRY(read_opt(t, "norm_topk_prob", c.norm_topk_prob, w));
      DF_TRY(read_opt(t, "decoder_sparse_step", c.decoder_sparse_step, w));
      if (t.contains("mlp_only_layers") && !t["mlp_only_layers"].is_null()) {
        DF_ASSIGN(c.mlp_only_layers, read_int_list(t["mlp_only_layers"], "mlp_only_layers", w));
      }
    }
  }

  // Layer pattern: explicit list, else every full_attention_interval-th layer is full attention.
  if (t.contains("layer_types") && !t["layer_types"].is_null()) {
    const json& lt = t["layer_types"];
    if (!lt.is_array()) return core::Error{w + ": field 'layer_types' must be a list"};
    for (const auto& x : lt) {
      const std::string s = x.is_string() ? x.get<std::string>() : "";
      if (s == "linear_attention") {
        c.layer_types.push_back(LayerType::kLinearAttention);
      } else if (s == "full_attention" || s == "attention") {
        c.layer_types.push_back(LayerType::kFullAttention);
      } else {
        return core::Error{w + ": field 'layer_types': unknown layer type " + x.dump()};
      }
    }
    if (static_cast<int64_t>(c.layer_types.size()) != c.num_hidden_layers)
      return core::Error{w + ": 'layer_types' has " + std::to_string(c.layer_types.size()) +
                         " entries but num_hidden_layers is " + std::to_string(c.num_hidden_layers)};
  } else {
    int64_t interval = 4;
    DF_TRY(read_opt(t, "full_attention_interval", interval, w));
    if (interval <= 0) return core::Error{w + ": field 'full_attention_interval' must be positive"};
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      c.layer_types.push_back((i + 1) % interval == 0 ? LayerType::kFullAttention
                                                      : LayerType::kLinearAttention);
  }

  // RoPE: rope_parameters, with the legacy top-level rope_theta / partial_rotary_factor as fallbacks.
  DF_TRY(read_opt(t, "rope_theta", c.rope_theta, w));
  DF_TRY(read_opt(t, "partial_rotary_factor", c.partial_rotary_factor, w));
  if (t.contains("rope_parameters") && t["rope_parameters"].is_object()) {
    const json& rp = t["rope_parameters"];
    const std::string rw = w + ": rope_parameters";
    RopeScaling& rs = c.rope_scaling;
    DF_TRY(read_opt(rp, "rope_type", rs.type, rw));
    if (rs.type != "default" && rs.type != "linear" && rs.type != "yarn")
      return core::Error{rw + ": unsupported rope_type '" + rs.type + "' (supported: default, linear, yarn)"};
    if (rs.type != "default") {
      if (rp.contains("factor") && !rp["factor"].is_null()) DF_TRY(read_opt(rp, "factor", rs.factor, rw));
      if (rs.type == "yarn") {
        for (const auto& [key, field] :
             {std::pair<const char*, double*>{"attention_factor", &rs.attention_factor},
              {"beta_fast", &rs.beta_fast},
              {"beta_slow", &rs.beta_slow},
              {"mscale", &rs.mscale},
              {"mscale_all_dim", &rs.mscale_all_dim}})
          if (rp.contains(key) && !rp[key].is_null()) DF_TRY(read_opt(rp, key, *field, rw));
        DF_TRY(read_opt(rp, "truncate", rs.truncate, rw));
        if (!rp.contains("original_max_position_embeddings"))
          return core::Error{rw + ": rope_type 'yarn' needs 'original_max_position_embeddings'"};
        DF_TRY(read_opt(rp, "original_max_position_embeddings", rs.original_max_position_embeddings, rw));
        if (rs.original_max_position_embeddings <= 0)
          return core::Error{rw + ": 'original_max_position_embeddings' must be positive"};
        if (!rp.contains("factor") || rp["factor"].is_null()) rs.factor = 0;  // from the lengths, below
      }
      if (rs.type == "linear" && !(rs.factor > 0)) return core::Error{rw + ": 'factor' must be positive"};
    }
    DF_TRY(read_opt(rp, "rope_theta", c.rope_theta, rw));
    DF_TRY(read_opt(rp, "partial_rotary_factor", c.partial_rotary_factor, rw));
    DF_TRY(read_opt(rp, "mrope_interleaved", c.mrope_interleaved, rw));
    if (rp.contains("mrope_section") && !rp["mrope_section"].is_null()) {
      DF_ASSIGN(c.mrope_section, read_int_list(rp["mrope_section"], "mrope_section", rw));
    }
  }

  if (c.rope_scaling.type == "yarn" && c.rope_scaling.factor == 0)  // as transformers: the lengths' ratio
    c.rope_scaling.factor = static_cast<double>(c.max_position_embeddings) /
                            static_cast<double>(c.rope_scaling.original_max_position_embeddings);

  if (t.contains("eos_token_id") && !t["eos_token_id"].is_null()) {
    DF_ASSIGN(c.eos_token_ids, read_int_list(t["eos_token_id"], "eos_token_id", w));
  }

  // Sanity: the sizes the forward pass divides by.
  auto positive = [&](int64_t v, const char* name) -> core::Status {
    if (v <= 0) return core::Error{w + ": field '" + std::string(name) + "' must be positive"};
    return core::Status();
  };
  DF_TRY(positive(c.vocab_size, "vocab_size"));
  DF_TRY(positive(c.hidden_size, "hidden_size"));
  DF_TRY(positive(c.num_hidden_layers, "num_hidden_layers"));
  DF_TRY(positive(c.num_attention_heads, "num_attention_heads"));
  DF_TRY(positive(c.num_key_value_heads, "num_key_value_heads"));
  DF_TRY(positive(c.head_dim, "head_dim"));
  DF_TRY(positive(c.linear_num_key_heads, "linear_num_key_heads"));
  DF_TRY(positive(c.linear_num_value_heads, "linear_num_value_heads"));
  DF_TRY(positive(c.linear_key_head_dim, "linear_key_head_dim"));
  DF_TRY(positive(c.linear_value_head_dim, "linear_value_head_dim"));
  DF_TRY(positive(c.linear_conv_kernel_dim, "linear_conv_kernel_dim"));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    return core::Error{w + ": num_attention_heads must be a multiple of num_key_value_heads"};
  if (c.linear_num_value_heads % c.linear_num_key_heads != 0)
    return core::Error{w + ": linear_num_value_heads must be a multiple of linear_num_key_heads"};
  if (c.rotary_dim() % 2 != 0 || c.rotary_dim() > c.head_dim)
    return core::Error{w + ": head_dim x partial_rotary_factor must be even and at most head_dim"};
  if (c.is_moe() && (c.num_experts_per_tok <= 0 || c.num_experts_per_tok > c.num_experts))
    return core::Error{w + ": num_experts_per_tok must be in [1, num_experts]"};
  // quantization_config sits at the top level (also in the multimodal layout); some exports put it in
  // text_config.
  const json* qc = root.contains("quantization_config") ? &root["quantization_config"]
                   : t.contains("quantization_config")  ? &t["quantization_config"]
                                                        : nullptr;
  if (qc && !qc->is_null()) {
    if (!qc->is_object()) return core::Error{where + ": field 'quantization_config' must be an object"};
    DF_ASSIGN(c.quant, quant::parse_quantization_config(qc->dump(), where + ": quantization_config"));
  }
  return c;
}

core::Expected<TextConfig> load_text_config(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return core::Error{path + ": cannot open"};
  std::stringstream ss;
  ss << in.rdbuf();
  DF_ASSIGN(TextConfig c, parse_text_config(ss.str(), path));
  // ModelOpt's own file, when present, is the one its exporter wrote first; it wins over config.json's copy.
  const std::string hf_quant = model_dir + "/hf_quant_config.json";
  std::ifstream hq(hf_quant, std::ios::binary);
  if (hq) {
    std::stringstream hs;
    hs << hq.rdbuf();
    DF_ASSIGN(c.quant, quant::parse_hf_quant_config(hs.str(), hf_quant));
  }
  return c;
}

}  // namespace deltaflow::model
