// The NCCL collectives: one communicator per GPU of this process (ncclCommInitAll), used by that GPU's rank
// thread only.
#include <nccl.h>

#include <cstdlib>
#include <string>

#include "backend/cuda/collective.hpp"

namespace deltaflow::backend::cuda {
namespace {

core::Status nccl_status(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return core::Status();
  return core::Error{std::string("NCCL ") + what + ": " + ncclGetErrorString(r)};
}

class NcclCollective final : public Collective {
 public:
  NcclCollective(ncclComm_t comm, int rank, int world) : comm_(comm), rank_(rank), world_(world) {}
  ~NcclCollective() override {
    if (comm_) ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int world() const override { return world_; }
  bool capturable() const override { return true; }
  core::Status all_reduce_sum(float* buf, size_t n, cudaStream_t stream) override {
    return nccl_status(ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, comm_, stream), "all-reduce");
  }
  core::Status all_gather(const float* send, float* recv, size_t n, cudaStream_t stream) override {
    return nccl_status(ncclAllGather(send, recv, n, ncclFloat32, comm_, stream), "all-gather");
  }

 private:
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, world_ = 1;
};

}  // namespace

core::Expected<std::vector<std::unique_ptr<Collective>>> make_nccl_collectives(
    const std::vector<int>& devices) {
  // NVLink multicast (NVLS) stays off: it needs multicast objects this project does not create, and some
  // hosts refuse them. The user's own setting wins.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  const int n = static_cast<int>(devices.size());
  if (n < 1) return core::Error{"NCCL: no devices"};
  std::vector<ncclComm_t> comms(static_cast<size_t>(n), nullptr);
  DF_TRY(nccl_status(ncclCommInitAll(comms.data(), n, devices.data()), "ncclCommInitAll"));
  std::vector<std::unique_ptr<Collective>> out;
  for (int r = 0; r < n; ++r)
    out.push_back(std::make_unique<NcclCollective>(comms[static_cast<size_t>(r)], r, n));
  return out;
}

}  // namespace deltaflow::backend::cuda
