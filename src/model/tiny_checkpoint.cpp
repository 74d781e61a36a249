#include "model/tiny_checkpoint.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/dtype.hpp"
#include "io/safetensors.hpp"
#include "model/embedded_assets.hpp"

namespace deltaflow::model {
namespace {

using ojson = nlohmann::ordered_json;
using core::DType;

// splitmix64: tiny, portable, and the same stream everywhere (std:: distributions are not).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  // Box-Muller in double, then rounded: deterministic given IEEE double and a correctly rounded libm on
  // log/cos, which glibc provides.
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t s_;
};

struct Preset {
  std::string name;
  std::string model_type;  // top-level
  bool multimodal = false;
  bool vision = false;  // a complete model.visual.* tower and preprocessor_config.json (the vl preset)
  bool moe = false;
  bool next = false;
  bool tied = false;
  bool fused_experts = false;
  bool shards = false;
  DType dtype = DType::kBF16;
  int64_t vocab = 1024, hidden = 64, layers = 4, heads = 4, kv_heads = 2, head_dim = 64, inter = 128;
  int64_t max_positions = 4096;
  bool mrope = true;
  int64_t lin_k_heads = 2, lin_v_heads = 4, lin_k_dim = 16, lin_v_dim = 16, conv_k = 4;
  int64_t experts = 8, top_k = 2, moe_inter = 32, shared_inter = 48;
  std::vector<std::string> layer_types;  // empty: full_attention_interval
  int64_t full_attention_interval = 2;
  std::vector<int64_t> mlp_only_layers;
  // Vision tower (Qwen3_5VisionConfig names). 16x16 learned positions, head_dim 16 (4 rotary frequencies per
  // axis).
  int64_t v_depth = 2, v_hidden = 32, v_inter = 64, v_heads = 2, v_patch = 16, v_merge = 2, v_temporal = 2;
  int64_t v_num_pos = 256;
};

Preset make_preset(const std::string& name) {
  Preset p;
  p.name = name;
  if (name == "dense") {
    p.model_type = "qwen3_5_text";
  } else if (name == "tied") {
    p.model_type = "qwen3_5_text";
    p.tied = true;
    p.dtype = DType::kF16;
    p.full_attention_interval = 3;
    p.layers = 3;
  } else if (name == "moe") {
    p.model_type = "qwen3_5_moe_text";
    p.moe = true;
    p.fused_experts = true;
    p.layer_types = {"linear_attention", "full_attention", "linear_attention", "linear_attention",
                     "full_attention"};
    p.layers = 5;
  } else if (name == "moe64") {
    // The moe preset with per-expert tensors and 64-wide expert FFNs: shapes the CUDA backend's quantized
    // kernels take (columns a multiple of 64), for quantized MoE tests. Not in tiny_presets().
    p.model_type = "qwen3_5_moe_text";
    p.moe = true;
    p.layers = 4;
    p.moe_inter = 64;
    p.shared_inter = 64;
  } else if (name == "multimodal") {
    p.model_type = "qwen3_5_moe";
    p.multimodal = true;
    p.moe = true;
    p.shards = true;
    p.full_attention_interval = 2;
  } else if (name == "vl") {
    p.model_type = "qwen3_5";
    p.multimodal = true;
    p.vision = true;
  } else if (name == "long") {
    // Long-context tests on the CPU: attention is what grows with the square of the length, so one full
    // attention layer of one 16-dim head; 65,536 positions.
    p.model_type = "qwen3_5_text";
    p.layer_types = {"linear_attention", "full_attention"};
    p.layers = 2;
    p.heads = 1;
    p.kv_heads = 1;
    p.head_dim = 16;
    p.max_positions = 65536;
    p.mrope = false;
  } else if (name == "next") {
    p.model_type = "qwen3_next";
    p.next = true;
    p.moe = true;
    p.layer_types = {"linear_attention", "linear_attention", "full_attention", "linear_attention",
                     "full_attention"};
    p.layers = 5;
    p.mlp_only_layers = {1};
    p.inter = 96;
  }
  return p;
}

ojson text_config_json(const Preset& p) {
  ojson t;
  if (p.multimodal) t["model_type"] = p.model_type + "_text";
  t["vocab_size"] = p.vocab;
  t["hidden_size"] = p.hidden;
  if (!p.moe || p.next) t["intermediate_size"] = p.inter;
  t["num_hidden_layers"] = p.layers;
  t["num_attention_heads"] = p.heads;
  t["num_key_value_heads"] = p.kv_heads;
  t["head_dim"] = p.head_dim;
  t["hidden_act"] = "silu";
  t["rms_norm_eps"] = 1e-6;
  t["max_position_embeddings"] = p.max_positions;
  t["tie_word_embeddings"] = p.tied;
  t["attention_bias"] = false;
  t["linear_conv_kernel_dim"] = p.conv_k;
  t["linear_key_head_dim"] = p.lin_k_dim;
  t["linear_value_head_dim"] = p.lin_v_dim;
  t["linear_num_key_heads"] = p.lin_k_heads;
  t["linear_num_value_heads"] = p.lin_v_heads;
  if (p.layer_types.empty()) {
    t["full_attention_interval"] = p.full_attention_interval;
  } else {
    t["layer_types"] = p.layer_types;
  }
  // Rotary dim = head_dim * 0.25 = 16, i.e. 8 frequencies: the mrope sections must sum to 8.
  t["rope_parameters"] = {{"rope_type", "default"},
                          {"rope_theta", 10000000.0},
                          {"partial_rotary_factor", 0.25},
                          {"mrope_section", {3, 3, 2}},
                          {"mrope_interleaved", true}};
  if (p.next || !p.mrope)
    t["rope_parameters"].erase("mrope_section"), t["rope_parameters"].erase("mrope_interleaved");
  if (p.moe) {
    t["num_experts"] = p.experts;
    t["num_experts_per_tok"] = p.top_k;
    t["moe_intermediate_size"] = p.moe_inter;
    t["shared_expert_intermediate_size"] = p.shared_inter;
  }
  if (p.next) {
    t["norm_topk_prob"] = true;
    t["decoder_sparse_step"] = 1;
    t["mlp_only_layers"] = p.mlp_only_layers;
  }
  t["mtp_num_hidden_layers"] = p.vision ? 0 : 1;  // vl: no MTP head
  t["eos_token_id"] = kTinyEosTokenId;
  t["dtype"] = p.dtype == DType::kF16 ? "float16" : "bfloat16";
  return t;
}

ojson config_json(const Preset& p) {
  if (!p.multimodal) {
    ojson c;
    c["architectures"] = {p.next  ? "Qwen3NextForCausalLM"
                          : p.moe ? "Qwen3_5MoeForCausalLM"
                                  : "Qwen3_5ForCausalLM"};
    c["model_type"] = p.model_type;
    const ojson t = text_config_json(p);
    for (auto it = t.begin(); it != t.end(); ++it) c[it.key()] = it.value();
    return c;
  }
  ojson c;
  c["architectures"] = {p.moe ? "Qwen3_5MoeForConditionalGeneration" : "Qwen3_5ForConditionalGeneration"};
  c["model_type"] = p.model_type;
  c["text_config"] = text_config_json(p);
  if (p.vision) {
    // The tiny tokenizer's vision tokens (assets/tiny-tokenizer: 1007..1011).
    c["image_token_id"] = kTinyImageTokenId;
    c["video_token_id"] = kTinyVideoTokenId;
    c["vision_start_token_id"] = kTinyVisionStartTokenId;
    c["vision_end_token_id"] = kTinyVisionEndTokenId;
    c["vision_config"] = {{"model_type", "qwen3_5_vision"},
                          {"depth", p.v_depth},
                          {"hidden_size", p.v_hidden},
                          {"hidden_act", "gelu_pytorch_tanh"},
                          {"intermediate_size", p.v_inter},
                          {"num_heads", p.v_heads},
                          {"in_channels", 3},
                          {"out_hidden_size", p.hidden},
                          {"patch_size", p.v_patch},
                          {"spatial_merge_size", p.v_merge},
                          {"temporal_patch_size", p.v_temporal},
                          {"num_position_embeddings", p.v_num_pos}};
    c["tie_word_embeddings"] = p.tied;
    return c;
  }
  c["vision_config"] = {{"model_type", "qwen3_5_moe_vision"},
                        {"depth", 1},
                        {"hidden_size", 32},
                        {"intermediate_size", 64},
                        {"num_heads", 2},
                        {"out_hidden_size", p.hidden},
                        {"patch_size", 16},
                        {"spatial_merge_size", 2},
                        {"temporal_patch_size", 2}};
  c["tie_word_embeddings"] = p.tied;
  return c;
}

// Accumulates tensors with values drawn in a fixed order.
class TensorSink {
 public:
  TensorSink(Rng& rng, DType dt) : rng_(rng), dt_(dt) {}
  // Normal(mean, std) values, stored in the preset's dtype (norm and decay vectors stay fp32 like real
  // checkpoints' A_log may).
  void add(const std::string& name, std::vector<int64_t> shape, double std, double mean = 0.0,
           bool f32 = false) {
    int64_t n = 1;
    for (auto s : shape) n *= s;
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = static_cast<float>(mean + std * rng_.normal());
    put(name, std::move(shape), v, f32 ? DType::kF32 : dt_);
  }
  void add_values(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v,
                  bool f32) {
    put(name, std::move(shape), v, f32 ? DType::kF32 : dt_);
  }
  Rng& rng() { return rng_; }
  std::vector<io::TensorToWrite>& tensors() { return out_; }

