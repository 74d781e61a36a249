#include "backend/memory_plan.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "backend/quant_pack.hpp"

namespace deltaflow::backend {

namespace {

// Constants of the CUDA backend the plan depends on (kLogitRows and kDecodeMaxRows in cuda_backend.cpp,
// kGemvMaxRows in gemv.cuh, kAttnSplitKeys and kAttnMaxSplits in attention.cuh, kGemmWorkspace in
// cuda_backend.cpp, kGdnChunkLen in gdn_chunked.cuh, kGroupedTileRows in moe_grouped.cuh, kMaxDraftTokens in
// cuda_backend.hpp).
constexpr int64_t kLogitRows = 256;
constexpr int64_t kGemvMaxRows = 32;  // also kQuantGemvMaxRows (gemv_quant.cuh)
constexpr int64_t kDecodeMaxRows = 256;
constexpr int64_t kAttnSplitKeys = 64;
constexpr int64_t kAttnMaxSplits = 128;
constexpr size_t kGemmWorkspace = 32u << 20;
constexpr int64_t kGdnChunkLen = 64;
constexpr int64_t kGroupedTileRows = 64;
constexpr int64_t kMaxDraftTokens = 8;
constexpr size_t kAlign = 256;

size_t align_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

// Sizes one allocation made of 256-byte-aligned pieces, as the backend's Layout and workspace do.
class Sizer {
 public:
  void add(size_t bytes) { size_ = align_up(size_, kAlign) + bytes; }
  size_t size() const { return size_; }

