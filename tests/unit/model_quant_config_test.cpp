// Quantization configs as the producers write them: ModelOpt (hf_quant_config.json and config.json),
// compressed-tensors and Qwen FP8, resolved per module; and their errors.
#include <gtest/gtest.h>

#include "model/quant/config.hpp"

namespace deltaflow {
namespace {

using namespace model::quant;

LinearScheme scheme(const QuantConfig& c, const std::string& m) {
  return c.scheme_for(m);
}

TEST(QuantConfig, GlobMatchesAsFnmatch) {
  EXPECT_TRUE(glob_match("mtp*", "mtp.layers.0.mlp.down_proj"));
  EXPECT_TRUE(glob_match("*lm_head*", "lm_head"));
  EXPECT_TRUE(glob_match("*mlp.gate.*", "model.layers.0.mlp.gate.weight"));
  EXPECT_FALSE(glob_match("*mlp.gate.*", "model.layers.0.mlp.gate"));
  EXPECT_TRUE(glob_match("model.layers.?.mlp*", "model.layers.3.mlp.up_proj"));
  EXPECT_FALSE(glob_match("model.layers.?.mlp*", "model.layers.13.mlp.up_proj"));
  EXPECT_TRUE(glob_match("layers.[0-2].x", "layers.1.x"));
  EXPECT_FALSE(glob_match("layers.[!0-2].x", "layers.1.x"));
  EXPECT_TRUE(glob_match("a[b", "a[b"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_FALSE(glob_match("", "x"));
}

TEST(QuantConfig, ModelOptMixedPrecisionAsNvidiaPublishesIt) {
  auto c = parse_hf_quant_config(R"({
    "producer": {"name": "modelopt", "version": "0.45.0"},
    "quantization": {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": "FP8",
      "exclude_modules": ["mtp*", "mtp.layers.0*"],
      "quantized_layers": {
        "model.language_model.layers.0.mlp.down_proj": {"quant_algo": "W4A16_NVFP4", "group_size": 16},
        "model.language_model.layers.3.self_attn.q_proj": {"quant_algo": "FP8"},
        "lm_head": {"quant_algo": "W4A16_NVFP4", "group_size": 16},
        "mtp.layers.0.mlp.down_proj": {"quant_algo": "W4A16_NVFP4", "group_size": 16},
        "model.language_model.layers.1.mlp.up_proj": {"quant_algo": "INT4_AWQ"}}}})",
                                 "hf_quant_config.json");
  ASSERT_TRUE(c.is_ok()) << c.message();
  EXPECT_EQ(c->convention, Convention::kModelOpt);
  EXPECT_EQ(c->summary, "modelopt MIXED_PRECISION (modelopt 0.45.0), kv cache FP8");
  auto d = scheme(*c, "model.language_model.layers.0.mlp.down_proj");
  EXPECT_EQ(d.format, WeightFormat::kNvfp4);
  EXPECT_FALSE(d.input_scale);
  auto q = scheme(*c, "model.language_model.layers.3.self_attn.q_proj");
  EXPECT_EQ(q.format, WeightFormat::kFp8);
  EXPECT_EQ(q.fp8_scales, Fp8Scales::kTensor);
  EXPECT_TRUE(q.input_scale);
  EXPECT_EQ(scheme(*c, "lm_head").format, WeightFormat::kNvfp4);
  // Unlisted: stored dtype. Excluded (glob) wins over a listing.
  EXPECT_EQ(scheme(*c, "model.language_model.layers.0.linear_attn.in_proj_a").format, WeightFormat::kFloat);
  EXPECT_EQ(scheme(*c, "mtp.layers.0.mlp.down_proj").format, WeightFormat::kFloat);
  // Recognised but unsupported: resolved, and the binder names the tensor.
  auto awq = scheme(*c, "model.language_model.layers.1.mlp.up_proj");
  EXPECT_FALSE(awq.supported);
  EXPECT_EQ(awq.algo, "modelopt INT4_AWQ");
}

TEST(QuantConfig, ModelOptUniformFromConfigJson) {
  auto c = parse_quantization_config(R"({"quant_method": "modelopt", "quant_algo": "NVFP4",
      "ignore": ["lm_head", "*mlp.gate", "model.layers.*.linear_attn.in_proj_[ab]"],
      "producer": {"name": "modelopt", "version": "0.47.0"}})",
                                     "config.json");
  ASSERT_TRUE(c.is_ok()) << c.message();
  auto s = scheme(*c, "model.layers.0.mlp.up_proj");
  EXPECT_EQ(s.format, WeightFormat::kNvfp4);
  EXPECT_TRUE(s.input_scale);
  EXPECT_EQ(scheme(*c, "lm_head").format, WeightFormat::kFloat);
  EXPECT_EQ(scheme(*c, "model.layers.2.mlp.gate").format, WeightFormat::kFloat);
  EXPECT_EQ(scheme(*c, "model.layers.2.linear_attn.in_proj_b").format, WeightFormat::kFloat);
  EXPECT_EQ(scheme(*c, "model.layers.2.linear_attn.in_proj_z").format, WeightFormat::kNvfp4);
}

