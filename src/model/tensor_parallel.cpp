#include "model/tensor_parallel.hpp"

#include <cstring>
#include <string>
#include <vector>

#include "model/weight_summary.hpp"

namespace deltaflow::model {
namespace {

// `total` items over `world` ranks: total/world each, or (replicate) one each when world is a multiple of
// total, rank r taking item r / (world / total).
core::Expected<Slice> split(int64_t total, ShardSpec s, bool replicate, const std::string& what) {
  const int64_t N = s.world, r = s.rank;
  if (total % N == 0) return Slice{r * (total / N), total / N};
  if (replicate && total > 0 && N % total == 0) return Slice{r / (N / total), 1};
  return core::Error{"tensor parallel size " + std::to_string(N) + ": " + what + " (" +
                     std::to_string(total) + ") is not divisible by it" +
                     (replicate ? " (nor does it divide it)" : "")};
}

Mat row_view(const Mat& m, int64_t first, int64_t count) {
  Mat v = m;
  v.data = m.row(first);
  v.rows = count;
  return v;
}

class Builder {
 public:
  explicit Builder(ModelWeights& out) : out_(out) {}

  // Columns [first, first + count) of every row, copied.
  Mat cols(const Mat& m, int64_t first, int64_t count) {
    const size_t es = core::dtype_size(m.dtype), rb = static_cast<size_t>(count) * es;
    auto& buf = fresh(static_cast<size_t>(m.rows) * rb);
    for (int64_t r = 0; r < m.rows; ++r)
      std::memcpy(buf.data() + static_cast<size_t>(r) * rb,
                  static_cast<const uint8_t*>(m.row(r)) + static_cast<size_t>(first) * es, rb);
    Mat v = m;
    v.data = buf.data();
    v.cols = count;
    return v;
  }

  // Row blocks of one matrix, stacked in order, copied.
  Mat stack(const Mat& m, const std::vector<Slice>& blocks) {
    int64_t rows = 0;
    for (const auto& b : blocks) rows += b.count;
    auto& buf = fresh(static_cast<size_t>(rows) * m.row_bytes());
    size_t at = 0;
    for (const auto& b : blocks) {
      const size_t n = static_cast<size_t>(b.count) * m.row_bytes();
      std::memcpy(buf.data() + at, m.row(b.first), n);
      at += n;
    }
    Mat v = m;
    v.data = buf.data();
    v.rows = rows;
    return v;
  }

 private:
  std::vector<uint8_t>& fresh(size_t bytes) {
    out_.owned.push_back(std::make_unique<std::vector<uint8_t>>(std::max<size_t>(bytes, 1)));
    return *out_.owned.back();
  }
  ModelWeights& out_;
};

MlpWeights shard_mlp(Builder& b, const MlpWeights& m, Slice s) {
  MlpWeights o;
  o.gate_proj = row_view(m.gate_proj, s.first, s.count);
  o.up_proj = row_view(m.up_proj, s.first, s.count);
  o.down_proj = b.cols(m.down_proj, s.first, s.count);
  return o;
}

}  // namespace

core::Expected<ShardLayout> shard_layout(const TextConfig& c, ShardSpec s) {
  if (s.world < 1 || s.rank < 0 || s.rank >= s.world)
    return core::Error{"tensor parallel: rank " + std::to_string(s.rank) + " of " + std::to_string(s.world)};
  ShardLayout l;
  l.spec = s;
  DF_ASSIGN(l.vocab, split(c.vocab_size, s, false, "vocab_size"));
  if (c.count_layers(LayerType::kFullAttention) > 0) {
    DF_ASSIGN(l.q_heads, split(c.num_attention_heads, s, false, "num_attention_heads"));
    DF_ASSIGN(l.kv_heads, split(c.num_key_value_heads, s, true, "num_key_value_heads"));
  } else {
    l.q_heads = {0, c.num_attention_heads};
    l.kv_heads = {0, c.num_key_value_heads};
  }
  if (c.count_layers(LayerType::kLinearAttention) > 0) {
    DF_ASSIGN(l.lin_v_heads, split(c.linear_num_value_heads, s, false, "linear_num_value_heads"));
    DF_ASSIGN(l.lin_k_heads, split(c.linear_num_key_heads, s, true, "linear_num_key_heads"));
  } else {
    l.lin_k_heads = {0, c.linear_num_key_heads};
    l.lin_v_heads = {0, c.linear_num_value_heads};
  }
  bool any_dense = false, any_moe = false;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) (c.layer_is_moe(i) ? any_moe : any_dense) = true;
  l.inter = {0, c.intermediate_size};
  if (any_dense) {
    DF_ASSIGN(l.inter, split(c.intermediate_size, s, false, "intermediate_size"));
  }
  l.moe_inter = {0, c.moe_intermediate_size};
  l.shared_inter = {0, c.shared_expert_intermediate_size};
  if (any_moe) {
    DF_ASSIGN(l.moe_inter, split(c.moe_intermediate_size, s, false, "moe_intermediate_size"));
    DF_ASSIGN(l.shared_inter,
              split(c.shared_expert_intermediate_size, s, false, "shared_expert_intermediate_size"));
  }
  return l;
}

TextConfig shard_config(const TextConfig& full, const ShardLayout& l) {
  TextConfig c = full;
  c.vocab_size = l.vocab.count;
  c.num_attention_heads = l.q_heads.count;
  c.num_key_value_heads = l.kv_heads.count;
  c.linear_num_key_heads = l.lin_k_heads.count;
  c.linear_num_value_heads = l.lin_v_heads.count;
  c.intermediate_size = l.inter.count;
  c.moe_intermediate_size = l.moe_inter.count;
  c.shared_expert_intermediate_size = l.shared_inter.count;
  return c;
}

