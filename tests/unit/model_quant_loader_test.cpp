// Binding quantized checkpoints (the producers' own exports under tests/fixtures/quant) and the one-line
// errors for what does not fit: each names the tensor, its file and the format.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.hpp"
#include "io/safetensors.hpp"
#include "model/config.hpp"
#include "model/tensor_parallel.hpp"
#include "model/weight_summary.hpp"
#include "model/weights.hpp"

namespace deltaflow {
namespace {

namespace fs = std::filesystem;

class QuantLoader : public ::testing::Test {
 protected:
  void use(const std::string& fixture) {
    dir_ = (fs::temp_directory_path() / ("df_quant_loader_" + std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
    fs::copy(std::string(DF_FIXTURES) + "/quant/" + fixture, dir_);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  core::Expected<model::ModelWeights> bind() {
    auto c = model::load_text_config(dir_);
    if (!c) return c.error();
    config_ = *c;
    auto ck = io::Checkpoint::open(dir_);
    if (!ck) return ck.error();
    ck_ = std::make_unique<io::Checkpoint>(std::move(ck).value());
    return model::bind_weights(config_, *ck_);
  }
  std::string bind_error() {
    auto w = bind();
    EXPECT_FALSE(w.is_ok());
    return w.is_ok() ? "" : w.message();
  }
  void rewrite(const std::function<void(std::vector<io::TensorToWrite>&)>& edit) {
    std::vector<io::TensorToWrite> ts;
    {
      auto f = io::SafetensorsFile::open(dir_ + "/model.safetensors");
      ASSERT_TRUE(f.is_ok()) << f.message();
      for (const auto& e : (*f)->header().tensors) {
        const uint8_t* p = (*f)->tensor_data(e);
        ts.push_back({e.name, e.dtype, e.shape, std::vector<uint8_t>(p, p + (e.end - e.begin))});
      }
    }
    edit(ts);
    ASSERT_TRUE(io::write_safetensors(dir_ + "/model.safetensors", ts, {}).is_ok());
  }
  void edit_json(const std::string& file, const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j;
    {
      std::ifstream in(dir_ + "/" + file);
      in >> j;
    }
    edit(j);
    std::ofstream(dir_ + "/" + file) << j.dump(2);
  }
  static bool has(const std::string& m, const std::string& part) { return m.find(part) != std::string::npos; }

  std::string dir_;
  model::TextConfig config_;
  std::unique_ptr<io::Checkpoint> ck_;
};

TEST_F(QuantLoader, ModelOptMixedBindsEachModuleInItsFormat) {
  use("modelopt_mixed_dense");
  auto w = bind();
  ASSERT_TRUE(w.is_ok()) << w.message();
  const auto& L0 = w->layers[0];
  EXPECT_EQ(L0.mlp.down_proj.format, model::quant::WeightFormat::kNvfp4);
  EXPECT_EQ(L0.mlp.down_proj.global_op, model::quant::GlobalOp::kMultiply);
  EXPECT_EQ(L0.mlp.down_proj.input_scale, 0.0f);  // W4A16: no activation scale
  EXPECT_EQ(L0.linear.in_proj_qkv.format, model::quant::WeightFormat::kFp8);
  EXPECT_GT(L0.linear.in_proj_qkv.input_scale, 0.0f);  // FP8 W8A8: static activation scale
  EXPECT_EQ(L0.linear.in_proj_a.format, model::quant::WeightFormat::kFloat);  // unlisted: stored dtype
  EXPECT_EQ(L0.linear.in_proj_a.dtype, core::DType::kBF16);
  EXPECT_EQ(w->lm_head.format, model::quant::WeightFormat::kNvfp4);
  EXPECT_EQ(w->embed_tokens.format, model::quant::WeightFormat::kFloat);
  EXPECT_EQ(*w->lm_head.name, "lm_head.weight");
  // What a decoded token reads is less than the bf16 model would.
  EXPECT_LT(model::bytes_per_decoded_token(config_, *w), static_cast<uint64_t>(2 * w->parameter_count));
}

// ModelOpt quantizes a tied lm_head and exports it as lm_head.weight (NVFP4) + scales beside the bf16
// embedding, the config still tied: the checkpoint loads, the embedding is lm_head (transformers' and vLLM's
// reading of a tied config), and the copy is listed as not used.
TEST_F(QuantLoader, QuantizedCopyOfATiedLmHeadIsNotUsed) {
  use("modelopt_mixed_dense");
  edit_json("config.json", [](nlohmann::json& j) {
    j["tie_word_embeddings"] = true;
    if (j.contains("text_config")) j["text_config"]["tie_word_embeddings"] = true;
  });
  auto w = bind();
  ASSERT_TRUE(w.is_ok()) << w.message();
  EXPECT_EQ(w->lm_head.format, model::quant::WeightFormat::kFloat);
  EXPECT_EQ(w->lm_head.data, w->embed_tokens.data);
  std::vector<std::string> names = w->tied_lm_head_tensors;
  std::sort(names.begin(), names.end());
  ASSERT_GE(names.size(), 3u);
  EXPECT_EQ(names[0], "lm_head.weight");
  EXPECT_TRUE(std::find(names.begin(), names.end(), "lm_head.weight_scale") != names.end());
  EXPECT_TRUE(std::find(names.begin(), names.end(), "lm_head.weight_scale_2") != names.end());
  // Another unknown tensor is still an error.
  rewrite([](auto& ts) {
    ts.push_back({"lm_head_extra.weight", core::DType::kF32, {1}, std::vector<uint8_t>(4)});
  });
  EXPECT_TRUE(has(bind_error(), "unexpected tensor 'lm_head_extra.weight'"));
}

TEST_F(QuantLoader, CompressedTensorsDividesByTheGlobalScale) {
  use("ct_nvfp4a16_dense");
  auto w = bind();
  ASSERT_TRUE(w.is_ok()) << w.message();
  const auto& m = w->layers[0].mlp.up_proj;
  EXPECT_EQ(m.format, model::quant::WeightFormat::kNvfp4);
  EXPECT_EQ(m.global_op, model::quant::GlobalOp::kDivide);
  EXPECT_EQ(*m.name, "model.layers.0.mlp.up_proj.weight_packed");
}

TEST_F(QuantLoader, MissingScaleIsNamed) {
  use("modelopt_nvfp4_dense");
  rewrite([](auto& ts) {
    std::erase_if(ts, [](const auto& t) { return t.name == "model.layers.1.mlp.down_proj.weight_scale"; });
  });
  const std::string m = bind_error();
  EXPECT_TRUE(has(m,
                  "missing tensor 'model.layers.1.mlp.down_proj.weight_scale' (modelopt NVFP4, expected "
                  "F8_E4M3 [64, 8]"))
      << m;
}

TEST_F(QuantLoader, WrongScaleShapeIsNamedWithBothShapes) {
  use("qwen_fp8_dense");
  rewrite([](auto& ts) {
    for (auto& t : ts)
      if (t.name == "model.layers.1.self_attn.q_proj.weight_scale_inv") {
        t.shape = {1, 4};
        t.bytes.resize(8);
      }
  });
  const std::string m = bind_error();
  EXPECT_TRUE(
      has(m,
          "tensor 'model.layers.1.self_attn.q_proj.weight_scale_inv' has shape [1, 4], expected [4, 1] "
          "(fp8 block 128x128 block scales)"))
      << m;
}

TEST_F(QuantLoader, UnsupportedAlgorithmNamesTheTensorAndFormat) {
  use("modelopt_nvfp4_dense");
  edit_json("hf_quant_config.json", [](auto& j) { j["quantization"]["quant_algo"] = "INT4_AWQ"; });
  const std::string m = bind_error();
  EXPECT_TRUE(
      has(m,
          "model.safetensors: tensor 'model.layers.0.linear_attn.in_proj_qkv.weight': format modelopt "
          "INT4_AWQ is not supported"))
      << m;
}

TEST_F(QuantLoader, TensorThatContradictsTheConfigIsNamed) {
  use("ct_fp8dynamic_dense");
  // The config says in_proj_a stays float (ignored); make it FP8 on disk.
  rewrite([](auto& ts) {
    for (auto& t : ts)
      if (t.name == "model.layers.0.linear_attn.in_proj_a.weight") {
        t.dtype = core::DType::kF8E4M3;
        t.bytes.resize(t.bytes.size() / 2);
      }
  });
  std::string m = bind_error();
  EXPECT_TRUE(has(m, "tensor 'model.layers.0.linear_attn.in_proj_a.weight' has dtype F8_E4M3 but ") &&
              has(m, "leaves module 'model.layers.0.linear_attn.in_proj_a' unquantized"))
      << m;
  // And the other way: the config quantizes a module stored in bf16.
  use("ct_fp8dynamic_dense");
  edit_json("config.json", [](auto& j) { j["quantization_config"]["ignore"] = nlohmann::json::array(); });
  m = bind_error();
  EXPECT_TRUE(has(m, "tensor 'model.layers.0.linear_attn.in_proj_") && has(m, "has dtype BF16 but ") &&
              has(m, "gives module"))
      << m;
}

TEST_F(QuantLoader, QwenFp8ScalesInF32GiveTheSameModel) {
  // Qwen's cards store weight_scale_inv in BF16; transformers' FP8Linear allocates F32. Both load, same
  // values.
  use("qwen_fp8_dense");
  const std::vector<int32_t> ids = {3, 141, 59, 26, 535};
  auto run = [&](std::vector<float>& logits) {
    auto b = backend::cpu::CpuBackend::load(dir_);
    ASSERT_TRUE(b.is_ok()) << b.message();
    auto s = (*b)->new_sequence();
    ASSERT_TRUE(
        (*b)->forward(static_cast<backend::cpu::CpuSequenceState&>(*s), ids, false, true, logits).is_ok());
  };
  std::vector<float> bf16, f32;
  run(bf16);
  int converted = 0;
  rewrite([&](auto& ts) {
    for (auto& t : ts) {
      if (t.name.size() < 17 || t.name.compare(t.name.size() - 17, 17, ".weight_scale_inv") != 0) continue;
      ASSERT_EQ(t.dtype, core::DType::kBF16);
      std::vector<uint8_t> out(t.bytes.size() * 2);
      for (size_t i = 0; i < t.bytes.size() / 2; ++i) {
        uint16_t h;
        std::memcpy(&h, t.bytes.data() + 2 * i, 2);
        const float f = core::bf16_to_f32(h);
        std::memcpy(out.data() + 4 * i, &f, 4);
      }
      t.dtype = core::DType::kF32;
      t.bytes = std::move(out);
      ++converted;
    }
  });
  EXPECT_EQ(converted, 26);
  run(f32);
  ASSERT_FALSE(bf16.empty());
  EXPECT_EQ(bf16, f32);
}

TEST_F(QuantLoader, TensorParallelRefusesQuantizedWeights) {
  use("modelopt_w4a16_moe");
  auto w = bind();
  ASSERT_TRUE(w.is_ok()) << w.message();
  auto layout = model::shard_layout(config_, model::ShardSpec{0, 2});
  ASSERT_TRUE(layout.is_ok()) << layout.message();
  auto s = model::shard_weights(config_, *w, *layout);
  ASSERT_FALSE(s.is_ok());
  EXPECT_TRUE(
      has(s.message(), "is NVFP4 (E2M1, E4M3 g16 scales, x global); quantized weights are not sharded yet"))
      << s.message();
}

}  // namespace
}  // namespace deltaflow