 private:
  void put(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v, DType dt) {
    io::TensorToWrite t{name, dt, std::move(shape), {}};
    t.bytes.resize(v.size() * core::dtype_size(dt));
    for (size_t i = 0; i < v.size(); ++i) {
      if (dt == DType::kF32) {
        std::memcpy(t.bytes.data() + 4 * i, &v[i], 4);
      } else {
        const uint16_t h = dt == DType::kBF16 ? core::f32_to_bf16(v[i]) : core::f32_to_f16(v[i]);
        std::memcpy(t.bytes.data() + 2 * i, &h, 2);
      }
    }
    out_.push_back(std::move(t));
  }
  Rng& rng_;
  DType dt_;
  std::vector<io::TensorToWrite> out_;
};

// Projection weights ~ N(0, gain / sqrt(fan_in)): activations stay O(1) through the layers.
double proj_std(int64_t fan_in, double gain = 0.7) {
  return gain / std::sqrt(static_cast<double>(fan_in));
}

void add_mlp(TensorSink& s, const std::string& p, int64_t H, int64_t I) {
  s.add(p + "gate_proj.weight", {I, H}, proj_std(H, 1.0));
  s.add(p + "up_proj.weight", {I, H}, proj_std(H, 1.0));
  s.add(p + "down_proj.weight", {H, I}, proj_std(I, 0.7));
}

void add_norm(TensorSink& s, const std::string& name, int64_t n) {
  s.add(name, {n}, 0.1);  // zero-centred (1+w) weight, perturbed so the +1 path is exercised
}

void add_layer(TensorSink& s, const Preset& p, const std::string& lp, int64_t i, bool full) {
  const int64_t H = p.hidden;
  add_norm(s, lp + "input_layernorm.weight", H);
  add_norm(s, lp + "post_attention_layernorm.weight", H);
  if (full) {
    const std::string a = lp + "self_attn.";
    s.add(a + "q_proj.weight", {p.heads * p.head_dim * 2, H}, proj_std(H, 1.0));
    s.add(a + "k_proj.weight", {p.kv_heads * p.head_dim, H}, proj_std(H, 1.0));
    s.add(a + "v_proj.weight", {p.kv_heads * p.head_dim, H}, proj_std(H, 1.0));
    s.add(a + "o_proj.weight", {H, p.heads * p.head_dim}, proj_std(p.heads * p.head_dim, 0.7));
    add_norm(s, a + "q_norm.weight", p.head_dim);
    add_norm(s, a + "k_norm.weight", p.head_dim);
  } else {
    const std::string a = lp + "linear_attn.";
    const int64_t kd = p.lin_k_heads * p.lin_k_dim, vd = p.lin_v_heads * p.lin_v_dim, C = 2 * kd + vd;
    const int64_t nv = p.lin_v_heads;
    if (p.next) {
      s.add(a + "in_proj_qkvz.weight", {2 * kd + 2 * vd, H}, proj_std(H, 1.0));
      s.add(a + "in_proj_ba.weight", {2 * nv, H}, proj_std(H, 1.0));
    } else {
      s.add(a + "in_proj_qkv.weight", {C, H}, proj_std(H, 1.0));
      s.add(a + "in_proj_z.weight", {vd, H}, proj_std(H, 1.0));
      s.add(a + "in_proj_b.weight", {nv, H}, proj_std(H, 1.0));
      s.add(a + "in_proj_a.weight", {nv, H}, proj_std(H, 1.0));
    }
    s.add(a + "conv1d.weight", {C, 1, p.conv_k}, 0.5);
    s.add(a + "dt_bias", {nv}, 0.2, 1.0, true);
    // A_log = log(U(0.01, 16)) as transformers initialises it; stored fp32.
    std::vector<float> alog(static_cast<size_t>(nv));
    for (auto& x : alog) x = static_cast<float>(std::log(0.01 + 15.99 * s.rng().uniform()));
    s.add_values(a + "A_log", {nv}, alog, true);
    s.add(a + "norm.weight", {p.lin_v_dim}, 0.1, 1.0);  // plain weight, around 1
    s.add(a + "out_proj.weight", {H, vd}, proj_std(vd, 0.7));
  }
  const bool moe_layer =
      p.moe && std::find(p.mlp_only_layers.begin(), p.mlp_only_layers.end(), i) == p.mlp_only_layers.end();
  const std::string m = lp + "mlp.";
  if (!moe_layer) {
    add_mlp(s, m, H, p.inter);
    return;
  }
  s.add(m + "gate.weight", {p.experts, H}, proj_std(H, 2.0));
  if (p.fused_experts) {
    s.add(m + "experts.gate_up_proj", {p.experts, 2 * p.moe_inter, H}, proj_std(H, 1.0));
    s.add(m + "experts.down_proj", {p.experts, H, p.moe_inter}, proj_std(p.moe_inter, 0.7));
  } else {
    for (int64_t e = 0; e < p.experts; ++e)
      add_mlp(s, m + "experts." + std::to_string(e) + ".", H, p.moe_inter);
  }
  add_mlp(s, m + "shared_expert.", H, p.shared_inter);
  s.add(m + "shared_expert_gate.weight", {1, H}, proj_std(H, 1.0));
}

// The vision tower of Qwen3_5VisionModel (modeling_qwen3_5.py) in its checkpoint names: Conv3d patch
// embedding, learned positions, pre-LayerNorm ViT blocks with fused qkv, and the 2x2 patch merger.
void add_vision_tower(TensorSink& s, const Preset& p) {
  const std::string v = "model.visual.";
  const int64_t D = p.v_hidden, I = p.v_inter, M = D * p.v_merge * p.v_merge;
  const int64_t patch_in = 3 * p.v_temporal * p.v_patch * p.v_patch;
  auto layer_norm = [&](const std::string& name, int64_t n) {
    s.add(name + ".weight", {n}, 0.1, 1.0);
    s.add(name + ".bias", {n}, 0.1);
  };
  auto linear = [&](const std::string& name, int64_t out, int64_t in, double gain) {
    s.add(name + ".weight", {out, in}, proj_std(in, gain));
    s.add(name + ".bias", {out}, 0.05);
  };
  s.add(v + "patch_embed.proj.weight", {D, 3, p.v_temporal, p.v_patch, p.v_patch}, proj_std(patch_in, 2.0));
  s.add(v + "patch_embed.proj.bias", {D}, 0.05);
  s.add(v + "pos_embed.weight", {p.v_num_pos, D}, 0.5);
  for (int64_t i = 0; i < p.v_depth; ++i) {
    const std::string b = v + "blocks." + std::to_string(i) + ".";
    layer_norm(b + "norm1", D);
    layer_norm(b + "norm2", D);
    linear(b + "attn.qkv", 3 * D, D, 1.5);
    linear(b + "attn.proj", D, D, 0.7);
    linear(b + "mlp.linear_fc1", I, D, 1.0);
    linear(b + "mlp.linear_fc2", D, I, 0.7);
  }
  layer_norm(v + "merger.norm", D);
  linear(v + "merger.linear_fc1", M, M, 1.0);
  linear(v + "merger.linear_fc2", p.hidden, M, 1.0);
}

// preprocessor_config.json in the keys the Qwen3.5 checkpoints ship (Qwen2VLImageProcessorFast). The pixel
// range is smaller than the real 65536..16777216 so that test images stay a few dozen patches.
ojson preprocessor_json(const Preset& p) {
  ojson j;
  j["size"] = {{"longest_edge", 65536}, {"shortest_edge", 4096}};
  j["patch_size"] = p.v_patch;
  j["temporal_patch_size"] = p.v_temporal;
  j["merge_size"] = p.v_merge;
  j["image_mean"] = {0.5, 0.5, 0.5};
  j["image_std"] = {0.5, 0.5, 0.5};
  j["processor_class"] = "Qwen3VLProcessor";
  j["image_processor_type"] = "Qwen2VLImageProcessorFast";
  return j;
}

core::Status write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) return core::Error{path + ": cannot write"};
  return core::Status();
}

}  // namespace

