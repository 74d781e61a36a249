#include "vision/processor_config.hpp"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace deltaflow::vision {
namespace {

using nlohmann::json;

core::Status read_int(const json& o, const char* key, int64_t& out, const std::string& where) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return core::Status();
  if (!it->is_number_integer() || it->get<int64_t>() <= 0)
    return core::Error{where + ": field '" + key + "' must be a positive integer"};
  out = it->get<int64_t>();
  return core::Status();
}

core::Status read_bool(const json& o, const char* key, bool& out, const std::string& where) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return core::Status();
  if (!it->is_boolean()) return core::Error{where + ": field '" + key + "' must be a boolean"};
  out = it->get<bool>();
  return core::Status();
}

core::Status read_triple(const json& o, const char* key, std::array<float, 3>& out,
                         const std::string& where) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return core::Status();
  if (it->is_number()) {
    out.fill(it->get<float>());
    return core::Status();
  }
  if (!it->is_array() || it->size() != 3)
    return core::Error{where + ": field '" + key + "' must be a number or a list of 3 numbers"};
  for (size_t i = 0; i < 3; ++i) {
    if (!(*it)[i].is_number()) return core::Error{where + ": field '" + key + "' must hold numbers"};
    out[i] = (*it)[i].get<float>();
  }
  return core::Status();
}

}  // namespace

core::Expected<ProcessorConfig> parse_processor_config(const std::string& json_text,
                                                       const std::string& where) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const std::exception& e) {
    return core::Error{where + ": invalid JSON: " + e.what()};
  }
  if (!j.is_object()) return core::Error{where + ": expected a JSON object"};
  ProcessorConfig c;
  DF_TRY(read_int(j, "patch_size", c.patch_size, where));
  DF_TRY(read_int(j, "temporal_patch_size", c.temporal_patch_size, where));
  DF_TRY(read_int(j, "merge_size", c.merge_size, where));
  if (auto it = j.find("size"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return core::Error{where + ": field 'size' must be an object"};
    DF_TRY(read_int(*it, "shortest_edge", c.min_pixels, where + ": size"));
    DF_TRY(read_int(*it, "longest_edge", c.max_pixels, where + ": size"));
  }
  // Qwen2VLImageProcessor.__init__: min_pixels / max_pixels, when given, override size.
  DF_TRY(read_int(j, "min_pixels", c.min_pixels, where));
  DF_TRY(read_int(j, "max_pixels", c.max_pixels, where));
  DF_TRY(read_triple(j, "image_mean", c.image_mean, where));
  DF_TRY(read_triple(j, "image_std", c.image_std, where));
  if (auto it = j.find("rescale_factor"); it != j.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() <= 0)
      return core::Error{where + ": field 'rescale_factor' must be a positive number"};
    c.rescale_factor = it->get<double>();
  }
  DF_TRY(read_bool(j, "do_resize", c.do_resize, where));
  DF_TRY(read_bool(j, "do_rescale", c.do_rescale, where));
  DF_TRY(read_bool(j, "do_normalize", c.do_normalize, where));
  DF_TRY(read_bool(j, "do_convert_rgb", c.do_convert_rgb, where));
  if (auto it = j.find("resample"); it != j.end() && !it->is_null() && !(it->is_number_integer() && *it == 3))
    return core::Error{where + ": field 'resample' must be 3 (bicubic); other filters are not supported"};
  for (float s : c.image_std)
    if (s == 0.0f) return core::Error{where + ": field 'image_std' must not contain 0"};
  if (c.min_pixels > c.max_pixels)
    return core::Error{where + ": min pixels " + std::to_string(c.min_pixels) + " exceed max pixels " +
                       std::to_string(c.max_pixels)};
  if (c.patch_size > 1024 || c.merge_size > 64 || c.temporal_patch_size > 64)
    return core::Error{where + ": patch_size, merge_size or temporal_patch_size out of range"};
  return c;
}

core::Expected<ProcessorConfig> load_processor_config(const std::string& model_dir) {
  const std::string path = model_dir + "/preprocessor_config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return core::Error{path + ": cannot open (a vision model ships its image processor config there)"};
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_processor_config(ss.str(), path);
}

}  // namespace deltaflow::vision
