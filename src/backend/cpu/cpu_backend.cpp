#include "backend/cpu/cpu_backend.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "backend/cpu/gated_deltanet.hpp"
#include "backend/cpu/ops.hpp"
#include "backend/cpu/vision_encoder.hpp"
#include "backend/host_sampling.hpp"
#include "backend/kv_quant.hpp"
#include "core/threads.hpp"
#include "model/mrope.hpp"
#include "model/quant/quantize.hpp"
#include "model/rope.hpp"

namespace deltaflow::backend::cpu {

using model::LayerType;

core::Expected<std::unique_ptr<CpuBackend>> CpuBackend::load(const std::string& dir, const CpuOptions& opt) {
  if (opt.page_size < 1 || !std::has_single_bit(static_cast<uint32_t>(opt.page_size)))
    return core::Error{"cpu backend: the KV page size must be a power of two, not " +
                       std::to_string(opt.page_size)};
  std::unique_ptr<CpuBackend> b(new CpuBackend());
  b->opt_ = opt;
  DF_ASSIGN(b->config_, model::load_text_config(dir));
  DF_ASSIGN(b->checkpoint_, io::Checkpoint::open(dir));
  DF_ASSIGN(b->weights_, model::bind_weights(b->config_, b->checkpoint_));
  const auto& c = b->config_;

  for (size_t i = 0; i < b->weights_.layers.size(); ++i) {
    const auto& L = b->weights_.layers[i];
    LayerConsts k;
    k.input_norm = load_all(L.input_layernorm);
    k.post_norm = load_all(L.post_attention_layernorm);
    if (L.type == LayerType::kFullAttention) {
      k.q_norm = load_all(L.attn.q_norm);
      k.k_norm = load_all(L.attn.k_norm);
      b->type_index_.push_back(b->n_full_++);
    } else {
      k.conv_w = load_all(L.linear.conv1d);
      k.dt_bias = load_all(L.linear.dt_bias);
      k.A_log = load_all(L.linear.A_log);
      k.gdn_norm = load_all(L.linear.norm);
      b->type_index_.push_back(b->n_linear_++);
    }
    if (L.is_moe) k.shared_gate = load_all(L.moe.shared_expert_gate);
    b->consts_.push_back(std::move(k));
  }
  b->final_norm_ = load_all(b->weights_.norm);
  if (const auto& m = b->weights_.mtp; m.present) {
    LayerConsts& k = b->mtp_consts_;
    k.input_norm = load_all(m.layer.input_layernorm);
    k.post_norm = load_all(m.layer.post_attention_layernorm);
    k.q_norm = load_all(m.layer.attn.q_norm);
    k.k_norm = load_all(m.layer.attn.k_norm);
    if (m.layer.is_moe) k.shared_gate = load_all(m.layer.moe.shared_expert_gate);
    b->mtp_norm_embedding_ = load_all(m.pre_fc_norm_embedding);
    b->mtp_norm_hidden_ = load_all(m.pre_fc_norm_hidden);
    b->mtp_norm_ = load_all(m.norm);
  }
  // RoPE frequencies (and yarn's attention factor) from rope_parameters, as transformers computes them.
  const auto rope = model::rope_frequencies(c);
  b->inv_freq_ = rope.inv_freq;
  b->rope_scaling_ = rope.attention_scaling;
  for (int64_t i = 0; i < c.rotary_dim() / 2; ++i)
    b->mrope_axis_.push_back(static_cast<uint8_t>(
        c.mrope_section.empty() ? 0 : model::mrope_axis(i, c.mrope_section, c.mrope_interleaved)));
  // The vision tower, when the checkpoint has one; otherwise images are refused with the reason.
  auto vc = model::load_vision_config(dir);
  if (!vc.is_ok()) {
    b->vision_error_ = vc.message();
  } else if (auto vw = model::bind_vision_weights(*vc, b->checkpoint_); !vw.is_ok()) {
    b->vision_error_ = vw.message();
  } else if (vc->out_hidden_size != c.hidden_size) {
    b->vision_error_ = "vision_config.out_hidden_size " + std::to_string(vc->out_hidden_size) +
                       " is not the text model's hidden_size " + std::to_string(c.hidden_size);
  } else {
    b->vision_config_ = *vc;
    b->vision_weights_ = std::move(vw).value();
    b->vision_ok_ = true;
  }
  return b;
}

core::Expected<std::vector<float>> CpuBackend::encode_images(std::span<const float> pixel_values,
                                                             std::span<const model::VisionGrid> grids) {
  if (!vision_ok_) return core::Error{vision_error_};
  return cpu::encode_images(vision_config_, vision_weights_, pixel_values, grids);
}

// ---------------------------------------------------------------------------------------------------------------
// Layers

namespace {

// fn(i) for i in [0, n), split across the pool for prefill-sized n (element-wise work: the split changes no
// number). Below kElementwiseGrain it runs inline: a decode step's few thousand elements are not worth a
// wake-up of the pool.
constexpr size_t kElementwiseGrain = 16384;
template <typename F>
void elementwise(int64_t n, F fn) {
  core::parallel_for(static_cast<size_t>(n), kElementwiseGrain, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) fn(static_cast<int64_t>(i));
  });
}

