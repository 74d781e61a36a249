// The one weight table: HF tensor names -> typed fields of ModelWeights, with shape and dtype checks.
// Mirrors transformers 5.17: Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM (which strip `language_model.` and
// ignore `mtp.*` and `model.visual.*`) and Qwen3NextForCausalLM.
#include <algorithm>
#include <cstring>
#include <set>
#include <sstream>

#include "model/weights.hpp"

namespace deltaflow::model {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

bool is_float_weight(core::DType t) {
  return t == core::DType::kBF16 || t == core::DType::kF16 || t == core::DType::kF32;
}

class Binder {
 public:
  Binder(const io::Checkpoint& ck, ModelWeights& w) : ck_(ck), w_(w) {}

  // The tensor `name` with exactly `shape`, viewed as [shape[0], rest...] (a 1-D tensor as [1, n]).
  core::Expected<Mat> mat(const std::string& name, const std::vector<int64_t>& shape,
                          const std::string& what) {
    DF_ASSIGN(const io::Tensor* t, find(name, shape, what));
    Mat m;
    m.data = t->data;
    m.dtype = t->dtype;
    if (shape.size() == 1) {
      m.rows = 1;
      m.cols = shape[0];
    } else {
      m.rows = shape[0];
      m.cols = 1;
      for (size_t i = 1; i < shape.size(); ++i) m.cols *= shape[i];
    }
    count(*t);
    return m;
  }

  core::Expected<const io::Tensor*> find(const std::string& name, const std::vector<int64_t>& shape,
                                         const std::string& what) {
    const io::Tensor* t = ck_.find(name);
    if (!t)
      return core::Error{ck_.dir() + ": missing tensor '" + name + "' (expected shape " + shape_str(shape) +
                         ", " + what + ")"};
    if (t->shape != shape)
      return core::Error{*t->file + ": tensor '" + name + "' has shape " + shape_str(t->shape) +
                         ", expected " + shape_str(shape) + " (" + what + ")"};
    if (!is_float_weight(t->dtype))
      return core::Error{*t->file + ": tensor '" + name + "' has dtype " +
                         std::string(core::dtype_name(t->dtype)) +
                         ", expected BF16, F16 or F32 (quantized formats are not supported yet)"};
    used_.insert(name);
    return t;
  }

  bool has(const std::string& name) const { return ck_.find(name) != nullptr; }
  void mark_used(const std::string& name) { used_.insert(name); }
  bool is_used(const std::string& name) const { return used_.count(name) > 0; }
  void count(const io::Tensor& t) {
    w_.bytes += t.nbytes;
    w_.parameter_count += t.numel();
  }

