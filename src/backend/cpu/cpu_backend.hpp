// The CPU backend: the readable reference forward pass (docs/architecture.md §3). Every later kernel is
// checked against it.
//
// It serves the engine's step seam (backend.hpp) from pools it allocates once: KV pages [page][page_size][nkv
// * head_dim] per full-attention layer and state slots (conv + fp32 Gated DeltaNet state per linear layer).
// Every row of a step goes through the projections and the FFN together (the weights are read once per
// step); the conv, the delta rule and attention run per sequence. By default the delta rule runs token by
// token for every row (Options::chunked_prefill off), so a sequence's numbers do not depend on how its
// tokens were grouped into steps: alone or in a batch, in one prefill or in chunks, from a prefix checkpoint
// or cold, the logits are bit-identical.
//
// It also keeps the per-sequence API (sequence_backend.hpp) with memory of its own per sequence, which the
// tests use to hold it to transformers' goldens and to run it beside the CUDA backend.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "backend/sequence_backend.hpp"
#include "io/safetensors.hpp"
#include "model/quant/writer.hpp"
#include "model/vision_config.hpp"
#include "model/vision_weights.hpp"
#include "model/weights.hpp"

namespace deltaflow::backend::cpu {

// State of one sequence on the per-sequence API. Layers of each type are indexed densely ("n-th layer of its
// type").
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

// Where one sequence's state and KV live during a forward pass.
struct SeqMemory {
  std::vector<float*> conv;  // per linear layer: [conv_dim, kernel - 1]
  std::vector<float*> gdn;   // per linear layer: [nv, dk, dv]
  std::vector<float*> k, v;  // per full-attention layer: the base of its page store, rows of kv_row floats
  const int32_t* pages = nullptr;  // block table: position p is row (pages[p >> page_shift] << page_shift) +
  int page_shift = 0;              // (p & (2^page_shift - 1)) of the store
  int64_t kv_row = 0;
  int64_t row_of(int64_t p) const {
    return (static_cast<int64_t>(pages[p >> page_shift]) << page_shift) |
           (p & ((int64_t{1} << page_shift) - 1));
  }
};

// One sequence's rows in a forward pass.
struct RunMemory {
  int64_t first_row = 0, n_rows = 0, start_pos = 0;
  SeqMemory mem;
  std::vector<std::pair<int64_t, SeqMemory>> snapshots;  // (rows, where the state after them is copied)
  // Images (SeqRun): (t, h, w) per row, or null for positions start_pos + i; rows given as embeddings.
  const int64_t* mrope = nullptr;
  std::span<const int32_t> embed_rows;
  std::span<const float> embeds;
};

struct CpuOptions {
  // The chunked (WY) delta rule for runs of more than one token instead of the token-by-token rule. Equal to
  // fp32 rounding, not bitwise: a sequence's numbers then depend on how its prompt was split into steps.
  bool chunked_prefill = false;
  int32_t page_size = 16;
  // The KV cache's rounding (backend.hpp). The CPU keeps fp32 storage and stores the values as they read
  // back (for kFp8: code * scale), the same numbers as storing the codes and scales.
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
  // Off (the reference of record): weight-only, activations fp32 whatever the checkpoint asks. On: a
  // matrix in FP8 with a static `input_scale` (W8A8, nvfp4-mixed's attention projections) sees its input
  // fake-quantized first, e4m3(clamp(x / input_scale, +-448)) * input_scale (quant::fake_quant_fp8_static),
  // as ModelOpt's fake-quant model runs it (`deltaflow eval --emulate-activation-quant`). NVFP4 input scales
  // (W4A4) are not emulated.
  bool emulate_activation_quant = false;
};

class CpuBackend final : public Backend, public SequenceBackend {
 public:
  // Opens DIR (config.json + safetensors) and binds the weights.
  static core::Expected<std::unique_ptr<CpuBackend>> load(const std::string& dir, const CpuOptions& opt = {});

  const model::TextConfig& config() const override { return config_; }
  const char* name() const override { return "cpu"; }
  const model::ModelWeights& weights() const { return weights_; }

  // The step seam.
  int32_t page_size() const override { return opt_.page_size; }
  size_t page_bytes() const override;
  size_t slot_bytes() const override;
  core::Status allocate(const PoolRequest& request) override;
  const Pools& pools() const override { return pools_; }
  core::Status step(const Step& step, StepOut& out) override;
  core::Expected<int32_t> draw(std::span<const float> row, const SamplingSpec& spec) override;
  core::Status copy_state(int32_t from_slot, int32_t to_slot) override;
  core::Status copy_pages(std::span<const PageCopy> copies) override;
  bool can_draft() const override { return weights_.mtp.present; }
  size_t draft_page_bytes() const override;
  core::Status draft(std::span<const DraftRun> runs, DraftOut& out) override;
  // A state slot's floats (tests compare states bitwise).
  std::span<const float> slot_floats(int32_t slot) const;
  // Images, with the checkpoint's vision tower (backend/cpu/vision_encoder.hpp).
  const model::VisionConfig* vision() const override { return vision_ok_ ? &vision_config_ : nullptr; }
  std::string vision_error() const override { return vision_error_; }
  core::Expected<std::vector<float>> encode_images(std::span<const float> pixel_values,
                                                   std::span<const model::VisionGrid> grids) override;
  // Calibration (`deltaflow quantize --format nvfp4-mixed`): while set, the largest |input| of every
  // attention projection is recorded, by module name (the weight's checkpoint name without ".weight").
  void record_input_amax(std::map<std::string, float>* out) { input_amax_ = out; }
  // While set, the Gram matrix X^T X of every linear module's input (attention, MLP and experts) is summed,
  // by module name (`deltaflow quantize --method mse|gptq --calibration FILE`).
  void record_input_stats(model::quant::InputStats* out) {
    input_stats_ = out;
    stats_last_x_ = nullptr;
  }

