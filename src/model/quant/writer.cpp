#include "model/quant/writer.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "model/quant/gptq.hpp"
#include "model/quant/quantize.hpp"
#include "model/quant/search.hpp"

namespace deltaflow::model::quant {
namespace {

using nlohmann::ordered_json;

struct Member {
  std::string module;  // output module name (checkpoint prefix + role)
  const Mat* mat;
};
using Group = std::vector<Member>;  // quantized with one shared amax (ModelOpt's fused export)

std::vector<float> dequant_all(const Mat& m) {
  std::vector<float> out(static_cast<size_t>(m.numel()));
  for (int64_t r = 0; r < m.rows; ++r) {
    const void* row = m.row(r);
    for (int64_t k = 0; k < m.cols; ++k)
      out[static_cast<size_t>(r * m.cols + k)] = core::load_as_f32(row, m.dtype, static_cast<size_t>(k));
  }
  return out;
}

void mlp_groups(const std::string& p, const MlpWeights& m, std::vector<Group>& g) {
  g.push_back({{p + "gate_proj", &m.gate_proj}, {p + "up_proj", &m.up_proj}});
  g.push_back({{p + "down_proj", &m.down_proj}});
}

std::vector<uint8_t> bytes_of(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::vector<uint8_t>(b, b + n);
}

// A module's calibration statistics when the method uses them (gptq) and they fit its K columns.
const InputGram* stats_of(const QuantMethod& method, const std::string& module, int64_t K) {
  if (!method.stats || method.name != "gptq") return nullptr;
  const auto it = method.stats->find(module);
  if (it == method.stats->end() || it->second.cols != K || it->second.tokens < 1) return nullptr;
  return &it->second;
}

// The mean squared input of each column (the Gram matrix's diagonal over the tokens); empty without stats.
std::vector<float> column_weights(const InputGram* g) {
  std::vector<float> h;
  if (!g) return h;
  for (int64_t k = 0; k < g->cols; ++k)
    h.push_back(
        static_cast<float>(g->gram[static_cast<size_t>(k * g->cols + k)] / static_cast<double>(g->tokens)));
  return h;
}

const float* ptr_or_null(const std::vector<float>& v) {
  return v.empty() ? nullptr : v.data();
}

}  // namespace

bool is_quant_method(const std::string& name) {
  return name == "exact" || name == "mse" || name == "gptq";
}

bool needs_calibration(const std::string& format) {
  return format == "nvfp4-mixed";
}

core::Expected<QuantizedCheckpoint> quantize_checkpoint(const TextConfig& c, const ModelWeights& w,
                                                        const io::Checkpoint& ck, const std::string& format,
                                                        const std::function<void(size_t, size_t)>& progress,
                                                        const InputAmax* input_amax,
                                                        const QuantMethod& method) {
  if (!is_quant_method(method.name))
    return core::Error{"method '" + method.name + "' is not supported (supported: exact, mse, gptq)"};
  if (format != "nvfp4" && format != "fp8-block" && format != "nvfp4-mixed")
    return core::Error{"format '" + format + "' is not supported (supported: nvfp4, nvfp4-mixed, fp8-block)"};
  const bool mixed = format == "nvfp4-mixed";
  if (mixed && !input_amax)
    return core::Error{"format nvfp4-mixed needs calibration (input amax per module)"};
  if (c.quant.quantized())
    return core::Error{ck.dir() + ": already quantized (" + c.quant.summary +
                       "); quantize a float checkpoint"};
  if (c.architecture == Architecture::kQwen3Next)
    return core::Error{"qwen3_next checkpoints (grouped in_proj_qkvz) are not supported"};
  const std::string& pre = w.prefix;
  std::vector<Group> groups;
  std::set<std::string> consumed;
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& L = w.layers[i];
    const std::string lp = pre + "layers." + std::to_string(i) + ".";
    if (L.type == LayerType::kFullAttention) {
      const std::string a = lp + "self_attn.";
      groups.push_back(
          {{a + "q_proj", &L.attn.q_proj}, {a + "k_proj", &L.attn.k_proj}, {a + "v_proj", &L.attn.v_proj}});
      groups.push_back({{a + "o_proj", &L.attn.o_proj}});
    } else {
      const std::string a = lp + "linear_attn.";
      groups.push_back({{a + "in_proj_qkv", &L.linear.in_proj_qkv}, {a + "in_proj_z", &L.linear.in_proj_z}});
      groups.push_back({{a + "out_proj", &L.linear.out_proj}});
    }
    if (L.is_moe) {
      for (size_t e = 0; e < L.moe.experts.size(); ++e)
        mlp_groups(lp + "mlp.experts." + std::to_string(e) + ".", L.moe.experts[e], groups);
      mlp_groups(lp + "mlp.shared_expert.", L.moe.shared_expert, groups);
      consumed.insert(lp + "mlp.experts.gate_up_proj");  // fused experts: written per expert
      consumed.insert(lp + "mlp.experts.down_proj");
    } else {
      mlp_groups(lp + "mlp.", L.mlp, groups);
    }
  }
  // nvfp4-mixed: the lm_head too, unless it is the embedding matrix (tied: it stays bf16).
  const std::string lm_module = pre == "language_model.model." ? "language_model.lm_head" : "lm_head";
  if (mixed && !c.tie_word_embeddings) groups.push_back({{lm_module, &w.lm_head}});
  // The FP8 (W8A8) members of nvfp4-mixed: the attention projections.
  auto is_fp8 = [&](const std::string& module) {
    return mixed && (module.find(".self_attn.") != std::string::npos ||
                     module.find(".linear_attn.") != std::string::npos);
  };
  ordered_json layers = ordered_json::object(), fp8_targets = ordered_json::array(),
               fp4_targets = ordered_json::array();
  size_t total = 0, done = 0;
  for (const auto& g : groups) total += g.size();

