// Helpers for the CUDA tests: device buffers poisoned with NaN, host matrices in any weight dtype, and the
// error measure every comparison uses.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.hpp"
#include "model/weights.hpp"

namespace deltaflow::gpu_test {

// A device copy of a host vector; a fresh buffer is filled with 0xff bytes (NaN as floats, -1 as ints) so an
// element a kernel forgets to write fails the comparison.
template <class T>
class DevBuf {
 public:
  explicit DevBuf(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(p_, 0xff, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
  }
  explicit DevBuf(const std::vector<T>& v) : DevBuf(v.size()) { upload(v); }
  ~DevBuf() { cudaFree(p_); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void upload(const std::vector<T>& v) {
    ASSERT_LE(v.size(), n_);
    ASSERT_EQ(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// max |a - b| / max(1, max |b|); infinite when a holds a non-finite value or the sizes differ.
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size() || a.empty()) return INFINITY;
  double md = 0, mr = 1;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    md = std::max(md, std::fabs(static_cast<double>(a[i]) - b[i]));
    mr = std::max(mr, std::fabs(static_cast<double>(b[i])));
  }
  return md / mr;
}

inline std::vector<float> randn(std::mt19937& rng, size_t n, float scale = 1.0f, float shift = 0.0f) {
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (auto& x : v) x = shift + scale * nd(rng);
  return v;
}

// Host bytes of `v` in dtype (bf16 / f16 rounding as torch does).
inline std::vector<uint8_t> to_bytes(const std::vector<float>& v, core::DType dt) {
  std::vector<uint8_t> out(v.size() * core::dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == core::DType::kF32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      const uint16_t h = dt == core::DType::kBF16 ? core::f32_to_bf16(v[i]) : core::f32_to_f16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// The floats of host bytes in dtype (the inverse of to_bytes).
inline std::vector<float> from_bytes(const std::vector<uint8_t>& b, core::DType dt) {
  const size_t es = core::dtype_size(dt);
  std::vector<float> out(b.size() / es);
  for (size_t i = 0; i < out.size(); ++i) {
    if (dt == core::DType::kF32) {
      std::memcpy(&out[i], b.data() + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      out[i] = dt == core::DType::kBF16 ? core::bf16_to_f32(h) : core::f16_to_f32(h);
    }
  }
  return out;
}

// v as dtype holds it (bf16 / f16 rounding; fp32 unchanged).
inline float round_to(float v, core::DType dt) {
  if (dt == core::DType::kBF16) return core::round_bf16(v);
  if (dt == core::DType::kF16) return core::f16_to_f32(core::f32_to_f16(v));
  return v;
}

// A host matrix in dtype with a model::Mat view (for the CPU reference) and a device copy.
struct HostMat {
  std::vector<uint8_t> bytes;
  model::Mat mat;
  HostMat(const std::vector<float>& v, core::DType dt, int64_t rows, int64_t cols) : bytes(to_bytes(v, dt)) {
    mat = model::Mat{bytes.data(), dt, rows, cols};
  }
};

inline bool have_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

}  // namespace deltaflow::gpu_test
