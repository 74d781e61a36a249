#include "backend/cuda/tp_backend.hpp"

#include <chrono>

#include "backend/cuda/cuda_check.hpp"
#include "model/tensor_parallel.hpp"

namespace deltaflow::backend::cuda {

core::Expected<std::unique_ptr<TpBackend>> TpBackend::create(
    const model::TextConfig& config, const CudaOptions& opt, const TpOptions& tp,
    const std::function<core::Expected<std::unique_ptr<CudaBackend>>(const CudaOptions&)>& make_rank) {
  const auto t0 = std::chrono::steady_clock::now();
  const int world = tp.world;
  if (world < 1) return core::Error{"tensor parallel size must be at least 1"};
  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess) {
    cudaGetLastError();
    visible = 0;
  }
  if (visible == 0) return core::Error{"tensor parallel: no CUDA device is visible"};
  if (!tp.same_device && world > visible)
    return core::Error{"tensor parallel size " + std::to_string(world) + " needs " + std::to_string(world) +
                       " GPUs; " + std::to_string(visible) + " visible"};
  // The split must exist before any GPU work: a size that does not divide is one error line.
  DF_TRY(model::shard_layout(config, {0, world}).status());

  std::unique_ptr<TpBackend> b(new TpBackend());
  b->config_ = config;
  std::vector<int> devices;
  for (int r = 0; r < world; ++r) devices.push_back(tp.same_device ? opt.device : r);
  if (tp.same_device) {
    b->collectives_ = make_same_device_collectives(world);
  } else {
    DF_ASSIGN(b->collectives_, make_nccl_collectives(devices));
  }
  b->threads_ = std::make_unique<RankThreads>(devices);
  b->ranks_.resize(static_cast<size_t>(world));
  b->scratch_.resize(static_cast<size_t>(world));
  b->scratch_ids_.resize(static_cast<size_t>(world));
  TpBackend* self = b.get();
  DF_TRY(b->threads_->run([&](int r) -> core::Status {
    CudaOptions o = opt;
    o.device = devices[static_cast<size_t>(r)];
    o.collective = self->collectives_[static_cast<size_t>(r)].get();
    o.progress = opt.progress && r == 0;
    if (!o.collective->capturable()) o.cuda_graphs = false;
    auto rank = make_rank(o);
    if (!rank) return core::Error{"tensor parallel rank " + std::to_string(r) + ": " + rank.message()};
    self->ranks_[static_cast<size_t>(r)] = std::move(*rank);
    return core::Status();
  }));
  b->load_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return b;
}

core::Expected<std::unique_ptr<TpBackend>> TpBackend::load(const std::string& dir, const CudaOptions& opt,
                                                           const TpOptions& tp) {
  DF_ASSIGN(model::TextConfig c, model::load_text_config(dir));
  return create(c, opt, tp, [&](const CudaOptions& o) { return CudaBackend::load(dir, o); });
}

core::Expected<std::unique_ptr<TpBackend>> TpBackend::synthetic(const model::TextConfig& config,
                                                                const CudaOptions& opt, const TpOptions& tp,
                                                                uint64_t seed) {
  return create(config, opt, tp,
                [&](const CudaOptions& o) { return CudaBackend::synthetic(config, o, seed); });
}

TpBackend::~TpBackend() {
  // Each rank's backend and communicator go on its own thread (its device current).
  if (threads_)
    (void)threads_->run([this](int r) {
      if (static_cast<size_t>(r) < ranks_.size()) ranks_[static_cast<size_t>(r)].reset();
      if (static_cast<size_t>(r) < collectives_.size()) collectives_[static_cast<size_t>(r)].reset();
      return core::Status();
    });
}

std::unique_ptr<SequenceState> TpBackend::new_sequence() {
  auto s = std::make_unique<TpSequenceState>();
  s->owner = this;
  s->ranks.resize(ranks_.size());
  (void)threads_->run([&](int r) {
    s->ranks[static_cast<size_t>(r)] = ranks_[static_cast<size_t>(r)]->new_sequence();
    return core::Status();
  });
  return s;
}

core::Expected<std::vector<std::vector<SequenceState*>>> TpBackend::rank_states(
    std::span<SequenceState* const> seqs) {
  std::vector<std::vector<SequenceState*>> out(ranks_.size());
  for (auto* s : seqs) {
    auto* ts = dynamic_cast<TpSequenceState*>(s);
    if (!ts || ts->owner != this || ts->ranks.size() != ranks_.size())
      return core::Error{"tensor parallel backend: sequence state from another backend"};
    for (size_t r = 0; r < ranks_.size(); ++r) out[r].push_back(ts->ranks[r].get());
  }
  return out;
}

core::Status TpBackend::prefill(std::span<const PrefillItem> items, std::vector<float>& logits) {
  std::vector<SequenceState*> states;
  for (const auto& it : items) states.push_back(it.state);
  DF_ASSIGN(auto per_rank, rank_states(states));
  std::vector<std::vector<PrefillItem>> rank_items(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r)
    for (size_t i = 0; i < items.size(); ++i)
      rank_items[r].push_back(PrefillItem{per_rank[r][i], items[i].tokens, items[i].all_logits});
  return threads_->run([&](int r) {
    const size_t k = static_cast<size_t>(r);
    return ranks_[k]->prefill(rank_items[k], r == 0 ? logits : scratch_[k]);
  });
}

core::Status TpBackend::decode(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                               std::vector<float>& logits) {
  DF_ASSIGN(auto per_rank, rank_states(seqs));
  return threads_->run([&](int r) {
    const size_t k = static_cast<size_t>(r);
    return ranks_[k]->decode(per_rank[k], tokens, r == 0 ? logits : scratch_[k]);
  });
}

core::Status TpBackend::decode_greedy(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                                      std::vector<int32_t>& ids) {
  DF_ASSIGN(auto per_rank, rank_states(seqs));
  return threads_->run([&](int r) {
    const size_t k = static_cast<size_t>(r);
    return ranks_[k]->decode_greedy(per_rank[k], tokens, r == 0 ? ids : scratch_ids_[k]);
  });
}

core::Status TpBackend::set_length(SequenceState& s, int64_t length) {
  SequenceState* p = &s;
  DF_ASSIGN(auto per_rank, rank_states(std::span<SequenceState* const>(&p, 1)));
  for (size_t r = 0; r < ranks_.size(); ++r) DF_TRY(ranks_[r]->set_length(*per_rank[r][0], length));
  return core::Status();
}

}  // namespace deltaflow::backend::cuda
