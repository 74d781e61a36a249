#include "backend/cuda/sampling_batch.hpp"

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_check.hpp"

namespace deltaflow::backend::cuda {

namespace {

size_t align16(size_t n) {
  return (n + 15) / 16 * 16;
}

}  // namespace

void build_sample_rows(std::span<const SamplingSpec> specs, int64_t vocab, std::vector<SampleRowParams>& rows,
                       std::vector<PenaltyEntry>& entries) {
  std::vector<TokenCount> gen;
  for (const auto& s : specs) {
    SampleRowParams r;
    r.temperature = s.temperature;
    r.top_k = s.top_k;
    r.top_p = s.top_p;
    r.min_p = std::min(s.min_p, 1.0f);  // the most likely token always stays
    r.presence = s.presence_penalty;
    r.frequency = s.frequency_penalty;
    r.repetition = s.repetition_penalty;
    r.seed = s.seed;
    r.step = s.step;
    r.pen_begin = static_cast<int>(entries.size());
    if (s.has_penalties()) {
      gen.assign(s.generated.begin(), s.generated.end());
      std::sort(gen.begin(), gen.end(), [](const TokenCount& x, const TokenCount& y) { return x.id < y.id; });
      auto push = [&](int32_t id, int32_t count) {
        if (id < 0 || id >= vocab) return;
        if (static_cast<int>(entries.size()) > r.pen_begin && entries.back().id == id) {
          entries.back().count += count;  // a repeated id
        } else {
          entries.push_back({id, count});
        }
      };
      // Merge the sorted generated ids with the sorted prompt ids (which count for repetition only).
      const auto pr = s.repetition_penalty != 1.0f ? s.prompt_seen : std::span<const int32_t>();
      size_t i = 0, j = 0;
      while (i < gen.size() || j < pr.size()) {
        if (j == pr.size() || (i < gen.size() && gen[i].id < pr[j])) {
          push(gen[i].id, gen[i].count);
          ++i;
        } else if (i == gen.size() || pr[j] < gen[i].id) {
          push(pr[j++], 0);
        } else {
          push(gen[i].id, gen[i].count);
          ++i;
          ++j;
        }
      }
    }
    r.pen_end = static_cast<int>(entries.size());
    rows.push_back(r);
  }
}

SamplingBatch::~SamplingBatch() {
  if (pinned_) cudaFreeHost(pinned_);
  if (device_) cudaFree(device_);
}

core::Status SamplingBatch::reserve(size_t bytes) {
  if (bytes <= capacity_) return core::Status();
  const size_t cap = std::max<size_t>(bytes * 2, 64u << 10);
  if (pinned_) cudaFreeHost(pinned_);
  if (device_) cudaFree(device_);
  pinned_ = device_ = nullptr;
  capacity_ = 0;
  DF_CUDA_TRY(cudaHostAlloc(&pinned_, cap, cudaHostAllocDefault));
  DF_CUDA_TRY(cudaMalloc(&device_, cap));
  capacity_ = cap;
  return core::Status();
}

core::Status SamplingBatch::run(float* logits, int64_t V, std::span<const SamplingSpec> specs,
                                cudaStream_t stream, std::vector<int32_t>& ids) {
  if (specs.empty()) return core::Status();
  rows_.clear();
  entries_.clear();
  build_sample_rows(specs, V, rows_, entries_);
  const size_t rows_bytes = align16(rows_.size() * sizeof(SampleRowParams));
  const size_t pen_bytes = align16(std::max<size_t>(entries_.size(), 1) * sizeof(PenaltyEntry));
  const size_t out_bytes = align16(rows_.size() * sizeof(int));
  const size_t in_bytes = rows_bytes + pen_bytes;
  DF_TRY(reserve(in_bytes + out_bytes));
  auto* host = static_cast<uint8_t*>(pinned_);
  auto* dev = static_cast<uint8_t*>(device_);
  std::memcpy(host, rows_.data(), rows_.size() * sizeof(SampleRowParams));
  if (!entries_.empty())
    std::memcpy(host + rows_bytes, entries_.data(), entries_.size() * sizeof(PenaltyEntry));
  DF_CUDA_TRY(cudaMemcpyAsync(dev, host, in_bytes, cudaMemcpyHostToDevice, stream));
  int* d_out = reinterpret_cast<int*>(dev + in_bytes);
  DF_CUDA_TRY(sample_rows(logits, static_cast<int64_t>(rows_.size()), V,
                          reinterpret_cast<const SampleRowParams*>(dev),
                          reinterpret_cast<const PenaltyEntry*>(dev + rows_bytes), d_out, stream));
  DF_CUDA_TRY(
      cudaMemcpyAsync(host + in_bytes, d_out, rows_.size() * sizeof(int), cudaMemcpyDeviceToHost, stream));
  DF_CUDA_TRY(cudaStreamSynchronize(stream));
  const int* h_out = reinterpret_cast<const int*>(host + in_bytes);
  for (size_t r = 0; r < rows_.size(); ++r) ids.push_back(h_out[r]);
  return core::Status();
}

}  // namespace deltaflow::backend::cuda
