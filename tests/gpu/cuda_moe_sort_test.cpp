// The MoE prefill's expert sort on the device (backend/cuda/moe_sort.cuh) against the host's counting sort
// and grouped_tiles(): real (T = 4096, K = 8, E = 256) and ragged shapes, experts with no rows and with many
// (skewed ids), out-of-range ids, and the grouped GEMM run over a device-built tile list in a grid sized for
// the most tiles (moe_grouped.cuh n_live). Exact comparisons: the sort is integer work. Label `gpu`.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/moe_grouped.cuh"
#include "backend/cuda/moe_sort.cuh"
#include "gpu_test_util.hpp"

namespace deltaflow {
namespace {

using gpu_test::DevBuf;
using gpu_test::HostMat;
using gpu_test::randn;
using gpu_test::round_to;
using gpu_test::to_bytes;
namespace cu = backend::cuda;

class CudaMoeSort : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(gpu_test::have_gpu()) << "no GPU visible"; }
};

struct Sorted {
  std::vector<int> slot, tok;
  std::vector<cu::GroupedTile> tiles;
  int n_tiles = -1;
};

Sorted sort_on_device(const std::vector<int>& ids, int K, int E) {
  const int64_t nk = static_cast<int64_t>(ids.size());
  const int room = static_cast<int>(nk / cu::kGroupedTileRows + E + 1);
  DevBuf<int> d_ids(ids.empty() ? std::vector<int>{0} : ids);
  DevBuf<int> scratch(std::vector<int>(static_cast<size_t>(cu::moe_sort_scratch_ints(E)), -1));
  DevBuf<int> slot(std::vector<int>(std::max<size_t>(ids.size(), 1), -1)),
      tok(std::vector<int>(std::max<size_t>(ids.size(), 1), -1)), n_tiles(std::vector<int>{-1});
  DevBuf<int> tiles(std::vector<int>(static_cast<size_t>(3 * room), -1));
  EXPECT_EQ(
      cu::moe_sort_by_expert(d_ids.get(), nk, K, E, scratch.get(), slot.get(), tok.get(),
                             reinterpret_cast<cu::GroupedTile*>(tiles.get()), room, n_tiles.get(), nullptr),
      cudaSuccess);
  Sorted out;
  out.slot = slot.download();
  out.tok = tok.download();
  out.slot.resize(ids.size());
  out.tok.resize(ids.size());
  out.n_tiles = n_tiles.download()[0];
  const auto t = tiles.download();
  for (int i = 0; i < std::max(out.n_tiles, 0); ++i)
    out.tiles.push_back(cu::GroupedTile{t[3 * i], t[3 * i + 1], t[3 * i + 2]});
  return out;
}

TEST_F(CudaMoeSort, SortsSlotsByExpertAndBuildsTheHostTileList) {
  std::mt19937 rng(41);
  struct Case {
    int T, K, E;
  };
  const Case cases[] = {{1, 1, 1},     {3, 8, 8},   {100, 8, 256}, {4096, 8, 256},
                        {33, 2, 1000}, {5, 3, 512}, {0, 8, 16}};
  for (const auto& c : cases) {
    for (bool skewed : {false, true}) {
      const int64_t nk = int64_t{c.T} * c.K;
      std::vector<int> ids(static_cast<size_t>(nk));
      // Skewed: half the slots on the first few experts (segments of many tiles), many experts empty.
      for (auto& e : ids) e = static_cast<int>(skewed && rng() % 2 ? rng() % std::min(c.E, 3) : rng() % c.E);
      const Sorted s = sort_on_device(ids, c.K, c.E);
      const std::string where = "T=" + std::to_string(c.T) + " K=" + std::to_string(c.K) +
                                " E=" + std::to_string(c.E) + (skewed ? " skewed" : "");
      std::vector<int64_t> counts(static_cast<size_t>(c.E), 0);
      for (int e : ids) ++counts[static_cast<size_t>(e)];
      std::vector<int> perm = s.slot;
      std::sort(perm.begin(), perm.end());
      std::vector<int> iota(ids.size());
      std::iota(iota.begin(), iota.end(), 0);
      EXPECT_EQ(perm, iota) << "sort_slot is not a permutation of the slots, " << where;
      bool ordered = true, tok_ok = true;
      for (size_t p = 0; p < s.slot.size(); ++p) {
        if (s.slot[p] < 0 || s.slot[p] >= nk) {
          ordered = false;
          break;
        }
        if (p > 0 && s.slot[p - 1] >= 0 && ids[s.slot[p - 1]] > ids[s.slot[p]]) ordered = false;
        tok_ok = tok_ok && s.tok[p] == s.slot[p] / c.K;
      }
      EXPECT_TRUE(ordered) << "segments not in expert order, " << where;
      EXPECT_TRUE(tok_ok) << "sort_tok != sort_slot / K, " << where;
      std::vector<cu::GroupedTile> want(static_cast<size_t>(nk / cu::kGroupedTileRows + c.E + 1));
      const int n = cu::grouped_tiles(counts.data(), c.E, want.data(), static_cast<int>(want.size()));
      ASSERT_GE(n, 0) << where;
      EXPECT_EQ(s.n_tiles, n) << where;
      bool same = static_cast<int>(s.tiles.size()) == n;
      for (int i = 0; same && i < n; ++i)
        same = s.tiles[i].expert == want[i].expert && s.tiles[i].row0 == want[i].row0 &&
               s.tiles[i].rows == want[i].rows;
      EXPECT_TRUE(same) << "tile list differs from grouped_tiles(), " << where;
    }
  }
}