 private:
  size_t size_ = 0;
};

// The checkpoint's text-model prefix its quantization config names modules under.
std::string module_prefix(const model::TextConfig& c, const MemoryPlanOptions& opt) {
  if (!opt.module_prefix.empty()) return opt.module_prefix;
  return c.multimodal_layout ? "model.language_model." : "model.";
}

// A linear module as the checkpoint's quantization config describes it (its checkpoint name, prefix
// included): a Mat without data whose format, shape and scale grid are those the binder would give it, so
// that pack_quant's layout pass sizes it as the CUDA backend places it.
model::Mat planned_mat(const model::TextConfig& c, const std::string& module, int64_t rows, int64_t cols,
                       core::DType float_dtype) {
  static const uint8_t kNoData = 0;  // ScaleView::empty() is a null pointer; the layout pass reads no entry
  model::Mat m(nullptr, float_dtype, rows, cols);
  if (!c.quant.quantized()) return m;
  const model::quant::LinearScheme s = c.quant.scheme_for(module);
  if (!s.supported || s.format == model::quant::WeightFormat::kFloat) return m;
  m.format = s.format;
  m.scale.data = &kNoData;
  if (s.format == model::quant::WeightFormat::kNvfp4) {
    m.dtype = core::DType::kU8;
    m.scale = {&kNoData, core::DType::kF8E4M3,     rows, cols / model::quant::kNvfp4Group,
               1,        model::quant::kNvfp4Group};
    return m;
  }
  m.dtype = core::DType::kF8E4M3;
  using model::quant::Fp8Scales;
  const int64_t br = s.fp8_scales == Fp8Scales::kTensor    ? rows
                     : s.fp8_scales == Fp8Scales::kChannel ? 1
                                                           : s.block_rows;
  const int64_t bc = s.fp8_scales == Fp8Scales::kBlock ? s.block_cols : cols;
  m.scale = {&kNoData, core::DType::kF32, (rows + br - 1) / br, (cols + bc - 1) / bc, br, bc};
  m.input_scale = s.input_scale ? 1.0f : 0.0f;  // one stored: its value does not change the layout
  return m;
}

// How the CUDA backend's Layout::mat places one matrix made of `parts`: float parts in their dtype; quantized
// parts that stack in the kernels' layout (codes, then each scale array, each its own piece); a group of
// different formats as one matrix per part; else (a [gate | up] pair of different formats, or float_only:
// the MoE matrices and the embedding) widened to bf16.
enum class Placement : uint8_t { kFloat, kPacked, kParts, kWidened };

Placement place(const std::vector<model::Mat>& parts, bool gate_up, bool float_only, PackedQuant* packed) {
  bool any_quant = false, mixed = false;
  for (const auto& p : parts) {
    any_quant |= p.quantized();
    mixed |= p.format != parts[0].format || (!p.quantized() && p.dtype != parts[0].dtype);
  }
  if (!any_quant) return Placement::kFloat;
  if (float_only) return Placement::kWidened;
  if (!mixed) {
    std::vector<const model::Mat*> ptrs;
    for (const auto& p : parts) ptrs.push_back(&p);
    const bool interleave = gate_up && parts[0].format == model::quant::WeightFormat::kNvfp4;
    auto pq = pack_quant(ptrs, interleave, true);
    if (pq) {
      *packed = std::move(*pq);
      return Placement::kPacked;
    }
  }
  return !gate_up && parts.size() > 1 ? Placement::kParts : Placement::kWidened;
}

// The matrices Layout::quant_mat makes of a kParts group: one per run of consecutive members of one kind
// (a quantized format, or a float dtype), a quantized run that does not stack one per member; a group of one
// kind (that does not stack) one per member.
std::vector<std::vector<model::Mat>> part_matrices(const std::vector<model::Mat>& parts) {
  std::vector<std::vector<model::Mat>> runs, out;
  for (const auto& p : parts) {
    if (runs.empty() || !same_kind(runs.back()[0], p)) runs.emplace_back();
    runs.back().push_back(p);
  }
  for (auto& run : runs) {
    PackedQuant pq;
    if (runs.size() == 1 ||
        (run.size() > 1 && run[0].quantized() && place(run, false, false, &pq) != Placement::kPacked)) {
      for (const auto& p : run) out.push_back({p});
    } else {
      out.push_back(std::move(run));
    }
  }
  return out;
}

int64_t rows_of(const std::vector<model::Mat>& parts) {
  int64_t r = 0;
  for (const auto& p : parts) r += p.rows;
  return r;
}

void add_matrix(Sizer& s, const std::vector<model::Mat>& parts, int64_t rows, int64_t cols, bool gate_up,
                bool float_only) {
  PackedQuant pq;
  switch (place(parts, gate_up, float_only, &pq)) {
    case Placement::kFloat:
      s.add(static_cast<size_t>(rows * cols) * core::dtype_size(parts[0].dtype));
      return;
    case Placement::kPacked:
      s.add(pq.codes_bytes);
      if (pq.format == model::quant::WeightFormat::kNvfp4) {
        s.add(pq.scales_bytes);
        s.add(pq.row_scales_n * 4);
      } else {
        s.add(pq.grid_n * 4);
      }
      return;
    case Placement::kParts:
      for (const auto& m : part_matrices(parts)) add_matrix(s, m, rows_of(m), cols, false, false);
      return;
    case Placement::kWidened:
      s.add(static_cast<size_t>(rows * cols) * 2);
      return;
  }
}

// The routed experts of one MoE layer (module prefix `m`): one expert's [gate | up] (gate_up, 2 rows x cols
// per part) or down matrix as the config gives expert 0, and whether the experts keep a quantized layout
// (CudaBackend's Layout::experts_pack: quantized, packing, not exact) with one expert's arrays.
struct ExpertPack {
  model::Mat mat;
  bool packs = false;
  PackedQuant one;
};

ExpertPack expert_pack(const model::TextConfig& c, const std::string& base, int64_t rows, int64_t cols,
                       bool gate_up, bool exact) {
  ExpertPack e;
  std::vector<model::Mat> parts;
  if (gate_up)
    parts = {planned_mat(c, base + "gate_proj", rows, cols, core::DType::kBF16),
             planned_mat(c, base + "up_proj", rows, cols, core::DType::kBF16)};
  else
    parts = {planned_mat(c, base + "down_proj", rows, cols, core::DType::kBF16)};
  e.mat = parts[0];
  if (exact || !parts[0].quantized() || (gate_up && parts[1].format != parts[0].format)) return e;
  std::vector<const model::Mat*> ptrs;
  for (const auto& p : parts) ptrs.push_back(&p);
  auto pq = pack_quant(ptrs, gate_up && parts[0].format == model::quant::WeightFormat::kNvfp4, true);
  if (!pq) return e;
  e.packs = true;
  e.one = std::move(*pq);
  return e;
}

// One decoder layer's weights (module prefix L), in CudaBackend's layout order (lay_out_layer).
void add_layer_bytes(Sizer& s, const model::TextConfig& c, const std::string& L, model::LayerType type,
                     bool moe, core::DType dt, bool exact) {
  using model::LayerType;
  const int64_t H = c.hidden_size;
  const int64_t nv = c.linear_num_value_heads, dv = c.linear_value_head_dim;
  const int64_t C = c.linear_conv_dim(), vd = c.linear_value_dim();
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  const int64_t qw = c.attn_output_gate ? 2 * hd : hd;
  auto lin = [&](const std::string& module, int64_t rows, int64_t cols) {
    return planned_mat(c, module, rows, cols, dt);
  };
  auto vec = [](int64_t n) { return static_cast<size_t>(n) * 4; };
  s.add(vec(H));  // input norm
  s.add(vec(H));  // post-attention norm
  if (type == LayerType::kLinearAttention) {
    const std::string g = L + "linear_attn.";
    add_matrix(s,
               {lin(g + "in_proj_qkv", C, H), lin(g + "in_proj_z", vd, H), lin(g + "in_proj_b", nv, H),
                lin(g + "in_proj_a", nv, H)},
               C + vd + 2 * nv, H, false, false);  // in_proj [qkv | z | b | a]
    s.add(vec(C * c.linear_conv_kernel_dim));
    s.add(vec(nv));  // dt_bias
    s.add(vec(nv));  // A_log
    s.add(vec(dv));  // gated norm
    add_matrix(s, {lin(g + "out_proj", H, vd)}, H, vd, false, false);
  } else {
    const std::string a = L + "self_attn.";
    add_matrix(
        s, {lin(a + "q_proj", nh * qw, H), lin(a + "k_proj", nkv * hd, H), lin(a + "v_proj", nkv * hd, H)},
        nh * qw + 2 * nkv * hd, H, false, false);  // q/k/v_proj
    s.add(vec(hd));
    s.add(vec(hd));
    add_matrix(s, {lin(a + "o_proj", H, nh * hd)}, H, nh * hd, false, false);
  }
  if (!moe) {
    const int64_t I = c.intermediate_size;
    const std::string m = L + "mlp.";
    add_matrix(s, {lin(m + "gate_proj", I, H), lin(m + "up_proj", I, H)}, 2 * I, H, true, false);
    add_matrix(s, {lin(m + "down_proj", H, I)}, H, I, false, false);
  } else {
    // The router and shared expert gate stay float (widened to bf16 when quantized). The experts' format is
    // their first expert's (the config gives every expert the same scheme; resolving thousands of names
    // is slow): quantized, they keep the kernels' layout (not in exact mode); else they are widened.
    const int64_t E = c.num_experts, Im = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
    const std::string m = L + "mlp.";
    const model::Mat router = lin(m + "gate", E, H), sgate = lin(m + "shared_expert_gate", 1, H);
    if (router.dtype == sgate.dtype) {
      add_matrix(s, {router, sgate}, E + 1, H, false, true);  // [router | shared expert gate]
    } else {
      add_matrix(s, {router}, E, H, false, true);
      add_matrix(s, {sgate}, 1, H, false, true);
    }
    const std::string e0 = m + "experts.0.", sh = m + "shared_expert.";
    const ExpertPack gu = expert_pack(c, e0, Im, H, true, exact),
                     dn = expert_pack(c, e0, H, Im, false, exact);
    bool stacked = false;  // the shared expert as expert E of the stacks (CudaBackend's shared_in_stack)
    if (gu.packs && dn.packs && Is == Im) {
      const ExpertPack sgu = expert_pack(c, sh, Is, H, true, exact),
                       sdn = expert_pack(c, sh, H, Is, false, exact);
      stacked = sgu.packs && sdn.packs && same_layout(sgu.one, gu.one) && same_layout(sdn.one, dn.one);
    }
    if (gu.packs && dn.packs) {
      // Quantized experts in the kernels' layout, E (or E + 1) copies of one expert's arrays; else the
      // shared expert in its own format.
      const size_t n = static_cast<size_t>(E + (stacked ? 1 : 0));
      for (const ExpertPack* e : {&gu, &dn}) {
        s.add(e->one.codes_bytes * n);
        if (e->one.format == model::quant::WeightFormat::kNvfp4) {
          s.add(e->one.scales_bytes * n);
          s.add(e->one.row_scales_n * 4 * n);
        } else {
          s.add(e->one.grid_n * 4 * n);
        }
      }
    } else {
      add_matrix(s, {gu.mat}, E * 2 * Im, H, false, true);
      add_matrix(s, {dn.mat}, E * H, Im, false, true);
    }
    const bool shared_float = !(gu.packs && dn.packs);
    if (!stacked) {
      add_matrix(s, {lin(sh + "gate_proj", Is, H), lin(sh + "up_proj", Is, H)}, 2 * Is, H, true,
                 shared_float);
      add_matrix(s, {lin(sh + "down_proj", H, Is)}, H, Is, false, shared_float);
    }
  }
}

size_t weight_bytes(const model::TextConfig& c, const std::string& prefix, core::DType dt, bool exact,
                    bool mtp) {
  using model::LayerType;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  auto lin = [&](const std::string& module, int64_t rows, int64_t cols) {
    return planned_mat(c, module, rows, cols, dt);
  };
  auto vec = [](int64_t n) { return static_cast<size_t>(n) * 4; };
  Sizer s;
  add_matrix(s, {model::Mat(nullptr, dt, V, H)}, V, H, false, true);                      // embed_tokens
  if (!c.tie_word_embeddings) add_matrix(s, {lin("lm_head", V, H)}, V, H, false, false);  // lm_head
  s.add(vec(H));                                                                          // final norm
  s.add(vec(std::max<int64_t>(c.rotary_dim() / 2, 1)));                                   // inv_freq
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    add_layer_bytes(s, c, prefix + "layers." + std::to_string(i) + ".", c.layer_types[static_cast<size_t>(i)],
                    c.layer_is_moe(i), dt, exact);
  if (mtp) {
    // The MTP head (CudaBackend's lay_out_mtp): two pre-fc norms, fc, its full-attention layer, its norm.
    s.add(vec(H));
    s.add(vec(H));
    add_matrix(s, {lin("mtp.fc", H, 2 * H)}, H, 2 * H, false, false);
    add_layer_bytes(s, c, "mtp.layers.0.", LayerType::kFullAttention, c.num_experts > 0, dt, exact);
    s.add(vec(H));
  }
  return s.size();
}

// What CudaBackend::plan_memory sizes its quantized-matmul buffers by: the largest quantized matrix (or
// part) the layers keep in a quantized layout (wdq: its bf16 copy, for prefill chunks past the decode
// buckets), and whether any matrix runs the quantized GEMV (lm_head too).
struct QuantBuffers {
  size_t widest = 0;
  bool any = false;
  bool experts = false;    // quantized routed experts (a step stages its T * K slots' activations)
  bool fp8_block = false;  // FP8 on the FP8 GEMM (prefill quantizes activations: block or static scales)
};

QuantBuffers quant_buffers(const model::TextConfig& c, const std::string& prefix, bool exact) {
  QuantBuffers qb;
  if (!c.quant.quantized()) return qb;
  const int64_t H = c.hidden_size;
  const int64_t nv = c.linear_num_value_heads, C = c.linear_conv_dim(), vd = c.linear_value_dim();
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  const int64_t qw = c.attn_output_gate ? 2 * hd : hd;
  qb.any = !c.tie_word_embeddings && planned_mat(c, "lm_head", 16, H, core::DType::kBF16).quantized();
  auto group = [&](const std::vector<model::Mat>& parts, bool gate_up) {
    PackedQuant pq;
    const Placement pl = place(parts, gate_up, false, &pq);
    // FP8 with 128 x 128 block scales, or with a static input scale (the same GEMM's activations).
    const auto block_scaled = [](const PackedQuant& q) {
      return q.format == model::quant::WeightFormat::kFp8 &&
             ((q.block_rows == 128 && q.block_cols == 128) || q.input_scale > 0);
    };
    if (pl == Placement::kPacked) {
      qb.any = true;
      qb.widest = std::max(qb.widest, static_cast<size_t>(pq.rows * pq.cols));
      qb.fp8_block |= block_scaled(pq);
    } else if (pl == Placement::kParts) {
      qb.any = true;
      for (const auto& m : part_matrices(parts)) {
        PackedQuant one;
        if (place(m, false, false, &one) == Placement::kPacked) {
          qb.widest = std::max(qb.widest, static_cast<size_t>(rows_of(m) * m[0].cols));
          qb.fp8_block |= block_scaled(one);
        }
      }
    }
  };
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string L = prefix + "layers." + std::to_string(i) + ".";
    auto lin = [&](const std::string& m, int64_t r, int64_t k) {
      return planned_mat(c, L + m, r, k, core::DType::kBF16);
    };
    if (c.layer_types[static_cast<size_t>(i)] == model::LayerType::kLinearAttention) {
      group({lin("linear_attn.in_proj_qkv", C, H), lin("linear_attn.in_proj_z", vd, H),
             lin("linear_attn.in_proj_b", nv, H), lin("linear_attn.in_proj_a", nv, H)},
            false);
      group({lin("linear_attn.out_proj", H, vd)}, false);
    } else {
      group({lin("self_attn.q_proj", nh * qw, H), lin("self_attn.k_proj", nkv * hd, H),
             lin("self_attn.v_proj", nkv * hd, H)},
            false);
      group({lin("self_attn.o_proj", H, nh * hd)}, false);
    }
    if (!c.layer_is_moe(i)) {
      const int64_t I = c.intermediate_size;
      group({lin("mlp.gate_proj", I, H), lin("mlp.up_proj", I, H)}, true);
      group({lin("mlp.down_proj", H, I)}, false);
    }
    if (c.layer_is_moe(i)) {
      const int64_t Im = c.moe_intermediate_size;
      const std::string m = L + "mlp.";
      if (expert_pack(c, m, Im, H, true, exact).packs && expert_pack(c, m, H, Im, false, exact).packs) {
        qb.any = qb.experts = true;
        const int64_t Is = c.shared_expert_intermediate_size;
        group({lin("mlp.shared_expert.gate_proj", Is, H), lin("mlp.shared_expert.up_proj", Is, H)}, true);
        group({lin("mlp.shared_expert.down_proj", H, Is)}, false);
      }
    }
  }
  return qb;
}

// The chunked Gated DeltaNet prefill's per-chunk records for one R-token sequence (fast mode only; as
// gdn_chunked_supported / gdn_chunked_workspace_bytes in gdn_chunked.cu, chunks of kGdnChunkLen tokens).
size_t gdn_chunk_bytes(const model::TextConfig& c, const MemoryPlanOptions& opt, int64_t R) {
  const int64_t nk = c.linear_num_key_heads, nv = c.linear_num_value_heads;
  const int64_t dk = c.linear_key_head_dim, dv = c.linear_value_head_dim;
  const bool supported =
      nk > 0 && nv > 0 && nv % nk == 0 && (dk == 64 || dk == 128) && (dv == 64 || dv == 128);
  if (c.count_layers(model::LayerType::kLinearAttention) == 0 || opt.exact || !supported) return 0;
  const int64_t recs = (R + kGdnChunkLen - 1) / kGdnChunkLen * nv, L = kGdnChunkLen;
  const size_t parts[6] = {static_cast<size_t>(recs * L * dk) * 2, static_cast<size_t>(recs * L * dk) * 2,
                           static_cast<size_t>(recs * L * dk) * 2, static_cast<size_t>(recs * L * L) * 2,
                           static_cast<size_t>(recs * L * dv) * 4, static_cast<size_t>(recs) * 4};
  size_t total = 0;
  for (size_t b : parts) total += align_up(b, kAlign);
  return total;
}

size_t workspace_bytes(const model::TextConfig& c, const MemoryPlanOptions& opt, int64_t max_ctx) {
  const bool fp8 = opt.kv_fp8 && !opt.exact;
  using model::LayerType;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const int64_t n_lin = c.count_layers(LayerType::kLinearAttention),
                n_full = c.count_layers(LayerType::kFullAttention);
  const int64_t C = c.linear_conv_dim(), vd = c.linear_value_dim(), nv = c.linear_num_value_heads;
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  const int64_t qw = c.attn_output_gate ? 2 * hd : hd;
  const int64_t max_splits = std::min((max_ctx + kAttnSplitKeys - 1) / kAttnSplitKeys, kAttnMaxSplits);
  const int64_t R = std::max<int64_t>(opt.prefill_chunk, kGemvMaxRows);
  const int64_t E = c.is_moe() ? c.num_experts : 0, K = c.is_moe() ? c.num_experts_per_tok : 0;
  const int64_t Im = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  const int64_t RK = R * std::max<int64_t>(K, 1);
  int64_t I = 0;
  bool any_dense = false;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    if (!c.layer_is_moe(i)) {
      any_dense = true;
      I = std::max(I, c.intermediate_size);
    }
  int64_t Pmax = 1;
  if (n_lin) Pmax = std::max(Pmax, C + vd + 2 * nv);
  if (n_full) Pmax = std::max(Pmax, nh * qw + 2 * nkv * hd);
  if (any_dense) Pmax = std::max(Pmax, 2 * I);
  if (E) Pmax = std::max(Pmax, 2 * Is);
  const int64_t Kmax = std::max({H, I, Im, Is, vd, nh * hd, opt.mtp ? 2 * H : 0});
  const int64_t D = decode_workspace_rows(opt.exact, R);
  const int64_t part = std::max(R * nh * hd, D * nh * max_splits * hd);
  const int64_t part_ml = std::max(R * nh * 2, D * nh * max_splits * 2);
  // The grouped expert GEMM's tile list, then the device-side expert sort's scratch (2E ints) and live count.
  const int64_t moe_tiles = E ? 3 * (RK / kGroupedTileRows + E + 1) + 2 * E + 1 : 1;
  const std::vector<int64_t> words = {R * H,
                                      R * H,
                                      R * H,
                                      R * Pmax,  // h, xn, y, proj
                                      n_lin ? R * C : 1,
                                      n_lin ? R * vd : 1,  // conv, gdn
                                      n_full ? R * nh * hd : 1,
                                      n_full ? R * nh * hd : 1,  // q, attn
                                      n_full ? part : 1,
                                      n_full ? part_ml : 1,               // split-attention partials
                                      R * std::max<int64_t>({I, Is, 1}),  // act
                                      E ? R * E : 1,
                                      E ? RK : 1,
                                      E ? RK * 2 * Im : 1,
                                      E ? RK * Im : 1,  // router, moe_w, gu_s, act_s
                                      E ? RK * H : 1,
                                      E ? RK * H : 1,
                                      E ? RK * H : 1,
                                      E ? R * H : 1,
                                      E ? R : 1,                             // y_slot xs ys y_shared gate
                                      std::max<int64_t>(kLogitRows, D) * V,  // logits
                                      E ? RK : 1,
                                      E ? RK : 1,
                                      E ? RK : 1,  // moe ids, sort order
                                      R,
                                      R,
                                      R,
                                      R,
                                      R,
                                      R + 1,
                                      D,  // ids, pos, slot, row snapshots, short runs' run0 and runs, out ids
                                      moe_tiles};
  Sizer s;
  for (int64_t w : words) s.add(static_cast<size_t>(w) * 4);
  // fp8 KV: a prefill's keys and values as bf16 (attention_dequant_elems: k and v of max_ctx positions).
  s.add(std::max<size_t>(
      fp8 && n_full ? static_cast<size_t>(2 * max_ctx * c.num_key_value_heads * c.head_dim) * 2 : 0, 16));
  const size_t x16_elems = opt.exact ? 0 : static_cast<size_t>(std::max(R, RK) * Kmax);
  s.add(std::max<size_t>(x16_elems * 2, 16));  // 16-bit copies of matmul inputs for cuBLASLt
  // Quantized matmuls: a bf16 copy of the widest quantized weight but the experts' when prefill chunks pass
  // the decode buckets, the fp16 activations of one GEMV launch (quantized experts: of a step's T * K
  // slots), their per-row factors.
  const QuantBuffers qb = quant_buffers(c, module_prefix(c, opt), opt.exact);
  const size_t wdq = !opt.exact && R > kDecodeMaxRows ? qb.widest : 0;
  const int64_t xq_rows = qb.experts ? std::max(R, kDecodeMaxRows) * std::max<int64_t>(K, 1) : kGemvMaxRows;
  // FP8 block-scaled matrices: prefill's activations in E4M3 and their per-128-column scales (rows to 8).
  const bool x8 = qb.fp8_block && !opt.exact && R > kDecodeMaxRows;
  const int64_t x8_rows = x8 ? (R + 7) / 8 * 8 : 0, x8_cols = x8 ? (Kmax + 127) / 128 * 128 : 0;
  s.add(std::max<size_t>(static_cast<size_t>(x8_rows * x8_cols), 16));
  s.add(static_cast<size_t>(std::max<int64_t>(x8_cols / 128 * x8_rows, 4)) * 4);
  s.add(std::max<size_t>(wdq * 2, 16));
  s.add(qb.any ? static_cast<size_t>(xq_rows * Kmax) * 2 : 16);
  s.add(static_cast<size_t>(xq_rows) * 4);
  s.add(std::max<size_t>(gdn_chunk_bytes(c, opt, R), 16));
  return s.size();
}

}  // namespace

