// The CPU vision encoder against transformers 5.17 Qwen3_5VisionModel on the make-tiny vl checkpoint
// (tools/reference/make_vision_goldens.py): one image, two images of different sizes, three images.
//
// Tolerance: both sides compute in fp32 over the same bf16 weights; only the order of operations differs.
// Embeddings and merged rows: max |ours - ref| <= 2e-5 * max(1, max |ref|) (largest seen: 1.6e-6).
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "../golden_file.hpp"
#include "../vision_goldens.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/vision_encoder.hpp"
#include "io/safetensors.hpp"
#include "model/tiny_checkpoint.hpp"
#include "model/vision_config.hpp"
#include "model/vision_weights.hpp"

namespace deltaflow {
namespace {

using testing_vision::VisionGoldens;

constexpr double kTol = 2e-5;

using testing_golden::rel_err;

class VisionEncoder : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        (std::filesystem::temp_directory_path() / ("df_vision_enc_" + std::to_string(::getpid()))).string();
    ASSERT_TRUE(model::write_tiny_checkpoint("vl", 1, dir_).is_ok());
    auto c = model::load_vision_config(dir_);
    ASSERT_TRUE(c.is_ok()) << c.message();
    config_ = *c;
    auto ck = io::Checkpoint::open(dir_);
    ASSERT_TRUE(ck.is_ok()) << ck.message();
    ck_ = std::make_unique<io::Checkpoint>(std::move(ck).value());
    auto w = model::bind_vision_weights(config_, *ck_);
    ASSERT_TRUE(w.is_ok()) << w.message();
    weights_ = std::move(w).value();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string dir_;
  model::VisionConfig config_;
  std::unique_ptr<io::Checkpoint> ck_;
  model::VisionWeights weights_;
};

TEST_F(VisionEncoder, ConfigOfTheVlPreset) {
  EXPECT_EQ(config_.depth, 2);
  EXPECT_EQ(config_.hidden_size, 32);
  EXPECT_EQ(config_.out_hidden_size, 64);
  EXPECT_EQ(config_.num_grid_per_side(), 16);
  EXPECT_EQ(config_.image_token_id, 1010);
  EXPECT_EQ(config_.vision_start_token_id, 1007);
  EXPECT_EQ(weights_.prefix, "model.visual.");
  EXPECT_EQ(weights_.blocks.size(), 2u);
}

TEST_F(VisionEncoder, MatchesTransformers) {
  const auto& g = VisionGoldens::get();
  ASSERT_TRUE(g.ok()) << g.error;
  // The case order of the goldens' metadata: the encoder sets name cases by index.
  const std::vector<std::string> cases = {"rgb_67x45.png",  "photo_80x50.jpg", "lossy_50x34.webp",
                                          "gray_31x17.jpg", "synth_300x400",   "synth_100x150",
                                          "synth_37x1000",  "synth_64x64"};
  for (const char* set : {"one", "two", "three"}) {
    SCOPED_TRACE(set);
    const auto idx = g.read<int64_t>(std::string("encoder/") + set + "/input_cases");
    ASSERT_FALSE(idx.empty());
    std::vector<float> pixels;
    std::vector<model::VisionGrid> grids;
    for (int64_t i : idx) {
      const std::string name = cases[static_cast<size_t>(i)];
      const auto gr = g.read<int64_t>("grid/" + name);
      ASSERT_EQ(gr.size(), 3u);
      grids.push_back({gr[0], gr[1], gr[2]});
      std::vector<float> px;
      if (g.find("pixels/" + name)) {
        px = g.read<float>("pixels/" + name);
      } else {
        // Cases too large to commit as pixel values: rebuild them from the committed resized image, which
        // the preprocess test holds exact to transformers.
        std::vector<int64_t> shape;
        const auto rgb = g.read<uint8_t>("resized/" + name, &shape);
        const int64_t H = shape[0], W = shape[1], P = 16, M = 2;
        for (int64_t bh = 0; bh < H / P / M; ++bh)
          for (int64_t bw = 0; bw < W / P / M; ++bw)
            for (int64_t mh = 0; mh < M; ++mh)
              for (int64_t mw = 0; mw < M; ++mw)
                for (int ch = 0; ch < 3; ++ch)
                  for (int t = 0; t < 2; ++t)
                    for (int64_t py = 0; py < P; ++py)
                      for (int64_t px2 = 0; px2 < P; ++px2) {
                        const int64_t y = (bh * M + mh) * P + py, x = (bw * M + mw) * P + px2;
                        px.push_back(
                            (static_cast<float>(rgb[static_cast<size_t>((y * W + x) * 3 + ch)]) - 127.5f) /
                            127.5f);
                      }
      }
      pixels.insert(pixels.end(), px.begin(), px.end());
    }
    backend::cpu::VisionTrace trace;
    auto out = backend::cpu::encode_images(config_, weights_, pixels, grids, &trace);
    ASSERT_TRUE(out.is_ok()) << out.message();
    const double e_emb =
        rel_err(trace.embeddings, g.read<float>(std::string("encoder/") + set + "/embeddings"));
    const double e_out = rel_err(*out, g.read<float>(std::string("encoder/") + set + "/merged"));
    std::printf("[ %s ] embeddings rel err %.3g, merged rel err %.3g\n", set, e_emb, e_out);
    EXPECT_LE(e_emb, kTol);
    EXPECT_LE(e_out, kTol);
    int64_t tokens = 0;
    for (const auto& gr : grids) tokens += gr.t * gr.h * gr.w / 4;
    EXPECT_EQ(static_cast<int64_t>(out->size()), tokens * config_.out_hidden_size);
  }
}

// Two frames in one grid (t = 2): attention stays within each frame, positions repeat per frame.
TEST_F(VisionEncoder, TwoFrameGridMatchesTransformers) {
  const auto& g = VisionGoldens::get();
  ASSERT_TRUE(g.ok()) << g.error;
  const auto gr = g.read<int64_t>("encoder/frames/grid");
  ASSERT_EQ(gr.size(), 3u);
  const int64_t n = gr[0] * gr[1] * gr[2];
  std::vector<float> px(static_cast<size_t>(n * 1536));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < 1536; ++j)
      px[static_cast<size_t>(i * 1536 + j)] = static_cast<float>((i * 37 + j * 11) % 255) / 127.5f - 1.0f;
  backend::cpu::VisionTrace trace;
  auto out = backend::cpu::encode_images(config_, weights_, px,
                                         std::vector<model::VisionGrid>{{gr[0], gr[1], gr[2]}}, &trace);
  ASSERT_TRUE(out.is_ok()) << out.message();
  EXPECT_LE(rel_err(trace.embeddings, g.read<float>("encoder/frames/embeddings")), kTol);
  EXPECT_LE(rel_err(*out, g.read<float>("encoder/frames/merged")), kTol);
}

