// Token sampling on the GPU, one block per logits row (vocab up to 2^31): the presence / frequency /
// repetition penalties from a short per-row list, then greedy, or temperature with top-k, min-p and top-p,
// drawn with a Philox counter-based generator keyed by (seed, step). The same meanings as engine::Sampler
// (the host reference); the random draw differs, its distribution does not.
//
// The kept set of top-k / min-p / top-p is a prefix of the row sorted by logit (ties to the lower id). It is
// found without sorting: a radix select over a 64-bit key (order-preserving logit bits, then the inverted
// id) by count (top-k) and by softmax weight (top-p), 4 bits a pass, on the full row until the candidates
// fit a shared-memory list. The draw then walks the kept tokens in a fixed order: the same inputs give the
// same id on every run.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace deltaflow::backend::cuda {

// One row's parameters. Penalty entries [pen_begin, pen_end) of the entry list belong to the row.
struct SampleRowParams {
  float temperature = 0.0f;  // <= 0: greedy
  int top_k = 0;             // <= 0 or >= V: off
  float top_p = 1.0f;        // >= 1: off
  float min_p = 0.0f;        // <= 0: off
  float presence = 0.0f, frequency = 0.0f, repetition = 1.0f;
  int pen_begin = 0, pen_end = 0;
  uint64_t seed = 0, step = 0;
};

// A distinct token id of one row that a penalty touches: repetition always (identity when it is 1), then
// logit -= frequency * count + presence when count > 0 (count 0: seen in the prompt only).
struct PenaltyEntry {
  int id = 0;
  int count = 0;
};

// out[r] = the id drawn for row r of logits [rows, V]. The rows are penalised in place.
cudaError_t sample_rows(float* logits, int64_t rows, int64_t V, const SampleRowParams* params,
                        const PenaltyEntry* penalties, int* out, cudaStream_t stream);

// The uniform in [0, 1) the draw of (seed, step) uses (Philox4x32-10, first word, 24 bits); for tests.
double sampling_uniform(uint64_t seed, uint64_t step);

}  // namespace deltaflow::backend::cuda