  QuantizedCheckpoint out;
  for (const auto& g : groups) {
    std::vector<std::vector<float>> vals;
    float amax = 0;
    for (const auto& m : g) {
      if (m.mat->quantized()) return core::Error{"tensor '" + m.module + "' is already quantized"};
      vals.push_back(dequant_all(*m.mat));
      amax = std::max(amax, abs_max(vals.back().data(), vals.back().size()));
      if (m.mat->name) consumed.insert(*m.mat->name);
    }
    // The members of a group read one input: its statistics (the first member's) weight them all.
    const int64_t Kg = g.front().mat->cols;
    const InputGram* stats = stats_of(method, g.front().module, Kg);
    const std::vector<float> h = column_weights(stats);
    std::vector<double> U;
    if (method.name == "gptq" && stats) U = gptq_factor(stats->gram, Kg);
    const bool gptq = !U.empty();
    // mse's NVFP4 members share a searched weight_scale_2.
    std::vector<Nvfp4Weight> searched;
    if (method.name != "exact" && !gptq && (format == "nvfp4" || mixed) && !is_fp8(g.front().module) &&
        Kg % kNvfp4Group == 0) {
      std::vector<const float*> ptrs;
      std::vector<int64_t> rows;
      for (size_t j = 0; j < g.size(); ++j) {
        ptrs.push_back(vals[j].data());
        rows.push_back(g[j].mat->rows);
      }
      searched = quantize_nvfp4_search_group(ptrs, rows, Kg, amax, ptr_or_null(h));
    }
    for (size_t j = 0; j < g.size(); ++j) {
      const Mat& m = *g[j].mat;
      const int64_t N = m.rows, K = m.cols;
      const std::string& mod = g[j].module;
      if (is_fp8(mod)) {
        // ModelOpt's FP8 per-tensor export: scale = amax / 448 of this matrix alone, e4m3 of the bf16-rounded
        // quotient; the input scale is the calibrated input amax / 448 (shared by a fused group's members,
        // which read the same input).
        const auto it = input_amax->find(mod);
        if (it == input_amax->end() || !(it->second > 0))
          return core::Error{"calibration saw no input for module '" + mod + "'"};
        Fp8TensorWeight t = method.name == "exact"
                                ? quantize_fp8_tensor_modelopt(vals[j].data(), vals[j].size())
                                : quantize_fp8_tensor_search(vals[j].data(), N, K, ptr_or_null(h));
        if (gptq) t.w = gptq_fp8(vals[j].data(), N, K, {t.scale}, N, K, U);
        const float scale = t.scale;
        std::vector<uint8_t> q = std::move(t.w);
        const float in_scale = it->second / 448.0f;
        out.tensors.push_back({mod + ".weight", core::DType::kF8E4M3, {N, K}, std::move(q)});
        out.tensors.push_back({mod + ".weight_scale", core::DType::kF32, {}, bytes_of(&scale, 4)});
        out.tensors.push_back({mod + ".input_scale", core::DType::kF32, {}, bytes_of(&in_scale, 4)});
        layers[mod] = {{"quant_algo", "FP8"}};
        fp8_targets.push_back(mod);
      } else if (format == "nvfp4" || mixed) {
        if (K % kNvfp4Group != 0)
          return core::Error{"tensor '" + mod + ".weight' has " + std::to_string(K) +
                             " columns, NVFP4 needs a multiple of 16"};
        Nvfp4Weight q = gptq ? gptq_nvfp4(vals[j].data(), N, K, amax / 2688.0f, U, ptr_or_null(h))
                        : !searched.empty() ? std::move(searched[j])
                                            : quantize_nvfp4_modelopt(vals[j].data(), N, K, amax);
        out.tensors.push_back({mod + ".weight", core::DType::kU8, {N, K / 2}, std::move(q.packed)});
        out.tensors.push_back(
            {mod + ".weight_scale", core::DType::kF8E4M3, {N, K / kNvfp4Group}, std::move(q.scale)});
        out.tensors.push_back({mod + ".weight_scale_2", core::DType::kF32, {}, bytes_of(&q.scale_2, 4)});
        layers[mod] = {{"quant_algo", "W4A16_NVFP4"}, {"group_size", 16}};
        fp4_targets.push_back(mod);
      } else {
        Fp8BlockWeight q = method.name == "exact"
                               ? quantize_fp8_block(vals[j].data(), N, K)
                               : quantize_fp8_block_search(vals[j].data(), N, K, ptr_or_null(h));
        if (gptq) {
          std::vector<float> scales;
          for (uint16_t s16 : q.scale) scales.push_back(core::bf16_to_f32(s16));
          q.w = gptq_fp8(vals[j].data(), N, K, scales, kFp8Block, kFp8Block, U);
        }
        const int64_t bn = (N + kFp8Block - 1) / kFp8Block, bk = (K + kFp8Block - 1) / kFp8Block;
        out.tensors.push_back({mod + ".weight", core::DType::kF8E4M3, {N, K}, std::move(q.w)});
        out.tensors.push_back({mod + ".weight_scale_inv",
                               core::DType::kBF16,
                               {bn, bk},
                               bytes_of(q.scale.data(), q.scale.size() * 2)});
      }
      if (progress) progress(++done, total);
    }
  }
  for (const auto& t : ck.tensors()) {
    if (consumed.count(t.name)) continue;
    out.tensors.push_back({t.name, t.dtype, t.shape, bytes_of(t.data, t.nbytes)});
  }

