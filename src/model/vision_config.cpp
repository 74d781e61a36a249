#include "model/vision_config.hpp"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace deltaflow::model {
namespace {

using nlohmann::json;

core::Status read_int(const json& obj, const char* key, int64_t& out, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return core::Status();
  if (!it->is_number_integer()) return core::Error{where + ": field '" + key + "' must be an integer"};
  out = it->get<int64_t>();
  return core::Status();
}

// patch_size and temporal_patch_size may be written as [n, n] (the config allows a list); both must agree.
core::Status read_size(const json& obj, const char* key, int64_t& out, const std::string& where) {
  auto it = obj.find(key);
  if (it != obj.end() && it->is_array()) {
    if (it->empty() || !(*it)[0].is_number_integer())
      return core::Error{where + ": field '" + key + "' must be an integer or a list of equal integers"};
    for (const auto& x : *it)
      if (!x.is_number_integer() || x.get<int64_t>() != (*it)[0].get<int64_t>())
        return core::Error{where + ": field '" + key + "' must be an integer or a list of equal integers"};
    out = (*it)[0].get<int64_t>();
    return core::Status();
  }
  return read_int(obj, key, out, where);
}

}  // namespace

int64_t VisionConfig::num_grid_per_side() const {
  return static_cast<int64_t>(std::sqrt(static_cast<double>(num_position_embeddings)));
}

core::Expected<VisionConfig> parse_vision_config(const std::string& json_text, const std::string& where) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const std::exception& e) {
    return core::Error{where + ": invalid JSON: " + e.what()};
  }
  if (!root.is_object()) return core::Error{where + ": expected a JSON object"};
  auto vit = root.find("vision_config");
  if (vit == root.end() || !vit->is_object())
    return core::Error{where + ": no 'vision_config' (a text-only model has no vision tower)"};
  const json& v = *vit;
  const std::string vw = where + ": vision_config";
  VisionConfig c;
  DF_TRY(read_int(v, "depth", c.depth, vw));
  DF_TRY(read_int(v, "hidden_size", c.hidden_size, vw));
  DF_TRY(read_int(v, "intermediate_size", c.intermediate_size, vw));
  DF_TRY(read_int(v, "num_heads", c.num_heads, vw));
  DF_TRY(read_int(v, "in_channels", c.in_channels, vw));
  DF_TRY(read_size(v, "patch_size", c.patch_size, vw));
  DF_TRY(read_int(v, "spatial_merge_size", c.spatial_merge_size, vw));
  DF_TRY(read_size(v, "temporal_patch_size", c.temporal_patch_size, vw));
  DF_TRY(read_int(v, "out_hidden_size", c.out_hidden_size, vw));
  DF_TRY(read_int(v, "num_position_embeddings", c.num_position_embeddings, vw));
  if (auto it = v.find("hidden_act"); it != v.end() && !it->is_null()) {
    if (!it->is_string()) return core::Error{vw + ": field 'hidden_act' must be a string"};
    c.hidden_act = it->get<std::string>();
  }
  if (auto it = v.find("rope_parameters"); it != v.end() && it->is_object()) {
    if (auto t = it->find("rope_theta"); t != it->end() && t->is_number()) c.rope_theta = t->get<double>();
    if (auto t = it->find("rope_type"); t != it->end() && t->is_string() && t->get<std::string>() != "axial")
      return core::Error{vw + ": rope_parameters.rope_type '" + t->get<std::string>() +
                         "' is not supported (the Qwen3.5 vision tower uses 'axial')"};
  }
  // Qwen3-VL's deepstack mergers feed intermediate ViT layers into the first decoder layers; Qwen3.5 has none
  // and neither does this encoder, so a config that asks for them is refused rather than run without them.
  if (auto it = v.find("deepstack_visual_indexes"); it != v.end() && it->is_array() && !it->empty())
    return core::Error{vw + ": deepstack_visual_indexes is not empty; deepstack (Qwen3-VL) is not supported"};
  DF_TRY(read_int(root, "image_token_id", c.image_token_id, where));
  DF_TRY(read_int(root, "video_token_id", c.video_token_id, where));
  DF_TRY(read_int(root, "vision_start_token_id", c.vision_start_token_id, where));
  DF_TRY(read_int(root, "vision_end_token_id", c.vision_end_token_id, where));

  if (c.hidden_act != "gelu_pytorch_tanh")
    return core::Error{vw + ": hidden_act '" + c.hidden_act +
                       "' is not supported (expected gelu_pytorch_tanh)"};
  auto positive = [&](int64_t x, const char* name) -> core::Status {
    if (x <= 0 || x > (int64_t{1} << 20))
      return core::Error{vw + ": field '" + name + "' must be a positive integer, got " + std::to_string(x)};
    return core::Status();
  };
  DF_TRY(positive(c.depth, "depth"));
  DF_TRY(positive(c.hidden_size, "hidden_size"));
  DF_TRY(positive(c.intermediate_size, "intermediate_size"));
  DF_TRY(positive(c.num_heads, "num_heads"));
  DF_TRY(positive(c.in_channels, "in_channels"));
  DF_TRY(positive(c.patch_size, "patch_size"));
  DF_TRY(positive(c.spatial_merge_size, "spatial_merge_size"));
  DF_TRY(positive(c.temporal_patch_size, "temporal_patch_size"));
  DF_TRY(positive(c.out_hidden_size, "out_hidden_size"));
  DF_TRY(positive(c.num_position_embeddings, "num_position_embeddings"));
  if (c.hidden_size % c.num_heads != 0 || c.head_dim() % 4 != 0)
    return core::Error{vw + ": hidden_size / num_heads must be a multiple of 4 (2-D rotary over h and w)"};
  const int64_t side = c.num_grid_per_side();
  if (side * side != c.num_position_embeddings)
    return core::Error{vw + ": num_position_embeddings " + std::to_string(c.num_position_embeddings) +
                       " is not a square"};
  if (c.in_channels != 3) return core::Error{vw + ": in_channels must be 3 (RGB)"};
  return c;
}

core::Expected<VisionConfig> load_vision_config(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return core::Error{path + ": cannot open"};
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_vision_config(ss.str(), path);
}

}  // namespace deltaflow::model
