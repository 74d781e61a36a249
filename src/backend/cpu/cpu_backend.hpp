// The CPU backend: the readable reference forward pass (DESIGN.md §3). Every later kernel is checked against
// it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "io/safetensors.hpp"
#include "model/weights.hpp"

namespace deltaflow::backend::cpu {

// State of one sequence. Layers of each type are indexed densely ("n-th layer of its type").
struct CpuSequenceState : SequenceState {
  int64_t pos = 0;
  std::vector<std::vector<float>> key_cache;    // per full-attention layer: [pos, nkv * head_dim]
  std::vector<std::vector<float>> value_cache;  // per full-attention layer: [pos, nkv * head_dim]
  std::vector<std::vector<float>> conv_state;  // per linear layer: [conv_dim, kernel - 1], oldest input first
  std::vector<std::vector<float>> gdn_state;   // per linear layer: [nv, dk, dv] fp32
  int64_t length() const override { return pos; }
};

// Optional capture of intermediate values for tests against the reference.
struct ForwardTrace {
  // [embedding output, output of layer 0, ..., output of layer L-1], each [T, hidden] (before the final
  // norm).
  std::vector<std::vector<float>> hidden;
};

// fp32 copies of the small per-layer vectors (norm weights, conv taps, A_log, dt_bias).
struct LayerConsts {
  std::vector<float> input_norm, post_norm;
  std::vector<float> q_norm, k_norm;                    // full attention
  std::vector<float> conv_w, dt_bias, A_log, gdn_norm;  // linear attention
  std::vector<float> shared_gate;                       // MoE shared-expert gate [hidden]
};

class CpuBackend final : public Backend {
 public:
  // Opens DIR (config.json + safetensors) and binds the weights.
  static core::Expected<std::unique_ptr<CpuBackend>> load(const std::string& dir);

  const model::TextConfig& config() const override { return config_; }
  const char* name() const override { return "cpu"; }
  const model::ModelWeights& weights() const { return weights_; }

  std::unique_ptr<SequenceState> new_sequence() override;
  core::Status prefill(std::span<const PrefillItem> items, std::vector<float>& logits) override;
  core::Status decode(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                      std::vector<float>& logits) override;

  // One sequence, T tokens. `recurrent` selects the token-by-token delta rule (decode) instead of the chunked
  // form (prefill); the result must be the same. Logits of every token if all_logits, else of the last.
  core::Status forward(CpuSequenceState& s, std::span<const int32_t> tokens, bool recurrent, bool all_logits,
                       std::vector<float>& logits, ForwardTrace* trace = nullptr);

 private:
  CpuBackend() = default;
  void gated_deltanet(size_t layer, int64_t linear_idx, const float* x, int64_t T, CpuSequenceState& s,
                      bool recurrent, float* out);
  void full_attention(size_t layer, int64_t attn_idx, const float* x, int64_t T, CpuSequenceState& s,
                      float* out);
  void ffn(size_t layer, const float* x, int64_t T, float* out);

  model::TextConfig config_;
  io::Checkpoint checkpoint_;
  model::ModelWeights weights_;
  std::vector<LayerConsts> consts_;
  std::vector<float> final_norm_;
  std::vector<float> inv_freq_;      // RoPE, rotary_dim / 2 entries
  std::vector<int64_t> type_index_;  // layer -> index among layers of its type
};

}  // namespace deltaflow::backend::cpu
