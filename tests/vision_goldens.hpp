// Reads tests/fixtures/vision/goldens.safetensors (tools/reference/make_vision_goldens.py) for the vision
// tests of the unit and model suites.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.hpp"

namespace deltaflow::testing_vision {

inline std::string fixture_dir() {
  return std::string(DF_FIXTURES) + "/vision";
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class VisionGoldens {
 public:
  static const VisionGoldens& get() {
    static VisionGoldens g;
    return g;
  }
  const io::TensorEntry* find(const std::string& name) const {
    if (!file_) return nullptr;
    for (const auto& e : file_->header().tensors)
      if (e.name == name) return &e;
    return nullptr;
  }
  template <class T>
  std::vector<T> read(const std::string& name, std::vector<int64_t>* shape = nullptr) const {
    const auto* e = find(name);
    EXPECT_NE(e, nullptr) << "golden " << name << " missing";
    if (!e) return {};
    if (shape) *shape = e->shape;
    std::vector<T> v(static_cast<size_t>(e->numel()));
    EXPECT_EQ(e->end - e->begin, v.size() * sizeof(T)) << name;
    if (e->end - e->begin != v.size() * sizeof(T)) return {};
    std::memcpy(v.data(), file_->tensor_data(*e), v.size() * sizeof(T));
    return v;
  }
  bool ok() const { return file_ != nullptr; }
  std::string error;

 private:
  VisionGoldens() {
    auto f = io::SafetensorsFile::open(fixture_dir() + "/goldens.safetensors");
    if (f.is_ok()) {
      file_ = std::move(f).value();
    } else {
      error = f.message();
    }
  }
  std::unique_ptr<io::SafetensorsFile> file_;
};

// The synthetic image of make_vision_goldens.py synthetic_image(h, w).
inline std::vector<uint8_t> synthetic_rgb(int64_t h, int64_t w) {
  std::vector<uint8_t> v(static_cast<size_t>(h * w * 3));
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x) {
      uint8_t* p = v.data() + (y * w + x) * 3;
      p[0] = static_cast<uint8_t>((x * 7 + y * 3) % 256);
      p[1] = static_cast<uint8_t>((x * y + 5 * x) % 256);
      p[2] = ((x / 3) + (y / 3)) % 2 == 0 ? 250 : 10;
    }
  return v;
}

}  // namespace deltaflow::testing_vision
