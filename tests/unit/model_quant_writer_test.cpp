// `deltaflow quantize` against the producers: on the same BF16 input (make-tiny seed 1) every tensor we write
// is byte-identical to ModelOpt 0.47's own W4A16_NVFP4 export (tests/fixtures/quant/modelopt_w4a16_moe) and
// to the Qwen FP8 block layout the generator wrote and transformers read back (qwen_fp8_dense); the result
// loads.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <map>

#include "backend/cpu/calibration.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "io/safetensors.hpp"
#include "model/config.hpp"
#include "model/quant/quantize.hpp"
#include "model/quant/writer.hpp"
#include "model/tiny_checkpoint.hpp"

namespace deltaflow {
namespace {

namespace fs = std::filesystem;

TEST(QuantQuantize, E4M3AndE2M1RoundingByHand) {
  using model::quant::e2m1_code;
  using model::quant::f32_to_e4m3;
  EXPECT_EQ(f32_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(0x1p-9f), 0x01);
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);     // halfway 1 and 1.125: even mantissa (1.0)
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3A);     // halfway 1.125 and 1.25: even (1.25)
  EXPECT_EQ(f32_to_e4m3(0x1.8p-10f), 0x01);  // 1.5 * 2^-10 = 0.75 of the smallest subnormal: rounds up
  EXPECT_EQ(f32_to_e4m3(0x1p-10f), 0x00);    // half the smallest subnormal: ties to even (0)
  EXPECT_EQ(f32_to_e4m3(-2.0f), 0xC0);
  // E2M1 (ModelOpt _cast_fp4): ties to even at every bound.
  const std::map<float, uint8_t> want = {{0.0f, 0}, {0.25f, 0}, {0.26f, 1}, {0.75f, 2}, {1.25f, 2},
                                         {1.3f, 3}, {1.75f, 4}, {2.5f, 4},  {2.6f, 5},  {3.5f, 6},
                                         {5.0f, 6}, {5.1f, 7},  {100.f, 7}, {-0.1f, 8}, {-6.0f, 15}};
  for (const auto& [x, c] : want) EXPECT_EQ(e2m1_code(x), c) << x;
}

class QuantWriter : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = (fs::temp_directory_path() / ("df_quant_writer_" + std::to_string(::getpid()))).string();
    fs::remove_all(base_);
  }
  void TearDown() override { fs::remove_all(base_); }

  // Every tensor of the fixture, byte for byte, and no other.
  void expect_same_tensors(const std::string& ours_dir, const std::string& fixture) {
    auto a = io::SafetensorsFile::open(ours_dir + "/model.safetensors");
    auto b = io::SafetensorsFile::open(std::string(DF_FIXTURES) + "/quant/" + fixture + "/model.safetensors");
    ASSERT_TRUE(a.is_ok()) << a.message();
    ASSERT_TRUE(b.is_ok()) << b.message();
    // The fixtures were exported from make-tiny checkpoints made before it wrote an MTP head; both producers
    // keep mtp.* as it is (ModelOpt excludes "mtp*"), and so do we: those tensors are left out here.
    std::map<std::string, const io::TensorEntry*> ours;
    for (const auto& e : (*a)->header().tensors)
      if (e.name.rfind("mtp.", 0) != 0) ours[e.name] = &e;
    EXPECT_EQ(ours.size(), (*b)->header().tensors.size());
    int differ = 0;
    for (const auto& e : (*b)->header().tensors) {
      auto it = ours.find(e.name);
      ASSERT_NE(it, ours.end()) << "missing " << e.name;
      const io::TensorEntry& o = *it->second;
      EXPECT_EQ(o.shape, e.shape) << e.name;
      if (o.dtype == core::DType::kF32 && e.dtype == core::DType::kBF16) {
        // The producer loaded the model in bf16, so the F32 vectors make-tiny stores (A_log, dt_bias) come
        // out as bf16 there; we copy them as stored. Same values after that rounding.
        for (int64_t i = 0; i < e.numel(); ++i)
          EXPECT_EQ(
              core::round_bf16(core::load_as_f32((*a)->tensor_data(o), o.dtype, static_cast<size_t>(i))),
              core::load_as_f32((*b)->tensor_data(e), e.dtype, static_cast<size_t>(i)))
              << e.name;
        continue;
      }
      EXPECT_EQ(core::dtype_name(o.dtype), core::dtype_name(e.dtype)) << e.name;
      if (o.end - o.begin != e.end - e.begin) continue;
      if (e.name.size() > 12 && e.name.compare(e.name.size() - 12, 12, ".input_scale") == 0) {
        // Static activation scales come from calibration: ModelOpt's bf16 forward pass and our fp32 one see
        // the same windows with slightly different activations. Within 1%.
        const float x = core::load_as_f32((*a)->tensor_data(o), o.dtype, 0),
                    y = core::load_as_f32((*b)->tensor_data(e), e.dtype, 0);
        EXPECT_NEAR(x, y, 0.01f * y) << e.name;
        continue;
      }
      if (std::memcmp((*a)->tensor_data(o), (*b)->tensor_data(e), e.end - e.begin) != 0 && ++differ <= 5)
        ADD_FAILURE() << e.name << " differs";
    }
    EXPECT_EQ(differ, 0);
  }
  std::string base_;
};

