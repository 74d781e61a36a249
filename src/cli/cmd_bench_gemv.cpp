// `deltaflow bench --gemv FORMATS [--shapes NxK,...] [--rows LIST] [--experts E] [--iters N] [--json]`: the
// decode matmul
// alone, as a weight stream against the copy bandwidth measured in the same run. Each point multiplies T
// activation rows by an N x K matrix (y = x @ W.T) in one of the weight formats the model loads: bf16 (the
// dense GEMV), nvfp4 (W4A16, E4M3 group-16 scales and a per-row second level) or fp8-block (E4M3 with
// 128 x 128 block scales), both in the CUDA backend's device layout (backend/quant_pack.hpp) with random
// codes. The bytes counted are those one call must move: codes and every scale, the fp16 activations and the
// fp32 outputs. Enough copies of the matrix are cycled that they do not fit the L2 cache, so each call
// streams from HBM as a model's decode step does. With --experts E (quantized formats): E stacked experts of
// each shape (the MoE layers' grouped form) and `rows` routed slots of one token, each a different expert,
// in one grouped GEMV (gemv_quant_grouped); successive calls route to the next experts, and the bytes
// counted are the chosen experts'.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"

#ifdef DELTAFLOW_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.hpp"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/gemv.cuh"
#include "backend/cuda/gemv_quant.cuh"
#include "backend/quant_pack.hpp"
#include "cli/bench_cuda.hpp"
#endif

