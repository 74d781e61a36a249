// The one weight table: HF tensor names -> typed fields of ModelWeights, with shape and dtype checks.
// Mirrors transformers 5.17: Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM (which strip `language_model.` and
// ignore `mtp.*` and `model.visual.*`) and Qwen3NextForCausalLM.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "model/weights.hpp"

namespace deltaflow::model {
namespace {

bool is_float_weight(core::DType t) {
  return t == core::DType::kBF16 || t == core::DType::kF16 || t == core::DType::kF32;
}

std::string scheme_name(const quant::LinearScheme& s) {
  return s.algo.empty() ? std::string(quant::format_name(s.format)) : s.algo;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

class Binder {
 public:
  Binder(const io::Checkpoint& ck, const quant::QuantConfig& q, ModelWeights& w) : ck_(ck), q_(q), w_(w) {}

  // The tensor `name` with exactly `shape`, viewed as [shape[0], rest...] (a 1-D tensor as [1, n]); float.
  core::Expected<Mat> mat(const std::string& name, const std::vector<int64_t>& shape,
                          const std::string& what) {
    DF_ASSIGN(const io::Tensor* t, find(name, shape, what));
    Mat m;
    m.data = t->data;
    m.dtype = t->dtype;
    m.name = &t->name;
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

  // The weight [N, K] of the linear module `module` (checkpoint name without ".weight"): float, or in the
  // format the quantization config gives it, with its scale tensors.
  core::Expected<Mat> linear(const std::string& module, int64_t N, int64_t K, const std::string& what) {
    const quant::LinearScheme s = q_.scheme_for(module);
    const std::string wname = module + ".weight";
    if (!s.supported)
      return core::Error{where(module) + ": tensor '" + wname + "': format " + scheme_name(s) +
                         " is not supported"};
    if (s.format == quant::WeightFormat::kFloat) {
      const io::Tensor* t = ck_.find(wname);
      if (t && !is_float_weight(t->dtype) && q_.quantized())
        return core::Error{*t->file + ": tensor '" + wname + "' has dtype " +
                           std::string(core::dtype_name(t->dtype)) + " but " + q_.where + " leaves module '" +
                           module + "' unquantized (" + q_.summary + ")"};
      return mat(wname, {N, K}, what);
    }
    const bool ct = q_.convention == quant::Convention::kCompressedTensors;
    const std::string qname =
        ct && s.format == quant::WeightFormat::kNvfp4 ? module + ".weight_packed" : wname;
    const io::Tensor* t = ck_.find(qname);
    const io::Tensor* f = ck_.find(wname);
    if (f && is_float_weight(f->dtype) && (!t || t == f)) {
      // Qwen's FP8 configs list only some of the modules they keep in bf16; a float weight without scales
      // is a module kept as it is.
      if (q_.convention == quant::Convention::kQwenFp8 && !has(module + ".weight_scale_inv"))
        return mat(wname, {N, K}, what);
      return core::Error{*f->file + ": tensor '" + wname + "' has dtype " +
                         std::string(core::dtype_name(f->dtype)) + " but " + q_.where + " gives module '" +
                         module + "' format " + scheme_name(s)};
    }
    Mat m;
    m.rows = N;
    m.cols = K;
    m.format = s.format;
    if (s.format == quant::WeightFormat::kNvfp4) {
      if (K % quant::kNvfp4Group != 0)
        return core::Error{where(module) + ": tensor '" + qname + "': NVFP4 needs in_features (" +
                           std::to_string(K) + ") to be a multiple of 16"};
      DF_ASSIGN(t, quant_tensor(qname, {N, K / 2}, core::DType::kU8, s, what));
      DF_ASSIGN(const io::Tensor* sc, quant_tensor(module + ".weight_scale", {N, K / quant::kNvfp4Group},
                                                   core::DType::kF8E4M3, s, what));
      m.scale = quant::ScaleView{sc->data, sc->dtype, N, K / quant::kNvfp4Group, 1, quant::kNvfp4Group};
      count_extra(*sc);
      if (ct) {
        DF_ASSIGN(m.global_scale, scalar(module + ".weight_global_scale", s, what, true));
        m.global_op = quant::GlobalOp::kDivide;
        if (has(module + ".input_global_scale")) {
          DF_ASSIGN(float in, scalar(module + ".input_global_scale", s, what, true));
          m.input_scale = 1.0f / in;
        }
      } else {
        DF_ASSIGN(m.global_scale, scalar(module + ".weight_scale_2", s, what, false));
        if (has(module + ".input_scale")) {
          DF_ASSIGN(m.input_scale, scalar(module + ".input_scale", s, what, false));
        }
      }
    } else {  // FP8
      DF_ASSIGN(t, quant_tensor(wname, {N, K}, core::DType::kF8E4M3, s, what));
      const bool qwen = q_.convention == quant::Convention::kQwenFp8;
      const std::string sname = module + (qwen ? ".weight_scale_inv" : ".weight_scale");
      const io::Tensor* sc = ck_.find(sname);
      if (!sc)
        return core::Error{where(module) + ": missing tensor '" + sname + "' (" + scheme_name(s) + ", " +
                           what + ")"};
      if (sc->dtype != core::DType::kF32 && sc->dtype != core::DType::kBF16 && sc->dtype != core::DType::kF16)
        return core::Error{*sc->file + ": tensor '" + sname + "' has dtype " +
                           std::string(core::dtype_name(sc->dtype)) + ", expected F32, BF16 or F16 (" +
                           scheme_name(s) + ")"};
      quant::ScaleView v{sc->data, sc->dtype, 1, 1, N, K};
      std::vector<int64_t> want;
      if (s.fp8_scales == quant::Fp8Scales::kTensor) {
        if (sc->numel() != 1)
          return core::Error{*sc->file + ": tensor '" + sname + "' has shape " + io::shape_string(sc->shape) +
                             ", expected one value (" + scheme_name(s) + " per-tensor scale)"};
      } else if (s.fp8_scales == quant::Fp8Scales::kChannel) {
        want = {N, 1};
        if (sc->shape != want && sc->shape != std::vector<int64_t>{N})
          return core::Error{*sc->file + ": tensor '" + sname + "' has shape " + io::shape_string(sc->shape) +
                             ", expected " + io::shape_string(want) + " (" + scheme_name(s) +
                             " per-channel scales)"};
        v = quant::ScaleView{sc->data, sc->dtype, N, 1, 1, K};
      } else {
        // ModelOpt's FP8_PB_WO is 128x128 like the others.
        const int64_t br = s.block_rows, bc = s.block_cols;
        want = {ceil_div(N, br), ceil_div(K, bc)};
        if (sc->shape != want)
          return core::Error{*sc->file + ": tensor '" + sname + "' has shape " + io::shape_string(sc->shape) +
                             ", expected " + io::shape_string(want) + " (" + scheme_name(s) + " " +
                             std::to_string(br) + "x" + std::to_string(bc) + " block scales)"};
        v = quant::ScaleView{sc->data, sc->dtype, want[0], want[1], br, bc};
      }
      for (int64_t i = 0; i < v.rows * v.cols; ++i) {
        const float x = core::load_as_f32(sc->data, sc->dtype, static_cast<size_t>(i));
        if (!std::isfinite(x))
          return core::Error{*sc->file + ": tensor '" + sname + "' holds a non-finite scale (" +
                             scheme_name(s) + ")"};
      }
      m.scale = v;
      used_.insert(sname);
      count_extra(*sc);
      const std::string iname = module + ".input_scale";
      if (has(iname)) {
        DF_ASSIGN(m.input_scale, scalar(iname, s, what, false));
      }
    }
    m.data = t->data;
    m.dtype = t->dtype;
    m.name = &t->name;
    w_.bytes += t->nbytes;
    w_.parameter_count += N * K;
    return m;
  }

  core::Expected<const io::Tensor*> find(const std::string& name, const std::vector<int64_t>& shape,
                                         const std::string& what) {
    const io::Tensor* t = ck_.find(name);
    if (!t)
      return core::Error{ck_.dir() + ": missing tensor '" + name + "' (expected shape " +
                         io::shape_string(shape) + ", " + what + ")"};
    if (t->shape != shape)
      return core::Error{*t->file + ": tensor '" + name + "' has shape " + io::shape_string(t->shape) +
                         ", expected " + io::shape_string(shape) + " (" + what + ")"};
    if (!is_float_weight(t->dtype))
      return core::Error{*t->file + ": tensor '" + name + "' has dtype " +
                         std::string(core::dtype_name(t->dtype)) + ", expected BF16, F16 or F32" +
                         (q_.quantized()
                              ? " (" + q_.where + " does not quantize it: " + q_.summary + ")"
                              : " (no quantization_config or hf_quant_config.json says how to read it)")};
    used_.insert(name);
    return t;
  }

  bool has(const std::string& name) const { return ck_.find(name) != nullptr; }
  const io::Checkpoint& checkpoint() const { return ck_; }
  void mark_used(const std::string& name) { used_.insert(name); }
  bool is_used(const std::string& name) const { return used_.count(name) > 0; }
  void count(const io::Tensor& t) {
    w_.bytes += t.nbytes;
    w_.parameter_count += t.numel();
  }
  // Scales: bytes only, they are not parameters.
  void count_extra(const io::Tensor& t) { w_.bytes += t.nbytes; }

 private:
  std::string where(const std::string& module) const {
    const io::Tensor* t = ck_.find(module + ".weight");
    if (!t) t = ck_.find(module + ".weight_packed");
    return t ? *t->file : ck_.dir();
  }

  // A quantized tensor of exactly `shape` and `dtype`.
  core::Expected<const io::Tensor*> quant_tensor(const std::string& name, const std::vector<int64_t>& shape,
                                                 core::DType dtype, const quant::LinearScheme& s,
                                                 const std::string& what) {
    const io::Tensor* t = ck_.find(name);
    if (!t)
      return core::Error{ck_.dir() + ": missing tensor '" + name + "' (" + scheme_name(s) + ", expected " +
                         std::string(core::dtype_name(dtype)) + " " + io::shape_string(shape) + ", " + what +
                         ")"};
    if (t->dtype != dtype || t->shape != shape)
      return core::Error{*t->file + ": tensor '" + name + "' is " + std::string(core::dtype_name(t->dtype)) +
                         " " + io::shape_string(t->shape) + ", expected " +
                         std::string(core::dtype_name(dtype)) + " " + io::shape_string(shape) + " (" +
                         scheme_name(s) + ", " + what + ")"};
    used_.insert(name);
    return t;
  }

  // A one-value F32 scale ([] or [1]); `nonzero` for divisors.
  core::Expected<float> scalar(const std::string& name, const quant::LinearScheme& s, const std::string& what,
                               bool nonzero) {
    const io::Tensor* t = ck_.find(name);
    if (!t)
      return core::Error{ck_.dir() + ": missing tensor '" + name + "' (" + scheme_name(s) + ", " + what +
                         ")"};
    if (t->numel() != 1 || t->shape.size() > 1 ||
        (t->dtype != core::DType::kF32 && t->dtype != core::DType::kBF16 && t->dtype != core::DType::kF16))
      return core::Error{*t->file + ": tensor '" + name + "' is " + std::string(core::dtype_name(t->dtype)) +
                         " " + io::shape_string(t->shape) + ", expected one F32 value (" + scheme_name(s) +
                         ")"};
    const float v = core::load_as_f32(t->data, t->dtype, 0);
    if (!std::isfinite(v) || (nonzero && v == 0.0f))
      return core::Error{*t->file + ": tensor '" + name + "' holds " + std::to_string(v) +
                         ", expected a finite" + (nonzero ? " non-zero" : "") + " scale (" + scheme_name(s) +
                         ")"};
    used_.insert(name);
    count_extra(*t);
    return v;
  }

  const io::Checkpoint& ck_;
  const quant::QuantConfig& q_;
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
  DF_ASSIGN(m.gate_proj, b.linear(p + "gate_proj", inter, hidden, what));
  DF_ASSIGN(m.up_proj, b.linear(p + "up_proj", inter, hidden, what));
  DF_ASSIGN(m.down_proj, b.linear(p + "down_proj", hidden, inter, what));
  return core::Status();
}

core::Status bind_moe(Binder& b, const io::Checkpoint& ck, const TextConfig& c, const std::string& p,
                      MoeWeights& m, const std::string& what) {
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  DF_ASSIGN(m.router, b.linear(p + "gate", E, H, what + ", router"));
  m.experts.resize(static_cast<size_t>(E));
  const std::string fused_gu = p + "experts.gate_up_proj", fused_d = p + "experts.down_proj";
  if (b.has(fused_gu) || b.has(fused_d)) {
    // Fused layout: gate_up_proj [E, 2I, H] with rows [gate I | up I], down_proj [E, H, I].
    for (const std::string& n : {fused_gu, fused_d}) {
      const io::Tensor* t = ck.find(n);
      if (t && !is_float_weight(t->dtype))
        return core::Error{
            *t->file + ": tensor '" + n + "' is " + std::string(core::dtype_name(t->dtype)) +
            ": quantized fused experts are not supported (quantized experts load as per-expert "
            "tensors, experts.E.{gate,up,down}_proj)"};
    }
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
  DF_TRY(bind_mlp(b, p + "shared_expert.", H, c.shared_expert_intermediate_size, m.shared_expert,
                  what + ", shared expert"));
  DF_ASSIGN(m.shared_expert_gate, b.linear(p + "shared_expert_gate", 1, H, what + ", shared expert gate"));
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
    DF_ASSIGN(g.in_proj_qkv, b.linear(p + "in_proj_qkv", conv_dim, H, what));
    DF_ASSIGN(g.in_proj_z, b.linear(p + "in_proj_z", vdim, H, what));
    DF_ASSIGN(g.in_proj_b, b.linear(p + "in_proj_b", nv, H, what));
    DF_ASSIGN(g.in_proj_a, b.linear(p + "in_proj_a", nv, H, what));
  }
  (void)ck;
  DF_ASSIGN(g.conv1d, b.mat(p + "conv1d.weight", {conv_dim, 1, K}, what));
  DF_ASSIGN(g.dt_bias, b.mat(p + "dt_bias", {nv}, what));
  DF_ASSIGN(g.A_log, b.mat(p + "A_log", {nv}, what));
  DF_ASSIGN(g.norm, b.mat(p + "norm.weight", {dv}, what));
  DF_ASSIGN(g.out_proj, b.linear(p + "out_proj", H, vdim, what));
  return core::Status();
}

core::Status bind_full_attention(Binder& b, const TextConfig& c, const std::string& p,
                                 FullAttentionWeights& a, const std::string& what) {
  const int64_t H = c.hidden_size, nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  const int64_t q_rows = nh * hd * (c.attn_output_gate ? 2 : 1);
  DF_ASSIGN(a.q_proj, b.linear(p + "q_proj", q_rows, H, what));
  DF_ASSIGN(a.k_proj, b.linear(p + "k_proj", nkv * hd, H, what));
  DF_ASSIGN(a.v_proj, b.linear(p + "v_proj", nkv * hd, H, what));
  DF_ASSIGN(a.o_proj, b.linear(p + "o_proj", H, nh * hd, what));
  DF_ASSIGN(a.q_norm, b.mat(p + "q_norm.weight", {hd}, what));
  DF_ASSIGN(a.k_norm, b.mat(p + "k_norm.weight", {hd}, what));
  return core::Status();
}

// FP8 KV-cache scales of a full-attention layer: ModelOpt writes self_attn.{k,v}_proj.{k,v}_scale,
// compressed-tensors self_attn.{k,v}_scale. Recognised and kept aside: the KV cache runs in bf16/fp32 for
// now.
bool is_kv_scale(const std::string& name, const std::string& pre) {
  if (name.rfind(pre + "layers.", 0) != 0) return false;
  for (const char* tail : {".self_attn.k_proj.k_scale", ".self_attn.v_proj.v_scale", ".self_attn.k_scale",
                           ".self_attn.v_scale"}) {
    const size_t n = std::strlen(tail);
    if (name.size() > n && name.compare(name.size() - n, n, tail) == 0) return true;
  }
  return false;
}

// The MTP head, when the config asks for one and its decoder layer is in the checkpoint. A checkpoint with
// only part of a head (no mtp.layers.0.*) keeps those tensors as recognised and unbound.
core::Status bind_mtp(Binder& b, const TextConfig& c, ModelWeights& w) {
  if (c.mtp_num_hidden_layers < 1 || !b.has("mtp.fc.weight") || !b.has("mtp.layers.0.input_layernorm.weight"))
    return core::Status();
  const int64_t H = c.hidden_size;
  MtpWeights& m = w.mtp;
  const std::string what = "MTP head";
  // The head's bytes and parameters are its own, not the text model's (bench rooflines, inspect).
  const uint64_t bytes0 = w.bytes;
  const int64_t params0 = w.parameter_count;
  DF_ASSIGN(m.pre_fc_norm_embedding, b.mat("mtp.pre_fc_norm_embedding.weight", {H}, what));
  DF_ASSIGN(m.pre_fc_norm_hidden, b.mat("mtp.pre_fc_norm_hidden.weight", {H}, what));
  DF_ASSIGN(m.fc, b.linear("mtp.fc", H, 2 * H, what));
  DF_ASSIGN(m.norm, b.mat("mtp.norm.weight", {H}, what));
  LayerWeights& L = m.layer;
  L.type = LayerType::kFullAttention;
  const std::string lp = "mtp.layers.0.";
  DF_ASSIGN(L.input_layernorm, b.mat(lp + "input_layernorm.weight", {H}, what));
  DF_ASSIGN(L.post_attention_layernorm, b.mat(lp + "post_attention_layernorm.weight", {H}, what));
  DF_TRY(bind_full_attention(b, c, lp + "self_attn.", L.attn, what));
  // The MTP layer's FFN is sparse in MoE models (per-expert tensors in the official checkpoints).
  L.is_moe = c.num_experts > 0;
  if (L.is_moe) {
    DF_TRY(bind_moe(b, b.checkpoint(), c, lp + "mlp.", L.moe, what + " MoE"));
  } else {
    DF_TRY(bind_mlp(b, lp + "mlp.", H, c.intermediate_size, L.mlp, what + " MLP"));
  }
  m.present = true;
  m.bytes = w.bytes - bytes0;
  m.parameter_count = w.parameter_count - params0;
  w.bytes = bytes0;
  w.parameter_count = params0;
  return core::Status();
}

}  // namespace

core::Expected<ModelWeights> bind_weights(const TextConfig& c, const io::Checkpoint& ck) {
  ModelWeights w;
  Binder b(ck, c.quant, w);
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
  const std::string lm_module = pre == "language_model.model." ? "language_model.lm_head" : "lm_head";
  const std::string lm_name = lm_module + ".weight";
  if (c.tie_word_embeddings) {
    w.lm_head = w.embed_tokens;
    // A saved copy of the tied matrix (transformers re-ties it), or a quantized copy with its scales
    // (ModelOpt quantizes the tied lm_head and writes it beside the embedding): recognised, not used.
    for (const auto& t : ck.tensors())
      if (t.name.rfind(lm_module + ".", 0) == 0 && !b.is_used(t.name)) {
        b.mark_used(t.name);
        if (t.name != lm_name || t.dtype != w.embed_tokens.dtype) w.tied_lm_head_tensors.push_back(t.name);
      }
  } else {
    DF_ASSIGN(w.lm_head, b.linear(lm_module, V, H, "lm_head (tie_word_embeddings is false)"));
  }

  DF_TRY(bind_mtp(b, c, w));

  for (const auto& t : ck.tensors()) {
    if (b.is_used(t.name)) continue;
    if (t.name.rfind("mtp.", 0) == 0) {
      w.mtp_tensors.push_back(t.name);
    } else if (is_kv_scale(t.name, pre)) {
      w.kv_scale_tensors.push_back(t.name);
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