TEST(QuantConfig, ModelOptMixedFromConfigGroups) {
  auto c = parse_quantization_config(R"({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
      "config_groups": {
        "group_0": {"targets": ["model.layers.1.self_attn.q_proj"],
                    "weights": {"num_bits": 8, "type": "float"}, "input_activations": {"num_bits": 8}},
        "group_1": {"targets": ["model.layers.0.mlp.up_proj"],
                    "weights": {"num_bits": 4, "type": "float", "group_size": 16}}},
      "ignore": ["mtp*"]})",
                                     "config.json");
  ASSERT_TRUE(c.is_ok()) << c.message();
  EXPECT_EQ(scheme(*c, "model.layers.1.self_attn.q_proj").format, WeightFormat::kFp8);
  auto u = scheme(*c, "model.layers.0.mlp.up_proj");
  EXPECT_EQ(u.format, WeightFormat::kNvfp4);
  EXPECT_EQ(u.algo, "modelopt W4A16_NVFP4");
  EXPECT_EQ(scheme(*c, "model.layers.0.mlp.down_proj").format, WeightFormat::kFloat);
}

TEST(QuantConfig, CompressedTensorsNvfp4WithIgnoreRegexes) {
  auto c = parse_quantization_config(R"({"quant_method": "compressed-tensors",
      "format": "nvfp4-pack-quantized", "quantization_status": "compressed",
      "config_groups": {"group_0": {"targets": ["Linear"],
        "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                    "symmetric": true, "dynamic": false},
        "input_activations": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                              "dynamic": "local"}}},
      "ignore": ["lm_head", "re:.*mlp.gate$", "re:.*linear_attn.*"]})",
                                     "config.json");
  ASSERT_TRUE(c.is_ok()) << c.message();
  auto s = scheme(*c, "model.layers.0.mlp.up_proj");
  EXPECT_EQ(s.format, WeightFormat::kNvfp4);
  EXPECT_TRUE(s.input_scale);
  EXPECT_EQ(scheme(*c, "lm_head").format, WeightFormat::kFloat);
  EXPECT_EQ(scheme(*c, "model.layers.0.mlp.gate").format, WeightFormat::kFloat);
  EXPECT_EQ(scheme(*c, "model.layers.0.mlp.gate_proj").format, WeightFormat::kNvfp4);  // '$' anchors
  EXPECT_EQ(scheme(*c, "model.layers.0.linear_attn.out_proj").format, WeightFormat::kFloat);
  // re.match anchors at the start only: "mlp.gate$" does not match a longer name.
  auto c2 = parse_quantization_config(R"({"quant_method": "compressed-tensors",
      "format": "nvfp4-pack-quantized", "config_groups": {"g": {"targets": ["Linear"],
        "weights": {"num_bits": 4, "type": "float", "group_size": 16}}}, "ignore": ["re:mlp"]})",
                                      "config.json");
  ASSERT_TRUE(c2.is_ok()) << c2.message();
  EXPECT_EQ(scheme(*c2, "model.layers.0.mlp.up_proj").format, WeightFormat::kNvfp4);
  EXPECT_FALSE(scheme(*c2, "model.layers.0.mlp.up_proj").input_scale);  // NVFP4A16
  EXPECT_EQ(scheme(*c2, "mlp.x").format, WeightFormat::kFloat);
}