MemoryPlanEstimate estimate_memory_plan(const model::TextConfig& c, const MemoryPlanOptions& opt) {
  using model::LayerType;
  MemoryPlanEstimate p;
  const int64_t n_lin = c.count_layers(LayerType::kLinearAttention),
                n_full = c.count_layers(LayerType::kFullAttention);
  const int64_t max_ctx =
      opt.max_context > 0 ? opt.max_context : std::min<int64_t>(c.max_position_embeddings, 32768);
  const bool paged = opt.kv_pages > 0;
  const int slots = (paged ? opt.state_slots : opt.max_sequences) + 1;
  p.slots = slots;
  p.kv_pages = paged ? opt.kv_pages + 1 : 0;
  p.max_context = max_ctx;
  p.kv_f32 = opt.exact;
  p.kv_fp8 = opt.kv_fp8 && !opt.exact;
  const size_t kv_es = opt.exact ? 4 : p.kv_fp8 ? 1 : 2;
  const int64_t conv_slot = n_lin * c.linear_conv_dim() * (c.linear_conv_kernel_dim - 1);
  const int64_t gdn_slot = n_lin * c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim;
  // The KV cache's unit: a page of kCudaPageSize positions, or a slot's max_ctx positions.
  const bool drafting = paged && opt.mtp && opt.draft_step_rows > 0;
  const int64_t kv_layers = n_full + (drafting ? 1 : 0);  // + the MTP layer's store
  const int64_t kv_unit = kv_layers * c.num_key_value_heads * (paged ? kCudaPageSize : max_ctx) * c.head_dim;
  const int64_t kv_units = paged ? p.kv_pages : slots;
  p.states = align_up(static_cast<size_t>(slots * conv_slot) * 4, kAlign) +
             align_up(static_cast<size_t>(slots * gdn_slot) * 4, kAlign);
  // fp8: k and v codes, then their scales (one fp32 per position and kv head).
  const size_t scales =
      p.kv_fp8 ? align_up(static_cast<size_t>(kv_units * kv_unit / c.head_dim) * 4, kAlign) : 0;
  p.kv = 2 * (align_up(static_cast<size_t>(kv_units * kv_unit) * kv_es, kAlign) + scales);
  p.kv_bytes_per_token = 2 * static_cast<size_t>(n_full * c.num_key_value_heads) *
                         (static_cast<size_t>(c.head_dim) * kv_es + (p.kv_fp8 ? 4 : 0));
  p.kv_page_bytes = p.kv_bytes_per_token * kCudaPageSize;
  if (opt.mtp) p.draft_page_bytes = p.kv_page_bytes / static_cast<size_t>(std::max<int64_t>(n_full, 1));
  if (drafting) {
    // CudaBackend::allocate_draft_buffers.
    const int64_t H = c.hidden_size, R = std::max<int64_t>(opt.prefill_chunk, kGemvMaxRows);
    const int64_t S = opt.draft_step_seqs;
    const int64_t index = std::max(opt.draft_step_rows, R) + 2 * std::max<int64_t>(S, kLogitRows);
    for (int64_t words : {opt.draft_step_rows * H, R * 2 * H, S * H, 3 * kMaxDraftTokens * S, index})
      p.draft += align_up(static_cast<size_t>(words) * 4, kAlign);
  }
  p.state_bytes_per_sequence = static_cast<size_t>(conv_slot + gdn_slot) * 4;
  p.weights = weight_bytes(c, module_prefix(c, opt), opt.matrix_dtype, opt.exact, opt.mtp);
  p.workspace = workspace_bytes(c, opt, max_ctx);
  p.gemm_workspace = kGemmWorkspace;
  return p;
}

}  // namespace deltaflow::backend