core::Expected<ModelWeights> shard_weights(const TextConfig& c, const ModelWeights& w, const ShardLayout& l) {
  if (w.layers.size() != static_cast<size_t>(c.num_hidden_layers))
    return core::Error{"tensor parallel: the weights do not match the config"};
  if (const Mat* q = first_quantized(c, w))
    return core::Error{"tensor parallel: tensor '" + (q->name ? *q->name : std::string("?")) + "' is " +
                       describe_format(*q) + "; quantized weights are not sharded yet"};
  ModelWeights o;
  Builder b(o);
  o.prefix = w.prefix;
  o.mtp_tensors = w.mtp_tensors;
  o.visual_tensors = w.visual_tensors;
  o.embed_tokens = row_view(w.embed_tokens, l.vocab.first, l.vocab.count);
  o.lm_head = c.tie_word_embeddings ? o.embed_tokens : row_view(w.lm_head, l.vocab.first, l.vocab.count);
  o.norm = w.norm;
  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim, nk = c.linear_num_key_heads;
  const int64_t hd = c.head_dim, qw = c.attn_output_gate ? 2 * hd : hd;
  const Slice kh = l.lin_k_heads, vh = l.lin_v_heads, qh = l.q_heads, kvh = l.kv_heads;
  for (const auto& lw : w.layers) {
    LayerWeights L;
    L.type = lw.type;
    L.is_moe = lw.is_moe;
    L.input_layernorm = lw.input_layernorm;
    L.post_attention_layernorm = lw.post_attention_layernorm;
    if (lw.type == LayerType::kLinearAttention) {
      const auto& g = lw.linear;
      // Conv channels (and in_proj_qkv rows): [q (nk dk) | k (nk dk) | v (nv dv)], head-major.
      const std::vector<Slice> qkv = {{kh.first * dk, kh.count * dk},
                                      {nk * dk + kh.first * dk, kh.count * dk},
                                      {2 * nk * dk + vh.first * dv, vh.count * dv}};
      L.linear.in_proj_qkv = b.stack(g.in_proj_qkv, qkv);
      L.linear.in_proj_z = row_view(g.in_proj_z, vh.first * dv, vh.count * dv);
      L.linear.in_proj_b = row_view(g.in_proj_b, vh.first, vh.count);
      L.linear.in_proj_a = row_view(g.in_proj_a, vh.first, vh.count);
      L.linear.conv1d = b.stack(g.conv1d, qkv);
      L.linear.dt_bias = b.cols(g.dt_bias, vh.first, vh.count);
      L.linear.A_log = b.cols(g.A_log, vh.first, vh.count);
      L.linear.norm = g.norm;
      L.linear.out_proj = b.cols(g.out_proj, vh.first * dv, vh.count * dv);
    } else {
      const auto& a = lw.attn;
      L.attn.q_proj = row_view(a.q_proj, qh.first * qw, qh.count * qw);  // per head [q | gate]
      L.attn.k_proj = row_view(a.k_proj, kvh.first * hd, kvh.count * hd);
      L.attn.v_proj = row_view(a.v_proj, kvh.first * hd, kvh.count * hd);
      L.attn.o_proj = b.cols(a.o_proj, qh.first * hd, qh.count * hd);
      L.attn.q_norm = a.q_norm;
      L.attn.k_norm = a.k_norm;
    }
    if (!lw.is_moe) {
      L.mlp = shard_mlp(b, lw.mlp, l.inter);
    } else {
      L.moe.router = lw.moe.router;
      L.moe.shared_expert_gate = lw.moe.shared_expert_gate;
      for (const auto& e : lw.moe.experts) L.moe.experts.push_back(shard_mlp(b, e, l.moe_inter));
      L.moe.shared_expert = shard_mlp(b, lw.moe.shared_expert, l.shared_inter);
    }
    o.layers.push_back(std::move(L));
  }
  auto add = [&](const Mat& m) {
    o.bytes += static_cast<uint64_t>(m.rows) * m.row_bytes();
    o.parameter_count += m.numel();
  };
  add(o.embed_tokens);
  if (!c.tie_word_embeddings) add(o.lm_head);
  add(o.norm);
  for (const auto& L : o.layers) {
    for (const Mat* m : {&L.input_layernorm,
                         &L.post_attention_layernorm,
                         &L.linear.in_proj_qkv,
                         &L.linear.in_proj_z,
                         &L.linear.in_proj_b,
                         &L.linear.in_proj_a,
                         &L.linear.conv1d,
                         &L.linear.dt_bias,
                         &L.linear.A_log,
                         &L.linear.norm,
                         &L.linear.out_proj,
                         &L.attn.q_proj,
                         &L.attn.k_proj,
                         &L.attn.v_proj,
                         &L.attn.o_proj,
                         &L.attn.q_norm,
                         &L.attn.k_norm,
                         &L.mlp.gate_proj,
                         &L.mlp.up_proj,
                         &L.mlp.down_proj,
                         &L.moe.router,
                         &L.moe.shared_expert_gate,
                         &L.moe.shared_expert.gate_proj,
                         &L.moe.shared_expert.up_proj,
                         &L.moe.shared_expert.down_proj})
      add(*m);
    for (const auto& e : L.moe.experts)
      for (const Mat* m : {&e.gate_proj, &e.up_proj, &e.down_proj}) add(*m);
  }
  return o;
}

}  // namespace deltaflow::model
