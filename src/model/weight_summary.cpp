#include "model/weight_summary.hpp"

namespace deltaflow::model {
namespace {

void mlp(const std::string& p, const MlpWeights& m,
         const std::function<void(const std::string&, const Mat&)>& f) {
  f(p + "gate_proj", m.gate_proj);
  f(p + "up_proj", m.up_proj);
  f(p + "down_proj", m.down_proj);
}

uint64_t mlp_bytes(const MlpWeights& m) {
  return m.gate_proj.stored_bytes() + m.up_proj.stored_bytes() + m.down_proj.stored_bytes();
}

}  // namespace

void for_each_weight(const TextConfig& c, const ModelWeights& w,
                     const std::function<void(const std::string& role, const Mat& m)>& f) {
  f("embed_tokens", w.embed_tokens);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& L = w.layers[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    f(p + "input_layernorm", L.input_layernorm);
    if (L.type == LayerType::kFullAttention) {
      f(p + "self_attn.q_proj", L.attn.q_proj);
      f(p + "self_attn.k_proj", L.attn.k_proj);
      f(p + "self_attn.v_proj", L.attn.v_proj);
      f(p + "self_attn.o_proj", L.attn.o_proj);
      f(p + "self_attn.q_norm", L.attn.q_norm);
      f(p + "self_attn.k_norm", L.attn.k_norm);
    } else {
      const auto& g = L.linear;
      f(p + "linear_attn.in_proj_qkv", g.in_proj_qkv);
      f(p + "linear_attn.in_proj_z", g.in_proj_z);
      f(p + "linear_attn.in_proj_b", g.in_proj_b);
      f(p + "linear_attn.in_proj_a", g.in_proj_a);
      f(p + "linear_attn.conv1d", g.conv1d);
      f(p + "linear_attn.dt_bias", g.dt_bias);
      f(p + "linear_attn.A_log", g.A_log);
      f(p + "linear_attn.norm", g.norm);
      f(p + "linear_attn.out_proj", g.out_proj);
    }
    f(p + "post_attention_layernorm", L.post_attention_layernorm);
    if (L.is_moe) {
      f(p + "mlp.gate", L.moe.router);
      for (size_t e = 0; e < L.moe.experts.size(); ++e)
        mlp(p + "mlp.experts." + std::to_string(e) + ".", L.moe.experts[e], f);
      mlp(p + "mlp.shared_expert.", L.moe.shared_expert, f);
      f(p + "mlp.shared_expert_gate", L.moe.shared_expert_gate);
    } else {
      mlp(p + "mlp.", L.mlp, f);
    }
  }
  f("norm", w.norm);
  if (!c.tie_word_embeddings) f("lm_head", w.lm_head);
}

const Mat* first_quantized(const TextConfig& c, const ModelWeights& w) {
  const Mat* found = nullptr;
  for_each_weight(c, w, [&](const std::string&, const Mat& m) {
    if (!found && m.quantized()) found = &m;
  });
  return found;
}

uint64_t bytes_per_decoded_token(const TextConfig& c, const ModelWeights& w) {
  uint64_t total = w.embed_tokens.row_bytes();
  for (const auto& L : w.layers) {
    uint64_t layer = L.input_layernorm.stored_bytes() + L.post_attention_layernorm.stored_bytes();
    if (L.type == LayerType::kFullAttention) {
      const auto& a = L.attn;
      layer += a.q_proj.stored_bytes() + a.k_proj.stored_bytes() + a.v_proj.stored_bytes() +
               a.o_proj.stored_bytes() + a.q_norm.stored_bytes() + a.k_norm.stored_bytes();
    } else {
      const auto& g = L.linear;
      for (const Mat* m : {&g.in_proj_qkv, &g.in_proj_z, &g.in_proj_b, &g.in_proj_a, &g.conv1d, &g.dt_bias,
                           &g.A_log, &g.norm, &g.out_proj})
        layer += m->stored_bytes();
    }
    if (L.is_moe) {
      uint64_t experts = 0;
      for (const auto& e : L.moe.experts) experts += mlp_bytes(e);
      const uint64_t n = L.moe.experts.size();
      if (n > 0) experts = experts * static_cast<uint64_t>(c.num_experts_per_tok) / n;
      layer += L.moe.router.stored_bytes() + experts + mlp_bytes(L.moe.shared_expert) +
               L.moe.shared_expert_gate.stored_bytes();
    } else {
      layer += mlp_bytes(L.mlp);
    }
    total += layer;
  }
  total += w.norm.stored_bytes();
  total += w.lm_head.stored_bytes();  // tied: the whole embedding matrix is read again as lm_head
  return total;
}

std::string describe_format(const Mat& m) {
  if (!m.quantized()) return std::string(core::dtype_name(m.dtype));
  const auto& s = m.scale;
  if (m.format == quant::WeightFormat::kNvfp4)
    return std::string("NVFP4 (E2M1, E4M3 g16 scales, ") +
           (m.global_op == quant::GlobalOp::kMultiply ? "x global" : "/ global") +
           (m.input_scale > 0 ? ", static input scale)" : ")");
  std::string g;
  if (s.block_rows == m.rows && s.block_cols == m.cols)
    g = "per-tensor";
  else if (s.block_rows == 1 && s.block_cols == m.cols)
    g = "per-channel";
  else
    g = std::to_string(s.block_rows) + "x" + std::to_string(s.block_cols) + " block";
  return "FP8 (E4M3, " + g + " " + std::string(core::dtype_name(s.dtype)) + " scales" +
         (m.input_scale > 0 ? ", static input scale)" : ")");
}

}  // namespace deltaflow::model
