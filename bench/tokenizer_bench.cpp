// Tokenizer throughput: tokenizer_bench TOKENIZER_DIR TEXT_FILE [REPEATS]
// Encodes the file's text (cold: first pass with empty word caches, then warm passes) in chunks of about 64
// KB, cut at line ends, the way a server sees prompts; prints MB/s and tokens/s for encode and decode on one
// thread.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "text/tokenizer.hpp"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER_DIR TEXT_FILE [REPEATS]\n", argv[0]);
    return 2;
  }
  const int repeats = argc > 3 ? std::max(1, std::atoi(argv[3])) : 3;
  std::ifstream in(argv[2], std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot open %s\n", argv[2]);
    return 2;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();

  auto t0 = std::chrono::steady_clock::now();
  auto tok = deltaflow::text::Tokenizer::load(argv[1]);
  if (!tok) {
    std::fprintf(stderr, "%s\n", tok.message().c_str());
    return 1;
  }
  std::printf("load: %.3f s (vocab %zu)\n", seconds_since(t0), tok->vocab_size());

  std::vector<std::string_view> chunks;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = std::min(text.size(), pos + 65536);
    if (end < text.size()) {
      const size_t nl = text.find('\n', end);
      end = nl == std::string::npos ? text.size() : nl + 1;
    }
    chunks.push_back(std::string_view(text).substr(pos, end - pos));
    pos = end;
  }

  const double mb = static_cast<double>(text.size()) / 1e6;
  std::vector<int32_t> ids;
  double best = 1e30;
  for (int r = 0; r < repeats + 1; ++r) {
    ids.clear();
    t0 = std::chrono::steady_clock::now();
    for (auto c : chunks) tok->encode_append(c, ids);
    const double s = seconds_since(t0);
    if (r == 0) {
      std::printf("encode (cold): %.2f MB in %.3f s = %.1f MB/s, %zu tokens (%.2f bytes/token)\n", mb, s,
                  mb / s, ids.size(), static_cast<double>(text.size()) / std::max<size_t>(1, ids.size()));
    } else {
      best = std::min(best, s);
    }
  }
  std::printf("encode (warm, best of %d): %.1f MB/s, %.2f M tokens/s\n", repeats, mb / best,
              static_cast<double>(ids.size()) / best / 1e6);

  t0 = std::chrono::steady_clock::now();
  const std::string back = tok->decode(ids, false);
  const double ds = seconds_since(t0);
  std::printf("decode: %.1f MB/s; round trip %s\n", static_cast<double>(back.size()) / 1e6 / ds,
              back == text ? "exact" : "differs (normalization or invalid UTF-8 in the input)");
  return 0;
}
