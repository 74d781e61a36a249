#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/model_options.hpp"
#include "engine/generate.hpp"
#include "text/tokenizer.hpp"

namespace deltaflow::cli {

// Two inputs: --ids (teacher-forced log-probabilities of one id sequence) or --text FILE (tokenized with the
// model's tokenizer, scored in non-overlapping windows of --window tokens, default the model's context; the
// first token of each window has no context and is not scored). `tokens` counts the scored positions, `nll`
// is their total in nats, ppl = exp(nll / tokens).
int cmd_eval(const Argv& argv) {
  const std::string cmd = "eval";
  ArgSpec spec{
      {"--model", "--ids", "--text", "--window", "--device", "--tensor-parallel-size"}, {"--json"}, 0};
  add_engine_flags(spec);
  auto args = Args::parse(argv, spec);
  if (!args) return fail(cmd, args.message());
  const auto ids_text = args->get("--ids"), text_file = args->get("--text");
  if (!ids_text == !text_file) return fail(cmd, "give one of --ids 1,2,3,... or --text FILE");

  std::vector<int32_t> ids;
  if (ids_text) {
    auto parsed = parse_id_list(*ids_text, "--ids");
    if (!parsed) return fail(cmd, parsed.message());
    ids.assign(parsed->begin(), parsed->end());
    if (ids.size() < 2) return fail(cmd, "--ids needs at least 2 ids");
  } else {
    std::ifstream in(*text_file, std::ios::binary);
    if (!in) return fail(cmd, *text_file + ": cannot open");
    std::stringstream ss;
    ss << in.rdbuf();
    auto tok = text::Tokenizer::load(model_dir(*args));
    if (!tok) return fail(cmd, tok.message());
    ids = tok->encode(ss.str());
    if (ids.size() < 2) return fail(cmd, *text_file + ": fewer than 2 tokens");
  }

  auto engine = open_engine(*args);
  if (!engine) return fail(cmd, engine.message());
  const int64_t ctx = engine->scheduler->max_model_len();
  auto window = args->get_int("--window", ids_text ? static_cast<long long>(ids.size()) : ctx);
  if (!window) return fail(cmd, window.message());
  if (*window < 2 || *window > ctx)
    return fail(cmd, "flag --window must be in [2, " + std::to_string(ctx) + "] (the model's context)");
  if (ids_text && static_cast<long long>(ids.size()) > *window)
    return fail(cmd, "--ids holds " + std::to_string(ids.size()) + " ids, more than the window " +
                         std::to_string(*window));

  // Every window at once: the engine batches them.
  std::vector<std::vector<int32_t>> windows;
  for (size_t b = 0; b < ids.size(); b += static_cast<size_t>(*window)) {
    const size_t e = std::min(ids.size(), b + static_cast<size_t>(*window));
    if (e - b < 2) break;
    windows.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(b),
                         ids.begin() + static_cast<std::ptrdiff_t>(e));
  }
  auto scored = engine::score_all(*engine->scheduler, windows);
  if (!scored) return fail(cmd, scored.message());
  std::vector<double> logprobs;
  double nll = 0;
  for (const auto& r : *scored) {
    logprobs.insert(logprobs.end(), r.logprobs.begin(), r.logprobs.end());
    nll += r.nll;
  }
  const size_t n = logprobs.size();
  const double ppl = std::exp(nll / static_cast<double>(n));
  if (args->has("--json")) {
    nlohmann::json out = {{"tokens", n}, {"nll", nll}, {"ppl", ppl}};
    if (ids_text) out["logprobs"] = logprobs;
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("tokens %zu  nll %.6f nats  ppl %.4f\n", n, nll, ppl);
  }
  return 0;
}

}  // namespace deltaflow::cli
