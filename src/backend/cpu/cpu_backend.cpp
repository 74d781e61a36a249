#include "backend/cpu/cpu_backend.hpp"

#include <algorithm>
#include <cmath>

#include "backend/cpu/gated_deltanet.hpp"
#include "backend/cpu/ops.hpp"
#include "core/threads.hpp"

namespace deltaflow::backend::cpu {

using model::LayerType;

core::Expected<std::unique_ptr<CpuBackend>> CpuBackend::load(const std::string& dir) {
  std::unique_ptr<CpuBackend> b(new CpuBackend());
  DF_ASSIGN(b->config_, model::load_text_config(dir));
  DF_ASSIGN(b->checkpoint_, io::Checkpoint::open(dir));
  DF_ASSIGN(b->weights_, model::bind_weights(b->config_, b->checkpoint_));
  const auto& c = b->config_;

  int64_t n_linear = 0, n_full = 0;
  for (size_t i = 0; i < b->weights_.layers.size(); ++i) {
    const auto& L = b->weights_.layers[i];
    LayerConsts k;
    k.input_norm = load_all(L.input_layernorm);
    k.post_norm = load_all(L.post_attention_layernorm);
    if (L.type == LayerType::kFullAttention) {
      k.q_norm = load_all(L.attn.q_norm);
      k.k_norm = load_all(L.attn.k_norm);
      b->type_index_.push_back(n_full++);
    } else {
      k.conv_w = load_all(L.linear.conv1d);
      k.dt_bias = load_all(L.linear.dt_bias);
      k.A_log = load_all(L.linear.A_log);
      k.gdn_norm = load_all(L.linear.norm);
      b->type_index_.push_back(n_linear++);
    }
    if (L.is_moe) k.shared_gate = load_all(L.moe.shared_expert_gate);
    b->consts_.push_back(std::move(k));
  }
  b->final_norm_ = load_all(b->weights_.norm);
  // inv_freq[i] = 1 / theta^(2i / rot), as Qwen3_5TextRotaryEmbedding computes it.
  const int64_t rot = c.rotary_dim();
  for (int64_t i = 0; i < rot / 2; ++i)
    b->inv_freq_.push_back(static_cast<float>(
        1.0 /
        std::pow(c.rope_theta, static_cast<double>(static_cast<float>(2 * i) / static_cast<float>(rot)))));
  return b;
}

std::unique_ptr<SequenceState> CpuBackend::new_sequence() {
  auto s = std::make_unique<CpuSequenceState>();
  const auto& c = config_;
  const int64_t n_full = c.count_layers(LayerType::kFullAttention);
  const int64_t n_linear = c.count_layers(LayerType::kLinearAttention);
  s->key_cache.resize(static_cast<size_t>(n_full));
  s->value_cache.resize(static_cast<size_t>(n_full));
  s->conv_state.assign(
      static_cast<size_t>(n_linear),
      std::vector<float>(static_cast<size_t>(c.linear_conv_dim() * (c.linear_conv_kernel_dim - 1)), 0.f));
  s->gdn_state.assign(static_cast<size_t>(n_linear),
                      std::vector<float>(static_cast<size_t>(c.linear_num_value_heads *
                                                             c.linear_key_head_dim * c.linear_value_head_dim),
                                         0.f));
  return s;
}

void CpuBackend::gated_deltanet(size_t layer, int64_t li, const float* x, int64_t T, CpuSequenceState& s,
                                bool recurrent, float* out) {
  const auto& c = config_;
  const auto& W = weights_.layers[layer].linear;
  const auto& k = consts_[layer];
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
  causal_conv1d_silu(qkv.data(), T, C, k.conv_w.data(), c.linear_conv_kernel_dim, s.conv_state[li].data(),
                     conv.data());

  // Split the conv output into q, k (nk heads, repeated to nv: value head j reads key head j / r) and v.
  std::vector<float> q(static_cast<size_t>(T * nv * dk)), kk(static_cast<size_t>(T * nv * dk));
  std::vector<float> v(static_cast<size_t>(T * nv * dv)), g(static_cast<size_t>(T * nv)),
      beta(static_cast<size_t>(T * nv));
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (int64_t t = 0; t < T; ++t) {
    const float* row = conv.data() + t * C;
    std::vector<float> qh(static_cast<size_t>(nk * dk)), kh(static_cast<size_t>(nk * dk));
    std::copy(row, row + kd, qh.begin());
    std::copy(row + kd, row + 2 * kd, kh.begin());
    l2norm(qh.data(), nk, dk, 1e-6f);
    l2norm(kh.data(), nk, dk, 1e-6f);
    for (int64_t j = 0; j < nv; ++j)
      for (int64_t d = 0; d < dk; ++d) {
        q[(t * nv + j) * dk + d] = qh[(j / r) * dk + d] * q_scale;
        kk[(t * nv + j) * dk + d] = kh[(j / r) * dk + d];
      }
    std::copy(row + 2 * kd, row + 2 * kd + vd, v.begin() + t * vd);
    for (int64_t j = 0; j < nv; ++j) {
      beta[t * nv + j] = sigmoid(bb[t * nv + j]);
      g[t * nv + j] = -std::exp(k.A_log[j]) * softplus(aa[t * nv + j] + k.dt_bias[j]);
    }
  }

  std::vector<float> o(static_cast<size_t>(T * nv * dv));
  DeltaRuleArgs args{
      q.data(), kk.data(), v.data(), g.data(), beta.data(), T, nv, dk, dv, s.gdn_state[li].data(), o.data()};
  if (recurrent) {
    gated_delta_rule_recurrent(args);
  } else {
    gated_delta_rule_chunked(args);
  }

  // Gated RMSNorm per head (plain weight), times SiLU(z); then out_proj.
  rmsnorm(o.data(), T * nv, dv, k.gdn_norm.data(), c.rms_norm_eps, o.data());
  for (int64_t i = 0; i < T * vd; ++i) o[i] *= silu(z[i]);
  linear(o.data(), T, W.out_proj, out);
}

void CpuBackend::full_attention(size_t layer, int64_t ai, const float* x, int64_t T, CpuSequenceState& s,
                                float* out) {
  const auto& c = config_;
  const auto& W = weights_.layers[layer].attn;
  const auto& k = consts_[layer];
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim, grp = nh / nkv;
  const int64_t qw = c.attn_output_gate ? 2 * hd : hd;

  std::vector<float> qg(static_cast<size_t>(T * nh * qw)), kx(static_cast<size_t>(T * nkv * hd)),
      vx(static_cast<size_t>(T * nkv * hd));
  linear(x, T, W.q_proj, qg.data());
  linear(x, T, W.k_proj, kx.data());
  linear(x, T, W.v_proj, vx.data());

  // q_proj's rows are per head [q | gate] (an interleave, not two halves of the whole projection).
  std::vector<float> q(static_cast<size_t>(T * nh * hd)), gate(static_cast<size_t>(T * nh * hd), 0.f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < nh; ++h) {
      const float* src = qg.data() + (t * nh + h) * qw;
      std::copy(src, src + hd, q.begin() + (t * nh + h) * hd);
      if (c.attn_output_gate) std::copy(src + hd, src + 2 * hd, gate.begin() + (t * nh + h) * hd);
    }
  rmsnorm_1p(q.data(), T * nh, hd, k.q_norm.data(), c.rms_norm_eps, q.data());
  rmsnorm_1p(kx.data(), T * nkv, hd, k.k_norm.data(), c.rms_norm_eps, kx.data());
  const int64_t p0 = s.pos;
  for (int64_t t = 0; t < T; ++t) {
    rope_neox(q.data() + t * nh * hd, nh, hd, c.rotary_dim(), inv_freq_.data(), p0 + t);
    rope_neox(kx.data() + t * nkv * hd, nkv, hd, c.rotary_dim(), inv_freq_.data(), p0 + t);
  }
  auto& kc = s.key_cache[ai];
  auto& vc = s.value_cache[ai];
  kc.insert(kc.end(), kx.begin(), kx.end());
  vc.insert(vc.end(), vx.begin(), vx.end());

  std::vector<float> o(static_cast<size_t>(T * nh * hd), 0.f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  core::parallel_for(static_cast<size_t>(T * nh), 1, [&](size_t b, size_t e) {
    std::vector<float> sc(static_cast<size_t>(p0 + T));
    for (size_t th = b; th < e; ++th) {
      const int64_t t = static_cast<int64_t>(th) / nh, h = static_cast<int64_t>(th) % nh, kvh = h / grp;
      const int64_t n = p0 + t + 1;  // causal: keys 0 .. p0+t
      const float* qh = q.data() + (t * nh + h) * hd;
      for (int64_t j = 0; j < n; ++j) {
        const float* kj = kc.data() + (j * nkv + kvh) * hd;
        float d = 0;
        for (int64_t i = 0; i < hd; ++i) d += qh[i] * kj[i];
        sc[j] = d * scale;
      }
      softmax(sc.data(), n);
      float* oh = o.data() + (t * nh + h) * hd;
      for (int64_t j = 0; j < n; ++j) {
        const float* vj = vc.data() + (j * nkv + kvh) * hd;
        for (int64_t i = 0; i < hd; ++i) oh[i] += sc[j] * vj[i];
      }
    }
  });
  if (c.attn_output_gate)
    for (int64_t i = 0; i < T * nh * hd; ++i) o[i] *= sigmoid(gate[i]);  // elementwise output gate
  linear(o.data(), T, W.o_proj, out);
}

namespace {

// down(silu(gate(x)) * up(x)) for T rows.
void swiglu(const model::MlpWeights& m, const float* x, int64_t T, float* out) {
  const int64_t I = m.gate_proj.rows;
  std::vector<float> g(static_cast<size_t>(T * I)), u(static_cast<size_t>(T * I));
  linear(x, T, m.gate_proj, g.data());
  linear(x, T, m.up_proj, u.data());
  for (int64_t i = 0; i < T * I; ++i) g[i] = silu(g[i]) * u[i];
  linear(g.data(), T, m.down_proj, out);
}

}  // namespace

void CpuBackend::ffn(size_t layer, const float* x, int64_t T, float* out) {
  const auto& c = config_;
  const auto& L = weights_.layers[layer];
  const int64_t H = c.hidden_size;
  if (!L.is_moe) {
    swiglu(L.mlp, x, T, out);
    return;
  }
  // Router: softmax over experts in fp32, top-k, renormalised (always in Qwen3.5-MoE; Qwen3-Next when
  // norm_topk_prob). Ties go to the lower expert index, as torch.topk on CPU.
  const int64_t E = c.num_experts, K = c.num_experts_per_tok;
  std::vector<float> probs(static_cast<size_t>(T * E));
  linear(x, T, L.moe.router, probs.data());
  std::vector<std::vector<std::pair<int64_t, float>>> routed(
      static_cast<size_t>(E));  // expert -> (token, weight)
  for (int64_t t = 0; t < T; ++t) {
    float* p = probs.data() + t * E;
    softmax(p, E);
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
    swiglu(L.moe.experts[e], xe.data(), n, ye.data());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < H; ++d) out[rows[i].first * H + d] += rows[i].second * ye[i * H + d];
  }
  // Shared expert, gated by sigmoid(x . shared_expert_gate).
  std::vector<float> sh(static_cast<size_t>(T * H));
  swiglu(L.moe.shared_expert, x, T, sh.data());
  const auto& sg = consts_[layer].shared_gate;
  for (int64_t t = 0; t < T; ++t) {
    float d = 0;
    for (int64_t i = 0; i < H; ++i) d += x[t * H + i] * sg[i];
    const float gate = sigmoid(d);
    for (int64_t i = 0; i < H; ++i) out[t * H + i] += gate * sh[t * H + i];
  }
}

core::Status CpuBackend::forward(CpuSequenceState& s, std::span<const int32_t> tokens, bool recurrent,
                                 bool all_logits, std::vector<float>& logits, ForwardTrace* trace) {
  const auto& c = config_;
  const int64_t T = static_cast<int64_t>(tokens.size()), H = c.hidden_size, V = c.vocab_size;
  if (T == 0) return core::Error{"forward: no tokens"};
  for (int32_t id : tokens)
    if (id < 0 || id >= V)
      return core::Error{"token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                         std::to_string(V) + ")"};
  if (s.pos + T > c.max_position_embeddings)
    return core::Error{"sequence length " + std::to_string(s.pos + T) + " exceeds max_position_embeddings " +
                       std::to_string(c.max_position_embeddings)};

  std::vector<float> h(static_cast<size_t>(T * H)), xn(static_cast<size_t>(T * H)),
      y(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t) load_row(weights_.embed_tokens, tokens[t], h.data() + t * H);
  if (trace) trace->hidden.assign(1, h);

  for (size_t l = 0; l < weights_.layers.size(); ++l) {
    const auto& k = consts_[l];
    rmsnorm_1p(h.data(), T, H, k.input_norm.data(), c.rms_norm_eps, xn.data());
    if (weights_.layers[l].type == LayerType::kFullAttention) {
      full_attention(l, type_index_[l], xn.data(), T, s, y.data());
    } else {
      gated_deltanet(l, type_index_[l], xn.data(), T, s, recurrent, y.data());
    }
    for (int64_t i = 0; i < T * H; ++i) h[i] += y[i];
    rmsnorm_1p(h.data(), T, H, k.post_norm.data(), c.rms_norm_eps, xn.data());
    ffn(l, xn.data(), T, y.data());
    for (int64_t i = 0; i < T * H; ++i) h[i] += y[i];
    if (trace) trace->hidden.push_back(h);
  }
  s.pos += T;

  // Final norm and lm_head on the rows that need logits only.
  const int64_t first = all_logits ? 0 : T - 1, rows = T - first;
  rmsnorm_1p(h.data() + first * H, rows, H, final_norm_.data(), c.rms_norm_eps, xn.data());
  const size_t off = logits.size();
  logits.resize(off + static_cast<size_t>(rows * V));
  linear(xn.data(), rows, weights_.lm_head, logits.data() + off);
  return core::Status();
}

core::Status CpuBackend::prefill(std::span<const PrefillItem> items, std::vector<float>& logits) {
  logits.clear();
  for (const auto& it : items) {
    auto* s = dynamic_cast<CpuSequenceState*>(it.state);
    if (!s) return core::Error{"cpu backend: sequence state from another backend"};
    DF_TRY(forward(*s, it.tokens, /*recurrent=*/false, it.all_logits, logits));
  }
  return core::Status();
}

core::Status CpuBackend::decode(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                                std::vector<float>& logits) {
  if (seqs.size() != tokens.size()) return core::Error{"decode: one token per sequence"};
  logits.clear();
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto* s = dynamic_cast<CpuSequenceState*>(seqs[i]);
    if (!s) return core::Error{"cpu backend: sequence state from another backend"};
    DF_TRY(forward(*s, tokens.subspan(i, 1), /*recurrent=*/true, false, logits));
  }
  return core::Status();
}

}  // namespace deltaflow::backend::cpu
