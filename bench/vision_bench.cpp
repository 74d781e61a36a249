// The image path on the CPU: vision_bench [WIDTH HEIGHT [SIZE]]
// Preprocesses a synthetic WIDTH x HEIGHT image with the real Qwen3.5 processor settings (65536..16777216
// pixels) and runs the CPU reference encoder with random bf16 weights in the shape of SIZE: 0.8b (depth 12,
// width 768) or 27b (depth 27, width 1152; also 9B and the MoE models). Prints the time of each stage, the
// token count and the rows per second; the CUDA encoder is compared with this.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/vision_encoder.hpp"
#include "core/dtype.hpp"
#include "vision/preprocess.hpp"

namespace {

using namespace deltaflow;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Random bf16 weights that live as long as the bench.
struct Store {
  std::vector<std::vector<uint16_t>> bufs;
  uint64_t s = 0x9E3779B97F4A7C15ull;
  model::Mat mat(int64_t rows, int64_t cols, float std, float mean = 0) {
    std::vector<uint16_t> v(static_cast<size_t>(rows * cols));
    for (auto& x : v) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      const float u = static_cast<float>((s >> 40) & 0xffffff) / 16777216.0f - 0.5f;
      x = core::f32_to_bf16(mean + std * 3.4f * u);
    }
    bufs.push_back(std::move(v));
    return model::Mat{bufs.back().data(), core::DType::kBF16, rows, cols};
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int64_t W = argc > 2 ? std::atoll(argv[1]) : 1024, H = argc > 2 ? std::atoll(argv[2]) : 1024;
  const std::string size = argc > 3 ? argv[3] : "0.8b";
  model::VisionConfig c;
  if (size == "0.8b") {
    c.depth = 12, c.hidden_size = 768, c.num_heads = 12, c.intermediate_size = 3072, c.out_hidden_size = 1024;
  } else if (size == "27b") {
    c.depth = 27, c.hidden_size = 1152, c.num_heads = 16, c.intermediate_size = 4304,
    c.out_hidden_size = 5120;
  } else {
    std::fprintf(stderr, "usage: %s [WIDTH HEIGHT [0.8b|27b]]\n", argv[0]);
    return 2;
  }
  vision::Image img{W, H, std::vector<uint8_t>(static_cast<size_t>(W * H * 3))};
  for (int64_t i = 0; i < W * H * 3; ++i)
    img.rgb[static_cast<size_t>(i)] = static_cast<uint8_t>((i * 2654435761u) >> 13);
  vision::ProcessorConfig pc;
  pc.min_pixels = 65536;
  pc.max_pixels = 16777216;
  pc.image_mean = pc.image_std = {0.5f, 0.5f, 0.5f};

  auto t0 = std::chrono::steady_clock::now();
  auto pv = vision::preprocess_image(img, pc);
  const double t_pre = seconds_since(t0);
  if (!pv.is_ok()) {
    std::fprintf(stderr, "%s\n", pv.message().c_str());
    return 1;
  }
  Store st;
  const int64_t D = c.hidden_size, I = c.intermediate_size, M = 4 * D;
  model::VisionWeights w;
  w.patch_embed_w = st.mat(D, c.patch_dim(), 1.0f / std::sqrt(static_cast<float>(c.patch_dim())));
  w.patch_embed_b = st.mat(1, D, 0.02f);
  w.pos_embed = st.mat(c.num_position_embeddings, D, 0.5f);
  for (int64_t i = 0; i < c.depth; ++i) {
    model::VisionBlockWeights b;
    b.norm1_w = st.mat(1, D, 0.1f, 1.0f), b.norm1_b = st.mat(1, D, 0.1f);
    b.norm2_w = st.mat(1, D, 0.1f, 1.0f), b.norm2_b = st.mat(1, D, 0.1f);
    const float s = 1.0f / std::sqrt(static_cast<float>(D));
    b.qkv_w = st.mat(3 * D, D, s), b.qkv_b = st.mat(1, 3 * D, 0.02f);
    b.proj_w = st.mat(D, D, s), b.proj_b = st.mat(1, D, 0.02f);
    b.fc1_w = st.mat(I, D, s), b.fc1_b = st.mat(1, I, 0.02f);
    b.fc2_w = st.mat(D, I, 1.0f / std::sqrt(static_cast<float>(I))), b.fc2_b = st.mat(1, D, 0.02f);
    w.blocks.push_back(b);
  }
  w.merger_norm_w = st.mat(1, D, 0.1f, 1.0f), w.merger_norm_b = st.mat(1, D, 0.1f);
  w.merger_fc1_w = st.mat(M, M, 1.0f / std::sqrt(static_cast<float>(M))),
  w.merger_fc1_b = st.mat(1, M, 0.02f);
  w.merger_fc2_w = st.mat(c.out_hidden_size, M, 1.0f / std::sqrt(static_cast<float>(M)));
  w.merger_fc2_b = st.mat(1, c.out_hidden_size, 0.02f);

  const std::vector<model::VisionGrid> grids = {{pv->grid_t, pv->grid_h, pv->grid_w}};
  t0 = std::chrono::steady_clock::now();
  auto out = backend::cpu::encode_images(c, w, pv->data, grids);
  const double t_enc = seconds_since(t0);
  if (!out.is_ok()) {
    std::fprintf(stderr, "%s\n", out.message().c_str());
    return 1;
  }
  const int64_t tokens = vision::image_token_count(*pv, 2);
  std::printf("image %lldx%lld -> grid %lldx%lld (%lld patches, %lld tokens), tower %s\n",
              static_cast<long long>(W), static_cast<long long>(H), static_cast<long long>(pv->grid_h),
              static_cast<long long>(pv->grid_w), static_cast<long long>(pv->rows),
              static_cast<long long>(tokens), size.c_str());
  std::printf("preprocess %.1f ms, cpu encoder %.1f ms (%.0f patches/s)\n", 1e3 * t_pre, 1e3 * t_enc,
              static_cast<double>(pv->rows) / t_enc);
  return 0;
}