  // ModelOpt's default exclusions that this model has (its export lists them by name).
  ordered_json ignore = ordered_json::array();
  if (!mixed || c.tie_word_embeddings) ignore.push_back(lm_module);
  ignore.push_back(pre + "embed_tokens");
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const std::string lp = pre + "layers." + std::to_string(i) + ".";
    if (w.layers[i].type == LayerType::kLinearAttention)
      for (const char* m : {"linear_attn.conv1d", "linear_attn.in_proj_a", "linear_attn.in_proj_b"})
        ignore.push_back(lp + m);
    if (w.layers[i].is_moe)
      for (const char* m : {"mlp.gate", "mlp.shared_expert_gate"}) ignore.push_back(lp + m);
  }
  ignore.push_back("mtp*");
  const ordered_json producer = {{"name", "modelopt"}, {"version", "0.47.0"}};
  const std::string quantized_by =
      method.name != "exact" ? "deltaflow quantize --method " + method.name + " (ModelOpt 0.47 layout)"
      : mixed                ? "deltaflow quantize (ModelOpt 0.47 weight recipe, bit-identical weights)"
                             : "deltaflow quantize (ModelOpt 0.47 weight recipe, bit-identical)";
  if (mixed) {
    // As ModelOpt 0.47 writes MIXED_PRECISION: the per-module algorithms, in hf_quant_config.json and in
    // config.json's quantization_config (config groups of W8A8 FP8 and W4A16 NVFP4 targets).
    ordered_json hq = {{"producer", producer},
                       {"quantization",
                        {{"quant_algo", "MIXED_PRECISION"},
                         {"kv_cache_quant_algo", nullptr},
                         {"quantized_layers", layers},
                         {"exclude_modules", ignore}}},
                       {"quantized_by", quantized_by}};
    out.hf_quant_config = hq.dump(4);
    const ordered_json fp8 = {{"dynamic", false}, {"num_bits", 8}, {"type", "float"}};
    ordered_json qc = {
        {"config_groups",
         {{"group_0", {{"input_activations", fp8}, {"weights", fp8}, {"targets", fp8_targets}}},
          {"group_1",
           {{"weights", {{"dynamic", false}, {"num_bits", 4}, {"type", "float"}, {"group_size", 16}}},
            {"targets", fp4_targets}}}}},
        {"quantized_layers", layers},
        {"ignore", ignore},
        {"quant_algo", "MIXED_PRECISION"},
        {"producer", producer},
        {"quant_method", "modelopt"}};
    out.quantization_config = qc.dump();
  } else if (format == "nvfp4") {
    ordered_json hq = {{"producer", producer},
                       {"quantization",
                        {{"quant_algo", "W4A16_NVFP4"},
                         {"kv_cache_quant_algo", nullptr},
                         {"group_size", 16},
                         {"exclude_modules", ignore}}},
                       {"quantized_by", quantized_by}};
    out.hf_quant_config = hq.dump(4);
    ordered_json qc = {
        {"config_groups",
         {{"group_0",
           {{"weights", {{"dynamic", false}, {"num_bits", 4}, {"type", "float"}, {"group_size", 16}}},
            {"targets", {"Linear"}}}}}},
        {"ignore", ignore},
        {"quant_algo", "W4A16_NVFP4"},
        {"producer", producer},
        {"quant_method", "modelopt"}};
    out.quantization_config = qc.dump();
  } else {
    ordered_json keep = ordered_json::array();
    for (const char* m : {"lm_head", "embed_tokens", "linear_attn.conv1d", "linear_attn.in_proj_a",
                          "linear_attn.in_proj_b", "mlp.gate", "shared_expert_gate", "mtp"})
      keep.push_back(m);
    ordered_json qc = {{"quant_method", "fp8"},
                       {"fmt", "e4m3"},
                       {"activation_scheme", "dynamic"},
                       {"weight_block_size", {kFp8Block, kFp8Block}},
                       {"modules_to_not_convert", keep}};
    out.quantization_config = qc.dump();
  }
  return out;
}

