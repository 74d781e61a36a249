#include "rounded_reference.hpp"

#include <algorithm>
#include <cmath>

#include "backend/cpu/gated_deltanet.hpp"
#include "backend/cpu/ops.hpp"

namespace deltaflow::gpu_test {

using model::LayerType;
namespace cpu = backend::cpu;

core::Expected<std::unique_ptr<RoundedReference>> RoundedReference::load(const std::string& dir,
                                                                         Options opt) {
  std::unique_ptr<RoundedReference> r(new RoundedReference());
  r->opt_ = opt;
  DF_ASSIGN(r->c_, model::load_text_config(dir));
  DF_ASSIGN(r->ck_, io::Checkpoint::open(dir));
  DF_ASSIGN(r->w_, model::bind_weights(r->c_, r->ck_));
  int64_t n_lin = 0, n_full = 0;
  for (const auto& L : r->w_.layers) {
    Consts k;
    k.in_norm = cpu::load_all(L.input_layernorm);
    k.post_norm = cpu::load_all(L.post_attention_layernorm);
    if (L.type == LayerType::kFullAttention) {
      k.q_norm = cpu::load_all(L.attn.q_norm);
      k.k_norm = cpu::load_all(L.attn.k_norm);
      r->type_index_.push_back(n_full++);
    } else {
      k.conv_w = cpu::load_all(L.linear.conv1d);
      k.dt_bias = cpu::load_all(L.linear.dt_bias);
      k.A_log = cpu::load_all(L.linear.A_log);
      k.gdn_norm = cpu::load_all(L.linear.norm);
      r->type_index_.push_back(n_lin++);
    }
    if (L.is_moe) k.shared_gate = cpu::load_all(L.moe.shared_expert_gate);
    r->k_.push_back(std::move(k));
  }
  r->final_norm_ = cpu::load_all(r->w_.norm);
  const int64_t rot = r->c_.rotary_dim();
  for (int64_t i = 0; i < rot / 2; ++i)
    r->inv_freq_.push_back(static_cast<float>(
        1.0 / std::pow(r->c_.rope_theta,
                       static_cast<double>(static_cast<float>(2 * i) / static_cast<float>(rot)))));
  return r;
}

RoundedReference::Sequence RoundedReference::new_sequence() const {
  Sequence s;
  const int64_t n_full = c_.count_layers(LayerType::kFullAttention),
                n_lin = c_.count_layers(LayerType::kLinearAttention);
  s.k.resize(static_cast<size_t>(n_full));
  s.v.resize(static_cast<size_t>(n_full));
  s.conv.assign(
      static_cast<size_t>(n_lin),
      std::vector<float>(static_cast<size_t>(c_.linear_conv_dim() * (c_.linear_conv_kernel_dim - 1)), 0.f));
  s.gdn.assign(static_cast<size_t>(n_lin),
               std::vector<float>(static_cast<size_t>(c_.linear_num_value_heads * c_.linear_key_head_dim *
                                                      c_.linear_value_head_dim),
                                  0.f));
  return s;
}

void RoundedReference::linear(const float* x, int64_t T, const model::Mat& W, float* y, bool never_round,
                              bool always_round) const {
  const bool round =
      opt_.round_gemm_inputs && !never_round &&
      (always_round || (T > opt_.gemm_rows && W.cols % 8 == 0) || (T > opt_.mma_rows && W.cols % 32 == 0)) &&
      (W.dtype == core::DType::kBF16 || W.dtype == core::DType::kF16);
  if (!round) {
    cpu::linear(x, T, W, y);
    return;
  }
  std::vector<float> xr(x, x + T * W.cols);
  for (auto& v : xr)
    v = W.dtype == core::DType::kBF16 ? core::round_bf16(v) : core::f16_to_f32(core::f32_to_f16(v));
  cpu::linear(xr.data(), T, W, y);
}

void RoundedReference::gated_deltanet(size_t layer, int64_t li, const float* x, int64_t T, Sequence& s,
                                      float* out) {
  const auto& c = c_;
  const auto& W = w_.layers[layer].linear;
  const auto& k = k_[layer];
  const int64_t nk = c.linear_num_key_heads, nv = c.linear_num_value_heads, r = nv / nk;
  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const int64_t C = c.linear_conv_dim(), kd = c.linear_key_dim(), vd = c.linear_value_dim();
  std::vector<float> qkv(static_cast<size_t>(T * C)), conv(static_cast<size_t>(T * C));
  std::vector<float> z(static_cast<size_t>(T * vd)), bb(static_cast<size_t>(T * nv)),
      aa(static_cast<size_t>(T * nv));
  linear(x, T, W.in_proj_qkv, qkv.data());
  linear(x, T, W.in_proj_z, z.data());
  linear(x, T, W.in_proj_b, bb.data());
  linear(x, T, W.in_proj_a, aa.data());
  cpu::causal_conv1d_silu(qkv.data(), T, C, k.conv_w.data(), c.linear_conv_kernel_dim, s.conv[li].data(),
                          conv.data());
  std::vector<float> q(static_cast<size_t>(T * nv * dk)), kk(static_cast<size_t>(T * nv * dk));
  std::vector<float> v(static_cast<size_t>(T * nv * dv)), g(static_cast<size_t>(T * nv)),
      beta(static_cast<size_t>(T * nv));
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (int64_t t = 0; t < T; ++t) {
    const float* row = conv.data() + t * C;
    std::vector<float> qh(row, row + kd), kh(row + kd, row + 2 * kd);
    cpu::l2norm(qh.data(), nk, dk, 1e-6f);
    cpu::l2norm(kh.data(), nk, dk, 1e-6f);
    for (int64_t j = 0; j < nv; ++j)
      for (int64_t d = 0; d < dk; ++d) {
        q[(t * nv + j) * dk + d] = qh[(j / r) * dk + d] * q_scale;
        kk[(t * nv + j) * dk + d] = kh[(j / r) * dk + d];
      }
    std::copy(row + 2 * kd, row + 2 * kd + vd, v.begin() + t * vd);
    for (int64_t j = 0; j < nv; ++j) {
      beta[t * nv + j] = cpu::sigmoid(bb[t * nv + j]);
      g[t * nv + j] = -std::exp(k.A_log[j]) * cpu::softplus(aa[t * nv + j] + k.dt_bias[j]);
    }
  }
  std::vector<float> o(static_cast<size_t>(T * nv * dv));
  cpu::DeltaRuleArgs args{q.data(), kk.data(), v.data(), g.data(),         beta.data(), T,
                          nv,       dk,        dv,       s.gdn[li].data(), o.data()};
  cpu::gated_delta_rule_recurrent(args);
  cpu::rmsnorm(o.data(), T * nv, dv, k.gdn_norm.data(), c.rms_norm_eps, o.data());
  for (int64_t i = 0; i < T * vd; ++i) o[i] *= cpu::silu(z[i]);
  linear(o.data(), T, W.out_proj, out);
}

void RoundedReference::full_attention(size_t layer, int64_t ai, const float* x, int64_t T, Sequence& s,
                                      float* out) {
  const auto& c = c_;
  const auto& W = w_.layers[layer].attn;
  const auto& k = k_[layer];
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim, grp = nh / nkv;
  const int64_t qw = c.attn_output_gate ? 2 * hd : hd;
  std::vector<float> qg(static_cast<size_t>(T * nh * qw)), kx(static_cast<size_t>(T * nkv * hd)),
      vx(static_cast<size_t>(T * nkv * hd));
  linear(x, T, W.q_proj, qg.data());
  linear(x, T, W.k_proj, kx.data());
  linear(x, T, W.v_proj, vx.data());
  std::vector<float> q(static_cast<size_t>(T * nh * hd)), gate(static_cast<size_t>(T * nh * hd), 0.f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nh; ++h) {
      const float* src = qg.data() + (t * nh + h) * qw;
      std::copy(src, src + hd, q.begin() + (t * nh + h) * hd);
      if (c.attn_output_gate) std::copy(src + hd, src + 2 * hd, gate.begin() + (t * nh + h) * hd);
    }
  cpu::rmsnorm_1p(q.data(), T * nh, hd, k.q_norm.data(), c.rms_norm_eps, q.data());
  cpu::rmsnorm_1p(kx.data(), T * nkv, hd, k.k_norm.data(), c.rms_norm_eps, kx.data());
  const int64_t p0 = s.pos;
  for (int64_t t = 0; t < T; ++t) {
    cpu::rope_neox(q.data() + t * nh * hd, nh, hd, c.rotary_dim(), inv_freq_.data(), p0 + t);
    cpu::rope_neox(kx.data() + t * nkv * hd, nkv, hd, c.rotary_dim(), inv_freq_.data(), p0 + t);
  }
  if (opt_.bf16_kv) {
    for (auto& e : kx) e = core::round_bf16(e);
    for (auto& e : vx) e = core::round_bf16(e);
  }
  auto& kc = s.k[ai];
  auto& vc = s.v[ai];
  kc.insert(kc.end(), kx.begin(), kx.end());
  vc.insert(vc.end(), vx.begin(), vx.end());
  std::vector<float> o(static_cast<size_t>(T * nh * hd), 0.f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> sc(static_cast<size_t>(p0 + T));
  if (opt_.bf16_kv && T > 1 && (hd == 64 || hd == 128 || hd == 256)) {
    tensor_core_prefill_attention(q, kc, vc, T, p0, o);
  } else {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t kvh = h / grp, n = p0 + t + 1;
        const float* qh = q.data() + (t * nh + h) * hd;
        for (int64_t j = 0; j < n; ++j) {
          const float* kj = kc.data() + (j * nkv + kvh) * hd;
          float d = 0;
          for (int64_t i = 0; i < hd; ++i) d += qh[i] * kj[i];
          sc[j] = d * scale;
        }
        cpu::softmax(sc.data(), n);
        float* oh = o.data() + (t * nh + h) * hd;
        for (int64_t j = 0; j < n; ++j) {
          const float* vj = vc.data() + (j * nkv + kvh) * hd;
          for (int64_t i = 0; i < hd; ++i) oh[i] += sc[j] * vj[i];
        }
      }
  }
  if (c.attn_output_gate)
    for (int64_t i = 0; i < T * nh * hd; ++i) o[i] *= cpu::sigmoid(gate[i]);
  linear(o.data(), T, W.o_proj, out);
}

// backend/cuda/attention_prefill.cu's numerics: q rounded to bf16; per 64-key tile (from key 0) an fp32
// online softmax in the log2 domain with the weights p rounded to bf16 before p.v; l sums the unrounded p.
void RoundedReference::tensor_core_prefill_attention(std::vector<float> q, const std::vector<float>& kc,
                                                     const std::vector<float>& vc, int64_t T, int64_t p0,
                                                     std::vector<float>& o) const {
  const int64_t nh = c_.num_attention_heads, nkv = c_.num_key_value_heads, hd = c_.head_dim, grp = nh / nkv;
  constexpr int64_t kKeys = 64;
  const float sl = 1.0f / std::sqrt(static_cast<float>(hd)) * 1.4426950408889634f;
  for (auto& e : q) e = core::round_bf16(e);
  std::vector<float> s(kKeys), acc(static_cast<size_t>(hd));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t kvh = h / grp, n = p0 + t + 1;
      const float* qh = q.data() + (t * nh + h) * hd;
      float m = -INFINITY, l = 0.f;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j0 = 0; j0 < n; j0 += kKeys) {
        const int64_t nk = std::min(kKeys, n - j0);
        float mx = -INFINITY;
        for (int64_t j = 0; j < nk; ++j) {
          const float* kj = kc.data() + ((j0 + j) * nkv + kvh) * hd;
          float d = 0;
          for (int64_t i = 0; i < hd; ++i) d += qh[i] * kj[i];
          s[static_cast<size_t>(j)] = d;
          mx = std::max(mx, d);
        }
        const float mn = std::max(m, mx * sl), corr = std::exp2(m - mn);
        m = mn;
        float sum = 0.f;
        for (auto& a : acc) a *= corr;
        for (int64_t j = 0; j < nk; ++j) {
          const float p = std::exp2(std::fma(s[static_cast<size_t>(j)], sl, -mn));
          sum += p;
          const float pb = core::round_bf16(p);
          const float* vj = vc.data() + ((j0 + j) * nkv + kvh) * hd;
          for (int64_t i = 0; i < hd; ++i) acc[static_cast<size_t>(i)] += pb * vj[i];
        }
        l = l * corr + sum;
      }
      float* oh = o.data() + (t * nh + h) * hd;
      for (int64_t i = 0; i < hd; ++i) oh[i] = acc[static_cast<size_t>(i)] / l;
    }
}

