// Split-key GQA decode attention over a bf16 KV cache on the tensor cores (flash-decoding style). One block
// takes one decode token, one kv head and one split of its keys (attention_split_keys): the token's q heads
// that share the kv head are the rows of one m16 tile, so the cache is read once for the whole group. Each
// warp streams its own 16-key K/V tiles from the cache (cp.async, two stages) and keeps an online softmax in
// registers; the warps' results merge in shared memory into the split's partial (unnormalised acc, m, l),
// which attention()'s combine step normalises and gates as for the fp32 kernel. mma.sync m16n8k16 with bf16
// operands (q rounded to bf16 once, p rounded before p.v) and fp32 accumulation, as the prefill kernel.
// An fp8 cache (E4M3 codes + a scale per position and kv head) streams half the bytes: each warp widens its
// tile's codes to bf16 in shared memory (exact) and applies the scales to the scores and the weights.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/attention.cuh"

namespace deltaflow::backend::cuda {

// Whether attention_decode_tc handles these arguments: decode over a bf16 or fp8 cache, hd in {64, 128, 256},
// at most 16 q heads per kv head, 16-byte aligned q and cache, and the shared memory the head size needs.
bool attention_decode_tc_supports(const AttnArgs& args);

// Writes args.part_acc / part_ml for every split that holds keys of each token (tokens: one per sequence,
// token t sees cache positions 0..tok_pos[t] of slot tok_slot[t]). The caller combines the splits.
// Returns cudaErrorInvalidValue where attention_decode_tc_supports is false.
cudaError_t attention_decode_tc(const AttnArgs& args, cudaStream_t stream);

}  // namespace deltaflow::backend::cuda
