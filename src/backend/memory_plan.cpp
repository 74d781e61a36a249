#include "backend/memory_plan.hpp"

#include <algorithm>
#include <vector>

namespace deltaflow::backend {

namespace {

// Constants of the CUDA backend the plan depends on (kLogitRows in cuda_backend.cpp, kGemvMaxRows in
// gemv.cuh, kAttnSplitKeys and kAttnMaxSplits in attention.cuh, kGemmWorkspace in cuda_backend.cpp,
// kGdnChunkLen in gdn_chunked.cuh, kGroupedTileRows in moe_grouped.cuh).
constexpr int64_t kLogitRows = 256;
constexpr int64_t kGemvMaxRows = 32;
constexpr int64_t kAttnSplitKeys = 64;
constexpr int64_t kAttnMaxSplits = 128;
constexpr size_t kGemmWorkspace = 32u << 20;
constexpr int64_t kGdnChunkLen = 64;
constexpr int64_t kGroupedTileRows = 64;
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

size_t weight_bytes(const model::TextConfig& c, size_t es) {
  using model::LayerType;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const int64_t nv = c.linear_num_value_heads, dv = c.linear_value_head_dim;
  const int64_t C = c.linear_conv_dim(), vd = c.linear_value_dim();
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads, hd = c.head_dim;
  const int64_t qw = c.attn_output_gate ? 2 * hd : hd;
  auto mat = [&](int64_t rows, int64_t cols) { return static_cast<size_t>(rows * cols) * es; };
  auto vec = [](int64_t n) { return static_cast<size_t>(n) * 4; };
  Sizer s;
  s.add(mat(V, H));                                      // embed_tokens
  if (!c.tie_word_embeddings) s.add(mat(V, H));          // lm_head
  s.add(vec(H));                                         // final norm
  s.add(vec(std::max<int64_t>(c.rotary_dim() / 2, 1)));  // inv_freq
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    s.add(vec(H));  // input norm
    s.add(vec(H));  // post-attention norm
    if (c.layer_types[static_cast<size_t>(i)] == LayerType::kLinearAttention) {
      s.add(mat(C + vd + 2 * nv, H));  // in_proj [qkv | z | b | a]
      s.add(vec(C * c.linear_conv_kernel_dim));
      s.add(vec(nv));  // dt_bias
      s.add(vec(nv));  // A_log
      s.add(vec(dv));  // gated norm
      s.add(mat(H, vd));
    } else {
      s.add(mat(nh * qw + 2 * nkv * hd, H));  // q/k/v_proj
      s.add(vec(hd));
      s.add(vec(hd));
      s.add(mat(H, nh * hd));
    }
    if (!c.layer_is_moe(i)) {
      s.add(mat(2 * c.intermediate_size, H));
      s.add(mat(H, c.intermediate_size));
    } else {
      const int64_t E = c.num_experts, Im = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
      s.add(mat(E + 1, H));  // [router | shared expert gate]
      s.add(mat(E * 2 * Im, H));
      s.add(mat(E * H, Im));
      s.add(mat(2 * Is, H));
      s.add(mat(H, Is));
    }
  }
  return s.size();
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
  const int64_t Kmax = std::max({H, I, Im, Is, vd, nh * hd});
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
                                      D,  // ids, pos, slot, out ids
                                      moe_tiles};
  Sizer s;
  for (int64_t w : words) s.add(static_cast<size_t>(w) * 4);
  // fp8 KV: a prefill's keys and values as bf16 (attention_dequant_elems: k and v of max_ctx positions).
  s.add(std::max<size_t>(
      fp8 && n_full ? static_cast<size_t>(2 * max_ctx * c.num_key_value_heads * c.head_dim) * 2 : 0, 16));
  const size_t x16_elems = opt.exact ? 0 : static_cast<size_t>(std::max(R, RK) * Kmax);
  s.add(std::max<size_t>(x16_elems * 2, 16));  // 16-bit copies of matmul inputs for cuBLASLt
  // Quantized matmuls' buffers (a bf16 copy of one weight, fp16 activations), as a 16-bit checkpoint leaves
  // them; the per-row factors of the fp16 activations.
  s.add(16);
  s.add(16);
  s.add(32 * 4);
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
  const int64_t kv_unit = n_full * c.num_key_value_heads * (paged ? kCudaPageSize : max_ctx) * c.head_dim;
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
  p.state_bytes_per_sequence = static_cast<size_t>(conv_slot + gdn_slot) * 4;
  p.weights = weight_bytes(c, core::dtype_size(opt.matrix_dtype));
  p.workspace = workspace_bytes(c, opt, max_ctx);
  p.gemm_workspace = kGemmWorkspace;
  return p;
}

}  // namespace deltaflow::backend
