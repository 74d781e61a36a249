// The tensor-parallel split on the host (model/tensor_parallel.hpp), on make-tiny checkpoints: which sizes
// divide, and that the ranks' slices put back together are the whole weights (exact byte equality).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "io/safetensors.hpp"
#include "model/tensor_parallel.hpp"
#include "model/tiny_checkpoint.hpp"

namespace deltaflow::model {
namespace {

struct Tiny {
  explicit Tiny(const std::string& preset) {
    dir = (std::filesystem::temp_directory_path() / ("df_tp_unit_" + preset + std::to_string(::getpid())))
              .string();
    EXPECT_TRUE(write_tiny_checkpoint(preset, 1, dir).is_ok());
    auto c = load_text_config(dir);
    EXPECT_TRUE(c.is_ok());
    config = *c;
    auto k = io::Checkpoint::open(dir);
    EXPECT_TRUE(k.is_ok());
    ck.emplace(std::move(*k));
    auto w = bind_weights(config, *ck);
    EXPECT_TRUE(w.is_ok()) << w.message();
    weights = std::move(*w);
  }
  ~Tiny() { std::filesystem::remove_all(dir); }
  std::string dir;
  TextConfig config;
  std::optional<io::Checkpoint> ck;
  ModelWeights weights;
};

std::vector<uint8_t> rows_of(const Mat& m, int64_t first, int64_t count) {
  const auto* p = static_cast<const uint8_t*>(m.row(first));
  return {p, p + static_cast<size_t>(count) * m.row_bytes()};
}
std::vector<uint8_t> all(const Mat& m) {
  return rows_of(m, 0, m.rows);
}
// Columns [c0, c0 + n) of m, row by row.
std::vector<uint8_t> cols_of(const Mat& m, int64_t c0, int64_t n) {
  std::vector<uint8_t> out;
  const size_t es = core::dtype_size(m.dtype);
  for (int64_t r = 0; r < m.rows; ++r) {
    const auto* p = static_cast<const uint8_t*>(m.row(r)) + static_cast<size_t>(c0) * es;
    out.insert(out.end(), p, p + static_cast<size_t>(n) * es);
  }
  return out;
}

class Split : public ::testing::TestWithParam<std::string> {};

TEST_P(Split, SlicesReassembleTheWholeModel) {
  Tiny t(GetParam());
  const TextConfig& c = t.config;
  for (int world : {1, 2, 4}) {
    for (int rank = 0; rank < world; ++rank) {
      auto l = shard_layout(c, {rank, world});
      ASSERT_TRUE(l.is_ok()) << l.message();
      const TextConfig lc = shard_config(c, *l);
      EXPECT_EQ(lc.vocab_size * world, c.vocab_size);
      EXPECT_EQ(lc.linear_num_value_heads * world, c.linear_num_value_heads);
      EXPECT_EQ(lc.num_attention_heads * world, c.num_attention_heads);
      auto s = shard_weights(c, t.weights, *l);
      ASSERT_TRUE(s.is_ok()) << s.message();
      EXPECT_EQ(all(s->embed_tokens), rows_of(t.weights.embed_tokens, l->vocab.first, l->vocab.count));
      const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim, nk = c.linear_num_key_heads;
      const int64_t hd = c.head_dim, qw = c.attn_output_gate ? 2 * hd : hd;
      for (size_t i = 0; i < t.weights.layers.size(); ++i) {
        const auto &W = t.weights.layers[i], &S = s->layers[i];
        if (W.type == LayerType::kLinearAttention) {
          const auto kh = l->lin_k_heads, vh = l->lin_v_heads;
          auto want = rows_of(W.linear.in_proj_qkv, kh.first * dk, kh.count * dk);
          auto k = rows_of(W.linear.in_proj_qkv, nk * dk + kh.first * dk, kh.count * dk);
          auto v = rows_of(W.linear.in_proj_qkv, 2 * nk * dk + vh.first * dv, vh.count * dv);
          want.insert(want.end(), k.begin(), k.end());
          want.insert(want.end(), v.begin(), v.end());
          EXPECT_EQ(all(S.linear.in_proj_qkv), want) << "layer " << i;
          EXPECT_EQ(all(S.linear.out_proj), cols_of(W.linear.out_proj, vh.first * dv, vh.count * dv));
          EXPECT_EQ(all(S.linear.A_log), cols_of(W.linear.A_log, vh.first, vh.count));
          EXPECT_EQ(S.linear.conv1d.rows, lc.linear_conv_dim());
        } else {
          const auto qh = l->q_heads, kvh = l->kv_heads;
          EXPECT_EQ(all(S.attn.q_proj), rows_of(W.attn.q_proj, qh.first * qw, qh.count * qw));
          EXPECT_EQ(all(S.attn.k_proj), rows_of(W.attn.k_proj, kvh.first * hd, kvh.count * hd));
          EXPECT_EQ(all(S.attn.o_proj), cols_of(W.attn.o_proj, qh.first * hd, qh.count * hd));
        }
        if (!W.is_moe) {
          EXPECT_EQ(all(S.mlp.down_proj), cols_of(W.mlp.down_proj, l->inter.first, l->inter.count));
        } else {
          ASSERT_EQ(S.moe.experts.size(), W.moe.experts.size());
          EXPECT_EQ(all(S.moe.router), all(W.moe.router));
          EXPECT_EQ(all(S.moe.experts[1].up_proj),
                    rows_of(W.moe.experts[1].up_proj, l->moe_inter.first, l->moe_inter.count));
          EXPECT_EQ(all(S.moe.shared_expert.down_proj),
                    cols_of(W.moe.shared_expert.down_proj, l->shared_inter.first, l->shared_inter.count));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, Split, ::testing::Values("dense", "moe", "tied", "multimodal", "next"));

TEST(TensorParallelLayout, ReplicatesKvHeadsAndRejectsWhatDoesNotDivide) {
  Tiny t("dense");  // 4 query heads, 2 KV heads, 2 DeltaNet key heads, 4 value heads
  auto l = shard_layout(t.config, {3, 4});
  ASSERT_TRUE(l.is_ok()) << l.message();
  EXPECT_EQ(l->kv_heads.first, 1);  // ranks 2 and 3 share KV head 1
  EXPECT_EQ(l->kv_heads.count, 1);
  EXPECT_EQ(l->lin_k_heads.first, 1);
  EXPECT_EQ(l->q_heads.first, 3);
  auto bad = shard_layout(t.config, {0, 3});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.message().find("not divisible"), std::string::npos) << bad.message();
  EXPECT_FALSE(shard_layout(t.config, {8, 8}).is_ok());  // rank outside the world
}

}  // namespace
}  // namespace deltaflow::model
