// rope_parameters scaling (model/rope.cpp: linear, yarn with and without mscale) against transformers 5.17
// (tools/reference/make_rope_goldens.py): the make-tiny dense model with each case's rope_parameters, 300
// positions, several times the original context. Logits of every position: max |ours - ref| <= 5e-5 *
// max(1, max |ref|), the model goldens' bound. Each case also differs from the unscaled model by far more
// than that, so the scaling is really exercised.
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../golden_file.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "model/tiny_checkpoint.hpp"

namespace deltaflow {
namespace {

using testing_golden::GoldenFile;
using testing_golden::rel_err;

std::vector<float> logits_of(const std::string& dir, const std::vector<int32_t>& ids) {
  auto b = backend::cpu::CpuBackend::load(dir);
  EXPECT_TRUE(b.is_ok()) << b.message();
  if (!b.is_ok()) return {};
  auto s = (*b)->new_sequence();
  std::vector<float> logits;
  EXPECT_TRUE(
      (*b)->forward(static_cast<backend::cpu::CpuSequenceState&>(*s), ids, false, true, logits).is_ok());
  return logits;
}

class RopeScaling : public ::testing::TestWithParam<std::string> {};

TEST_P(RopeScaling, LogitsMatchTransformers) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("df_rope_" + GetParam() + "_" + std::to_string(::getpid())))
          .string();
  ASSERT_TRUE(model::write_tiny_checkpoint("dense", 1, dir).is_ok());
  GoldenFile g(std::string(DF_FIXTURES) + "/rope/" + GetParam() + ".safetensors");
  const auto ids = g.i32("ids");
  ASSERT_EQ(ids.size(), 300u);
  const auto plain = logits_of(dir, ids);

  nlohmann::json cfg;
  std::ifstream(dir + "/config.json") >> cfg;
  cfg["rope_parameters"] = nlohmann::json::parse(g.metadata("rope_parameters"));
  cfg["max_position_embeddings"] = 4 * 4096;
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  const auto scaled = logits_of(dir, ids);
  const auto ref = g.f32("logits");
  EXPECT_LE(rel_err(scaled, ref), 5e-5);
  EXPECT_GT(rel_err(plain, ref), 1e-2);  // without the scaling the logits are far off
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Cases, RopeScaling, ::testing::Values("yarn", "yarn_mscale", "linear"));

TEST(RopeScalingConfig, UnknownTypeAndMissingFieldsAreErrors) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("df_rope_cfg_" + std::to_string(::getpid()))).string();
  ASSERT_TRUE(model::write_tiny_checkpoint("dense", 1, dir).is_ok());
  nlohmann::json cfg;
  std::ifstream(dir + "/config.json") >> cfg;
  for (const auto& [rp, needle] : std::vector<std::pair<nlohmann::json, std::string>>{
           {{{"rope_type", "longrope"}}, "unsupported rope_type 'longrope'"},
           {{{"rope_type", "yarn"}, {"factor", 4.0}}, "needs 'original_max_position_embeddings'"}}) {
    cfg["rope_parameters"] = rp;
    std::ofstream(dir + "/config.json") << cfg.dump(2);
    auto b = backend::cpu::CpuBackend::load(dir);
    ASSERT_FALSE(b.is_ok());
    EXPECT_NE(b.message().find(needle), std::string::npos) << b.message();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace deltaflow
