// Tensor parallelism over the GPUs of one host (issue 7): one process, one thread per GPU (RankThreads),
// one CudaBackend per GPU holding that rank's slices of the weights (model/tensor_parallel.hpp), NCCL
// all-reduces after the row-parallel matmuls, captured in each rank's decode graphs.
//
// Why one process with a thread per GPU rather than a process per GPU: the engine, the scheduler and the
// server stay single-process and see one Backend; the prompt and sampled ids pass between ranks as plain
// memory; ncclCommInitAll needs no rendezvous (no unique-id exchange, no launcher); and a failing rank is an
// error value in the same process, not a hung peer. The cost is one host thread per GPU feeding launches,
// which CUDA graphs make cheap for decode.
//
// Every rank computes every step; all ranks end with the same logits (the all-gather), and rank 0's are
// returned.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cuda/collective.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/rank_threads.hpp"

namespace deltaflow::backend::cuda {

struct TpOptions {
  int world = 1;
  // Every rank on CudaOptions::device with the same-device collectives (tests only: TP=N on one GPU; no
  // CUDA graphs). Otherwise rank r runs on GPU r through NCCL.
  bool same_device = false;
};

class TpSequenceState final : public SequenceState {
 public:
  int64_t length() const override { return ranks.empty() ? 0 : ranks[0]->length(); }
  std::vector<std::unique_ptr<SequenceState>> ranks;  // one per rank, each owned by that rank's backend
  const void* owner = nullptr;
};

class TpBackend final : public SequenceBackend {
 public:
  static core::Expected<std::unique_ptr<TpBackend>> load(const std::string& dir, const CudaOptions& opt,
                                                         const TpOptions& tp);
  static core::Expected<std::unique_ptr<TpBackend>> synthetic(const model::TextConfig& config,
                                                              const CudaOptions& opt, const TpOptions& tp,
                                                              uint64_t seed);
  ~TpBackend() override;

  const model::TextConfig& config() const override { return config_; }
  const char* name() const override { return "cuda"; }
  int world() const { return static_cast<int>(ranks_.size()); }
  int max_sequences() const override { return ranks_[0]->max_sequences(); }
  int64_t max_context() const override { return ranks_[0]->max_context(); }

  std::unique_ptr<SequenceState> new_sequence() override;
  core::Status prefill(std::span<const PrefillItem> items, std::vector<float>& logits) override;
  core::Status decode(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                      std::vector<float>& logits) override;
  core::Status decode_greedy(std::span<SequenceState* const> seqs, std::span<const int32_t> tokens,
                             std::vector<int32_t>& ids);
  core::Status set_length(SequenceState& s, int64_t length);

  // Rank 0's plan (each rank holds about 1/world of the weights; KV and states split the same way).
  const MemoryPlan& memory_plan() const { return ranks_[0]->memory_plan(); }
  double load_seconds() const { return load_seconds_; }

 private:
  TpBackend() = default;
  static core::Expected<std::unique_ptr<TpBackend>> create(
      const model::TextConfig& config, const CudaOptions& opt, const TpOptions& tp,
      const std::function<core::Expected<std::unique_ptr<CudaBackend>>(const CudaOptions&)>& make_rank);
  core::Expected<std::vector<std::vector<SequenceState*>>> rank_states(std::span<SequenceState* const> seqs);

  model::TextConfig config_;
  double load_seconds_ = 0;
  std::vector<std::unique_ptr<Collective>> collectives_;
  std::vector<std::unique_ptr<CudaBackend>> ranks_;
  std::unique_ptr<RankThreads> threads_;
  std::vector<std::vector<float>> scratch_;  // logits of ranks 1.. (the same as rank 0's)
  std::vector<std::vector<int32_t>> scratch_ids_;
};

}  // namespace deltaflow::backend::cuda
