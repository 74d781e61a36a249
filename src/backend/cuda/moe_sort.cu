#include "backend/cuda/moe_sort.cuh"

#include <algorithm>

#include "backend/cuda/moe.cuh"

namespace deltaflow::backend::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kPlanThreads = 1024;
constexpr int kMaxCountBlocks = 528;  // the histogram's grid strides past this: each block flushes E bins
static_assert(kMaxExperts <= kPlanThreads, "the plan block gives each expert a thread");

__device__ __forceinline__ int clamped(int e, int E) {
  return min(max(e, 0), E - 1);
}

__global__ void __launch_bounds__(kThreads)
    kernel_moe_count(const int* __restrict__ ids, int64_t nk, int E, int* __restrict__ counts) {
  extern __shared__ int bins[];
  for (int e = threadIdx.x; e < E; e += kThreads) bins[e] = 0;
  __syncthreads();
  for (int64_t s = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; s < nk;
       s += static_cast<int64_t>(gridDim.x) * kThreads)
    atomicAdd(&bins[clamped(ids[s], E)], 1);
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += kThreads)
    if (bins[e]) atomicAdd(&counts[e], bins[e]);
}

// Thread e: expert e. Two block-wide exclusive scans (rows, tiles) in shared memory (Hillis-Steele over
// kPlanThreads), then expert e writes its tiles and its segment start into fill[e].
__global__ void __launch_bounds__(kPlanThreads)
    kernel_moe_plan(const int* __restrict__ counts, int E, int* __restrict__ fill,
                    GroupedTile* __restrict__ tiles, int max_tiles, int* __restrict__ n_tiles) {
  __shared__ int rows[kPlanThreads], nt[kPlanThreads];
  const int e = threadIdx.x;
  const int c = e < E ? counts[e] : 0, t = (c + kGroupedTileRows - 1) / kGroupedTileRows;
  rows[e] = c;
  nt[e] = t;
  __syncthreads();
  for (int o = 1; o < kPlanThreads; o <<= 1) {
    const int r = e >= o ? rows[e - o] : 0, n = e >= o ? nt[e - o] : 0;
    __syncthreads();
    rows[e] += r;
    nt[e] += n;
    __syncthreads();
  }
  const int row0 = rows[e] - c, tile0 = nt[e] - t;  // inclusive -> exclusive
  if (e < E) {
    fill[e] = row0;
    for (int i = 0; i < t && tile0 + i < max_tiles; ++i)
      tiles[tile0 + i] =
          GroupedTile{e, row0 + i * kGroupedTileRows, min(kGroupedTileRows, c - i * kGroupedTileRows)};
  }
  if (e == kPlanThreads - 1) *n_tiles = min(nt[e], max_tiles);
}

__global__ void __launch_bounds__(kThreads)
    kernel_moe_place(const int* __restrict__ ids, int64_t nk, int K, int E, int* __restrict__ fill,
                     int* __restrict__ sort_slot, int* __restrict__ sort_tok) {
  const int64_t s = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (s >= nk) return;
  const int p = atomicAdd(&fill[clamped(ids[s], E)], 1);
  sort_slot[p] = static_cast<int>(s);
  sort_tok[p] = static_cast<int>(s / K);
}

}  // namespace

cudaError_t moe_sort_by_expert(const int* ids, int64_t nk, int K, int E, int* scratch, int* sort_slot,
                               int* sort_tok, GroupedTile* tiles, int max_tiles, int* n_tiles,
                               cudaStream_t stream) {
  if (nk < 0 || nk > 0x7fffffff || K < 1 || E < 1 || E > kMaxExperts || max_tiles < 0 || !scratch || !n_tiles)
    return cudaErrorInvalidValue;
  int* counts = scratch;
  int* fill = scratch + E;
  if (const cudaError_t e = cudaMemsetAsync(counts, 0, static_cast<size_t>(E) * 4, stream); e != cudaSuccess)
    return e;
  if (nk > 0) {
    const unsigned blocks =
        static_cast<unsigned>(std::min<int64_t>((nk + kThreads - 1) / kThreads, kMaxCountBlocks));
    kernel_moe_count<<<blocks, kThreads, static_cast<size_t>(E) * 4, stream>>>(ids, nk, E, counts);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  kernel_moe_plan<<<1, kPlanThreads, 0, stream>>>(counts, E, fill, tiles, max_tiles, n_tiles);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (nk == 0) return cudaSuccess;
  kernel_moe_place<<<static_cast<unsigned>((nk + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      ids, nk, K, E, fill, sort_slot, sort_tok);
  return cudaGetLastError();
}

}  // namespace deltaflow::backend::cuda
