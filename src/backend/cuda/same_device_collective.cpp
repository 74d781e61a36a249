// The same-device collectives (tests only, see collective.hpp): ranks publish a device pointer and an event,
// meet at a host barrier, and each sums (or copies) every rank's buffer on its own stream in rank order, so
// all ranks get bitwise the same sums. A second barrier keeps a buffer alive until every rank has read it.
#include <barrier>
#include <memory>
#include <mutex>

#include "backend/cuda/collective.hpp"
#include "backend/cuda/cuda_check.hpp"
#include "backend/cuda/tp_kernels.cuh"

namespace deltaflow::backend::cuda {
namespace {

struct Shared {
  explicit Shared(int world)
      : world(world),
        meet(world),
        ptrs(static_cast<size_t>(world)),
        ready(static_cast<size_t>(world)),
        done(static_cast<size_t>(world)) {}
  int world;
  std::barrier<> meet;
  std::vector<const float*> ptrs;
  std::vector<cudaEvent_t> ready, done;
};

class SameDeviceCollective final : public Collective {
 public:
  SameDeviceCollective(std::shared_ptr<Shared> s, int rank) : s_(std::move(s)), rank_(rank) {}
  ~SameDeviceCollective() override {
    if (tmp_) cudaFree(tmp_);
    for (auto* ev : {&s_->ready[static_cast<size_t>(rank_)], &s_->done[static_cast<size_t>(rank_)]})
      if (*ev) cudaEventDestroy(*ev);
  }
  int rank() const override { return rank_; }
  int world() const override { return s_->world; }
  bool capturable() const override { return false; }

  core::Status all_reduce_sum(float* buf, size_t n, cudaStream_t stream) override {
    DF_TRY(ensure(n));
    DF_TRY(publish(buf, stream));
    DF_CUDA_TRY(cudaMemcpyAsync(tmp_, s_->ptrs[0], n * 4, cudaMemcpyDeviceToDevice, stream));
    for (int r = 1; r < s_->world; ++r)
      DF_CUDA_TRY(add_into(tmp_, s_->ptrs[static_cast<size_t>(r)], n, stream));
    DF_TRY(finish(stream));
    DF_CUDA_TRY(cudaMemcpyAsync(buf, tmp_, n * 4, cudaMemcpyDeviceToDevice, stream));
    return core::Status();
  }

  core::Status all_gather(const float* send, float* recv, size_t n, cudaStream_t stream) override {
    // In place (send inside recv) would let a rank overwrite what another still reads: stage the send.
    DF_TRY(ensure(n));
    DF_CUDA_TRY(cudaMemcpyAsync(tmp_, send, n * 4, cudaMemcpyDeviceToDevice, stream));
    DF_TRY(publish(tmp_, stream));
    for (int r = 0; r < s_->world; ++r)
      DF_CUDA_TRY(cudaMemcpyAsync(recv + static_cast<size_t>(r) * n, s_->ptrs[static_cast<size_t>(r)], n * 4,
                                  cudaMemcpyDeviceToDevice, stream));
    return finish(stream);
  }

 private:
  core::Status ensure(size_t n) {
    auto& ready = s_->ready[static_cast<size_t>(rank_)];
    auto& done = s_->done[static_cast<size_t>(rank_)];
    if (!ready) DF_CUDA_TRY(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    if (!done) DF_CUDA_TRY(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    if (n <= cap_) return core::Status();
    if (tmp_) {
      DF_CUDA_TRY(cudaDeviceSynchronize());
      cudaFree(tmp_);
      tmp_ = nullptr;
    }
    DF_CUDA_TRY(cudaMalloc(&tmp_, n * 4));
    cap_ = n;
    return core::Status();
  }
  // Makes `p` and an event after the rank's work so far visible, waits for every rank, then orders this
  // stream after every rank's event.
  core::Status publish(const float* p, cudaStream_t stream) {
    s_->ptrs[static_cast<size_t>(rank_)] = p;
    DF_CUDA_TRY(cudaEventRecord(s_->ready[static_cast<size_t>(rank_)], stream));
    s_->meet.arrive_and_wait();
    for (int r = 0; r < s_->world; ++r)
      DF_CUDA_TRY(cudaStreamWaitEvent(stream, s_->ready[static_cast<size_t>(r)], 0));
    return core::Status();
  }
  // Waits until every rank has enqueued its reads of the published buffers, and orders this stream after
  // them.
  core::Status finish(cudaStream_t stream) {
    DF_CUDA_TRY(cudaEventRecord(s_->done[static_cast<size_t>(rank_)], stream));
    s_->meet.arrive_and_wait();
    for (int r = 0; r < s_->world; ++r)
      DF_CUDA_TRY(cudaStreamWaitEvent(stream, s_->done[static_cast<size_t>(r)], 0));
    // Nobody may publish again (re-record `ready`) before every rank has enqueued its waits above.
    s_->meet.arrive_and_wait();
    return core::Status();
  }

  std::shared_ptr<Shared> s_;
  int rank_ = 0;
  float* tmp_ = nullptr;
  size_t cap_ = 0;
};

}  // namespace

std::vector<std::unique_ptr<Collective>> make_same_device_collectives(int world) {
  auto s = std::make_shared<Shared>(world);
  std::vector<std::unique_ptr<Collective>> out;
  for (int r = 0; r < world; ++r) out.push_back(std::make_unique<SameDeviceCollective>(s, r));
  return out;
}

}  // namespace deltaflow::backend::cuda
