// CUDA ops against the CPU reference. Label `gpu`: CI builds these and skips them; run them on the GPU
// machine.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backend/cuda/device.hpp"
#include "backend/cuda/embedding.cuh"
#include "core/dtype.hpp"

namespace deltaflow {
namespace {

TEST(CudaEmbedding, GatherEqualsCpuRows) {
  ASSERT_FALSE(backend::cuda::list_devices().empty()) << "no GPU visible";
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (int64_t hidden : {1, 63, 64, 1000, 5120}) {  // ragged sizes and a real one
    const int64_t vocab = 301, n = 37;
    std::vector<uint16_t> table(static_cast<size_t>(vocab * hidden));
    for (auto& x : table) x = core::f32_to_bf16(nd(rng));
    std::vector<int32_t> ids(n);
    for (auto& id : ids) id = static_cast<int32_t>(rng() % vocab);
    uint16_t* d_table;
    int32_t* d_ids;
    float* d_out;
    ASSERT_EQ(cudaMalloc(&d_table, table.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d_ids, ids.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d_out, static_cast<size_t>(n * hidden) * 4), cudaSuccess);
    ASSERT_EQ(cudaMemset(d_out, 0xff, static_cast<size_t>(n * hidden) * 4), cudaSuccess);  // poison: NaN
    cudaMemcpy(d_table, table.data(), table.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice);
    ASSERT_EQ(backend::cuda::embedding_gather_bf16(d_table, hidden, d_ids, n, d_out, nullptr), cudaSuccess);
    std::vector<float> out(static_cast<size_t>(n * hidden));
    ASSERT_EQ(cudaMemcpy(out.data(), d_out, out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < hidden; ++i)
        ASSERT_EQ(out[t * hidden + i], core::bf16_to_f32(table[ids[t] * hidden + i]))
            << t << "," << i;  // exact
    cudaFree(d_table);
    cudaFree(d_ids);
    cudaFree(d_out);
  }
}

}  // namespace
}  // namespace deltaflow
