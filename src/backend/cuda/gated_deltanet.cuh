// The Gated DeltaNet mixer core after the conv (qwen35-architecture.md §2.3), one fused kernel per layer:
// gating, L2 norm of q and k, the delta-rule state update, the output, and the gated RMSNorm x SiLU(z). The
// fp32 state lives in registers for the whole launch: read once, written once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.hpp"

namespace deltaflow::backend::cuda {

struct GdnArgs {
  // The conv output, [tokens, ld_conv]: q in columns [0, nk*dk), k in [nk*dk, 2*nk*dk), v in [2*nk*dk,
  // +nv*dv).
  const float* conv = nullptr;
  int64_t ld_conv = 0;
  // Columns of the in_proj output, [tokens, ld_proj]: z [nv*dv] at z, b [nv] at b, a [nv] at a.
  const float* z = nullptr;
  const float* b = nullptr;
  const float* a = nullptr;
  int64_t ld_proj = 0;
  const float* A_log = nullptr;    // [nv]
  const float* dt_bias = nullptr;  // [nv]
  const float* norm_w = nullptr;   // [dv], the gated norm's plain weight
  int nk = 0, nv = 0, dk = 0, dv = 0;
  float eps = 1e-6f;  // the gated norm's (rms_norm_eps); the L2 norm's is FLA's 1e-6
  // Sequence i owns tokens [i * tokens_per_seq, (i + 1) * tokens_per_seq): one sequence of T tokens (prefill)
  // or n sequences of one token (decode). With seq_start (on the device, n_seqs + 1 ascending entries,
  // gated_deltanet only): tokens [seq_start[i], seq_start[i + 1]), and slots is per token (the sequence's
  // at its first token).
  int n_seqs = 0, tokens_per_seq = 0;
  const int* seq_start = nullptr;
  float* states = nullptr;  // S of sequence i: states + slots[i] * slot_stride, [nv, dk, dv] fp32
  int64_t slot_stride = 0;
  const int* slots = nullptr;
  // Per token (indexed as the inputs): when >= 0, the state after it is also written to
  // states + snap_slots[t] * slot_stride (speculative rollback points). gated_deltanet only.
  const int* snap_slots = nullptr;
  float* out = nullptr;  // [tokens, ld_out]: nv*dv gated-normed outputs
  int64_t ld_out = 0;
  // gated_deltanet_chunked only: when set, the gated-normed outputs go here instead, packed [tokens, nv*dv]
  // in out16_type (BF16 or F16; the next matmul's input), and out is left holding them before the norm.
  void* out16 = nullptr;
  core::DType out16_type = core::DType::kBF16;
};

// dk in {16, 32, 64, 128}; dv <= 256 (dv <= 128 when dk = 128); nv a multiple of nk; out16 unset.
cudaError_t gated_deltanet(const GdnArgs& args, cudaStream_t stream);

}  // namespace deltaflow::backend::cuda
