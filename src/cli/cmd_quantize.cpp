#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "backend/cpu/calibration.hpp"
#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "model/config.hpp"
#include "model/quant/writer.hpp"
#include "text/tokenizer.hpp"

namespace deltaflow::cli {
namespace {

// Calibration windows: FILE.json holds {"ids": [[...], ...]}; any other FILE is text, tokenized with the
// checkpoint's tokenizer and cut into windows of 512 tokens (32 at most). Without a file: 4 windows of 48
// pseudo-random ids (seeded), a weak stand-in for text.
core::Expected<std::vector<std::vector<int32_t>>> calibration_windows(const std::string& model,
                                                                      const std::optional<std::string>& file,
                                                                      int64_t vocab) {
  std::vector<std::vector<int32_t>> out;
  if (!file) {
    std::mt19937 rng(7);
    for (int w = 0; w < 4; ++w) {
      out.emplace_back();
      for (int i = 0; i < 48; ++i)
        out.back().push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab)));
    }
    return out;
  }
  std::ifstream in(*file, std::ios::binary);
  if (!in) return core::Error{*file + ": cannot read the calibration file"};
  std::stringstream ss;
  ss << in.rdbuf();
  if (file->size() > 5 && file->compare(file->size() - 5, 5, ".json") == 0) {
    const auto j = nlohmann::json::parse(ss.str(), nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("ids") || !j["ids"].is_array())
      return core::Error{*file + ": expected {\"ids\": [[id, ...], ...]}"};
    for (const auto& w : j["ids"]) {
      if (!w.is_array() || w.empty())
        return core::Error{*file + ": each window must be a non-empty list of ids"};
      out.emplace_back();
      for (const auto& id : w) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab)
          return core::Error{*file + ": id " + id.dump() + " is outside the vocabulary [0, " +
                             std::to_string(vocab) + ")"};
        out.back().push_back(id.get<int32_t>());
      }
    }
    return out;
  }
  DF_ASSIGN(auto tok, text::Tokenizer::load(model));
  const auto ids = tok.encode(ss.str());
  if (ids.empty()) return core::Error{*file + ": no text to calibrate with"};
  for (size_t at = 0; at < ids.size() && out.size() < 32; at += 512)
    out.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(at),
                     ids.begin() + static_cast<std::ptrdiff_t>(std::min(ids.size(), at + 512)));
  return out;
}

}  // namespace

int cmd_quantize(const Argv& argv) {
  const std::string cmd = "quantize";
  auto args = Args::parse(argv, {{"--model", "--out", "--format", "--calibration", "--method"}, {}, 0});
  if (!args) return fail(cmd, args.message());
  const auto model = args->get("--model");
  const auto out = args->get("--out");
  const auto format = args->get("--format");
  if (!model) return fail(cmd, "missing --model DIR");
  if (!out) return fail(cmd, "missing --out DIR");
  if (!format) return fail(cmd, "missing --format fp8-block|nvfp4|nvfp4-mixed");
  model::quant::QuantMethod method;
  method.name = args->get_or("--method", "exact");
  if (!model::quant::is_quant_method(method.name))
    return fail(cmd, "flag --method: '" + method.name + "' is not one of exact, mse, gptq");
  const auto calibration_file = args->get("--calibration");
  const bool gptq = method.name == "gptq";
  if (calibration_file && !model::quant::needs_calibration(*format) && !gptq)
    return fail(cmd,
                "--calibration is for --format nvfp4-mixed or --method gptq (the others are weight-only)");
  if (gptq && !calibration_file)
    return fail(cmd, "--method gptq needs --calibration FILE (text like the model's inputs)");
  std::optional<model::quant::InputAmax> amax;
  std::optional<model::quant::InputStats> stats;
  const bool want_stats = gptq;
  if (model::quant::needs_calibration(*format) || want_stats) {
    auto config = model::load_text_config(*model);
    if (!config) return fail(cmd, config.message());
    auto windows = calibration_windows(*model, calibration_file, config->vocab_size);
    if (!windows) return fail(cmd, windows.message());
    for (const auto& w : *windows)
      if (static_cast<int64_t>(w.size()) > config->max_position_embeddings)
        return fail(cmd, "a calibration window is longer than the model's max_position_embeddings");
    if (model::quant::needs_calibration(*format)) amax.emplace();
    if (want_stats) stats.emplace();
    auto st = backend::cpu::calibrate(*model, *windows, amax ? &*amax : nullptr, stats ? &*stats : nullptr);
    if (!st) return fail(cmd, st.message());
    method.stats = stats ? &*stats : nullptr;
  }
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  auto progress = [&](size_t done, size_t total) {
    if (!tty) return;
    const int width = 40, filled = total ? static_cast<int>(width * done / total) : width;
    std::fprintf(stderr, "\rquantize [%.*s%*s] %zu/%zu matrices", filled,
                 "########################################", width - filled, "", done, total);
    if (done == total) std::fprintf(stderr, "\n");
  };
  auto st = model::quant::write_quantized_checkpoint(*model, *out, *format, progress, amax ? &*amax : nullptr,
                                                     method);
  if (!st) return fail(cmd, st.message());
  std::printf("wrote %s (%s, method %s)\n", out->c_str(), format->c_str(), method.name.c_str());
  return 0;
}

}  // namespace deltaflow::cli