int64_t conv_floats(const model::TextConfig& c) {
  return c.linear_conv_dim() * (c.linear_conv_kernel_dim - 1);
}
int64_t gdn_floats(const model::TextConfig& c) {
  return c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
}

}  // namespace

void CpuBackend::gated_deltanet(size_t layer, int64_t li, const float* x, std::span<const RunMemory> runs,
                                int64_t T, bool chunked, float* out) {
  const auto& c = config_;
  const auto& W = weights_.layers[layer].linear;
  const auto& k = consts_[layer];
  const int64_t nk = c.linear_num_key_heads, nv = c.linear_num_value_heads, r = nv / nk;
  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const int64_t C = c.linear_conv_dim(), kd = c.linear_key_dim(), vd = c.linear_value_dim();
  const int64_t Kc = c.linear_conv_kernel_dim;

  std::vector<float> qkv(static_cast<size_t>(T * C)), conv(static_cast<size_t>(T * C));
  std::vector<float> z(static_cast<size_t>(T * vd)), bb(static_cast<size_t>(T * nv)),
      aa(static_cast<size_t>(T * nv));
  note_input(W.in_proj_qkv, x, T * c.hidden_size);
  note_input(W.in_proj_z, x, T * c.hidden_size);
  qlinear(x, T, W.in_proj_qkv, qkv.data());
  qlinear(x, T, W.in_proj_z, z.data());
  qlinear(x, T, W.in_proj_b, bb.data());
  qlinear(x, T, W.in_proj_a, aa.data());

  // The conv, per channel, each run's rows in order from its state. A run is cut where a snapshot of the
  // state is asked for; neither the conv nor the token-by-token rule depends on where a segment ends, so a
  // snapshot changes no number.
  const int64_t S_conv = Kc - 1;
  core::parallel_for(static_cast<size_t>(C), 64, [&](size_t b, size_t e) {
    for (size_t ch = b; ch < e; ++ch)
      for (const auto& run : runs) {
        float* st = run.mem.conv[li] + static_cast<int64_t>(ch) * S_conv;
        int64_t done = 0;
        for (const auto& [rows, snap] : run.snapshots) {
          causal_conv1d_silu_channel(qkv.data(), run.first_row + done, run.first_row + rows, C,
                                     static_cast<int64_t>(ch), k.conv_w.data(), Kc, st, conv.data());
          std::copy(st, st + S_conv, snap.conv[li] + static_cast<int64_t>(ch) * S_conv);
          done = rows;
        }
        causal_conv1d_silu_channel(qkv.data(), run.first_row + done, run.first_row + run.n_rows, C,
                                   static_cast<int64_t>(ch), k.conv_w.data(), Kc, st, conv.data());
      }
  });

  // Split the conv output into q, k (nk heads, repeated to nv: value head j reads key head j / r) and v.
  std::vector<float> q(static_cast<size_t>(T * nv * dk)), kk(static_cast<size_t>(T * nv * dk));
  std::vector<float> v(static_cast<size_t>(T * nv * dv)), g(static_cast<size_t>(T * nv)),
      beta(static_cast<size_t>(T * nv));
  std::vector<float> o(static_cast<size_t>(T * nv * dv));
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dk));
  core::parallel_for(static_cast<size_t>(T), 4, [&](size_t b, size_t e) {
    std::vector<float> qh(static_cast<size_t>(nk * dk)), kh(static_cast<size_t>(nk * dk));
    for (int64_t t = static_cast<int64_t>(b); t < static_cast<int64_t>(e); ++t) {
      const float* row = conv.data() + t * C;
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
  });

  const size_t head_floats = static_cast<size_t>(dk * dv);
  auto args_for = [&](const RunMemory& run, int64_t t0, int64_t n) {
    return DeltaRuleArgs{q.data() + t0 * nv * dk,
                         kk.data() + t0 * nv * dk,
                         v.data() + t0 * nv * dv,
                         g.data() + t0 * nv,
                         beta.data() + t0 * nv,
                         n,
                         nv,
                         dk,
                         dv,
                         run.mem.gdn[li],
                         o.data() + t0 * nv * dv};
  };
  if (chunked) {
    // The WY form per run (multi-token segments), token by token for single tokens.
    for (const auto& run : runs) {
      int64_t done = 0;
      auto segment = [&](int64_t end) {
        if (end <= done) return;
        const DeltaRuleArgs a = args_for(run, run.first_row + done, end - done);
        if (end - done > 1) {
          gated_delta_rule_chunked(a);
        } else {
          gated_delta_rule_recurrent(a);
        }
        done = end;
      };
      for (const auto& [rows, snap] : run.snapshots) {
        segment(rows);
        std::copy_n(run.mem.gdn[li], gdn_floats(c), snap.gdn[li]);
      }
      segment(run.n_rows);
    }
  } else {
    // Token by token, every (run, head) pair at once.
    const size_t pairs = runs.size() * static_cast<size_t>(nv);
    core::parallel_for(pairs, 1, [&](size_t b, size_t e) {
      std::vector<float> kv(static_cast<size_t>(dv));
      for (size_t p = b; p < e; ++p) {
        const RunMemory& run = runs[p / static_cast<size_t>(nv)];
        const int64_t h = static_cast<int64_t>(p % static_cast<size_t>(nv));
        const DeltaRuleArgs a = args_for(run, run.first_row, run.n_rows);
        int64_t done = 0;
        for (const auto& [rows, snap] : run.snapshots) {
          gated_delta_rule_recurrent_head(a, h, done, rows, kv.data());
          std::copy_n(run.mem.gdn[li] + static_cast<size_t>(h) * head_floats, head_floats,
                      snap.gdn[li] + static_cast<size_t>(h) * head_floats);
          done = rows;
        }
        gated_delta_rule_recurrent_head(a, h, done, run.n_rows, kv.data());
      }
    });
  }

  // Gated RMSNorm per head (plain weight), times SiLU(z); then out_proj.
  rmsnorm(o.data(), T * nv, dv, k.gdn_norm.data(), c.rms_norm_eps, o.data());
  elementwise(T * vd, [&](int64_t i) { o[i] *= silu(z[i]); });
  note_input(W.out_proj, o.data(), T * vd);
  qlinear(o.data(), T, W.out_proj, out);
}