TEST_F(VisionEncoder, BadInputsAreErrors) {
  std::vector<float> px(4 * 1536, 0.0f);
  EXPECT_EQ(
      backend::cpu::encode_images(config_, weights_, px, std::vector<model::VisionGrid>{{1, 2, 4}}).message(),
      "vision encoder: 6144 pixel values, the grids need 8 rows of 1536");
  EXPECT_EQ(
      backend::cpu::encode_images(config_, weights_, px, std::vector<model::VisionGrid>{{1, 1, 4}}).message(),
      "vision encoder: grid 1x1x4 is not a positive multiple of the merge size 2");
}

// tests/fixtures/vision/logits.safetensors holds Qwen3_5ForConditionalGeneration logits for prompts with
// images, for the engine once images reach the language model. Until then, the text before the first image
// (plain positions p, p, p) must already match our text model: this pins the fixture to this checkpoint.
TEST_F(VisionEncoder, ImagePromptLogitsMatchOurTextModelBeforeTheFirstImage) {
  auto f = io::SafetensorsFile::open(testing_vision::fixture_dir() + "/logits.safetensors");
  ASSERT_TRUE(f.is_ok()) << f.message();
  auto tensor = [&](const std::string& name) -> const io::TensorEntry* {
    for (const auto& e : (*f)->header().tensors)
      if (e.name == name) return &e;
    return nullptr;
  };
  auto b = backend::cpu::CpuBackend::load(dir_);
  ASSERT_TRUE(b.is_ok()) << b.message();
  for (const char* name : {"one", "two"}) {
    SCOPED_TRACE(name);
    const auto* ids_e = tensor(std::string("ids/") + name);
    const auto* lg_e = tensor(std::string("logits/") + name);
    ASSERT_TRUE(ids_e && lg_e);
    std::vector<int32_t> ids(static_cast<size_t>(ids_e->numel()));
    std::memcpy(ids.data(), (*f)->tensor_data(*ids_e), ids.size() * 4);
    size_t prefix = 0;
    while (prefix < ids.size() && ids[prefix] != config_.image_token_id) ++prefix;
    ASSERT_GT(prefix, 1u);
    ASSERT_LT(prefix, ids.size());
    const int64_t V = lg_e->shape[1];
    std::vector<float> ref(prefix * static_cast<size_t>(V));
    std::memcpy(ref.data(), (*f)->tensor_data(*lg_e), ref.size() * 4);
    auto seq = (*b)->new_sequence();
    std::vector<float> ours;
    ASSERT_TRUE((*b)->forward(static_cast<backend::cpu::CpuSequenceState&>(*seq),
                              std::span<const int32_t>(ids.data(), prefix), false, true, ours)
                    .is_ok());
    EXPECT_LE(rel_err(ours, ref), 5e-5);  // the text-model tolerance of model_goldens_test.cpp
  }
}

