// The config-only parameter counts the benchmarks' rooflines use (model/param_counts.hpp), on the full-size
// configs of bench/configs: the matmul weights plus the embedding come to the parameter counts the model
// cards state (within the norms, convolutions and gates they leave out), and the distinct experts a MoE step
// reads go from num_experts_per_tok at one row towards num_experts.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "model/config.hpp"
#include "model/param_counts.hpp"

namespace deltaflow::model {
namespace {

TextConfig bench_config(const std::string& name) {
  const std::string path = std::string(DF_SOURCE_DIR) + "/bench/configs/" + name;
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  auto c = parse_text_config(ss.str(), path);
  EXPECT_TRUE(c.is_ok()) << c.message();
  return c.is_ok() ? *c : TextConfig{};
}

double total(const TextConfig& c, const ParamCounts& m) {
  const double embed = static_cast<double>(c.vocab_size * c.hidden_size);
  return m.dense + m.expert * m.moe_layers * static_cast<double>(c.num_experts) + m.lm_head +
         (c.tie_word_embeddings ? 0.0 : embed);
}

TEST(ModelParamCounts, FullSizeConfigsAddUpToTheirParameterCounts) {
  const TextConfig dense = bench_config("qwen3.6-27b.json");
  const ParamCounts d = count_params(dense);
  EXPECT_EQ(d.moe_layers, 0);
  EXPECT_NEAR(total(dense, d) / 1e9, 26.9, 0.3);  // 53.8 GB of bf16 weights, as `inspect` plans
  EXPECT_DOUBLE_EQ(d.kv_per_token, 16 * 2 * 4 * 256);
  EXPECT_DOUBLE_EQ(d.state_bytes, 48 * (48.0 * 128 * 128 + 10240.0 * 3) * 4);
  EXPECT_EQ(distinct_experts(dense, 64), 0.0);

  const TextConfig moe = bench_config("qwen3.5-35b-a3b.json");
  const ParamCounts m = count_params(moe);
  EXPECT_EQ(m.moe_layers, 40);
  EXPECT_DOUBLE_EQ(m.expert, 3.0 * 512 * 2048);
  EXPECT_NEAR(total(moe, m) / 1e9, 34.7, 0.3);  // 69.3 GB of bf16 weights
}

TEST(ModelParamCounts, DistinctExpertsGrowFromTopKTowardsAll) {
  const TextConfig moe = bench_config("qwen3.5-35b-a3b.json");
  EXPECT_NEAR(distinct_experts(moe, 1), 8.0, 1e-9);
  double last = 8.0;
  for (double rows : {2.0, 8.0, 23.0, 64.0, 256.0}) {
    const double e = distinct_experts(moe, rows);
    EXPECT_GT(e, last) << rows;
    EXPECT_LT(e, 256.0) << rows;
    last = e;
  }
  EXPECT_NEAR(distinct_experts(moe, 23), 132.66, 0.01);  // about half the experts at 23 rows
  EXPECT_NEAR(distinct_experts(moe, 4096), 256.0, 1e-6);
}

}  // namespace
}  // namespace deltaflow::model
