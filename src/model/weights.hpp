// Typed views of a checkpoint's tensors, bound by one table (weight_table.cpp) that maps HF names to fields
// with shape checks. Views point into the mmap'd safetensors; tensors that must be repacked (Qwen3-Next's
// grouped in_proj_qkvz / in_proj_ba) live in `owned`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/status.hpp"
#include "io/safetensors.hpp"
#include "model/config.hpp"
#include "model/quant/format.hpp"

namespace deltaflow::model {

// A row-major matrix [rows, cols] (the logical, dequantized shape). A vector is a matrix with one row.
// Float weights (format kFloat): `dtype` is the element type, bf16, f16 or f32. Quantized weights: `dtype` is
// the stored element type (U8 for packed E2M1 pairs, F8_E4M3 for FP8), `scale` the block / row / tensor
// scales and `global_scale` the second-level scale (quant/format.hpp); the value of element (n, k) is defined
// by quant::dequantize_row (quant/dequant.hpp). `input_scale` is a static activation scale (a multiplier)
// when the checkpoint stores one, else 0.
struct Mat {
  Mat() = default;
  // A float matrix (the common case; quantized matrices are filled field by field by the binder).
  Mat(const void* d, core::DType t, int64_t r, int64_t c) : data(d), dtype(t), rows(r), cols(c) {}

  const void* data = nullptr;
  core::DType dtype = core::DType::kF32;
  int64_t rows = 0, cols = 0;
  quant::WeightFormat format = quant::WeightFormat::kFloat;
  quant::ScaleView scale;
  float global_scale = 1.0f;
  quant::GlobalOp global_op = quant::GlobalOp::kMultiply;
  float input_scale = 0.0f;
  const std::string* name = nullptr;  // the checkpoint tensor it came from (nullptr if repacked)

  bool quantized() const { return format != quant::WeightFormat::kFloat; }
  // Stored bytes of one row (E2M1: two elements a byte).
  size_t row_bytes() const {
    return format == quant::WeightFormat::kNvfp4 ? static_cast<size_t>(cols) / 2
                                                 : static_cast<size_t>(cols) * core::dtype_size(dtype);
  }
  const void* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + static_cast<size_t>(r) * row_bytes();
  }
  int64_t numel() const { return rows * cols; }
  // Bytes read to use the whole matrix once: elements plus scales.
  size_t stored_bytes() const {
    return static_cast<size_t>(rows) * row_bytes() +
           (scale.empty() ? 0 : static_cast<size_t>(scale.rows * scale.cols) * core::dtype_size(scale.dtype));
  }
};

struct GatedDeltaNetWeights {
  Mat in_proj_qkv;  // [conv_dim, hidden]: rows [q (nk*dk) | k (nk*dk) | v (nv*dv)], head-major
  Mat in_proj_z;    // [nv*dv, hidden]
  Mat in_proj_b;    // [nv, hidden]
  Mat in_proj_a;    // [nv, hidden]
  Mat conv1d;       // [conv_dim, kernel] (checkpoint shape [conv_dim, 1, kernel]); depthwise, no bias
  Mat dt_bias;      // [1, nv]
  Mat A_log;        // [1, nv]
  Mat norm;         // [1, dv]: the gated RMSNorm's plain weight, shared by all heads
  Mat out_proj;     // [hidden, nv*dv]
};

struct FullAttentionWeights {
  Mat q_proj;  // [nh*head_dim*2, hidden]: per head [q (head_dim) | gate (head_dim)]
  Mat k_proj;  // [nkv*head_dim, hidden]
  Mat v_proj;  // [nkv*head_dim, hidden]
  Mat o_proj;  // [hidden, nh*head_dim]
  Mat q_norm;  // [1, head_dim], (1+w) RMSNorm
  Mat k_norm;  // [1, head_dim], (1+w) RMSNorm
};

struct MlpWeights {
  Mat gate_proj;  // [inter, hidden]
  Mat up_proj;    // [inter, hidden]
  Mat down_proj;  // [hidden, inter]
};

struct MoeWeights {
  Mat router;                       // [num_experts, hidden] (mlp.gate.weight)
  std::vector<MlpWeights> experts;  // [num_experts], each [moe_inter, hidden] / [hidden, moe_inter]
  MlpWeights shared_expert;         // [shared_inter, hidden] / [hidden, shared_inter]
  Mat shared_expert_gate;           // [1, hidden]
};

struct LayerWeights {
  LayerType type = LayerType::kLinearAttention;
  Mat input_layernorm;           // [1, hidden], (1+w)
  Mat post_attention_layernorm;  // [1, hidden], (1+w)
  GatedDeltaNetWeights linear;   // when type == kLinearAttention
  FullAttentionWeights attn;     // when type == kFullAttention
  bool is_moe = false;
  MlpWeights mlp;  // dense FFN
  MoeWeights moe;  // sparse FFN
};

// The checkpoint's multi-token-prediction head (mtp.*, qwen35-architecture.md §4): one full-attention
// decoder layer that drafts the token after next from the main model's final hidden state and the next
// token's embedding. It shares embed_tokens and lm_head with the main model.
struct MtpWeights {
  bool present = false;       // every tensor of the head is in the checkpoint (else none is bound)
  Mat pre_fc_norm_embedding;  // [1, hidden], (1+w)
  Mat pre_fc_norm_hidden;     // [1, hidden], (1+w)
  Mat fc;                     // [hidden, 2 * hidden]: input [normed embedding | normed hidden]
  LayerWeights layer;         // type kFullAttention; MoE FFN in MoE models
  Mat norm;                   // [1, hidden], (1+w)
  uint64_t bytes = 0;         // the head's own tensors (not counted in ModelWeights::bytes)
  int64_t parameter_count = 0;
};

struct ModelWeights {
  Mat embed_tokens;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Mat norm;     // [1, hidden], (1+w)
  Mat lm_head;  // [vocab, hidden]; = embed_tokens when tied
  std::string
      prefix;      // the text-model prefix found in the checkpoint ("model.language_model.", "model.", ...)
  MtpWeights mtp;  // bound when the checkpoint has a whole MTP head
  std::vector<std::string> mtp_tensors;       // mtp.* tensors recognised but not bound (a partial head)
  std::vector<std::string> visual_tensors;    // recognised, kept for the vision encoder
  std::vector<std::string> kv_scale_tensors;  // FP8 KV-cache scales, recognised (the cache is not FP8 yet)
  // lm_head.* beside a config that ties lm_head to the embedding, not used: ModelOpt exports a quantized
  // copy of a tied matrix this way; the embedding serves as lm_head, as transformers and vLLM tie it.
  std::vector<std::string> tied_lm_head_tensors;
  std::vector<std::unique_ptr<std::vector<uint8_t>>> owned;  // repacked tensors
  uint64_t bytes = 0;                                        // bytes of the tensors bound for the text model
  int64_t parameter_count = 0;  // elements bound for the text model (tied lm_head counted once)
};

// Binds every tensor the config needs. A missing, extra or mis-shaped tensor, or an unsupported dtype, is an
// error naming the tensor, its file and what was expected.
core::Expected<ModelWeights> bind_weights(const TextConfig& config, const io::Checkpoint& checkpoint);

}  // namespace deltaflow::model