void CpuBackend::full_attention(const model::LayerWeights& L, const LayerConsts& k, int64_t ai,
                                const float* x, std::span<const RunMemory> runs, int64_t T, float* out) {
  const auto& c = config_;
  const auto& W = L.attn;
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim, grp = nh / nkv;
  const int64_t qw = c.attn_output_gate ? 2 * hd : hd, kvw = nkv * hd;

  std::vector<float> qg(static_cast<size_t>(T * nh * qw)), kx(static_cast<size_t>(T * kvw)),
      vx(static_cast<size_t>(T * kvw));
  for (const auto* m : {&W.q_proj, &W.k_proj, &W.v_proj}) note_input(*m, x, T * c.hidden_size);
  qlinear(x, T, W.q_proj, qg.data());
  qlinear(x, T, W.k_proj, kx.data());
  qlinear(x, T, W.v_proj, vx.data());

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

  // Each row: rotary at its position, its key and value into the sequence's pages.
  std::vector<const RunMemory*> run_of(static_cast<size_t>(T));
  for (const auto& run : runs)
    for (int64_t i = 0; i < run.n_rows; ++i) {
      const int64_t t = run.first_row + i, p = run.start_pos + i;
      run_of[static_cast<size_t>(t)] = &run;
      if (run.mrope) {
        const int64_t* thw = run.mrope + 3 * i;
        rope_neox_mrope(q.data() + t * nh * hd, nh, hd, c.rotary_dim(), inv_freq_.data(), thw,
                        mrope_axis_.data(), rope_scaling_);
        rope_neox_mrope(kx.data() + t * kvw, nkv, hd, c.rotary_dim(), inv_freq_.data(), thw,
                        mrope_axis_.data(), rope_scaling_);
      } else {
        rope_neox(q.data() + t * nh * hd, nh, hd, c.rotary_dim(), inv_freq_.data(), p, rope_scaling_);
        rope_neox(kx.data() + t * kvw, nkv, hd, c.rotary_dim(), inv_freq_.data(), p, rope_scaling_);
      }
      for (int64_t h = 0; h < nkv; ++h) {
        round_kv_row(kx.data() + t * kvw + h * hd, hd, opt_.kv_cache_dtype);
        round_kv_row(vx.data() + t * kvw + h * hd, hd, opt_.kv_cache_dtype);
      }
      const int64_t row = run.mem.row_of(p);
      std::copy(kx.begin() + t * kvw, kx.begin() + (t + 1) * kvw, run.mem.k[ai] + row * kvw);
      std::copy(vx.begin() + t * kvw, vx.begin() + (t + 1) * kvw, run.mem.v[ai] + row * kvw);
    }

  std::vector<float> o(static_cast<size_t>(T * nh * hd), 0.f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  core::parallel_for(static_cast<size_t>(T * nh), 1, [&](size_t b, size_t e) {
    std::vector<float> sc;
    for (size_t th = b; th < e; ++th) {
      const int64_t t = static_cast<int64_t>(th) / nh, h = static_cast<int64_t>(th) % nh, kvh = h / grp;
      const RunMemory& run = *run_of[static_cast<size_t>(t)];
      const SeqMemory& m = run.mem;
      const int64_t n = run.start_pos + (t - run.first_row) + 1;  // causal: keys 0 .. its position
      sc.resize(static_cast<size_t>(n));
      const float* qh = q.data() + (t * nh + h) * hd;
      auto key = [&](int64_t j) { return m.k[ai] + m.row_of(j) * kvw + kvh * hd; };
      auto value = [&](int64_t j) { return m.v[ai] + m.row_of(j) * kvw + kvh * hd; };
      // Scores 8 keys at a time: 8 independent sums instead of one long dependency chain. Each key's sum
      // still runs over i in order, so every score is what the one-key loop gives.
      int64_t j = 0;
      for (; j + 8 <= n; j += 8) {
        const float* kj[8];
        for (int u = 0; u < 8; ++u) kj[u] = key(j + u);
        float d[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t i = 0; i < hd; ++i)
          for (int u = 0; u < 8; ++u) d[u] += qh[i] * kj[u][i];
        for (int u = 0; u < 8; ++u) sc[j + u] = d[u] * scale;
      }
      for (; j < n; ++j) {
        const float* kj = key(j);
        float d = 0;
        for (int64_t i = 0; i < hd; ++i) d += qh[i] * kj[i];
        sc[j] = d * scale;
      }
      softmax(sc.data(), n);
      // o += p_j v_j over j in order, 4 values a pass over o (each element's additions in the same order).
      float* oh = o.data() + (t * nh + h) * hd;
      j = 0;
      for (; j + 4 <= n; j += 4) {
        const float *v0 = value(j), *v1 = value(j + 1), *v2 = value(j + 2), *v3 = value(j + 3);
        const float p0 = sc[j], p1 = sc[j + 1], p2 = sc[j + 2], p3 = sc[j + 3];
        for (int64_t i = 0; i < hd; ++i)
          oh[i] = (((oh[i] + p0 * v0[i]) + p1 * v1[i]) + p2 * v2[i]) + p3 * v3[i];
      }
      for (; j < n; ++j) {
        const float* vj = value(j);
        for (int64_t i = 0; i < hd; ++i) oh[i] += sc[j] * vj[i];
      }
    }
  });
  if (c.attn_output_gate)
    elementwise(T * nh * hd, [&](int64_t i) { o[i] *= sigmoid(gate[i]); });  // elementwise output gate
  note_input(W.o_proj, o.data(), T * nh * hd);
  qlinear(o.data(), T, W.o_proj, out);
}

void CpuBackend::swiglu(const model::MlpWeights& m, const float* x, int64_t T, float* out,
                        const std::string* module) {
  const int64_t I = m.gate_proj.rows;
  std::vector<float> g(static_cast<size_t>(T * I)), u(static_cast<size_t>(T * I));
  std::string gate, up, down;
  if (module) gate = *module + "gate_proj", up = *module + "up_proj", down = *module + "down_proj";
  note_input(m.gate_proj, x, T * m.gate_proj.cols, /*with_amax=*/false, module ? &gate : nullptr);
  note_input(m.up_proj, x, T * m.up_proj.cols, /*with_amax=*/false, module ? &up : nullptr);
  qlinear(x, T, m.gate_proj, g.data());
  qlinear(x, T, m.up_proj, u.data());
  elementwise(T * I, [&](int64_t i) { g[i] = silu(g[i]) * u[i]; });
  note_input(m.down_proj, g.data(), T * I, /*with_amax=*/false, module ? &down : nullptr);
  qlinear(g.data(), T, m.down_proj, out);
}

void CpuBackend::ffn(const model::LayerWeights& L, const LayerConsts& k, const float* x, int64_t T,
                     float* out) {
  const auto& c = config_;
  const int64_t H = c.hidden_size;
  if (!L.is_moe) {
    swiglu(L.mlp, x, T, out);
    return;
  }
  // Router: softmax over experts in fp32, top-k, renormalised (always in Qwen3.5-MoE; Qwen3-Next when
  // norm_topk_prob). Ties go to the lower expert index, as torch.topk on CPU.
  const int64_t E = c.num_experts, K = c.num_experts_per_tok;
  std::vector<float> probs(static_cast<size_t>(T * E));
  qlinear(x, T, L.moe.router, probs.data());
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
    // Fused experts' slices have no names of their own: they are noted as the per-expert modules
    // `deltaflow quantize` writes.
    std::string name;
    const std::ptrdiff_t layer = &L - weights_.layers.data();
    const bool named = L.moe.experts[e].gate_proj.name != nullptr;
    if (input_stats_ && !named && layer >= 0 && layer < static_cast<std::ptrdiff_t>(weights_.layers.size()))
      name = weights_.prefix + "layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(e) + ".";
    swiglu(L.moe.experts[e], xe.data(), n, ye.data(), name.empty() ? nullptr : &name);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t d = 0; d < H; ++d) out[rows[i].first * H + d] += rows[i].second * ye[i * H + d];
  }
  // Shared expert, gated by sigmoid(x . shared_expert_gate).
  std::vector<float> sh(static_cast<size_t>(T * H));
  swiglu(L.moe.shared_expert, x, T, sh.data());
  const auto& sg = k.shared_gate;
  for (int64_t t = 0; t < T; ++t) {
    float d = 0;
    for (int64_t i = 0; i < H; ++i) d += x[t * H + i] * sg[i];
    const float gate = sigmoid(d);
    for (int64_t i = 0; i < H; ++i) out[t * H + i] += gate * sh[t * H + i];
  }
}