void RoundedReference::swiglu(const model::MlpWeights& m, const float* x, int64_t T, float* out,
                              bool never_round, bool round_gate_up, bool grouped) const {
  const int64_t I = m.gate_proj.rows;
  std::vector<float> g(static_cast<size_t>(T * I)), u(static_cast<size_t>(T * I));
  const auto half = [](const model::Mat& W) {
    return W.dtype == core::DType::kBF16 || W.dtype == core::DType::kF16;
  };
  const bool one_type =
      half(m.gate_proj) && m.gate_proj.dtype == m.up_proj.dtype && m.gate_proj.dtype == m.down_proj.dtype;
  // The grouped expert GEMM (moe_grouped.cuh) rounds every row it takes, whatever the expert's count.
  const bool all =
      grouped && one_type && !never_round && m.gate_proj.cols % 32 == 0 && m.down_proj.cols % 32 == 0;
  linear(x, T, m.gate_proj, g.data(), never_round, all);
  linear(x, T, m.up_proj, u.data(), never_round, all);
  // cuda_backend.cpp mlp_16bit: over more than gemm_rows rows, with all three matmuls on cuBLASLt in one
  // 16-bit type, [gate | up] comes out in that type; and so out of the grouped expert GEMM.
  if (opt_.round_gemm_inputs && (all || (round_gate_up && !never_round && T > opt_.gemm_rows && one_type &&
                                         m.gate_proj.cols % 8 == 0 && m.down_proj.cols % 8 == 0))) {
    const auto r = [&](float v) {
      return m.gate_proj.dtype == core::DType::kBF16 ? core::round_bf16(v)
                                                     : core::f16_to_f32(core::f32_to_f16(v));
    };
    for (auto& v : g) v = r(v);
    for (auto& v : u) v = r(v);
  }
  for (int64_t i = 0; i < T * I; ++i) g[i] = cpu::silu(g[i]) * u[i];
  linear(g.data(), T, m.down_proj, out, never_round, all);
}