namespace deltaflow::cli {

#ifdef DELTAFLOW_HAVE_CUDA
namespace {

namespace cu = backend::cuda;

struct Shape {
  int64_t n = 0, k = 0;
};

core::Expected<std::vector<Shape>> parse_shapes(const std::string& s) {
  std::vector<Shape> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t x = item.find('x');
    char* end = nullptr;
    Shape sh;
    bool ok = x != std::string::npos;
    if (ok) {
      sh.n = std::strtoll(item.substr(0, x).c_str(), &end, 10);
      ok = end && *end == '\0';
    }
    if (ok) {
      sh.k = std::strtoll(item.substr(x + 1).c_str(), &end, 10);
      ok = end && *end == '\0';
    }
    if (!ok || sh.n < 16 || sh.k < 64 || sh.n % 16 != 0 || sh.k % 64 != 0 || sh.n > (1 << 20) ||
        sh.k > (1 << 20))
      return core::Error{"flag --shapes: '" + item +
                         "' is not NxK with N a multiple of 16 and K a multiple of 64 (e.g. 17408x5120)"};
    out.push_back(sh);
  }
  if (out.empty()) return core::Error{"flag --shapes: no shape given"};
  return out;
}

// One matrix of a format on the device, with everything it points to in `blob`.
struct DeviceMatrix {
  cu::QuantWeight q;  // nvfp4 / fp8-block
  void* bf16 = nullptr;
  size_t bytes = 0;  // what one call reads of it
  void* blob = nullptr;
};

size_t align256(size_t v) {
  return (v + 255) / 256 * 256;
}

core::Expected<DeviceMatrix> make_matrix(const std::string& format, Shape s, uint64_t seed) {
  DeviceMatrix m;
  std::vector<size_t> parts;
  if (format == "bf16") {
    parts = {static_cast<size_t>(s.n * s.k * 2)};
  } else if (format == "nvfp4") {
    parts = {static_cast<size_t>(backend::nvfp4_padded_rows(s.n) * s.k / 2),
             static_cast<size_t>(backend::nvfp4_scales_bytes(s.n, s.k)), static_cast<size_t>(s.n * 4)};
  } else {
    const int64_t grid = (s.n + 127) / 128 * ((s.k + 127) / 128);
    parts = {static_cast<size_t>(s.n * s.k), static_cast<size_t>(grid * 4)};
  }
  size_t total = 0;
  for (size_t p : parts) total += align256(p);
  for (size_t p : parts) m.bytes += p;
  if (cudaMalloc(&m.blob, total) != cudaSuccess) {
    cudaGetLastError();
    return core::Error{"bench --gemv: no GPU memory for a " + std::to_string(s.n) + "x" +
                       std::to_string(s.k) + " " + format + " matrix"};
  }
  auto* base = static_cast<uint8_t*>(m.blob);
  std::vector<uint8_t*> at;
  for (size_t p : parts) {
    at.push_back(base);
    base += align256(p);
  }
  if (format == "bf16") {
    m.bf16 = at[0];
    DF_CUDA_TRY(cu::fill_random(m.bf16, core::DType::kBF16, s.n * s.k, seed, 0.05f, 0.0f, nullptr));
    return m;
  }
  m.q.N = s.n;
  m.q.K = s.k;
  m.q.codes = at[0];
  if (format == "nvfp4") {
    m.q.nvfp4 = true;
    m.q.scales = at[1];
    m.q.row_scales = reinterpret_cast<const float*>(at[2]);
  } else {
    m.q.nvfp4 = false;
    m.q.grid = reinterpret_cast<const float*>(at[1]);
    m.q.block_rows = m.q.block_cols = 128;
    m.q.grid_cols = (s.k + 127) / 128;
  }
  DF_CUDA_TRY(cu::fill_quant_random(m.q, seed, 0.05f, nullptr));
  return m;
}

struct Point {
  std::string format;
  Shape shape;
  int rows = 0;
  double seconds = 0, bytes = 0, bw = 0, ratio = 0;
};

// The median over 5 rounds of `iters` back-to-back calls call(i), after `warmup` untimed ones; seconds per
// call.
template <class Call>
core::Expected<double> median_seconds(const Call& call, int warmup, int iters) {
  cudaEvent_t e0, e1;
  DF_CUDA_TRY(cudaEventCreate(&e0));
  DF_CUDA_TRY(cudaEventCreate(&e1));
  std::vector<double> rounds;
  cudaError_t err = cudaSuccess;
  for (int i = 0; i < warmup && err == cudaSuccess; ++i) err = call(i);
  for (int r = 0; r < 5 && err == cudaSuccess; ++r) {
    cudaEventRecord(e0);
    for (int i = 0; i < iters && err == cudaSuccess; ++i) err = call(i);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    rounds.push_back(ms * 1e-3 / iters);
  }
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  DF_CUDA_TRY(err);
  std::sort(rounds.begin(), rounds.end());
  return rounds[rounds.size() / 2];
}

// One matrix, cycling the copies.
core::Expected<double> time_calls(const std::vector<DeviceMatrix>& mats, const std::string& format, Shape s,
                                  int T, const float* x32, const void* x16, const float* factor, float* y,
                                  int iters) {
  auto call = [&](int i) -> cudaError_t {
    const DeviceMatrix& m = mats[static_cast<size_t>(i) % mats.size()];
    if (format == "bf16")
      return cu::gemv(m.bf16, core::DType::kBF16, s.n, s.k, x32, s.k, x16, T, cu::GemvOut{y, s.n, false, {}},
                      nullptr);
    return cu::gemv_quant(m.q, x16, factor, T, y, s.n, false, nullptr);
  };
  return median_seconds(call, 2 * static_cast<int>(mats.size()), iters);
}

// The grouped form: one stack of E experts of shape s (one matrix of E * N rows in the same layout, at the
// strides), `slots` slots of one token each to a different expert, calls cycling through the experts.
core::Expected<Point> time_grouped(const std::string& format, Shape s, int64_t E, int slots, const void* x16,
                                   const float* factor, float* y, int iters) {
  if (format == "fp8-block" && s.n % 128 != 0)
    return core::Error{"bench --gemv --experts: fp8-block experts need N a multiple of 128"};
  auto stack = make_matrix(format, Shape{E * s.n, s.k}, 1);
  if (!stack) return core::Error{stack.message()};
  cu::QuantWeight q = stack->q;
  q.N = s.n;
  if (q.nvfp4) {
    q.codes_stride = s.n * s.k / 2;
    q.scales_stride = backend::nvfp4_scales_bytes(s.n, s.k);
    q.row_stride = s.n;
  } else {
    q.grid_stride = s.n / 128 * q.grid_cols;
  }
  constexpr int kCycle = 64;
  std::vector<int> ids(static_cast<size_t>(kCycle * slots));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(static_cast<int64_t>(i) % E);
  int* d_ids = nullptr;
  if (cudaMalloc(&d_ids, ids.size() * 4) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(stack->blob);
    return core::Error{"bench --gemv --experts: no GPU memory for the expert ids"};
  }
  auto call = [&](int i) {
    return cu::gemv_quant_grouped(q, d_ids + (i % kCycle) * slots, slots, x16, factor, slots, y, s.n, false,
                                  nullptr);
  };
  cudaError_t up = cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice);
  auto sec = up == cudaSuccess
                 ? median_seconds(call, kCycle, iters)
                 : core::Expected<double>(core::Error{std::string("CUDA: ") + cudaGetErrorString(up)});
  cudaFree(d_ids);
  cudaFree(stack->blob);
  if (!sec) return core::Error{sec.message()};
  Point p;
  p.format = format;
  p.shape = s;
  p.rows = slots;
  p.seconds = *sec;
  const int64_t chosen = std::min<int64_t>(slots, E);
  p.bytes = static_cast<double>(stack->bytes) / static_cast<double>(E) * static_cast<double>(chosen) +
            static_cast<double>(s.k) * 2 + static_cast<double>(slots * s.n) * 4;
  return p;
}

}  // namespace

