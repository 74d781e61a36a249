// The MoE decode kernels (backend/cuda/moe_decode.cuh) one by one on Qwen3.5-35B-A3B shapes (E 256, K 8,
// H 2048, Im = Is = 512, bf16), at T = 1, 8, 32 tokens: each kernel captured over L layers of distinct
// weights (more than L2 holds) as one CUDA graph, median of the replays; bytes are the weights the launch
// must read (the experts the tokens chose, each once) over that time.
//   moe_decode_bench [layers=8]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <set>
#include <vector>

#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/moe.cuh"
#include "backend/cuda/moe_decode.cuh"

namespace cu = deltaflow::backend::cuda;
using deltaflow::core::DType;

namespace {

#define CHECK(x)                                                                               \
  do {                                                                                         \
    const cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

void* dev_random(size_t elems, DType dt, uint64_t seed, float scale) {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, elems * (dt == DType::kF32 ? 4 : 2)));
  CHECK(cu::fill_random(p, dt, static_cast<int64_t>(elems), seed, scale, 0.0f, nullptr));
  return p;
}

// Median milliseconds of one replay of `body` captured `reps` times into one graph, per repetition.
double time_graph(cudaStream_t s, const std::function<void()>& body) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  body();
  CHECK(cudaStreamEndCapture(s, &g));
  CHECK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<double> t;
  for (int i = 0; i < 23; ++i) {
    CHECK(cudaEventRecord(a, s));
    CHECK(cudaGraphLaunch(ge, s));
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 3) t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int L = argc > 1 ? std::atoi(argv[1]) : 8;
  const int64_t E = 256, H = 2048, I = 512;
  const int K = 8;
  const DType dt = DType::kBF16;
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  struct Layer {
    void *rg, *gu, *dn, *sgu, *sdn;
  };
  std::vector<Layer> layers;
  for (int l = 0; l < L; ++l) {
    const uint64_t sd = 100 * static_cast<uint64_t>(l);
    layers.push_back({dev_random(static_cast<size_t>((E + 1) * H), dt, sd + 1, 0.05f),
                      dev_random(static_cast<size_t>(E * 2 * I * H), dt, sd + 2, 0.02f),
                      dev_random(static_cast<size_t>(E * H * I), dt, sd + 3, 0.04f),
                      dev_random(static_cast<size_t>(2 * I * H), dt, sd + 4, 0.02f),
                      dev_random(static_cast<size_t>(H * I), dt, sd + 5, 0.04f)});
  }
  const int Tmax = 32;
  float* x = static_cast<float*>(dev_random(static_cast<size_t>(Tmax * H), DType::kF32, 7, 1.0f));
  float *logits, *gate, *w, *act, *act_s, *y;
  int* ids;
  CHECK(cudaMalloc(&logits, Tmax * E * 4));
  CHECK(cudaMalloc(&gate, Tmax * 4));
  CHECK(cudaMalloc(&w, Tmax * K * 4));
  CHECK(cudaMalloc(&ids, Tmax * K * 4));
  CHECK(cudaMalloc(&act, Tmax * K * I * 4));
  CHECK(cudaMalloc(&act_s, Tmax * I * 4));
  CHECK(cudaMalloc(&y, Tmax * H * 4));
  CHECK(cudaDeviceSynchronize());

  std::printf("moe decode kernels, %d layers of distinct bf16 weights, median graph replay per layer\n", L);
  std::printf("  T  kernel           us/layer   MB/layer   TB/s\n");
  for (int T : {1, 8, 32}) {
    // Route once to get realistic ids (the same for every layer), and count the distinct experts.
    CHECK(cu::moe_router_logits(layers[0].rg, dt, E + 1, E, H, x, H, T, logits, E, gate, 1, s));
    CHECK(cu::moe_route(logits, E, T, E, K, true, ids, w, s));
    std::vector<int> h(static_cast<size_t>(T * K));
    CHECK(cudaMemcpyAsync(h.data(), ids, h.size() * 4, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    const double uniq = static_cast<double>(std::set<int>(h.begin(), h.end()).size());
    auto logits_k = [&](const Layer& ly) {
      CHECK(cu::moe_router_logits(ly.rg, dt, E + 1, E, H, x, H, T, logits, E, gate, 1, s));
    };
    auto route_k = [&](const Layer&) { CHECK(cu::moe_route(logits, E, T, E, K, true, ids, w, s)); };
    auto gu_k = [&](const Layer& ly) {
      CHECK(cu::moe_gate_up_swiglu({ly.gu, dt, I, 2 * I * H}, ids, K, {ly.sgu, dt, I, 0}, H, x, H, T, act, I,
                                   act_s, I, s));
    };
    auto dn_k = [&](const Layer& ly) {
      CHECK(cu::moe_down_combine({ly.dn, dt, I, H * I}, ids, w, K, {ly.sdn, dt, I, 0}, gate, H, act, I, act_s,
                                 I, T, y, H, s));
    };
    struct K_ {
      const char* name;
      std::function<void(const Layer&)> f;
      double mb;
    };
    const double mbe = 2.0 * I * H * 2 / 1e6;  // one expert's gate/up
    const K_ ks[] = {{"router logits", logits_k, (E + 1) * H * 2 / 1e6},
                     {"route", route_k, 0},
                     {"gate_up+swiglu", gu_k, (uniq + 1) * mbe},
                     {"down+combine", dn_k, (uniq + 1) * mbe / 2},
                     {"all four",
                      [&](const Layer& ly) {
                        logits_k(ly);
                        route_k(ly);
                        gu_k(ly);
                        dn_k(ly);
                      },
                      (E + 1) * H * 2 / 1e6 + 1.5 * (uniq + 1) * mbe}};
    for (const auto& k : ks) {
      const double ms = time_graph(s,
                                   [&] {
                                     for (const auto& ly : layers) k.f(ly);
                                   }) /
                        L;
      std::printf("  %2d  %-15s  %8.2f  %9.2f  %5.2f\n", T, k.name, ms * 1e3, k.mb,
                  k.mb > 0 ? k.mb / ms / 1e3 : 0.0);
    }
    std::printf("      (%g distinct experts of %d slots)\n", uniq, T * K);
  }
  return 0;
}