void RoundedReference::ffn(size_t layer, const float* x, int64_t T, float* out) {
  const auto& c = c_;
  const auto& L = w_.layers[layer];
  const int64_t H = c.hidden_size;
  if (!L.is_moe) {
    swiglu(L.mlp, x, T, out, false, /*round_gate_up=*/true);
    return;
  }
  const int64_t E = c.num_experts, K = c.num_experts_per_tok;
  // Up to gemm_rows tokens the MoE block runs the fused fp32 decode kernels (moe_decode.cuh): no rounding.
  const bool fp32_block = T <= opt_.gemm_rows;
  std::vector<float> probs(static_cast<size_t>(T * E));
  linear(x, T, L.moe.router, probs.data(), /*never_round=*/true);
  std::vector<std::vector<std::pair<int64_t, float>>> routed(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    float* p = probs.data() + t * E;
    cpu::softmax(p, E);
    std::vector<int64_t> idx(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) idx[e] = e;
    std::partial_sort(idx.begin(), idx.begin() + K, idx.end(),
                      [&](int64_t a, int64_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float sum = 0;
    for (int64_t j = 0; j < K; ++j) sum += p[idx[j]];
    const bool renorm = c.architecture != model::Architecture::kQwen3Next || c.norm_topk_prob;
    for (int64_t j = 0; j < K; ++j) routed[idx[j]].push_back({t, renorm ? p[idx[j]] / sum : p[idx[j]]});
  }
  std::fill(out, out + T * H, 0.0f);
  std::vector<float> xe, ye;
  for (int64_t e = 0; e < E; ++e) {
    const auto& rows = routed[e];
    if (rows.empty()) continue;
    const int64_t n = static_cast<int64_t>(rows.size());
    xe.resize(static_cast<size_t>(n * H));
    ye.resize(static_cast<size_t>(n * H));
    for (int64_t i = 0; i < n; ++i)
      std::copy(x + rows[i].first * H, x + (rows[i].first + 1) * H, xe.begin() + i * H);
    swiglu(L.moe.experts[e], xe.data(), n, ye.data(), fp32_block, false, /*grouped=*/!fp32_block);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < H; ++d) out[rows[i].first * H + d] += rows[i].second * ye[i * H + d];
  }
  std::vector<float> sh(static_cast<size_t>(T * H)), gl(static_cast<size_t>(T));
  swiglu(L.moe.shared_expert, x, T, sh.data(), fp32_block, /*round_gate_up=*/true);
  linear(x, T, L.moe.shared_expert_gate, gl.data(), /*never_round=*/true);
  for (int64_t t = 0; t < T; ++t) {
    const float gate = cpu::sigmoid(gl[t]);
    for (int64_t i = 0; i < H; ++i) out[t * H + i] += gate * sh[t * H + i];
  }
}

std::vector<float> RoundedReference::forward(Sequence& s, std::span<const int32_t> tokens, bool all_logits) {
  const auto& c = c_;
  const int64_t T = static_cast<int64_t>(tokens.size()), H = c.hidden_size, V = c.vocab_size;
  std::vector<float> h(static_cast<size_t>(T * H)), xn(static_cast<size_t>(T * H)),
      y(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t) cpu::load_row(w_.embed_tokens, tokens[t], h.data() + t * H);
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    cpu::rmsnorm_1p(h.data(), T, H, k_[l].in_norm.data(), c.rms_norm_eps, xn.data());
    if (w_.layers[l].type == LayerType::kFullAttention) {
      full_attention(l, type_index_[l], xn.data(), T, s, y.data());
    } else {
      gated_deltanet(l, type_index_[l], xn.data(), T, s, y.data());
    }
    for (int64_t i = 0; i < T * H; ++i) h[i] += y[i];
    cpu::rmsnorm_1p(h.data(), T, H, k_[l].post_norm.data(), c.rms_norm_eps, xn.data());
    ffn(l, xn.data(), T, y.data());
    for (int64_t i = 0; i < T * H; ++i) h[i] += y[i];
  }
  s.pos += T;
  const int64_t first = all_logits ? 0 : T - 1, rows = T - first;
  cpu::rmsnorm_1p(h.data() + first * H, rows, H, final_norm_.data(), c.rms_norm_eps, xn.data());
  std::vector<float> logits(static_cast<size_t>(rows * V));
  linear(xn.data(), rows, w_.lm_head, logits.data());
  return logits;
}

}  // namespace deltaflow::gpu_test