core::Status CpuBackend::forward_rows(std::span<const int32_t> tokens, std::span<const RunMemory> runs,
                                      std::span<const int64_t> head_rows, bool chunked,
                                      std::vector<float>& logits, ForwardTrace* trace,
                                      std::vector<float>* normed) {
  const auto& c = config_;
  const int64_t T = static_cast<int64_t>(tokens.size()), H = c.hidden_size, V = c.vocab_size;
  std::vector<float> h(static_cast<size_t>(T * H)), xn(static_cast<size_t>(T * H)),
      y(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t) load_row(weights_.embed_tokens, tokens[t], h.data() + t * H);
  for (const auto& run : runs)
    for (size_t i = 0; i < run.embed_rows.size(); ++i)
      std::copy_n(run.embeds.data() + static_cast<int64_t>(i) * H, H,
                  h.data() + (run.first_row + run.embed_rows[i]) * H);
  if (trace) trace->hidden.assign(1, h);

  for (size_t l = 0; l < weights_.layers.size(); ++l) {
    const auto& k = consts_[l];
    rmsnorm_1p(h.data(), T, H, k.input_norm.data(), c.rms_norm_eps, xn.data());
    if (weights_.layers[l].type == LayerType::kFullAttention) {
      full_attention(weights_.layers[l], k, type_index_[l], xn.data(), runs, T, y.data());
    } else {
      gated_deltanet(l, type_index_[l], xn.data(), runs, T, chunked, y.data());
    }
    for (int64_t i = 0; i < T * H; ++i) h[i] += y[i];
    rmsnorm_1p(h.data(), T, H, k.post_norm.data(), c.rms_norm_eps, xn.data());
    ffn(weights_.layers[l], k, xn.data(), T, y.data());
    for (int64_t i = 0; i < T * H; ++i) h[i] += y[i];
    if (trace) trace->hidden.push_back(h);
  }

  // Final norm (of every row when the caller keeps them, for the MTP head) and lm_head on the rows that need
  // logits only.
  const int64_t rows = static_cast<int64_t>(head_rows.size());
  if (normed) {
    normed->resize(static_cast<size_t>(T * H));
    rmsnorm_1p(h.data(), T, H, final_norm_.data(), c.rms_norm_eps, normed->data());
    for (int64_t i = 0; i < rows; ++i) std::copy_n(normed->data() + head_rows[i] * H, H, xn.data() + i * H);
  } else {
    for (int64_t i = 0; i < rows; ++i)
      rmsnorm_1p(h.data() + head_rows[i] * H, 1, H, final_norm_.data(), c.rms_norm_eps, xn.data() + i * H);
  }
  const size_t off = logits.size();
  logits.resize(off + static_cast<size_t>(rows * V));
  qlinear(xn.data(), rows, weights_.lm_head, logits.data() + off);
  return core::Status();
}