const std::vector<std::string>& tiny_presets() {
  static const std::vector<std::string> p = {"dense", "moe", "tied", "multimodal", "next", "vl"};
  return p;
}

const std::vector<std::string>& all_tiny_presets() {
  static const std::vector<std::string> p = [] {
    auto all = tiny_presets();
    all.push_back("long");
    all.push_back("moe64");
    return all;
  }();
  return p;
}

core::Status write_tiny_checkpoint(const std::string& preset, uint64_t seed, const std::string& out_dir) {
  const auto& known = all_tiny_presets();
  if (std::find(known.begin(), known.end(), preset) == known.end()) {
    std::string names;
    for (const auto& n : known) names += (names.empty() ? "" : ", ") + n;
    return core::Error{"unknown preset '" + preset + "' (presets: " + names + ")"};
  }
  const Preset p = make_preset(preset);
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return core::Error{out_dir + ": cannot create directory: " + ec.message()};

  Rng rng(seed);
  TensorSink s(rng, p.dtype);
  const std::string pre = p.multimodal ? "model.language_model." : "model.";
  // Embeddings ~ N(0, 1): hidden states start at unit scale. lm_head rows are larger so that logits spread
  // over several units and greedy choices have clear margins.
  // Tied: the same matrix scores the output, so a smaller scale keeps a token from predicting itself.
  s.add(pre + "embed_tokens.weight", {p.vocab, p.hidden}, p.tied ? 0.3 : 1.0);
  for (int64_t i = 0; i < p.layers; ++i) {
    bool full;
    if (p.layer_types.empty()) {
      full = (i + 1) % p.full_attention_interval == 0;
    } else {
      full = p.layer_types[i] == "full_attention";
    }
    add_layer(s, p, pre + "layers." + std::to_string(i) + ".", i, full);
  }
  add_norm(s, pre + "norm.weight", p.hidden);
  if (!p.tied) s.add("lm_head.weight", {p.vocab, p.hidden}, 3.0 / std::sqrt(static_cast<double>(p.hidden)));
  // The MTP head (speculative decoding): its norms and fc, then (after every other tensor, so that adding it
  // left the other tensors' values as they were) its decoder layer. The vl preset has none.
  if (p.vision) {
    add_vision_tower(s, p);
  } else {
    add_norm(s, "mtp.pre_fc_norm_embedding.weight", p.hidden);
    add_norm(s, "mtp.pre_fc_norm_hidden.weight", p.hidden);
    s.add("mtp.fc.weight", {p.hidden, 2 * p.hidden}, proj_std(2 * p.hidden));
    add_norm(s, "mtp.norm.weight", p.hidden);
    if (p.multimodal) {
      // A vision tower stub in the real names: recognised, not used by the text model.
      s.add("model.visual.patch_embed.proj.weight", {32, 3, 2, 16, 16}, 0.02);
      s.add("model.visual.patch_embed.proj.bias", {32}, 0.02);
    }
    Preset mtp = p;
    mtp.fused_experts = false;  // the official checkpoints store the MTP layer's experts one by one
    add_layer(s, mtp, "mtp.layers.0.", -1, /*full=*/true);
  }

  auto& tensors = s.tensors();
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  if (!p.shards) {
    DF_TRY(io::write_safetensors(out_dir + "/model.safetensors", tensors, meta));
  } else {
    // Two shards and an index, as large checkpoints ship.
    std::vector<io::TensorToWrite> a, b;
    ojson index;
    uint64_t total = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const bool first = i < tensors.size() / 2;
      const std::string shard =
          first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
      index["weight_map"][tensors[i].name] = shard;
      total += tensors[i].bytes.size();
      (first ? a : b).push_back(std::move(tensors[i]));
    }
    index["metadata"] = {{"total_size", total}};
    DF_TRY(io::write_safetensors(out_dir + "/model-00001-of-00002.safetensors", a, meta));
    DF_TRY(io::write_safetensors(out_dir + "/model-00002-of-00002.safetensors", b, meta));
    DF_TRY(write_text(out_dir + "/model.safetensors.index.json", index.dump(2) + "\n"));
  }
  DF_TRY(write_text(out_dir + "/config.json", config_json(p).dump(2) + "\n"));
  ojson gen = {{"eos_token_id", {kTinyEosTokenId, kTinyPadTokenId}},
               {"pad_token_id", kTinyPadTokenId},
               {"do_sample", true},
               {"temperature", 0.6},
               {"top_k", 20},
               {"top_p", 0.95}};
  DF_TRY(write_text(out_dir + "/generation_config.json", gen.dump(2) + "\n"));
  if (p.vision)
    DF_TRY(write_text(out_dir + "/preprocessor_config.json", preprocessor_json(p).dump(2) + "\n"));
  for (const auto& asset : tiny_tokenizer_assets())
    DF_TRY(write_text(out_dir + "/" + asset.name, std::string(asset.text)));
  return core::Status();
}

}  // namespace deltaflow::model