 private:
  const io::Checkpoint& ck_;
  ModelWeights& w_;
  std::set<std::string> used_;
};

// Copies rows [r0, r0+n) of a [rows, cols] tensor to the end of `out`.
void append_rows(std::vector<uint8_t>& out, const io::Tensor& t, int64_t cols, int64_t r0, int64_t n) {
  const size_t rb = static_cast<size_t>(cols) * core::dtype_size(t.dtype);
  const uint8_t* src = t.data + static_cast<size_t>(r0) * rb;
  out.insert(out.end(), src, src + static_cast<size_t>(n) * rb);
}

Mat owned_mat(ModelWeights& w, std::vector<uint8_t> bytes, core::DType dt, int64_t rows, int64_t cols) {
  w.owned.push_back(std::make_unique<std::vector<uint8_t>>(std::move(bytes)));
  return Mat{w.owned.back()->data(), dt, rows, cols};
}

core::Status bind_mlp(Binder& b, const std::string& p, int64_t hidden, int64_t inter, MlpWeights& m,
                      const std::string& what) {
  DF_ASSIGN(m.gate_proj, b.mat(p + "gate_proj.weight", {inter, hidden}, what));
  DF_ASSIGN(m.up_proj, b.mat(p + "up_proj.weight", {inter, hidden}, what));
  DF_ASSIGN(m.down_proj, b.mat(p + "down_proj.weight", {hidden, inter}, what));
  return core::Status();
}

core::Status bind_moe(Binder& b, const io::Checkpoint& ck, const TextConfig& c, const std::string& p,
                      MoeWeights& m, const std::string& what) {
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  DF_ASSIGN(m.router, b.mat(p + "gate.weight", {E, H}, what + ", router"));
  m.experts.resize(static_cast<size_t>(E));
  const std::string fused_gu = p + "experts.gate_up_proj", fused_d = p + "experts.down_proj";
  if (b.has(fused_gu) || b.has(fused_d)) {
    // Fused layout: gate_up_proj [E, 2I, H] with rows [gate I | up I], down_proj [E, H, I].
    DF_ASSIGN(const io::Tensor* gu, b.find(fused_gu, {E, 2 * I, H}, what + ", fused experts"));
    DF_ASSIGN(const io::Tensor* dn, b.find(fused_d, {E, H, I}, what + ", fused experts"));
    b.count(*gu);
    b.count(*dn);
    const size_t es = core::dtype_size(gu->dtype), ds = core::dtype_size(dn->dtype);
    for (int64_t e = 0; e < E; ++e) {
      const uint8_t* g0 = gu->data + static_cast<size_t>(e * 2 * I * H) * es;
      m.experts[e].gate_proj = Mat{g0, gu->dtype, I, H};
      m.experts[e].up_proj = Mat{g0 + static_cast<size_t>(I * H) * es, gu->dtype, I, H};
      m.experts[e].down_proj = Mat{dn->data + static_cast<size_t>(e * H * I) * ds, dn->dtype, H, I};
    }
  } else {
    for (int64_t e = 0; e < E; ++e)
      DF_TRY(bind_mlp(b, p + "experts." + std::to_string(e) + ".", H, I, m.experts[e],
                      what + ", expert " + std::to_string(e)));
  }
  (void)ck;
  DF_TRY(bind_mlp(b, p + "shared_expert.", H, c.shared_expert_intermediate_size, m.shared_expert,
                  what + ", shared expert"));
  DF_ASSIGN(m.shared_expert_gate,
            b.mat(p + "shared_expert_gate.weight", {1, H}, what + ", shared expert gate"));
  return core::Status();
}

core::Status bind_linear_attention(Binder& b, const io::Checkpoint& ck, const TextConfig& c,
                                   const std::string& p, ModelWeights& w, GatedDeltaNetWeights& g,
                                   const std::string& what) {
  const int64_t H = c.hidden_size, nk = c.linear_num_key_heads, nv = c.linear_num_value_heads;
  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim, K = c.linear_conv_kernel_dim;
  const int64_t conv_dim = c.linear_conv_dim(), vdim = c.linear_value_dim();
  if (c.architecture == Architecture::kQwen3Next) {
    // Grouped projections (modeling_qwen3_next.py fix_query_key_value_ordering): per key head g the rows of
    // in_proj_qkvz are [q_g dk | k_g dk | v_g r*dv | z_g r*dv] and of in_proj_ba [b_g r | a_g r]. Repack once
    // into the flat Qwen3.5 layout so the forward pass has one path.
    const int64_t r = nv / nk, gq = 2 * dk + 2 * r * dv;
    DF_ASSIGN(const io::Tensor* qkvz, b.find(p + "in_proj_qkvz.weight", {nk * gq, H}, what));
    DF_ASSIGN(const io::Tensor* ba, b.find(p + "in_proj_ba.weight", {2 * nv, H}, what));
    b.count(*qkvz);
    b.count(*ba);
    std::vector<uint8_t> qkv, z, bb, aa;
    for (int64_t part = 0; part < 3; ++part)  // q, k, v
      for (int64_t gi = 0; gi < nk; ++gi) {
        const int64_t off = part == 0 ? 0 : part == 1 ? dk : 2 * dk;
        append_rows(qkv, *qkvz, H, gi * gq + off, part == 2 ? r * dv : dk);
      }
    for (int64_t gi = 0; gi < nk; ++gi) append_rows(z, *qkvz, H, gi * gq + 2 * dk + r * dv, r * dv);
    for (int64_t gi = 0; gi < nk; ++gi) {
      append_rows(bb, *ba, H, gi * 2 * r, r);
      append_rows(aa, *ba, H, gi * 2 * r + r, r);
    }
    g.in_proj_qkv = owned_mat(w, std::move(qkv), qkvz->dtype, conv_dim, H);
    g.in_proj_z = owned_mat(w, std::move(z), qkvz->dtype, vdim, H);
    g.in_proj_b = owned_mat(w, std::move(bb), ba->dtype, nv, H);
    g.in_proj_a = owned_mat(w, std::move(aa), ba->dtype, nv, H);
  } else {
    DF_ASSIGN(g.in_proj_qkv, b.mat(p + "in_proj_qkv.weight", {conv_dim, H}, what));
    DF_ASSIGN(g.in_proj_z, b.mat(p + "in_proj_z.weight", {vdim, H}, what));
    DF_ASSIGN(g.in_proj_b, b.mat(p + "in_proj_b.weight", {nv, H}, what));
    DF_ASSIGN(g.in_proj_a, b.mat(p + "in_proj_a.weight", {nv, H}, what));
  }
  (void)ck;
  DF_ASSIGN(g.conv1d, b.mat(p + "conv1d.weight", {conv_dim, 1, K}, what));
  DF_ASSIGN(g.dt_bias, b.mat(p + "dt_bias", {nv}, what));
  DF_ASSIGN(g.A_log, b.mat(p + "A_log", {nv}, what));
  DF_ASSIGN(g.norm, b.mat(p + "norm.weight", {dv}, what));
  DF_ASSIGN(g.out_proj, b.mat(p + "out_proj.weight", {H, vdim}, what));
  return core::Status();
}

core::Status bind_full_attention(Binder& b, const TextConfig& c, const std::string& p,
                                 FullAttentionWeights& a, const std::string& what) {
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  const int64_t q_rows = nh * hd * (c.attn_output_gate ? 2 : 1);
  DF_ASSIGN(a.q_proj, b.mat(p + "q_proj.weight", {q_rows, H}, what));
  DF_ASSIGN(a.k_proj, b.mat(p + "k_proj.weight", {nkv * hd, H}, what));
  DF_ASSIGN(a.v_proj, b.mat(p + "v_proj.weight", {nkv * hd, H}, what));
  DF_ASSIGN(a.o_proj, b.mat(p + "o_proj.weight", {H, nh * hd}, what));
  DF_ASSIGN(a.q_norm, b.mat(p + "q_norm.weight", {hd}, what));
  DF_ASSIGN(a.k_norm, b.mat(p + "k_norm.weight", {hd}, what));
  return core::Status();
}

}  // namespace