void CpuBackend::qlinear(const float* x, int64_t T, const model::Mat& W, float* y) const {
  if (!opt_.emulate_activation_quant || W.format != model::quant::WeightFormat::kFp8 ||
      !(W.input_scale > 0)) {
    linear(x, T, W, y);
    return;
  }
  std::vector<float> xq(static_cast<size_t>(T * W.cols));
  model::quant::fake_quant_fp8_static(x, xq.size(), W.input_scale, xq.data());
  linear(xq.data(), T, W, y);
}

void CpuBackend::note_input(const model::Mat& W, const float* x, int64_t n, bool with_amax,
                            const std::string* name) {
  if (((!input_amax_ || !with_amax) && !input_stats_) || (!W.name && !name) || n == 0) return;
  std::string module = name ? *name : *W.name;
  if (module.size() > 7 && module.compare(module.size() - 7, 7, ".weight") == 0)
    module.resize(module.size() - 7);
  if (input_amax_ && with_amax) {
    float m = 0;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
    float& slot = (*input_amax_)[module];
    slot = std::max(slot, m);
  }
  if (input_stats_) {
    // X^T X of this call's rows in fp32, added to the module's total; row i of the upper triangle per task,
    // then mirrored.
    const int64_t K = W.cols, T = n / K;
    // Projections of one block that read the same input (q/k/v, qkv/z, gate/up) are noted one after another:
    // the totals of the one before are this one's too.
    const auto parent = [](const std::string& m) { return m.substr(0, m.rfind('.')); };
    if (x == stats_last_x_ && n == stats_last_n_ && parent(module) == parent(stats_last_module_) &&
        input_stats_->count(stats_last_module_)) {
      (*input_stats_)[module] = input_stats_->at(stats_last_module_);
      return;
    }
    stats_last_x_ = x;
    stats_last_n_ = n;
    stats_last_module_ = module;
    model::quant::InputGram& g = (*input_stats_)[module];
    if (g.cols == 0) {
      g.cols = K;
      g.gram.assign(static_cast<size_t>(K * K), 0.0);
    }
    g.tokens += T;
    core::parallel_for(static_cast<size_t>(K), 8, [&](size_t b, size_t e) {
      std::vector<float> acc(static_cast<size_t>(K));
      for (size_t i = b; i < e; ++i) {
        std::fill(acc.begin() + static_cast<std::ptrdiff_t>(i), acc.end(), 0.0f);
        for (int64_t t = 0; t < T; ++t) {
          const float* row = x + t * K;
          const float xi = row[i];
          if (xi == 0.0f) continue;
          for (int64_t j = static_cast<int64_t>(i); j < K; ++j) acc[j] += xi * row[j];
        }
        for (int64_t j = static_cast<int64_t>(i); j < K; ++j) {
          g.gram[i * static_cast<size_t>(K) + static_cast<size_t>(j)] += acc[j];
          if (static_cast<int64_t>(i) != j) g.gram[static_cast<size_t>(j * K) + i] += acc[j];
        }
      }
    });
  }
}