core::Status write_quantized_checkpoint(const std::string& model_dir, const std::string& out_dir,
                                        const std::string& format,
                                        const std::function<void(size_t, size_t)>& progress,
                                        const InputAmax* input_amax, const QuantMethod& method) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(out_dir, ec) && !fs::is_empty(out_dir, ec))
    return core::Error{out_dir + ": exists and is not empty"};
  DF_ASSIGN(TextConfig c, load_text_config(model_dir));
  DF_ASSIGN(io::Checkpoint ck, io::Checkpoint::open(model_dir));
  DF_ASSIGN(ModelWeights w, bind_weights(c, ck));
  DF_ASSIGN(QuantizedCheckpoint q, quantize_checkpoint(c, w, ck, format, progress, input_amax, method));
  fs::create_directories(out_dir, ec);
  if (ec) return core::Error{out_dir + ": cannot create: " + ec.message()};
  DF_TRY(io::write_safetensors(out_dir + "/model.safetensors", q.tensors, {{"format", "pt"}}));
  // config.json with quantization_config; key order and the rest kept.
  std::ifstream in(model_dir + "/config.json", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  ordered_json cfg = ordered_json::parse(ss.str(), nullptr, false);
  if (cfg.is_discarded() || !cfg.is_object())
    return core::Error{model_dir + "/config.json: not a JSON object"};
  cfg["quantization_config"] = ordered_json::parse(q.quantization_config);
  std::ofstream(out_dir + "/config.json") << cfg.dump(2) << "\n";
  if (!q.hf_quant_config.empty())
    std::ofstream(out_dir + "/hf_quant_config.json") << q.hf_quant_config << "\n";
  for (const auto& e : fs::directory_iterator(model_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name == "config.json" || name == "hf_quant_config.json" ||
        name == "model.safetensors.index.json" || e.path().extension() == ".safetensors")
      continue;
    fs::copy_file(e.path(), fs::path(out_dir) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return core::Error{out_dir + "/" + name + ": cannot copy: " + ec.message()};
  }
  if (ec) return core::Error{model_dir + ": cannot list: " + ec.message()};
  return core::Status();
}

}  // namespace deltaflow::model::quant
