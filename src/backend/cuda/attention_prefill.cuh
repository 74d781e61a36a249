// Causal GQA prefill attention over a bf16 KV cache on the tensor cores (flash-attention-2 style): one block
// takes 128 query rows of one head, streams the head's K/V tiles from the cache through shared memory
// (cp.async, two stages) and keeps the output in registers; mma.sync m16n8k16 with bf16 operands (q rounded
// to bf16 once per tile, p rounded to bf16 before p.v) and fp32 accumulation; fp32 online softmax; the
// sigmoid output gate on the way out. Writes AttnArgs.out directly (the partial buffers are not used).
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/attention.cuh"

namespace deltaflow::backend::cuda {

// Whether attention_prefill_tc handles these arguments: prefill over a bf16 cache, hd in {64, 128, 256}, and
// the device gives a block the shared memory the head size needs (hd 256: 192 KiB, so sm_90 / sm_100).
bool attention_prefill_tc_supports(const AttnArgs& args);

// args.prefill tokens are one sequence at increasing positions (token t sees cache positions 0..tok_pos[t]),
// all in slot tok_slot[0]. Returns cudaErrorInvalidValue where attention_prefill_tc_supports is false.
cudaError_t attention_prefill_tc(const AttnArgs& args, cudaStream_t stream);

}  // namespace deltaflow::backend::cuda
