// backend::estimate_memory_plan: the CUDA backend's memory plan from the config alone (what `inspect`
// prints). Exact byte counts, worked out by hand for Qwen3.6-27B and from the shapes for the tiny presets.
// (The gpu test CudaMemoryPlan holds them equal to what CudaBackend really allocates.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "backend/memory_plan.hpp"
#include "model/config.hpp"
#include "model/tiny_checkpoint.hpp"

namespace deltaflow::backend {
namespace {

model::TextConfig qwen36_27b() {
  std::ifstream f(std::string(DF_SOURCE_DIR) + "/bench/configs/qwen3.6-27b.json");
  std::stringstream ss;
  ss << f.rdbuf();
  auto c = model::parse_text_config(ss.str(), "qwen3.6-27b.json");
  EXPECT_TRUE(c.is_ok()) << c.message();
  return c.is_ok() ? *c : model::TextConfig{};
}

TEST(MemoryPlan, Qwen36_27bByHand) {
  const auto c = qwen36_27b();
  ASSERT_EQ(c.num_hidden_layers, 64);
  const auto p = estimate_memory_plan(c, {});
  // 16 full-attention layers x K and V x 4 kv heads x 256 dims x 2 bytes (bf16).
  EXPECT_EQ(p.kv_bytes_per_token, 16u * 2 * 4 * 256 * 2);
  EXPECT_EQ(p.kv_bytes_per_token, 65536u);
  // Defaults: 4 sequences + 1 scratch slot, min(262144, 32768) positions.
  EXPECT_EQ(p.slots, 5);
  EXPECT_EQ(p.max_context, 32768);
  EXPECT_EQ(p.kv, 5ull * 32768 * 65536);  // 10 GiB
  // 48 linear layers: conv state conv_dim (2*16*128 + 48*128 = 10240) x (4 - 1), fp32 state 48 x 128 x 128.
  EXPECT_EQ(p.state_bytes_per_sequence, 48ull * (10240 * 3 + 48 * 128 * 128) * 4);
  EXPECT_EQ(p.state_bytes_per_sequence, 156893184u);
  EXPECT_EQ(p.states, 5ull * 156893184);
  // Matrices (bf16): embed + lm_head 2 x 248320 x 5120; per linear layer in_proj (10240 + 6144 + 96) x 5120
  // and out_proj 5120 x 6144; per full layer q/k/v (24 x 512 + 2 x 4 x 256) x 5120 and o_proj 5120 x 6144;
  // per layer gate/up 2 x 17408 x 5120 and down 5120 x 17408: 26,893,352,960 parameters, 53,786,705,920
  // bytes. fp32 vectors, each padded to 256 bytes: final norm 20480, inv_freq 128 -> 256, 2 norms x 20480 per
  // layer, per linear layer conv 163840 + dt_bias 192 -> 256 + A_log 256 + norm 512, per full layer 2 x 1024:
  // 10,588,416 bytes.
  EXPECT_EQ(p.weights, 53786705920ull + 10588416ull);
  EXPECT_FALSE(p.kv_f32);
  EXPECT_EQ(p.total(), p.weights + p.kv + p.states + p.workspace + p.gemm_workspace);
}

// Speculative decoding (MemoryPlanOptions::mtp): the MTP head's weights, by hand for Qwen3.6-27B, and with
// drafting pools its layer's KV in each page and the drafting buffers.
TEST(MemoryPlan, Qwen36_27bMtpHeadByHand) {
  const auto c = qwen36_27b();
  MemoryPlanOptions o;
  const auto plain = estimate_memory_plan(c, o);
  o.mtp = true;
  const auto head = estimate_memory_plan(c, o);
  // Matrices (bf16): fc 5120 x 10240, the layer's q/k/v (24 x 512 + 2 x 4 x 256) x 5120, o_proj 5120 x 6144,
  // gate/up 2 x 17408 x 5120, down 5120 x 17408; fp32 vectors: 2 pre-fc norms, 2 layer norms, q/k norms
  // 1024 each, the head's norm (20480 each).
  const uint64_t matrices = 2ull * (5120ull * 10240 + (24ull * 512 + 2 * 4 * 256) * 5120 + 5120ull * 6144 +
                                    2ull * 17408 * 5120 + 5120ull * 17408);
  EXPECT_EQ(head.weights - plain.weights, matrices + 5 * 20480 + 2 * 1024);
  EXPECT_EQ(head.kv, plain.kv);  // no drafting pools: no MTP KV
  EXPECT_EQ(head.draft, 0u);
  // fc's [embedding | hidden] rows of 2 x 5120 are the widest matmul input now (they were gate/up's 17408
  // for down_proj: no change in the 16-bit staging).
  EXPECT_EQ(head.workspace, plain.workspace);
  EXPECT_EQ(head.draft_page_bytes, plain.kv_page_bytes / 16);  // one more of the 16 full-attention layers

  o.kv_pages = 1000;
  o.state_slots = 8;
  o.draft_step_rows = 8192;
  o.draft_step_seqs = 8;
  const auto drafting = estimate_memory_plan(c, o);
  o.mtp = false;
  const auto paged = estimate_memory_plan(c, o);
  // 1001 pages (one scratch) of 17 full-attention stores instead of 16.
  EXPECT_EQ(drafting.kv, 1001ull * 17 * 2 * 4 * 16 * 256 * 2);
  EXPECT_EQ(paged.kv, 1001ull * 16 * 2 * 4 * 16 * 256 * 2);
  // fp32 kept rows 8192 x 5120, fc input of one pass (the default 4096-row chunk) 4096 x 10240, last rows
  // 8 x 5120; ints: rounds 3 x 8 x 8, index lists 8192 + 2 x 256.
  const auto pad = [](uint64_t b) { return (b + 255) / 256 * 256; };
  EXPECT_EQ(drafting.draft, pad(8192ull * 5120 * 4) + pad(4096ull * 10240 * 4) + pad(8ull * 5120 * 4) +
                                pad(3ull * 8 * 8 * 4) + pad((8192ull + 512) * 4));
  EXPECT_EQ(drafting.total(), drafting.weights + drafting.kv + drafting.states + drafting.workspace +
                                  drafting.gemm_workspace + drafting.draft);
}

// Quantized checkpoints: the config's schemes, sized as the CUDA backend lays them out (quant_pack.hpp).
// bench/configs/qwen3.6-27b-nvfp4 is nvidia/Qwen3.6-27B-NVFP4's config (MIXED_PRECISION: W4A16 NVFP4 MLP and
// lm_head, FP8 per-tensor attention and Gated DeltaNet projections, in_proj_a/b and the embedding bf16).
TEST(MemoryPlan, Qwen36_27bNvfp4MixedByHand) {
  auto c = model::load_text_config(std::string(DF_SOURCE_DIR) + "/bench/configs/qwen3.6-27b-nvfp4");
  ASSERT_TRUE(c.is_ok()) << c.message();
  ASSERT_TRUE(c->quant.quantized());
  const auto p = estimate_memory_plan(*c, {});
  const uint64_t H = 5120, V = 248320, I = 17408;
  auto nvfp4 = [](uint64_t rows, uint64_t cols) { return rows * cols / 2 + rows * cols / 16 + rows * 4; };
  const uint64_t embed = V * H * 2;  // bf16
  const uint64_t lm_head = nvfp4(V, H);
  const uint64_t mlp = nvfp4(2 * I, H) + nvfp4(H, I);  // gate/up interleaved, down
  // in_proj (mixed formats): two matrices, one per run of one format: [qkv | z] FP8 per tensor with
  // different scales, stacked with the scales widened to one per row (16384 x 4 bytes), and [b | a] bf16;
  // out_proj FP8.
  const uint64_t lin = (16384 * H + 16384 * 4) + (96 * H * 2) + (H * 6144 + 256);
  // q/k/v FP8 per tensor with different rows: one matrix, its scales widened to one per row (14336 x 4
  // bytes); o_proj FP8.
  const uint64_t full = 14336 * H + 14336 * 4 + (H * 6144 + 256);
  EXPECT_EQ(p.weights, embed + lm_head + 10588416 + 64 * mlp + 48 * lin + 16 * full);
  EXPECT_EQ(p.weights, 20171159808ull);
  // The widest quantized matrix (gate/up, 2 x 17408 x 5120) has a bf16 copy in the workspace for prefill
  // chunks past the decode buckets (the default chunk of 4096 rows is).
  MemoryPlanOptions small;
  small.prefill_chunk = 256;
  const uint64_t gate_up_bf16 = 2 * I * H * 2;
  EXPECT_GE(p.workspace - estimate_memory_plan(*c, small).workspace, gate_up_bf16);
  // The float plan of the same shapes holds the bf16 matrices and no copy.
  const auto bf16 = estimate_memory_plan(qwen36_27b(), {});
  EXPECT_EQ(bf16.weights, 53786705920ull + 10588416ull);
  EXPECT_GE(p.workspace, bf16.workspace + gate_up_bf16);
}

// Qwen's FP8 block-128 layout (Qwen/Qwen3.6-27B-FP8's modules_to_not_convert: lm_head, the embedding,
// in_proj_a/b stay bf16): E4M3 codes and one fp32 scale per 128 x 128 block.
TEST(MemoryPlan, Qwen36_27bFp8BlockByHand) {
  auto c = model::load_text_config(std::string(DF_SOURCE_DIR) + "/bench/configs/qwen3.6-27b-fp8");
  ASSERT_TRUE(c.is_ok()) << c.message();
  const auto p = estimate_memory_plan(*c, {});
  const uint64_t H = 5120, V = 248320, I = 17408;
  auto fp8 = [](uint64_t rows, uint64_t cols) {
    return rows * cols + (rows + 127) / 128 * ((cols + 127) / 128) * 4;
  };
  const uint64_t lin = fp8(10240, H) + fp8(6144, H) + 2 * (48 * H * 2) + fp8(H, 6144);
  const uint64_t full = fp8(14336, H) + fp8(H, 6144);  // q/k/v blocks stack (every part a whole block row)
  EXPECT_EQ(p.weights, 2 * V * H * 2 + 10588416 + 64 * (fp8(2 * I, H) + fp8(H, I)) + 48 * lin + 16 * full);
  EXPECT_EQ(p.weights, 29476270336ull);
}

TEST(MemoryPlan, Qwen36_27bOptions) {
  const auto c = qwen36_27b();
  MemoryPlanOptions o;
  o.max_sequences = 16;
  o.max_context = 131072;
  o.exact = true;
  const auto p = estimate_memory_plan(c, o);
  EXPECT_EQ(p.kv_bytes_per_token, 131072u);  // fp32 cache
  EXPECT_EQ(p.kv, 17ull * 131072 * 131072);
  EXPECT_EQ(p.states, 17ull * 156893184);
  EXPECT_TRUE(p.kv_f32);
  // The exact mode keeps no 16-bit copies of matmul inputs: a smaller workspace.
  MemoryPlanOptions fast = o;
  fast.exact = false;
  EXPECT_LT(p.workspace, estimate_memory_plan(c, fast).workspace);
}

// The engine's pools (allocate_pools): KV in pages of kCudaPageSize positions, a scratch page and slot more.
TEST(MemoryPlan, Qwen36_27bEnginePools) {
  const auto c = qwen36_27b();
  MemoryPlanOptions o;
  o.kv_pages = 4096;
  o.state_slots = 80;
  o.max_context = 32768;
  const auto p = estimate_memory_plan(c, o);
  EXPECT_EQ(p.kv_pages, 4097);
  EXPECT_EQ(p.slots, 81);
  EXPECT_EQ(p.kv_page_bytes, 65536u * 16);  // 1 MiB a page
  EXPECT_EQ(p.kv, 4097ull * 65536 * 16);    // K and V halves, each 256-byte aligned already
  EXPECT_EQ(p.states, 81ull * 156893184);
  // The workspace does not depend on the pools.
  MemoryPlanOptions contiguous;
  contiguous.max_context = 32768;
  EXPECT_EQ(p.workspace, estimate_memory_plan(c, contiguous).workspace);
}

// The fp8 KV cache: a byte an element and a 4-byte scale per (position, kv head): 16 layers x 2 (k, v) x 4
// heads x (256 + 4) bytes a token, and a prefill's keys widened to bf16 in the workspace (2 x 32768 x 4 x 256
// bf16 = 128 MiB more than bf16's).
TEST(MemoryPlan, Qwen36_27bFp8Kv) {
  const auto c = qwen36_27b();
  MemoryPlanOptions o;
  o.kv_pages = 4096;
  o.state_slots = 80;
  o.max_context = 32768;
  o.kv_fp8 = true;
  const auto p = estimate_memory_plan(c, o);
  EXPECT_TRUE(p.kv_fp8);
  EXPECT_EQ(p.kv_bytes_per_token, 16u * 2 * 4 * 260);
  EXPECT_EQ(p.kv_page_bytes, 16u * 2 * 4 * 260 * 16);
  EXPECT_EQ(p.kv, 2 * (4097ull * 16 * 4 * 16 * 256 + 4097ull * 16 * 4 * 16 * 4));
  MemoryPlanOptions bf16 = o;
  bf16.kv_fp8 = false;
  // (bf16 keeps a 16-byte placeholder there, one 256-byte-aligned piece.)
  EXPECT_EQ(p.workspace - estimate_memory_plan(c, bf16).workspace, 2ull * 32768 * 4 * 256 * 2 - 256);
  // Exact mode keeps its fp32 cache whatever kv_fp8 says (the backend does the same).
  o.exact = true;
  EXPECT_FALSE(estimate_memory_plan(c, o).kv_fp8);
}

TEST(MemoryPlan, TinyPresetsFromShapes) {
  for (const auto& preset : model::tiny_presets()) {
    SCOPED_TRACE(preset);
    const auto dir = (std::filesystem::temp_directory_path() /
                      ("df_memory_plan_" + preset + "_" + std::to_string(::getpid())))
                         .string();
    ASSERT_TRUE(model::write_tiny_checkpoint(preset, 1, dir).is_ok());
    auto cfg = model::load_text_config(dir);
    std::filesystem::remove_all(dir);
    ASSERT_TRUE(cfg.is_ok()) << cfg.message();
    const auto& c = *cfg;
    const uint64_t n_full = static_cast<uint64_t>(c.count_layers(model::LayerType::kFullAttention));
    const uint64_t n_lin = static_cast<uint64_t>(c.count_layers(model::LayerType::kLinearAttention));
    MemoryPlanOptions o;
    o.max_sequences = 2;
    o.max_context = 100;
    const auto p = estimate_memory_plan(c, o);
    const uint64_t kv_tok = 2 * n_full * static_cast<uint64_t>(c.num_key_value_heads * c.head_dim) * 2;
    EXPECT_EQ(p.kv_bytes_per_token, kv_tok);
    auto pad = [](uint64_t n) { return (n + 255) / 256 * 256; };
    EXPECT_EQ(p.kv, 2 * pad(3 * 100 * kv_tok / 2));
    const uint64_t conv = n_lin * static_cast<uint64_t>(c.linear_conv_dim() * (c.linear_conv_kernel_dim - 1));
    const uint64_t gdn = n_lin * static_cast<uint64_t>(c.linear_num_value_heads * c.linear_key_head_dim *
                                                       c.linear_value_head_dim);
    EXPECT_EQ(p.state_bytes_per_sequence, (conv + gdn) * 4);
    EXPECT_EQ(p.states, pad(3 * conv * 4) + pad(3 * gdn * 4));
    EXPECT_EQ(p.slots, 3);
    EXPECT_EQ(p.max_context, 100);
    EXPECT_GT(p.weights, 0u);
    EXPECT_GT(p.workspace, static_cast<size_t>(256 * c.vocab_size * 4));  // at least the logits buffer
  }
}

}  // namespace
}  // namespace deltaflow::backend