core::Expected<ModelWeights> bind_weights(const TextConfig& c, const io::Checkpoint& ck) {
  ModelWeights w;
  Binder b(ck, w);
  const int64_t H = c.hidden_size, V = c.vocab_size;

  static const char* kPrefixes[] = {"model.language_model.", "model.", "language_model.model."};
  for (const char* p : kPrefixes)
    if (ck.find(std::string(p) + "embed_tokens.weight")) {
      w.prefix = p;
      break;
    }
  if (w.prefix.empty())
    return core::Error{
        ck.dir() +
        ": missing tensor 'embed_tokens.weight' under any known prefix (model.language_model., "
        "model., language_model.model.)"};
  const std::string& pre = w.prefix;

  DF_ASSIGN(w.embed_tokens, b.mat(pre + "embed_tokens.weight", {V, H}, "token embedding"));
  w.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights& L = w.layers[i];
    L.type = c.layer_types[i];
    const std::string lp = pre + "layers." + std::to_string(i) + ".";
    const std::string kind = L.type == LayerType::kFullAttention ? "full_attention" : "linear_attention";
    const std::string what = kind + " layer " + std::to_string(i);
    DF_ASSIGN(L.input_layernorm, b.mat(lp + "input_layernorm.weight", {H}, what));
    DF_ASSIGN(L.post_attention_layernorm, b.mat(lp + "post_attention_layernorm.weight", {H}, what));
    if (L.type == LayerType::kFullAttention) {
      DF_TRY(bind_full_attention(b, c, lp + "self_attn.", L.attn, what));
    } else {
      DF_TRY(bind_linear_attention(b, ck, c, lp + "linear_attn.", w, L.linear, what));
    }
    L.is_moe = c.layer_is_moe(i);
    if (L.is_moe) {
      DF_TRY(bind_moe(b, ck, c, lp + "mlp.", L.moe, what + " MoE"));
    } else {
      DF_TRY(bind_mlp(b, lp + "mlp.", H, c.intermediate_size, L.mlp, what + " MLP"));
    }
  }
  DF_ASSIGN(w.norm, b.mat(pre + "norm.weight", {H}, "final norm"));

  // lm_head sits beside the text model: `lm_head.weight` (or `language_model.lm_head.weight` for the old
  // layout).
  const std::string lm_name =
      pre == "language_model.model." ? "language_model.lm_head.weight" : "lm_head.weight";
  if (c.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
    if (b.has(lm_name)) b.mark_used(lm_name);  // a saved copy of the tied matrix; transformers re-ties it
  } else {
    DF_ASSIGN(w.lm_head, b.mat(lm_name, {V, H}, "lm_head (tie_word_embeddings is false)"));
  }

  for (const auto& t : ck.tensors()) {
    if (b.is_used(t.name)) continue;
    if (t.name.rfind("mtp.", 0) == 0) {
      w.mtp_tensors.push_back(t.name);
    } else if (t.name.rfind("model.visual.", 0) == 0 || t.name.rfind("visual.", 0) == 0) {
      w.visual_tensors.push_back(t.name);
    } else {
      return core::Error{*t.file + ": unexpected tensor '" + t.name + "' (not part of a " +
                         architecture_name(c.architecture) + " model with this config)"};
    }
  }
  return w;
}

}  // namespace deltaflow::model