TEST(VisionConfigParse, FieldsAndErrors) {
  auto c = model::parse_vision_config(
      R"({"vision_config": {"depth": 27, "hidden_size": 1152, "num_heads": 16, "patch_size": [16, 16],
          "deepstack_visual_indexes": [], "out_hidden_size": 5120}, "image_token_id": 248056})",
      "c.json");
  ASSERT_TRUE(c.is_ok()) << c.message();
  EXPECT_EQ(c->head_dim(), 72);
  EXPECT_EQ(c->patch_dim(), 1536);
  EXPECT_EQ(c->num_grid_per_side(), 48);
  EXPECT_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(
      model::parse_vision_config(R"({"vision_config": {"deepstack_visual_indexes": [8, 16]}})", "c.json")
          .message(),
      "c.json: vision_config: deepstack_visual_indexes is not empty; deepstack (Qwen3-VL) is not supported");
  EXPECT_EQ(model::parse_vision_config(R"({"vision_config": {"num_position_embeddings": 2300}})", "c.json")
                .message(),
            "c.json: vision_config: num_position_embeddings 2300 is not a square");
  EXPECT_EQ(model::parse_vision_config(R"({"vision_config": {"hidden_act": "silu"}})", "c.json").message(),
            "c.json: vision_config: hidden_act 'silu' is not supported (expected gelu_pytorch_tanh)");
  EXPECT_EQ(model::parse_vision_config(R"({"vision_config": {"patch_size": [16, 14]}})", "c.json").message(),
            "c.json: vision_config: field 'patch_size' must be an integer or a list of equal integers");
}

TEST(VisionWeights, ATextOnlyCheckpointNamesTheMissingVisionTower) {
  const auto dir =
      (std::filesystem::temp_directory_path() / ("df_vision_noweights_" + std::to_string(::getpid())))
          .string();
  ASSERT_TRUE(model::write_tiny_checkpoint("dense", 1, dir).is_ok());
  EXPECT_EQ(model::load_vision_config(dir).message(),
            dir + "/config.json: no 'vision_config' (a text-only model has no vision tower)");
  auto ck = io::Checkpoint::open(dir);
  ASSERT_TRUE(ck.is_ok());
  auto w = model::bind_vision_weights(model::VisionConfig{}, *ck);
  ASSERT_FALSE(w.is_ok());
  EXPECT_EQ(w.message(), dir +
                             ": no vision tower: missing tensor 'model.visual.patch_embed.proj.weight' (this "
                             "checkpoint has no trained vision encoder, so it cannot take images)");
  std::filesystem::remove_all(dir);
}

TEST(VisionWeights, AStubTowerIsAnErrorNamingTheTensor) {
  // The multimodal preset carries only a patch embedding in the real names.
  const auto dir =
      (std::filesystem::temp_directory_path() / ("df_vision_stub_" + std::to_string(::getpid()))).string();
  ASSERT_TRUE(model::write_tiny_checkpoint("multimodal", 1, dir).is_ok());
  auto c = model::load_vision_config(dir);
  ASSERT_TRUE(c.is_ok()) << c.message();
  auto ck = io::Checkpoint::open(dir);
  ASSERT_TRUE(ck.is_ok());
  auto w = model::bind_vision_weights(*c, *ck);
  ASSERT_FALSE(w.is_ok());
  EXPECT_EQ(w.message(),
            dir + ": missing vision tensor 'model.visual.pos_embed.weight' (expected shape [2304, 32])");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace deltaflow
