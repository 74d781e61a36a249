// Reading golden tensors (safetensors files the tools/reference scripts write) and comparing against them,
// for the model tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.hpp"

namespace deltaflow::testing_golden {

class GoldenFile {
 public:
  // Opens `path`; a failure is a test failure (and every read then returns nothing).
  explicit GoldenFile(const std::string& path) {
    auto f = io::SafetensorsFile::open(path);
    EXPECT_TRUE(f.is_ok()) << path << ": " << f.message();
    if (f.is_ok()) file_ = std::move(f).value();
  }
  bool ok() const { return file_ != nullptr; }
  const io::TensorEntry* find(const std::string& name) const {
    if (!file_) return nullptr;
    for (const auto& e : file_->header().tensors)
      if (e.name == name) return &e;
    return nullptr;
  }
  std::vector<float> f32(const std::string& name) const { return read<float>(name, core::DType::kF32); }
  std::string metadata(const std::string& key) const {
    if (!file_) return {};
    const auto it = file_->header().metadata.find(key);
    return it == file_->header().metadata.end() ? std::string() : it->second;
  }
  std::vector<int32_t> i32(const std::string& name) const { return read<int32_t>(name, core::DType::kI32); }

 private:
  template <class T>
  std::vector<T> read(const std::string& name, core::DType want) const {
    const auto* e = find(name);
    EXPECT_NE(e, nullptr) << "golden tensor " << name;
    if (!e || e->dtype != want) return {};
    std::vector<T> v(static_cast<size_t>(e->numel()));
    std::memcpy(v.data(), file_->tensor_data(*e), v.size() * sizeof(T));
    return v;
  }
  std::unique_ptr<io::SafetensorsFile> file_;
};

// max |a - b| / max(1, max |b|); infinite on a size mismatch or a non-finite value of `a`.
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  if (a.size() != b.size() || a.empty()) return INFINITY;
  double md = 0, mr = 1;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    md = std::max(md, std::fabs(static_cast<double>(a[i]) - b[i]));
    mr = std::max(mr, std::fabs(static_cast<double>(b[i])));
  }
  return md / mr;
}

}  // namespace deltaflow::testing_golden
