// Loader errors at the model level: each broken checkpoint gives the message that names what is wrong and
// where.
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.hpp"
#include "io/safetensors.hpp"
#include "model/config.hpp"
#include "model/tiny_checkpoint.hpp"
#include "model/weights.hpp"

namespace deltaflow {
namespace {

namespace fs = std::filesystem;

class ModelLoader : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("df_model_loader_" + std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
    ASSERT_TRUE(model::write_tiny_checkpoint("dense", 3, dir_).is_ok());
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string load_error() {
    auto b = backend::cpu::CpuBackend::load(dir_);
    EXPECT_FALSE(b.is_ok());
    return b.is_ok() ? "" : b.message();
  }
  // Rewrites model.safetensors through `edit`.
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
  void edit_config(const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j;
    {
      std::ifstream in(dir_ + "/config.json");
      in >> j;
    }
    edit(j);
    std::ofstream(dir_ + "/config.json") << j.dump(2);
  }
  std::string dir_;
};

TEST_F(ModelLoader, LoadsTheUntouchedCheckpoint) {
  auto b = backend::cpu::CpuBackend::load(dir_);
  ASSERT_TRUE(b.is_ok()) << b.message();
  EXPECT_EQ((*b)->config().num_hidden_layers, 4);
}

TEST_F(ModelLoader, MissingTensorIsNamed) {
  rewrite([](auto& ts) {
    std::erase_if(ts, [](const auto& t) { return t.name == "model.layers.1.self_attn.k_proj.weight"; });
  });
  const std::string m = load_error();
  EXPECT_NE(m.find("missing tensor 'model.layers.1.self_attn.k_proj.weight'"), std::string::npos) << m;
  EXPECT_NE(m.find("expected shape [128, 64]"), std::string::npos) << m;
  EXPECT_NE(m.find("full_attention layer 1"), std::string::npos) << m;
}

TEST_F(ModelLoader, WrongShapeIsNamedWithBothShapes) {
  rewrite([](auto& ts) {
    for (auto& t : ts)
      if (t.name == "model.layers.0.linear_attn.in_proj_b.weight") {
        t.shape = {2, 128};  // same bytes, wrong shape
      }
  });
  const std::string m = load_error();
  EXPECT_NE(
      m.find("model.safetensors: tensor 'model.layers.0.linear_attn.in_proj_b.weight' has shape [2, 128], "
             "expected [4, 64]"),
      std::string::npos)
      << m;
}

TEST_F(ModelLoader, ExtraTensorIsRejected) {
  rewrite([](auto& ts) {
    ts.push_back({"model.layers.0.mystery.weight", core::DType::kF32, {2}, std::vector<uint8_t>(8)});
  });
  const std::string m = load_error();
  EXPECT_NE(m.find("unexpected tensor 'model.layers.0.mystery.weight'"), std::string::npos) << m;
}

TEST_F(ModelLoader, MtpHeadIsBound) {
  auto b = backend::cpu::CpuBackend::load(dir_);
  ASSERT_TRUE(b.is_ok()) << b.message();
  EXPECT_TRUE((*b)->weights().mtp.present);
  EXPECT_TRUE((*b)->weights().mtp_tensors.empty());
  EXPECT_GT((*b)->weights().mtp.bytes, 0u);
}

// A head without its decoder layer is recognised and left unbound (no drafting), like a vision tower.
TEST_F(ModelLoader, PartialMtpHeadAndVisualTensorsAreRecognised) {
  rewrite([](auto& ts) {
    std::erase_if(ts, [](const auto& t) { return t.name.rfind("mtp.layers.", 0) == 0; });
    ts.push_back({"model.visual.blocks.0.attn.qkv.weight", core::DType::kF32, {2}, std::vector<uint8_t>(8)});
  });
  auto b = backend::cpu::CpuBackend::load(dir_);
  ASSERT_TRUE(b.is_ok()) << b.message();
  EXPECT_FALSE((*b)->weights().mtp.present);
  EXPECT_FALSE((*b)->can_draft());
  EXPECT_EQ((*b)->weights().mtp_tensors.size(), 4u);  // the norms, fc and the final norm
  EXPECT_EQ((*b)->weights().visual_tensors.size(), 1u);
}

TEST_F(ModelLoader, QuantizedDtypeIsAClearError) {
  rewrite([](auto& ts) {
    for (auto& t : ts)
      if (t.name == "model.layers.0.mlp.up_proj.weight") {
        t.dtype = core::DType::kI8;
        t.bytes.resize(t.bytes.size() / 2);
      }
  });
  const std::string m = load_error();
  EXPECT_NE(m.find("'model.layers.0.mlp.up_proj.weight' has dtype I8, expected BF16, F16 or F32"),
            std::string::npos)
      << m;
}

TEST_F(ModelLoader, UnknownModelTypeIsNamed) {
  edit_config([](auto& j) { j["model_type"] = "llama"; });
  const std::string m = load_error();
  EXPECT_NE(m.find("config.json: unsupported model_type 'llama'"), std::string::npos) << m;
}

TEST_F(ModelLoader, MissingConfigFieldIsNamed) {
  edit_config([](auto& j) { j.erase("hidden_size"); });
  EXPECT_NE(load_error().find("missing field 'hidden_size'"), std::string::npos);
}

TEST_F(ModelLoader, WrongTypeConfigFieldIsNamed) {
  edit_config([](auto& j) { j["num_attention_heads"] = "four"; });
  EXPECT_NE(load_error().find("field 'num_attention_heads': not an integer"), std::string::npos);
}

TEST_F(ModelLoader, LayerTypesLengthMustMatch) {
  edit_config([](auto& j) { j["layer_types"] = {"linear_attention", "full_attention"}; });
  EXPECT_NE(load_error().find("'layer_types' has 2 entries but num_hidden_layers is 4"), std::string::npos);
}

TEST_F(ModelLoader, TruncatedWeightsFileIsAnError) {
  const auto p = dir_ + "/model.safetensors";
  fs::resize_file(p, fs::file_size(p) - 100);
  const std::string m = load_error();
  EXPECT_NE(m.find("model.safetensors"), std::string::npos) << m;
}

TEST_F(ModelLoader, LayerPatternFromIntervalAndList) {
  auto c = model::parse_text_config(
      R"({"model_type":"qwen3_5_text","vocab_size":8,"hidden_size":8,"intermediate_size":8,"num_hidden_layers":8,
          "num_attention_heads":2,"num_key_value_heads":1,"head_dim":8})",
      "cfg");
  ASSERT_TRUE(c.is_ok()) << c.message();
  std::string pat;
  for (auto t : c->layer_types) pat += t == model::LayerType::kFullAttention ? 'F' : 'L';
  EXPECT_EQ(pat, "LLLFLLLF");  // default full_attention_interval 4: layers 3, 7
  EXPECT_DOUBLE_EQ(c->partial_rotary_factor, 0.25);
}