TEST_F(QuantWriter, Nvfp4IsBitIdenticalToModelOptsExport) {
  ASSERT_TRUE(model::write_tiny_checkpoint("moe", 1, base_ + "/bf16").is_ok());
  size_t last = 0, total = 0;
  auto st = model::quant::write_quantized_checkpoint(base_ + "/bf16", base_ + "/q", "nvfp4",
                                                     [&](size_t d, size_t t) { last = d, total = t; });
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(last, total);
  EXPECT_EQ(total, 152u);
  expect_same_tensors(base_ + "/q", "modelopt_w4a16_moe");
  EXPECT_TRUE(fs::exists(base_ + "/q/tokenizer.json"));
  auto b = backend::cpu::CpuBackend::load(base_ + "/q");
  ASSERT_TRUE(b.is_ok()) << b.message();
  EXPECT_EQ((*b)->config().quant.summary, "modelopt W4A16_NVFP4 (modelopt 0.47.0)");
}

// nvfp4-mixed (nvidia's Qwen3.6 NVFP4 recipe): calibrated on the windows ModelOpt saw, every weight and
// weight scale bit-identical to ModelOpt 0.47's MIXED_PRECISION export, input scales within 1%.
TEST_F(QuantWriter, Nvfp4MixedMatchesModelOptsExport) {
  ASSERT_TRUE(model::write_tiny_checkpoint("dense", 1, base_ + "/bf16").is_ok());
  std::ifstream in(std::string(DF_FIXTURES) + "/quant/modelopt_mixed_dense/calibration_ids.json");
  const auto j = nlohmann::json::parse(in);
  const auto windows = j["ids"].get<std::vector<std::vector<int32_t>>>();
  auto amax = backend::cpu::calibrate_input_amax(base_ + "/bf16", windows);
  ASSERT_TRUE(amax.is_ok()) << amax.message();
  EXPECT_EQ(amax->size(), 14u);  // 2 linear layers x 3 projections + 2 full-attention layers x 4
  EXPECT_FALSE(
      model::quant::write_quantized_checkpoint(base_ + "/bf16", base_ + "/q0", "nvfp4-mixed", nullptr)
          .is_ok());  // it needs the calibration
  auto st =
      model::quant::write_quantized_checkpoint(base_ + "/bf16", base_ + "/q", "nvfp4-mixed", nullptr, &*amax);
  ASSERT_TRUE(st.is_ok()) << st.message();
  expect_same_tensors(base_ + "/q", "modelopt_mixed_dense");
  auto b = backend::cpu::CpuBackend::load(base_ + "/q");
  ASSERT_TRUE(b.is_ok()) << b.message();
  EXPECT_NE((*b)->config().quant.summary.find("MIXED_PRECISION"), std::string::npos)
      << (*b)->config().quant.summary;
}

TEST_F(QuantWriter, Fp8BlockMatchesTheQwenLayout) {
  ASSERT_TRUE(model::write_tiny_checkpoint("dense", 1, base_ + "/bf16").is_ok());
  auto st = model::quant::write_quantized_checkpoint(base_ + "/bf16", base_ + "/q", "fp8-block", nullptr);
  ASSERT_TRUE(st.is_ok()) << st.message();
  expect_same_tensors(base_ + "/q", "qwen_fp8_dense");
  auto b = backend::cpu::CpuBackend::load(base_ + "/q");
  ASSERT_TRUE(b.is_ok()) << b.message();
}