// ---------------------------------------------------------------------------------------------------------------
// The step seam

size_t CpuBackend::page_bytes() const {
  return static_cast<size_t>(n_full_ * 2 * opt_.page_size * config_.num_key_value_heads * config_.head_dim) *
         4;
}

size_t CpuBackend::slot_bytes() const {
  return static_cast<size_t>(n_linear_ * (conv_floats(config_) + gdn_floats(config_))) * 4;
}

size_t CpuBackend::draft_page_bytes() const {
  return can_draft()
             ? static_cast<size_t>(2 * opt_.page_size * config_.num_key_value_heads * config_.head_dim) * 4
             : 0;
}

core::Status CpuBackend::allocate(const PoolRequest& r) {
  if (r.kv_pages < 1 || r.state_slots < 1 || r.max_step_rows < 1 || r.max_step_seqs < 1)
    return core::Error{"cpu backend: a pool request needs at least one page, slot, row and sequence"};
  if (r.draft && !can_draft())
    return core::Error{"cpu backend: speculative decoding needs the checkpoint's MTP head (mtp.*), and " +
                       checkpoint_.dir() + " has none"};
  const int64_t kv_row = config_.num_key_value_heads * config_.head_dim;
  const size_t page_floats = static_cast<size_t>(opt_.page_size * kv_row);
  try {
    states_.reset(new float[static_cast<size_t>(r.state_slots) * slot_bytes() / 4]);
    k_pages_.clear();
    v_pages_.clear();
    for (int64_t i = 0; i < n_full_ + (r.draft ? 1 : 0); ++i) {  // + the MTP layer's store
      k_pages_.emplace_back(new float[static_cast<size_t>(r.kv_pages) * page_floats]);
      v_pages_.emplace_back(new float[static_cast<size_t>(r.kv_pages) * page_floats]);
    }
  } catch (const std::bad_alloc&) {
    states_.reset();
    k_pages_.clear();
    v_pages_.clear();
    return core::Error{"cpu backend: out of memory for " + std::to_string(r.kv_pages) + " KV pages and " +
                       std::to_string(r.state_slots) + " state slots"};
  }
  pools_.page_size = opt_.page_size;
  pools_.kv_pages = r.kv_pages;
  pools_.state_slots = r.state_slots;
  pools_.max_step_rows = r.max_step_rows;
  pools_.max_step_seqs = r.max_step_seqs;
  pools_.max_context = config_.max_position_embeddings;
  pools_.paged = true;
  pools_.page_bytes = page_bytes() + (r.draft ? draft_page_bytes() : 0);
  pools_.slot_bytes = slot_bytes();
  draft_ = r.draft;
  last_tokens_.clear();
  last_hidden_.clear();
  return core::Status();
}

SeqMemory CpuBackend::slot_memory(int32_t slot, std::span<const int32_t> pages) {
  SeqMemory m;
  const int64_t per_layer = conv_floats(config_) + gdn_floats(config_);
  float* base = states_.get() + static_cast<int64_t>(slot) * n_linear_ * per_layer;
  for (int64_t li = 0; li < n_linear_; ++li) {
    m.conv.push_back(base + li * per_layer);
    m.gdn.push_back(base + li * per_layer + conv_floats(config_));
  }
  for (size_t ai = 0; ai < k_pages_.size(); ++ai) {
    m.k.push_back(k_pages_[ai].get());
    m.v.push_back(v_pages_[ai].get());
  }
  m.pages = pages.data();
  m.page_shift = std::countr_zero(static_cast<uint32_t>(opt_.page_size));
  m.kv_row = config_.num_key_value_heads * config_.head_dim;
  return m;
}