int cmd_bench_gemv(const Argv& argv) {
  const std::string cmd = "bench";
  ArgSpec spec{{"--gemv", "--shapes", "--rows", "--experts", "--iters"}, {"--json"}, 0};
  auto args = Args::parse(argv, spec);
  if (!args) return fail(cmd, args.message());
  std::vector<std::string> formats;
  {
    std::stringstream ss(args->get_or("--gemv", "nvfp4,fp8-block,bf16"));
    std::string f;
    while (std::getline(ss, f, ','))
      if (!f.empty()) formats.push_back(f);
  }
  if (formats.empty()) return fail(cmd, "flag --gemv: give formats, e.g. nvfp4,fp8-block,bf16");
  for (const auto& f : formats)
    if (f != "bf16" && f != "nvfp4" && f != "fp8-block")
      return fail(cmd, "flag --gemv: each format must be nvfp4, fp8-block or bf16, not '" + f + "'");
  auto shapes = parse_shapes(args->get_or("--shapes", "17408x5120,5120x17408"));
  if (!shapes) return fail(cmd, shapes.message());
  auto rows = int_list(*args, "--rows", "1,4,8");
  if (!rows) return fail(cmd, rows.message());
  auto experts = args->get_int("--experts", 0);
  if (!experts || *experts < 0 || *experts > 1024) return fail(cmd, "flag --experts must be in [0, 1024]");
  // Rows of one GEMV launch; with --experts, routed slots (one row each), up to a 256-token decode step's.
  const int64_t max_rows = *experts > 0 ? 2048 : cu::kQuantGemvMaxRows;
  for (auto r : *rows)
    if (r < 1 || r > max_rows)
      return fail(cmd,
                  "flag --rows: from 1 to " + std::to_string(max_rows) + " rows, not " + std::to_string(r));
  auto iters = args->get_int("--iters", 100);
  if (!iters || *iters < 1 || *iters > 100000) return fail(cmd, "flag --iters must be in [1, 100000]");
  const bool json = args->has("--json");
  if (*experts > 0)
    for (const auto& f : formats)
      if (f == "bf16")
        return fail(cmd, "flag --experts: the grouped GEMV takes nvfp4 and fp8-block, not bf16");

  int dev = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
    return fail(cmd, "no CUDA device is visible");
  auto bw = measure_copy_bandwidth();
  if (!bw) return fail(cmd, bw.message());

  // Activations and outputs for the largest point.
  int64_t max_k = 0, max_n = 0;
  for (auto s : *shapes) {
    max_k = std::max(max_k, s.k);
    max_n = std::max(max_n, s.n);
  }
  const int T_max = static_cast<int>(*std::max_element(rows->begin(), rows->end()));
  float *x32 = nullptr, *factor = nullptr, *y = nullptr;
  void* x16 = nullptr;
  auto fail_cuda = [&](cudaError_t e) { return fail(cmd, std::string("CUDA: ") + cudaGetErrorString(e)); };
  cudaError_t e = cudaMalloc(&x32, static_cast<size_t>(T_max * max_k) * 4);
  if (e == cudaSuccess) e = cudaMalloc(&x16, static_cast<size_t>(T_max * max_k) * 2);
  if (e == cudaSuccess) e = cudaMalloc(&factor, static_cast<size_t>(T_max) * 4);
  if (e == cudaSuccess) e = cudaMalloc(&y, static_cast<size_t>(T_max * max_n) * 4);
  if (e != cudaSuccess) return fail_cuda(e);
  e = cu::fill_random(x32, core::DType::kF32, T_max * max_k, 7, 1.0f, 0.0f, nullptr);
  if (e != cudaSuccess) return fail_cuda(e);

  std::vector<Point> points;
  for (const auto& format : formats) {
    for (auto s : *shapes) {
      if (*experts > 0) {
        e = cu::stage_activations_f16(x32, s.k, 1, s.k, x16, factor, nullptr);
        if (e != cudaSuccess) return fail_cuda(e);
        for (auto r : *rows) {
          auto p = time_grouped(format, s, *experts, static_cast<int>(r), x16, factor, y,
                                static_cast<int>(*iters));
          if (!p) return fail(cmd, p.message());
          p->bw = p->bytes / p->seconds;
          p->ratio = p->bw / *bw;
          points.push_back(*p);
        }
        continue;
      }
      // Copies enough to hold 3x the L2 cache, at least 2.
      auto first = make_matrix(format, s, 1);
      if (!first) return fail(cmd, first.message());
      const size_t per = first->bytes;
      const size_t want = std::max<size_t>(2, (3 * static_cast<size_t>(prop.l2CacheSize) + per - 1) / per);
      std::vector<DeviceMatrix> mats{*first};
      while (mats.size() < want) {
        auto m = make_matrix(format, s, mats.size() + 1);
        if (!m) return fail(cmd, m.message());
        mats.push_back(*m);
      }
      for (auto r : *rows) {
        const int T = static_cast<int>(r);
        // The activations as each kernel takes them: fp16 with a row factor (quantized) or bf16 (dense).
        e = format == "bf16" ? cu::convert_rows(x32, s.k, T, s.k, x16, core::DType::kBF16, nullptr)
                             : cu::stage_activations_f16(x32, s.k, T, s.k, x16, factor, nullptr);
        if (e != cudaSuccess) return fail_cuda(e);
        auto sec = time_calls(mats, format, s, T, x32, x16, factor, y, static_cast<int>(*iters));
        if (!sec) return fail(cmd, sec.message());
        Point p;
        p.format = format;
        p.shape = s;
        p.rows = T;
        p.seconds = *sec;
        p.bytes = static_cast<double>(per) +
                  static_cast<double>(T * s.k) * (format == "bf16" && T <= 4 ? 4 : 2) +
                  static_cast<double>(T * s.n) * 4;
        p.bw = p.bytes / p.seconds;
        p.ratio = p.bw / *bw;
        points.push_back(p);
      }
      for (auto& m : mats) cudaFree(m.blob);
    }
  }
  cudaFree(x32);
  cudaFree(x16);
  cudaFree(factor);
  cudaFree(y);

  if (json) {
    nlohmann::json j;
    j["device"] = prop.name;
    j["copy_bandwidth"] = *bw;
    j["points"] = nlohmann::json::array();
    for (const auto& p : points)
      j["points"].push_back({{"format", p.format},
                             {"n", p.shape.n},
                             {"k", p.shape.k},
                             {"rows", p.rows},
                             {"seconds", p.seconds},
                             {"bytes", p.bytes},
                             {"bandwidth", p.bw},
                             {"ratio", p.ratio}});
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("device: %s\ncopy bandwidth: %.2f TB/s (read + write, measured now)\n\n", prop.name,
              *bw / 1e12);
  std::printf("%-10s %13s %5s %11s %10s %10s %7s\n", "format", "N x K", "rows", "time (us)", "MB moved",
              "TB/s", "% copy");
  for (const auto& p : points) {
    const std::string shape = std::to_string(p.shape.n) + "x" + std::to_string(p.shape.k);
    std::printf("%-10s %13s %5d %11.2f %10.2f %10.3f %6.1f%%\n", p.format.c_str(), shape.c_str(), p.rows,
                p.seconds * 1e6, p.bytes / 1e6, p.bw / 1e12, 100 * p.ratio);
  }
  return 0;
}

#else

int cmd_bench_gemv(const Argv& argv) {
  (void)argv;
  return fail("bench", "this build has no CUDA backend (configure with -DDELTAFLOW_CUDA=ON)");
}

#endif

}  // namespace deltaflow::cli
