// Gated DeltaNet on the CPU: the causal conv with carried state, and the gated delta rule in its two forms:
// the recurrent step (decode) and the chunked WY/UT form (prefill). qwen35-architecture.md §2.3; mirrors
// transformers' torch_recurrent_gated_delta_rule / torch_chunk_gated_delta_rule (modeling_qwen3_next.py).
#pragma once

#include <cstdint>

namespace deltaflow::backend::cpu {

inline constexpr int64_t kGdnChunk = 64;

// Depthwise causal conv + SiLU over T tokens. in, out: [T, C]. w: [C, K]. state: [C, K-1], the K-1 inputs
// before this block (oldest first); updated to the last K-1 inputs. out may not alias in.
void causal_conv1d_silu(const float* in, int64_t T, int64_t C, const float* w, int64_t K, float* state,
                        float* out);

// Shapes for the delta rule: q, k: [T, nv, dk] (already L2-normalised, q scaled by dk^-0.5, key heads
// repeated to nv); v: [T, nv, dv]; g (log decay, <= 0) and beta: [T, nv]; S: [nv, dk, dv] fp32, updated; o:
// [T, nv, dv].
struct DeltaRuleArgs {
  const float* q;
  const float* k;
  const float* v;
  const float* g;
  const float* beta;
  int64_t T, nv, dk, dv;
  float* S;
  float* o;
};

// Token by token: S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q.
void gated_delta_rule_recurrent(const DeltaRuleArgs& a);
// The same for one head h over tokens [t0, t1) of `a` (S: that head's [dk, dv] slice at a.S + h dk dv);
// what gated_delta_rule_recurrent runs for each head. kv: scratch of dv floats.
void gated_delta_rule_recurrent_head(const DeltaRuleArgs& a, int64_t h, int64_t t0, int64_t t1, float* kv);
// One conv channel over tokens [t0, t1) of in [T, C]: state [K-1] (oldest first) carried and updated.
void causal_conv1d_silu_channel(const float* in, int64_t t0, int64_t t1, int64_t C, int64_t ch,
                                const float* w, int64_t K, float* state, float* out);
// The same function in chunks of kGdnChunk tokens (WY form): the prefill algorithm.
void gated_delta_rule_chunked(const DeltaRuleArgs& a);

}  // namespace deltaflow::backend::cpu