core::Status CpuBackend::check_step(const Step& st) const {
  if (pools_.state_slots == 0) return core::Error{"cpu backend: step before allocate()"};
  const int64_t V = config_.vocab_size, n = static_cast<int64_t>(st.tokens.size());
  for (int32_t id : st.tokens)
    if (id < 0 || id >= V)
      return core::Error{"token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                         std::to_string(V) + ")"};
  if (n > pools_.max_step_rows || static_cast<int64_t>(st.runs.size()) > pools_.max_step_seqs)
    return core::Error{"step: " + std::to_string(n) + " rows in " + std::to_string(st.runs.size()) +
                       " runs exceed the planned " + std::to_string(pools_.max_step_rows) + " / " +
                       std::to_string(pools_.max_step_seqs)};
  int64_t next_row = 0;
  std::vector<bool> slot_seen(static_cast<size_t>(pools_.state_slots));
  for (const auto& r : st.runs) {
    if (r.first_row != next_row || r.n_rows < 1 || r.first_row + r.n_rows > n)
      return core::Error{"step: runs must cover the rows in order, each at least one row"};
    next_row += r.n_rows;
    if (r.state_slot < 0 || r.state_slot >= pools_.state_slots ||
        slot_seen[static_cast<size_t>(r.state_slot)])
      return core::Error{"step: state slot " + std::to_string(r.state_slot) +
                         " is outside the pool or repeated"};
    slot_seen[static_cast<size_t>(r.state_slot)] = true;
    const int64_t end = r.start_pos + r.n_rows;
    if (r.start_pos < 0 || end > pools_.max_context)
      return core::Error{"sequence length " + std::to_string(end) + " exceeds max_position_embeddings " +
                         std::to_string(pools_.max_context)};
    const int64_t need = (end + pools_.page_size - 1) / pools_.page_size;
    if (static_cast<int64_t>(r.kv_pages.size()) < need && n_full_ > 0)
      return core::Error{"step: the block table has " + std::to_string(r.kv_pages.size()) + " pages, " +
                         std::to_string(need) + " needed"};
    for (int32_t p : r.kv_pages)
      if (p < 0 || p >= pools_.kv_pages)
        return core::Error{"step: KV page " + std::to_string(p) + " is outside the pool"};
    if (!r.mrope_positions.empty() && static_cast<int64_t>(r.mrope_positions.size()) != 3 * int64_t{r.n_rows})
      return core::Error{"step: a run's M-RoPE positions must be 3 per row"};
    if (r.embeds.size() != r.embed_rows.size() * static_cast<size_t>(config_.hidden_size))
      return core::Error{"step: a run's input embeddings must be one hidden-size row per embedding row"};
    for (size_t i = 0; i < r.embed_rows.size(); ++i)
      if (r.embed_rows[i] < 0 || r.embed_rows[i] >= r.n_rows ||
          (i > 0 && r.embed_rows[i] <= r.embed_rows[i - 1]))
        return core::Error{"step: a run's embedding rows must be ascending rows of the run"};
    if (!r.mrope_positions.empty() && config_.mrope_section.empty())
      return core::Error{"step: M-RoPE positions for a model without mrope_section"};
    int32_t last = 0;
    for (const auto& s : r.snapshots) {
      if (s.rows <= last || s.rows > r.n_rows || s.slot < 0 || s.slot >= pools_.state_slots ||
          s.slot == r.state_slot)
        return core::Error{"step: a state snapshot must name another slot after an ascending row count"};
      last = s.rows;
    }
  }
  if (next_row != n) return core::Error{"step: rows that belong to no run"};
  return core::Status();
}

core::Status CpuBackend::step(const Step& st, StepOut& out) {
  DF_TRY(check_step(st));
  const size_t V = static_cast<size_t>(config_.vocab_size);
  std::vector<RunMemory> runs;
  std::vector<int64_t> head_rows;
  for (const auto& r : st.runs) {
    RunMemory rm;
    rm.first_row = r.first_row;
    rm.n_rows = r.n_rows;
    rm.start_pos = r.start_pos;
    rm.mem = slot_memory(r.state_slot, r.kv_pages);
    if (r.start_pos == 0) {
      const size_t per_slot = slot_bytes() / 4;
      std::fill_n(states_.get() + per_slot * static_cast<size_t>(r.state_slot), per_slot, 0.0f);
    }
    for (const auto& s : r.snapshots) rm.snapshots.push_back({s.rows, slot_memory(s.slot, {})});
    rm.mrope = r.mrope_positions.empty() ? nullptr : r.mrope_positions.data();
    rm.embed_rows = r.embed_rows;
    rm.embeds = r.embeds;
    runs.push_back(std::move(rm));
    const int64_t last = r.first_row + r.n_rows - 1;
    if (r.logits == RunLogits::kAll) {
      for (int64_t t = r.first_row; t <= last; ++t) head_rows.push_back(t);
    } else if (r.logits == RunLogits::kLast || r.sample) {
      head_rows.push_back(last);
    }
  }
  std::vector<float> all;
  if (draft_) last_tokens_.assign(st.tokens.begin(), st.tokens.end());
  DF_TRY(forward_rows(st.tokens, runs, head_rows, opt_.chunked_prefill, all, nullptr,
                      draft_ ? &last_hidden_ : nullptr));

  out.logits.clear();
  out.sampled.assign(st.runs.size(), -1);
  size_t at = 0;  // row of `all`
  for (size_t i = 0; i < st.runs.size(); ++i) {
    const auto& r = st.runs[i];
    const size_t rows = r.logits == RunLogits::kAll ? static_cast<size_t>(r.n_rows)
                                                    : (r.logits == RunLogits::kLast || r.sample ? 1 : 0);
    if (r.logits != RunLogits::kNone)
      out.logits.insert(out.logits.end(), all.begin() + static_cast<std::ptrdiff_t>(at * V),
                        all.begin() + static_cast<std::ptrdiff_t>((at + rows) * V));
    if (r.sample) {
      const std::span<const float> last(all.data() + (at + rows - 1) * V, V);
      out.sampled[i] = sample_row(last, *r.sample, work_);
    }
    at += rows;
  }
  return core::Status();
}

