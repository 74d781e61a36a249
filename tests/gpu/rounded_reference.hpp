// The CPU reference forward pass (a copy of backend/cpu/cpu_backend.cpp's, on the same CPU ops) with the CUDA
// backend's default-mode rounding made explicit, so that mode can be checked tightly on the tiny models,
// which amplify bf16 rounding far beyond its 2^-9 (transformers with bf16-rounded matmul inputs moves their
// logits by 2e-2 to 2e-1; see cuda_model_test.cpp).
//   - a matmul over more than `gemm_rows` rows (cuBLASLt), or over more than `mma_rows` with K % 32 == 0 (the
//     tensor-core GEMV), takes its input rounded to the weight's 16-bit type;
//     the MoE router and shared-expert gate never do; routed experts count their own rows;
//   - a dense or shared-expert MLP over more than `gemm_rows` rows, all on cuBLASLt in one 16-bit type, has
//     its gate and up outputs rounded to that type too (they come out of cuBLASLt in it);
//   - above gemm_rows tokens the routed experts run as one grouped GEMM (moe_grouped.cuh) in their 16-bit
//     type: inputs, gate/up outputs and down's input rounded for every expert, however few its rows;
//   - the KV cache holds bf16 (k after norm and RoPE, v as projected), and with it a prefill of more than one
//     token at hd 64/128/256 takes the tensor-core attention's numerics (bf16 q and softmax weights, 64-key
//     tiles of online softmax: backend/cuda/attention_prefill.cu).
// With both off it is the CPU backend's function, which the test checks first.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "io/safetensors.hpp"
#include "model/config.hpp"
#include "model/weights.hpp"

namespace deltaflow::gpu_test {

class RoundedReference {
 public:
  struct Options {
    bool round_gemm_inputs = true;
    int64_t gemm_rows = 32;  // matmuls over more rows than this round their input (cuBLASLt)
    bool bf16_kv = true;
    int64_t mma_rows = 4;  // ... and over more than this when K % 32 == 0 (the tensor-core GEMV)
  };
  struct Sequence {
    int64_t pos = 0;
    std::vector<std::vector<float>> k, v;       // per full-attention layer [pos, nkv*hd]
    std::vector<std::vector<float>> conv, gdn;  // per linear layer
  };

  static core::Expected<std::unique_ptr<RoundedReference>> load(const std::string& dir, Options opt);
  Sequence new_sequence() const;
  // Appends tokens; logits of every token (all_logits) or of the last.
  std::vector<float> forward(Sequence& s, std::span<const int32_t> tokens, bool all_logits);

 private:
  void linear(const float* x, int64_t T, const model::Mat& W, float* y, bool never_round = false,
              bool always_round = false) const;
  void gated_deltanet(size_t l, int64_t li, const float* x, int64_t T, Sequence& s, float* out);
  void full_attention(size_t l, int64_t ai, const float* x, int64_t T, Sequence& s, float* out);
  void tensor_core_prefill_attention(std::vector<float> q, const std::vector<float>& kc,
                                     const std::vector<float>& vc, int64_t T, int64_t p0,
                                     std::vector<float>& o) const;
  void ffn(size_t l, const float* x, int64_t T, float* out);
  void swiglu(const model::MlpWeights& m, const float* x, int64_t T, float* out, bool never_round = false,
              bool round_gate_up = false, bool grouped = false) const;

  Options opt_;
  model::TextConfig c_;
  io::Checkpoint ck_;
  model::ModelWeights w_;
  struct Consts {
    std::vector<float> in_norm, post_norm, q_norm, k_norm, conv_w, dt_bias, A_log, gdn_norm, shared_gate;
  };
  std::vector<Consts> k_;
  std::vector<float> final_norm_, inv_freq_;
  std::vector<int64_t> type_index_;
};

}  // namespace deltaflow::gpu_test
