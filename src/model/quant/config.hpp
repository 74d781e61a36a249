// A checkpoint's quantization config (quant-formats.md §1.2, §2, §3), resolved per linear module:
//  - ModelOpt: hf_quant_config.json {"quantization": {quant_algo, exclude_modules, quantized_layers, ...}} or
//    config.json quantization_config {quant_method: "modelopt", ...}; exclude patterns are fnmatch globs.
//  - compressed-tensors: config.json quantization_config {quant_method: "compressed-tensors", format,
//    config_groups {targets, weights, input_activations, format}, ignore}; targets and ignore entries are
//    exact module names, "re:" regexes (Python re.match: anchored at the start) or the class name "Linear".
//  - Qwen FP8: config.json quantization_config {quant_method: "fp8", weight_block_size,
//  modules_to_not_convert}.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.hpp"
#include "model/quant/format.hpp"

namespace deltaflow::model::quant {

enum class Convention : uint8_t { kNone, kModelOpt, kCompressedTensors, kQwenFp8 };

// FP8 scale granularity.
enum class Fp8Scales : uint8_t { kTensor, kChannel, kBlock };

// How one linear module's weight is stored.
struct LinearScheme {
  WeightFormat format = WeightFormat::kFloat;
  Fp8Scales fp8_scales = Fp8Scales::kTensor;
  int64_t block_rows = kFp8Block, block_cols = kFp8Block;  // FP8 block scales
  bool input_scale = false;  // a static activation scale is stored (W4A4 / W8A8); the CPU runs weight-only
  bool supported = true;     // false: a format we recognise but cannot load; binding it names the tensor
  std::string algo;          // as the config names it ("NVFP4", "W4A16_NVFP4", "nvfp4-pack-quantized", ...)
};

// A compiled module-name pattern.
class NamePattern {
 public:
  // kHfPrefix: transformers' should_convert_module (modules_to_not_convert): a regex matched at the start of
  // the name, or a plain suffix.
  enum class Kind : uint8_t { kExact, kGlob, kRegex, kLinearClass, kHfPrefix };
  // `text` is kept for messages; a regex that does not compile is an error naming `where`.
  static core::Expected<NamePattern> make(Kind kind, std::string text, const std::string& where);
  bool matches(std::string_view module) const;
  const std::string& text() const { return text_; }
  Kind kind() const { return kind_; }

 private:
  Kind kind_ = Kind::kExact;
  std::string text_;
  std::shared_ptr<void> regex_;  // pcre2_code
};

struct QuantConfig {
  Convention convention = Convention::kNone;
  std::string where;    // the file the config came from
  std::string summary;  // one line for `inspect` ("modelopt MIXED_PRECISION, kv cache FP8", ...)

  // ModelOpt: uniform algorithm unless `layers` (MIXED_PRECISION) is non-empty. Qwen FP8: `uniform` is the
  // block scheme and `exclude` holds modules_to_not_convert.
  LinearScheme uniform;
  std::vector<std::pair<NamePattern, LinearScheme>> layers;
  std::vector<NamePattern> exclude;
  // compressed-tensors: the first group whose targets match decides; `ignore` wins over every group.
  struct Group {
    std::vector<NamePattern> targets;
    LinearScheme scheme;
  };
  std::vector<Group> groups;
  std::vector<NamePattern> ignore;

  bool quantized() const { return convention != Convention::kNone; }
  // The scheme of the linear module `module` (its checkpoint name without ".weight").
  LinearScheme scheme_for(std::string_view module) const;
};

// hf_quant_config.json (ModelOpt).
core::Expected<QuantConfig> parse_hf_quant_config(std::string_view json_text, const std::string& where);
// The value of config.json's "quantization_config" (any convention above; others are an error naming
// quant_method).
core::Expected<QuantConfig> parse_quantization_config(std::string_view json_text, const std::string& where);

// fnmatch(3)-style glob as Python's fnmatch.fnmatchcase: '*', '?', '[seq]', '[!seq]'.
bool glob_match(std::string_view pattern, std::string_view text);

}  // namespace deltaflow::model::quant