core::Expected<int32_t> CpuBackend::draw(std::span<const float> row, const SamplingSpec& spec) {
  if (static_cast<int64_t>(row.size()) != config_.vocab_size)
    return core::Error{"draw: a logits row of " + std::to_string(row.size()) +
                       " floats, the vocabulary has " + std::to_string(config_.vocab_size)};
  return sample_row(row, spec, work_);
}

core::Status CpuBackend::copy_state(int32_t from, int32_t to) {
  if (from < 0 || to < 0 || from >= pools_.state_slots || to >= pools_.state_slots)
    return core::Error{"copy_state: slot outside the pool"};
  if (from == to) return core::Status();
  const size_t per_slot = slot_bytes() / 4;
  std::copy_n(states_.get() + per_slot * static_cast<size_t>(from), per_slot,
              states_.get() + per_slot * static_cast<size_t>(to));
  return core::Status();
}

core::Status CpuBackend::copy_pages(std::span<const PageCopy> copies) {
  const size_t page_floats =
      static_cast<size_t>(opt_.page_size * config_.num_key_value_heads * config_.head_dim);
  for (const auto& pc : copies) {
    if (pc.from < 0 || pc.to < 0 || pc.from >= pools_.kv_pages || pc.to >= pools_.kv_pages)
      return core::Error{"copy_pages: page outside the pool"};
    for (auto* store : {&k_pages_, &v_pages_})
      for (auto& layer : *store)
        std::copy_n(layer.get() + page_floats * static_cast<size_t>(pc.from), page_floats,
                    layer.get() + page_floats * static_cast<size_t>(pc.to));
  }
  return core::Status();
}

// ---------------------------------------------------------------------------------------------------------------
// The per-sequence API

std::unique_ptr<SequenceState> CpuBackend::new_sequence() {
  auto s = std::make_unique<CpuSequenceState>();
  const auto& c = config_;
  s->key_cache.resize(static_cast<size_t>(n_full_));
  s->value_cache.resize(static_cast<size_t>(n_full_));
  s->conv_state.assign(static_cast<size_t>(n_linear_),
                       std::vector<float>(static_cast<size_t>(conv_floats(c)), 0.f));
  s->gdn_state.assign(static_cast<size_t>(n_linear_),
                      std::vector<float>(static_cast<size_t>(gdn_floats(c)), 0.f));
  return s;
}

core::Status CpuBackend::forward(CpuSequenceState& s, std::span<const int32_t> tokens, bool recurrent,
                                 bool all_logits, std::vector<float>& logits, ForwardTrace* trace) {
  const auto& c = config_;
  const int64_t T = static_cast<int64_t>(tokens.size()), V = c.vocab_size;
  if (T == 0) return core::Error{"forward: no tokens"};
  for (int32_t id : tokens)
    if (id < 0 || id >= V)
      return core::Error{"token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                         std::to_string(V) + ")"};
  if (s.pos + T > c.max_position_embeddings)
    return core::Error{"sequence length " + std::to_string(s.pos + T) + " exceeds max_position_embeddings " +
                       std::to_string(c.max_position_embeddings)};
  // The sequence's own memory, seen through an identity block table of one-position pages.
  const int64_t kv_row = c.num_key_value_heads * c.head_dim, end = s.pos + T;
  RunMemory run;
  run.n_rows = T;
  run.start_pos = s.pos;
  for (int64_t li = 0; li < n_linear_; ++li) {
    run.mem.conv.push_back(s.conv_state[static_cast<size_t>(li)].data());
    run.mem.gdn.push_back(s.gdn_state[static_cast<size_t>(li)].data());
  }
  for (int64_t ai = 0; ai < n_full_; ++ai) {
    s.key_cache[static_cast<size_t>(ai)].resize(static_cast<size_t>(end * kv_row));
    s.value_cache[static_cast<size_t>(ai)].resize(static_cast<size_t>(end * kv_row));
    run.mem.k.push_back(s.key_cache[static_cast<size_t>(ai)].data());
    run.mem.v.push_back(s.value_cache[static_cast<size_t>(ai)].data());
  }
  std::vector<int32_t> identity(static_cast<size_t>(end));
  for (int64_t p = 0; p < end; ++p) identity[static_cast<size_t>(p)] = static_cast<int32_t>(p);
  run.mem.pages = identity.data();
  run.mem.page_shift = 0;
  run.mem.kv_row = kv_row;
  std::vector<int64_t> head_rows;
  for (int64_t t = all_logits ? 0 : T - 1; t < T; ++t) head_rows.push_back(t);
  DF_TRY(forward_rows(tokens, std::span<const RunMemory>(&run, 1), head_rows, !recurrent, logits, trace));
  s.pos = end;
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
