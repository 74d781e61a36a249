#include <unistd.h>

#include <cstdio>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "model/quant/writer.hpp"

namespace deltaflow::cli {

int cmd_quantize(const Argv& argv) {
  const std::string cmd = "quantize";
  auto args = Args::parse(argv, {{"--model", "--out", "--format"}, {}, 0});
  if (!args) return fail(cmd, args.message());
  const auto model = args->get("--model");
  const auto out = args->get("--out");
  const auto format = args->get("--format");
  if (!model) return fail(cmd, "missing --model DIR");
  if (!out) return fail(cmd, "missing --out DIR");
  if (!format) return fail(cmd, "missing --format fp8-block|nvfp4");
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  auto progress = [&](size_t done, size_t total) {
    if (!tty) return;
    const int width = 40, filled = total ? static_cast<int>(width * done / total) : width;
    std::fprintf(stderr, "\rquantize [%.*s%*s] %zu/%zu matrices", filled,
                 "########################################", width - filled, "", done, total);
    if (done == total) std::fprintf(stderr, "\n");
  };
  auto st = model::quant::write_quantized_checkpoint(*model, *out, *format, progress);
  if (!st) return fail(cmd, st.message());
  std::printf("wrote %s (%s)\n", out->c_str(), format->c_str());
  return 0;
}

}  // namespace deltaflow::cli