TEST(QuantConfig, CompressedTensorsMixedPrecisionAndFp8Strategies) {
  auto c = parse_quantization_config(R"({"quant_method": "compressed-tensors", "format": "mixed-precision",
      "config_groups": {
        "attn": {"format": "float-quantized", "targets": ["re:.*self_attn.*"],
                 "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                 "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true}},
        "blk": {"format": "float-quantized", "targets": ["model.layers.0.mlp.down_proj"],
                "weights": {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}},
        "fp4": {"format": "nvfp4-pack-quantized", "targets": ["Linear"],
                "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16}},
        "int": {"format": "pack-quantized", "targets": ["model.layers.1.mlp.up_proj"],
                "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}}}})",
                                     "config.json");
  ASSERT_TRUE(c.is_ok()) << c.message();
  auto a = scheme(*c, "model.layers.3.self_attn.q_proj");
  EXPECT_EQ(a.format, WeightFormat::kFp8);
  EXPECT_EQ(a.fp8_scales, Fp8Scales::kChannel);
  EXPECT_FALSE(a.input_scale);
  auto b = scheme(*c, "model.layers.0.mlp.down_proj");  // an exact name beats "Linear"
  EXPECT_EQ(b.fp8_scales, Fp8Scales::kBlock);
  EXPECT_EQ(b.block_rows, 128);
  EXPECT_EQ(scheme(*c, "model.layers.0.mlp.up_proj").format, WeightFormat::kNvfp4);
  EXPECT_FALSE(scheme(*c, "model.layers.1.mlp.up_proj").supported);
}

TEST(QuantConfig, QwenFp8Block) {
  auto c = parse_quantization_config(R"({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
      "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head", "linear_attn.in_proj_a"]})",
                                     "config.json");
  ASSERT_TRUE(c.is_ok()) << c.message();
  auto s = scheme(*c, "model.language_model.layers.0.mlp.up_proj");
  EXPECT_EQ(s.format, WeightFormat::kFp8);
  EXPECT_EQ(s.fp8_scales, Fp8Scales::kBlock);
  EXPECT_EQ(scheme(*c, "lm_head").format, WeightFormat::kFloat);
  EXPECT_EQ(scheme(*c, "model.language_model.layers.0.linear_attn.in_proj_a").format, WeightFormat::kFloat);
  EXPECT_EQ(c->summary, "fp8 block 128x128");
  // transformers' should_convert_module: a regex at the start or a suffix, not a substring.
  auto g = parse_quantization_config(
      R"({"quant_method": "fp8", "modules_to_not_convert": ["mlp.gate", "model.layers.1"]})", "config.json");
  ASSERT_TRUE(g.is_ok()) << g.message();
  EXPECT_EQ(scheme(*g, "model.layers.0.mlp.gate").format, WeightFormat::kFloat);
  EXPECT_EQ(scheme(*g, "model.layers.0.mlp.gate_proj").format, WeightFormat::kFp8);
  EXPECT_EQ(scheme(*g, "model.layers.1.mlp.up_proj").format, WeightFormat::kFloat);
  EXPECT_EQ(scheme(*g, "model.layers.11.mlp.up_proj").format, WeightFormat::kFloat);  // as re.match does
}

TEST(QuantConfig, ErrorsNameTheFileAndField) {
  auto m = parse_quantization_config(R"({"quant_method": "gptq", "bits": 4})", "config.json");
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.message(),
            "config.json: quantization_config quant_method 'gptq' is not supported (supported: modelopt, "
            "compressed-tensors, fp8)");
  auto r = parse_quantization_config(R"({"quant_method": "compressed-tensors", "config_groups": {"g": {
      "targets": ["re:(unclosed"], "weights": {"num_bits": 4}}}})",
                                     "config.json");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.message().find("config.json: config_groups['g']: pattern 're:(unclosed' does not compile"),
            std::string::npos)
      << r.message();
  auto b = parse_quantization_config(R"({"quant_method": "fp8", "weight_block_size": [128]})", "config.json");
  ASSERT_FALSE(b.is_ok());
  EXPECT_EQ(b.message(), "config.json: field 'weight_block_size' must be [rows, cols] of positive integers");
  auto t = parse_hf_quant_config(R"({"quantization": {"quant_algo": 4}})", "hf_quant_config.json");
  ASSERT_FALSE(t.is_ok());
  EXPECT_EQ(t.message(), "hf_quant_config.json: field 'quant_algo' must be a string");
  auto p = parse_hf_quant_config(R"({"producer": {"name": "other"}, "quantization": {}})", "h.json");
  ASSERT_FALSE(p.is_ok());
  EXPECT_EQ(p.message(), "h.json: producer 'other' is not supported (expected modelopt)");
}

}  // namespace
}  // namespace deltaflow