// --method mse and gptq: the same tensors (names, dtypes, shapes) as the exact method in every format, MoE
// experts included, other bytes, and the result loads; gptq's statistics reach the experts.
TEST_F(QuantWriter, SearchAndGptqKeepTheLayout) {
  ASSERT_TRUE(model::write_tiny_checkpoint("moe", 1, base_ + "/bf16").is_ok());
  auto config = model::load_text_config(base_ + "/bf16");
  ASSERT_TRUE(config.is_ok());
  std::vector<std::vector<int32_t>> windows(2);
  for (int i = 0; i < 96; ++i)
    for (auto& w : windows)
      w.push_back(static_cast<int32_t>((i * 37 + w.size() * 11 + 5) % config->vocab_size));
  model::quant::InputAmax amax;
  model::quant::InputStats stats;
  ASSERT_TRUE(backend::cpu::calibrate(base_ + "/bf16", windows, &amax, &stats).is_ok());
  int expert_stats = 0;
  for (const auto& [module, gram] : stats) expert_stats += module.find(".mlp.experts.") != std::string::npos;
  EXPECT_GT(expert_stats, 0);
  const auto& g = stats.at("model.layers.0.mlp.shared_expert.down_proj");
  EXPECT_EQ(g.gram.size(), static_cast<size_t>(g.cols * g.cols));
  EXPECT_EQ(g.tokens, 192);
  for (const std::string format : {"nvfp4", "fp8-block", "nvfp4-mixed"}) {
    std::map<std::string, std::vector<uint8_t>> bytes;
    std::map<std::string, std::map<std::string, std::pair<std::string, std::vector<int64_t>>>> layout;
    for (const std::string method : {"exact", "mse", "gptq"}) {
      const std::string out = base_ + "/" + format + "-" + method;
      auto st = model::quant::write_quantized_checkpoint(base_ + "/bf16", out, format, nullptr, &amax,
                                                         {method, &stats});
      ASSERT_TRUE(st.is_ok()) << st.message();
      auto f = io::SafetensorsFile::open(out + "/model.safetensors");
      ASSERT_TRUE(f.is_ok()) << f.message();
      for (const auto& e : (*f)->header().tensors) {
        layout[method][e.name] = {std::string(core::dtype_name(e.dtype)), e.shape};
        const auto* p = static_cast<const uint8_t*>((*f)->tensor_data(e));
        if (e.name.find(".weight") != std::string::npos)
          bytes[method].insert(bytes[method].end(), p, p + (e.end - e.begin));
      }
      auto b = backend::cpu::CpuBackend::load(out);
      ASSERT_TRUE(b.is_ok()) << b.message();
    }
    EXPECT_EQ(layout["mse"], layout["exact"]) << format;
    EXPECT_EQ(layout["gptq"], layout["exact"]) << format;
    EXPECT_NE(bytes["mse"], bytes["exact"]) << format;
    EXPECT_NE(bytes["gptq"], bytes["mse"]) << format;
  }
  auto bad = model::quant::write_quantized_checkpoint(base_ + "/bf16", base_ + "/bad", "nvfp4", nullptr,
                                                      nullptr, {"awq", nullptr});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.message(), "method 'awq' is not supported (supported: exact, mse, gptq)");
}

TEST_F(QuantWriter, ErrorsAreOneLine) {
  ASSERT_TRUE(model::write_tiny_checkpoint("dense", 1, base_ + "/bf16").is_ok());
  auto f = model::quant::write_quantized_checkpoint(base_ + "/bf16", base_ + "/q", "int4", nullptr);
  ASSERT_FALSE(f.is_ok());
  EXPECT_EQ(f.message(), "format 'int4' is not supported (supported: nvfp4, nvfp4-mixed, fp8-block)");
  auto again = model::quant::write_quantized_checkpoint(std::string(DF_FIXTURES) + "/quant/qwen_fp8_dense",
                                                        base_ + "/q2", "nvfp4", nullptr);
  ASSERT_FALSE(again.is_ok());
  EXPECT_NE(again.message().find("already quantized (fp8 block 128x128)"), std::string::npos)
      << again.message();
}

}  // namespace
}  // namespace deltaflow
