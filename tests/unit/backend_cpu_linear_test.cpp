// backend::cpu::linear, both kernels (portable, and AVX2+FMA where this CPU has it): y = x @ W^T against a
// double-precision reference, and the batch invariance the engine rests on: a row of y is bit-identical
// computed alone (T = 1) or inside a batch of T = 1..9 (and a 64-row tile plus a remainder) beside other
// rows, whatever block of weight rows or thread split it lands in.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.hpp"
#include "core/dtype.hpp"
#include "core/threads.hpp"

namespace deltaflow::backend::cpu {
namespace {

// A weight matrix in one dtype, its values as fp32 (bf16 / f16 rounded) for the reference.
struct Weights {
  core::DType dtype;
  int64_t rows, cols;
  std::vector<uint8_t> bytes;
  std::vector<float> values;
  Mat mat() const { return Mat(bytes.data(), dtype, rows, cols); }
  // Rows [first, first + count) as a matrix of their own.
  Mat rows_of(int64_t first, int64_t count) const {
    const size_t row = static_cast<size_t>(cols) * core::dtype_size(dtype);
    return Mat(bytes.data() + static_cast<size_t>(first) * row, dtype, count, cols);
  }
};

Weights make_weights(core::DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.5f);
  Weights w{dtype, rows, cols, {}, {}};
  const size_t n = static_cast<size_t>(rows * cols);
  w.bytes.resize(n * core::dtype_size(dtype));
  w.values.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float v = dist(rng);
    if (dtype == core::DType::kBF16) {
      const uint16_t h = core::f32_to_bf16(v);
      std::memcpy(w.bytes.data() + 2 * i, &h, 2);
      w.values[i] = core::bf16_to_f32(h);
    } else if (dtype == core::DType::kF16) {
      const uint16_t h = core::f32_to_f16(v);
      std::memcpy(w.bytes.data() + 2 * i, &h, 2);
      w.values[i] = core::f16_to_f32(h);
    } else {
      std::memcpy(w.bytes.data() + 4 * i, &v, 4);
      w.values[i] = v;
    }
  }
  return w;
}

std::vector<float> random_rows(int64_t T, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(T * K));
  for (auto& v : x) v = dist(rng);
  return x;
}

std::vector<LinearKernel> kernels() {
  std::vector<LinearKernel> ks = {LinearKernel::kPortable};
  if (linear_kernel_supported(LinearKernel::kAvx2)) ks.push_back(LinearKernel::kAvx2);
  return ks;
}

std::string name(LinearKernel k, core::DType d) {
  return std::string(k == LinearKernel::kAvx2 ? "avx2 " : "portable ") + std::string(core::dtype_name(d));
}

std::vector<float> run(const float* x, int64_t T, const Mat& W, LinearKernel k) {
  std::vector<float> y(static_cast<size_t>(T * W.rows), std::nanf(""));
  linear(x, T, W, y.data(), k);
  return y;
}

bool same_bits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

// Shapes: K a multiple of 8 and not (the zero-padded tail), N a multiple of the 8-row weight block and not.
struct Shape {
  int64_t N, K;
};
const Shape kShapes[] = {{37, 384}, {16, 67}, {9, 8}, {3, 5}, {24, 130}};
const core::DType kDtypes[] = {core::DType::kBF16, core::DType::kF32, core::DType::kF16};

TEST(CpuLinear, MatchesADoubleReference) {
  // Each y[t, n] within 1e-5 * sum_k |x[t, k] * W[n, k]| of the exact dot product (an fp32 sum of K terms in
  // 8 lanes errs by at most about (K / 8 + 4) * 2^-24 of that sum: 3e-6 at K = 384).
  for (const LinearKernel k : kernels())
    for (const core::DType d : kDtypes)
      for (const Shape& s : kShapes)
        for (const int64_t T : {1, 2, 3, 4, 5, 8, 9, 70}) {
          const Weights w = make_weights(d, s.N, s.K, 7);
          const std::vector<float> x = random_rows(T, s.K, 11);
          const std::vector<float> y = run(x.data(), T, w.mat(), k);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = 0; n < s.N; ++n) {
              double want = 0, mag = 0;
              for (int64_t i = 0; i < s.K; ++i) {
                const double p = static_cast<double>(x[t * s.K + i]) * w.values[n * s.K + i];
                want += p;
                mag += std::fabs(p);
              }
              ASSERT_NEAR(y[t * s.N + n], want, 1e-5 * mag)
                  << name(k, d) << " N " << s.N << " K " << s.K << " T " << T << " t " << t << " n " << n;
            }
        }
}

TEST(CpuLinear, RowsAreBitIdenticalAloneAndInAnyBatch) {
  for (const LinearKernel k : kernels())
    for (const core::DType d : kDtypes)
      for (const Shape& s : kShapes) {
        const Weights w = make_weights(d, s.N, s.K, 3);
        const std::vector<float> probe = random_rows(1, s.K, 5);
        const std::vector<float> alone = run(probe.data(), 1, w.mat(), k);
        for (const int64_t T : {1, 2, 3, 4, 5, 6, 7, 8, 9, 64 + 7}) {
          for (int64_t at = 0; at < T; ++at) {
            // The probe at row `at`, the other rows different for every (T, at).
            std::vector<float> x = random_rows(T, s.K, static_cast<uint32_t>(100 * T + at));
            std::copy(probe.begin(), probe.end(), x.begin() + at * s.K);
            const std::vector<float> y = run(x.data(), T, w.mat(), k);
            ASSERT_TRUE(same_bits(y.data() + at * s.N, alone.data(), s.N))
                << name(k, d) << " N " << s.N << " K " << s.K << " T " << T << " at " << at;
          }
        }
        // However the weight rows fall into blocks and threads: every window of rows [first, first + count),
        // computed serially inside a pool worker, gives the full matrix's columns.
        const std::vector<float> x = random_rows(6, s.K, 9);
        const std::vector<float> full = run(x.data(), 6, w.mat(), k);
        for (int64_t first = 0; first < s.N; first += 3)
          for (const int64_t count : {int64_t{1}, int64_t{5}, s.N - first}) {
            if (first + count > s.N) continue;
            std::vector<float> part;
            core::parallel_for(2, 1, [&](size_t b, size_t) {
              if (b == 0) part = run(x.data(), 6, w.rows_of(first, count), k);
            });
            for (int64_t t = 0; t < 6; ++t)
              ASSERT_TRUE(same_bits(part.data() + t * count, full.data() + t * s.N + first, count))
                  << name(k, d) << " N " << s.N << " K " << s.K << " rows " << first << "+" << count;
          }
      }
}

}  // namespace
}  // namespace deltaflow::backend::cpu