TEST_F(ModelLoader, MultimodalConfigReadsTextConfig) {
  auto c = model::parse_text_config(
      R"({"model_type":"qwen3_5_moe","tie_word_embeddings":false,"text_config":{"vocab_size":8,"hidden_size":8,
          "num_hidden_layers":2,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":8,"num_experts":4,
          "num_experts_per_tok":2,"moe_intermediate_size":4,"shared_expert_intermediate_size":4,
          "layer_types":["linear_attention","full_attention"],
          "rope_parameters":{"rope_type":"default","rope_theta":10000000,"partial_rotary_factor":0.5,
                             "mrope_section":[1,1,0],"mrope_interleaved":true}}})",
      "cfg");
  ASSERT_TRUE(c.is_ok()) << c.message();
  EXPECT_TRUE(c->multimodal_layout);
  EXPECT_EQ(c->architecture, model::Architecture::kQwen35Moe);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e7);
  EXPECT_DOUBLE_EQ(c->partial_rotary_factor, 0.5);
  EXPECT_EQ(c->mrope_section, (std::vector<int64_t>{1, 1, 0}));
}

TEST(MakeTiny, SameSeedSameBytesOtherSeedOtherBytes) {
  const auto base = fs::temp_directory_path() / ("df_make_tiny_" + std::to_string(::getpid()));
  for (const auto& preset : model::tiny_presets()) {
    ASSERT_TRUE(model::write_tiny_checkpoint(preset, 5, (base / "a").string()).is_ok());
    ASSERT_TRUE(model::write_tiny_checkpoint(preset, 5, (base / "b").string()).is_ok());
    ASSERT_TRUE(model::write_tiny_checkpoint(preset, 6, (base / "c").string()).is_ok());
    auto read = [](const fs::path& p) {
      std::ifstream in(p, std::ios::binary);
      return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    };
    for (const auto& e : fs::directory_iterator(base / "a")) {
      const auto name = e.path().filename();
      EXPECT_EQ(read(e.path()), read(base / "b" / name)) << preset << " " << name;
    }
    const std::string w = preset == "multimodal" ? "model-00001-of-00002.safetensors" : "model.safetensors";
    EXPECT_NE(read(base / "a" / w), read(base / "c" / w)) << preset;
    auto b = backend::cpu::CpuBackend::load((base / "a").string());
    EXPECT_TRUE(b.is_ok()) << preset << ": " << b.message();
    fs::remove_all(base);
  }
}

TEST(MakeTiny, UnknownPresetListsThePresets) {
  auto s = model::write_tiny_checkpoint("huge", 1, "/tmp/unused");
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.message(),
            "unknown preset 'huge' (presets: dense, moe, tied, multimodal, next, vl, long, moe64)");
}

}  // namespace
}  // namespace deltaflow
