// CudaBackend's tensor-parallel hooks (issue 7; the split is in model/tensor_parallel.hpp). With no
// collective each hook is the single-GPU step it replaces.
#include "backend/cuda/collective.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_check.hpp"
#include "backend/cuda/embedding.cuh"
#include "backend/cuda/tp_kernels.cuh"
#include "model/tensor_parallel.hpp"

namespace deltaflow::backend::cuda {
namespace {

constexpr int64_t kTpLogitRows = 256;  // the most lm_head rows one call takes (kLogitRows of the backend)

}  // namespace

core::Status CudaBackend::enter_shard(const model::ModelWeights* whole, model::ModelWeights* part) {
  tp_vocab0_ = 0;
  tp_vocab_rows_ = config_.vocab_size;
  if (!opt_.collective) return core::Status();
  const model::ShardSpec spec{opt_.collective->rank(), opt_.collective->world()};
  DF_ASSIGN(model::ShardLayout layout, model::shard_layout(config_, spec));
  if (whole) {
    DF_ASSIGN(*part, model::shard_weights(config_, *whole, layout));
  }
  const int64_t V = config_.vocab_size;
  config_ = model::shard_config(config_, layout);
  config_.vocab_size = V;
  tp_vocab0_ = layout.vocab.first;
  tp_vocab_rows_ = layout.vocab.count;
  DF_CUDA_TRY(cudaMalloc(&tp_logits_, static_cast<size_t>(kTpLogitRows * V) * 4));
  return core::Status();
}

model::TextConfig CudaBackend::layout_config() const {
  model::TextConfig c = config_;
  c.vocab_size = tp_vocab_rows_;
  return c;
}

core::Status CudaBackend::embed(int64_t n) {
  const int64_t H = config_.hidden_size;
  if (!opt_.collective) {
    DF_CUDA_TRY(embedding_gather(embed_.data, embed_.dtype, H, ws_.ids, n, ws_.h, stream_));
    return core::Status();
  }
  DF_CUDA_TRY(embedding_gather_shard(embed_.data, embed_.dtype, embed_.rows, H, tp_vocab0_, ws_.ids, n, ws_.h,
                                     stream_));
  return reduce_partial(ws_.h, n);
}

core::Status CudaBackend::reduce_partial(float* y, int64_t n) {
  if (!opt_.collective) return core::Status();  // world 1 still calls it: the path TP=N takes
  return opt_.collective->all_reduce_sum(y, static_cast<size_t>(n * config_.hidden_size), stream_);
}

core::Status CudaBackend::lm_head_shard(int64_t r0, int64_t rows) {
  if (rows > kTpLogitRows) return core::Error{"cuda backend: lm_head over more than 256 rows at once"};
  const int world = opt_.collective->world(), rank = opt_.collective->rank();
  const int64_t H = config_.hidden_size, Vl = lm_head_.rows;
  float* mine = tp_logits_ + rank * rows * Vl;
  DF_TRY(linear(ws_.xn + r0 * H, H, rows, lm_head_, mine, Vl));
  DF_TRY(opt_.collective->all_gather(mine, tp_logits_, static_cast<size_t>(rows * Vl), stream_));
  DF_CUDA_TRY(interleave_shards(tp_logits_, world, rows, Vl, ws_.logits, stream_));
  return core::Status();
}

}  // namespace deltaflow::backend::cuda