TEST_F(CudaMoeSort, ClampsIdsOutsideTheExpertsAndRefusesBadArguments) {
  const std::vector<int> ids = {-5, 2, 7, 3, 100, 0};  // E = 4: -5 -> 0, 7 and 100 -> 3
  const Sorted s = sort_on_device(ids, 2, 4);
  std::vector<int> experts;
  for (int p : s.slot) experts.push_back(std::min(std::max(ids[static_cast<size_t>(p)], 0), 3));
  EXPECT_TRUE(std::is_sorted(experts.begin(), experts.end()));
  EXPECT_EQ(s.n_tiles, 3);  // experts 0, 2, 3 (expert 1 has no rows)
  DevBuf<int> buf(std::vector<int>(4096, 0));
  auto* tiles = reinterpret_cast<cu::GroupedTile*>(buf.get());
  EXPECT_EQ(cu::moe_sort_by_expert(buf.get(), 4, 1, 0, buf.get(), buf.get(), buf.get(), tiles, 8, buf.get(),
                                   nullptr),
            cudaErrorInvalidValue);  // no experts
  EXPECT_EQ(cu::moe_sort_by_expert(buf.get(), 4, 1, 1025, buf.get(), buf.get(), buf.get(), tiles, 8,
                                   buf.get(), nullptr),
            cudaErrorInvalidValue);  // past kMaxExperts
  EXPECT_EQ(cu::moe_sort_by_expert(buf.get(), 4, 0, 4, buf.get(), buf.get(), buf.get(), tiles, 8, buf.get(),
                                   nullptr),
            cudaErrorInvalidValue);  // K = 0
  EXPECT_EQ(
      cu::moe_sort_by_expert(buf.get(), 4, 1, 4, nullptr, buf.get(), buf.get(), tiles, 8, buf.get(), nullptr),
      cudaErrorInvalidValue);  // no scratch
}

// The backend's form: the grouped GEMM over the device-built list in a grid of `room` tiles, the entries past
// n_live holding garbage that must not be read; bit-equal to the launch over the host's list.
TEST_F(CudaMoeSort, GroupedGemmRunsOnlyTheLiveTiles) {
  std::mt19937 rng(43);
  const int E = 6, K = 2, T = 150, N = 128, Kd = 64;
  const int64_t nk = int64_t{T} * K;
  std::vector<int> ids(static_cast<size_t>(nk));
  for (auto& e : ids) e = static_cast<int>(rng() % E);
  const core::DType wt = core::DType::kBF16;
  HostMat W(randn(rng, static_cast<size_t>(E) * N * Kd, 0.2f), wt, int64_t{E} * N, Kd);
  DevBuf<uint8_t> dW(W.bytes);
  auto x = randn(rng, static_cast<size_t>(nk * Kd));
  for (auto& v : x) v = round_to(v, wt);
  DevBuf<uint8_t> dx(to_bytes(x, wt));
  const int room = static_cast<int>(nk / cu::kGroupedTileRows + E + 1);
  DevBuf<int> d_ids(ids), scratch(static_cast<size_t>(cu::moe_sort_scratch_ints(E))),
      slot(static_cast<size_t>(nk)), tok(static_cast<size_t>(nk)), n_live(1);
  DevBuf<int> tiles(std::vector<int>(static_cast<size_t>(3 * room), 1 << 28));  // garbage past the live ones
  auto* dt = reinterpret_cast<cu::GroupedTile*>(tiles.get());
  ASSERT_EQ(cu::moe_sort_by_expert(d_ids.get(), nk, K, E, scratch.get(), slot.get(), tok.get(), dt, room,
                                   n_live.get(), nullptr),
            cudaSuccess);
  DevBuf<float> y_live(std::vector<float>(static_cast<size_t>(nk * N), -7.0f));
  ASSERT_EQ(cu::moe_grouped_gemm(dW.get(), wt, int64_t{N} * Kd, N, Kd, dx.get(), dt, room, y_live.get(),
                                 core::DType::kF32, N, nullptr, nullptr, nullptr, n_live.get()),
            cudaSuccess);
  const int n = n_live.download()[0];
  ASSERT_GT(n, 0);
  ASSERT_LT(n, room);
  DevBuf<float> y_host(std::vector<float>(static_cast<size_t>(nk * N), -7.0f));
  ASSERT_EQ(cu::moe_grouped_gemm(dW.get(), wt, int64_t{N} * Kd, N, Kd, dx.get(), dt, n, y_host.get(),
                                 core::DType::kF32, N, nullptr),
            cudaSuccess);
  EXPECT_EQ(y_live.download(), y_host.download());
}

}  // namespace
}  // namespace deltaflow