  // The per-sequence API (tests).
  std::unique_ptr<SequenceState> new_sequence() override;
  int max_sequences() const override { return 1 << 20; }
  int64_t max_context() const override { return config_.max_position_embeddings; }
  core::Status prefill(std::span<const PrefillItem> items, std::vector<float>& logits) override;
  core::Status decode(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                      std::vector<float>& logits) override;

  // One sequence, T tokens. `recurrent` selects the token-by-token delta rule (decode) instead of the chunked
  // form (prefill); the result must be the same. Logits of every token if all_logits, else of the last.
  core::Status forward(CpuSequenceState& s, std::span<const int32_t> tokens, bool recurrent, bool all_logits,
                       std::vector<float>& logits, ForwardTrace* trace = nullptr);

 private:
  CpuBackend() = default;
  // The layers over every row of `tokens`; runs say which rows belong to which sequence. `head_rows` (sorted)
  // are the rows whose logits are appended to `logits`. `chunked`: the WY delta rule for runs of > 1 row.
  // `normed`: every row's final-normed hidden state (what the MTP head reads).
  core::Status forward_rows(std::span<const int32_t> tokens, std::span<const RunMemory> runs,
                            std::span<const int64_t> head_rows, bool chunked, std::vector<float>& logits,
                            ForwardTrace* trace, std::vector<float>* normed = nullptr);
  void gated_deltanet(size_t layer, int64_t linear_idx, const float* x, std::span<const RunMemory> runs,
                      int64_t T, bool chunked, float* out);
  // A full-attention layer's attention (its KV in page store `attn_idx`) and any layer's FFN, over T rows.
  void full_attention(const model::LayerWeights& L, const LayerConsts& k, int64_t attn_idx, const float* x,
                      std::span<const RunMemory> runs, int64_t T, float* out);
  void ffn(const model::LayerWeights& L, const LayerConsts& k, const float* x, int64_t T, float* out);
  SeqMemory slot_memory(int32_t slot, std::span<const int32_t> pages);
  // The MTP head over T rows: next-token ids, the main model's final hidden states (or the head's own output
  // when chaining drafts), positions from the runs; writes the head's normed output (T x hidden).
  void mtp_rows(std::span<const int32_t> next_ids, const float* hidden, std::span<const RunMemory> runs,
                float* out);
  core::Status check_step(const Step& step) const;

  model::TextConfig config_;
  CpuOptions opt_;
  io::Checkpoint checkpoint_;
  model::ModelWeights weights_;
  std::vector<LayerConsts> consts_;
  std::vector<float> final_norm_;
  LayerConsts mtp_consts_;  // the MTP decoder layer's norms, and its norms before fc and after the layer
  std::vector<float> mtp_norm_embedding_, mtp_norm_hidden_, mtp_norm_;
  std::vector<float> inv_freq_;      // RoPE, rotary_dim / 2 entries
  std::vector<uint8_t> mrope_axis_;  // M-RoPE: the position (0 t, 1 h, 2 w) each frequency takes
  bool vision_ok_ = false;
  std::string vision_error_;
  model::VisionConfig vision_config_;
  model::VisionWeights vision_weights_;
  float rope_scaling_ = 1.0f;        // yarn's attention factor on cos and sin
  std::vector<int64_t> type_index_;  // layer -> index among layers of its type
  int64_t n_linear_ = 0, n_full_ = 0;

  // Pools (allocate()).
  Pools pools_;
  // Allocated uninitialised (memory is touched as it is used); a state slot is zeroed when a run starts
  // at position 0, and only written KV positions are ever read.
  std::unique_ptr<float[]> states_;                // [slot][linear layer][conv | gdn]
  std::vector<std::unique_ptr<float[]>> k_pages_;  // per full-attention layer: [page][page_size][kv_row]
  std::vector<std::unique_ptr<float[]>> v_pages_;
  std::vector<float> work_;  // sampling scratch
  std::map<std::string, float>* input_amax_ = nullptr;
  model::quant::InputStats* input_stats_ = nullptr;
  const float* stats_last_x_ = nullptr;  // the input the last Gram matrix was summed over
  int64_t stats_last_n_ = 0;
  std::string stats_last_module_;
  // The input x (n floats) of linear W: its amax (attention projections only: `with_amax`) and Gram matrix.
  // `module`: the name to note it under when the weight has none of its own (a fused expert's slice).
  void note_input(const model::Mat& W, const float* x, int64_t n, bool with_amax = true,
                  const std::string* module = nullptr);
  // cpu::linear, with the static FP8 activation quantization of CpuOptions::emulate_activation_quant.
  void qlinear(const float* x, int64_t T, const model::Mat& W, float* y) const;
  // down(silu(gate(x)) * up(x)) for T rows. `module`: the MLP's name prefix ("...mlp.experts.3."), for
  // note_input, when its matrices have no names.
  void swiglu(const model::MlpWeights& m, const float* x, int64_t T, float* out,
              const std::string* module = nullptr);
  // Drafting (allocated with PoolRequest::draft): the MTP layer's KV is page store n_full_, and the last
  // step's tokens and final (normed) hidden states stay for draft().
  bool draft_ = false;
  std::vector<int32_t> last_tokens_;
  std::vector<float> last_hidden_;
};

}  // namespace deltaflow::backend::cpu
