// Any bytes as a quantization config (config.json's quantization_config, or hf_quant_config.json when the
// first byte is odd) must give a config or an error value: no crash, no sanitizer report, no exception. What
// parses must resolve module names (globs, regexes with match limits) without failing.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "model/quant/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using namespace deltaflow::model::quant;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  auto c =
      (data[0] & 1) ? parse_hf_quant_config(text, "fuzz.json") : parse_quantization_config(text, "fuzz.json");
  if (!c) {
    if (c.message().rfind("fuzz.json", 0) != 0) __builtin_trap();  // errors name the file
    return 0;
  }
  static const char* kModules[] = {"lm_head",
                                   "model.layers.0.mlp.down_proj",
                                   "model.language_model.layers.3.self_attn.q_proj",
                                   "model.layers.1.mlp.experts.7.gate_proj",
                                   "mtp.layers.0.mlp.up_proj",
                                   "model.layers.2.linear_attn.in_proj_a",
                                   ""};
  for (const char* m : kModules) {
    const LinearScheme s = c->scheme_for(m);
    if (s.format == WeightFormat::kNvfp4 && s.supported && s.algo.empty()) __builtin_trap();
    if (s.block_rows <= 0 || s.block_cols <= 0) __builtin_trap();
  }
  return 0;
}
