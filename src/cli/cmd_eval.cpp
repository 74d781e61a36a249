#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/model_options.hpp"
#include "engine/generate.hpp"
#include "model/config.hpp"
#include "text/tokenizer.hpp"

namespace deltaflow::cli {
namespace {

struct Scored {
  std::vector<double> logprobs;  // every scored position, windows in order
  double nll = 0;
  size_t tokens() const { return logprobs.size(); }
  double ppl() const { return std::exp(nll / static_cast<double>(tokens())); }
};

// Loads the model in `dir` with the command's engine flags and scores `ids` in non-overlapping windows of
// `window` tokens (0: the whole of ids, which must fit the context; else the model's context when the flag is
// absent), then frees the model. `window` is set to the one used.
core::Expected<Scored> score_windows(const Args& args, const std::string& dir,
                                     const std::vector<int32_t>& ids, bool whole, long long& window) {
  DF_ASSIGN(EngineHandle engine, open_engine(args, dir));
  const int64_t ctx = engine.scheduler->max_model_len();
  if (window == 0) {
    DF_ASSIGN(window, args.get_int("--window", whole ? static_cast<long long>(ids.size()) : ctx));
  }
  if (window < 2 || window > ctx)
    return core::Error{"flag --window must be in [2, " + std::to_string(ctx) + "] (" + dir + "'s context)"};
  if (whole && static_cast<long long>(ids.size()) > window)
    return core::Error{"--ids holds " + std::to_string(ids.size()) + " ids, more than the window " +
                       std::to_string(window)};
  // Every window at once: the engine batches them.
  std::vector<std::vector<int32_t>> windows;
  for (size_t b = 0; b < ids.size(); b += static_cast<size_t>(window)) {
    const size_t e = std::min(ids.size(), b + static_cast<size_t>(window));
    if (e - b < 2) break;
    windows.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(b),
                         ids.begin() + static_cast<std::ptrdiff_t>(e));
  }
  DF_ASSIGN(auto scored, engine::score_all(*engine.scheduler, windows));
  Scored out;
  for (const auto& r : scored) {
    out.logprobs.insert(out.logprobs.end(), r.logprobs.begin(), r.logprobs.end());
    out.nll += r.nll;
  }
  return out;
}

// --reference DIR: a model directory whose vocabulary (and, for --text, tokenization of the text) is the
// model's, so that both score the same ids.
core::Status check_reference(const std::string& model, const std::string& ref, const std::string* text,
                             const std::vector<int32_t>& ids) {
  std::error_code ec;
  if (!std::filesystem::is_directory(ref, ec))
    return core::Error{"--reference " + ref + ": no such directory"};
  if (!std::filesystem::exists(ref + "/config.json", ec))
    return core::Error{"--reference " + ref + ": not a model directory (no config.json)"};
  DF_ASSIGN(model::TextConfig mc, model::load_text_config(model));
  DF_ASSIGN(model::TextConfig rc, model::load_text_config(ref));
  if (mc.vocab_size != rc.vocab_size)
    return core::Error{"--reference " + ref + ": its vocabulary has " + std::to_string(rc.vocab_size) +
                       " ids, the model's " + std::to_string(mc.vocab_size) + " (a different tokenizer)"};
  if (text) {
    DF_ASSIGN(auto tok, text::Tokenizer::load(ref));
    if (tok.encode(*text) != ids)
      return core::Error{
          "--reference " + ref +
          ": its tokenizer encodes the text differently from the model's (a different tokenizer)"};
  }
  return core::Status();
}

}  // namespace

// Two inputs: --ids (teacher-forced log-probabilities of one id sequence) or --text FILE (tokenized with the
// model's tokenizer, scored in non-overlapping windows of --window tokens, default the model's context; the
// first token of each window has no context and is not scored). `tokens` counts the scored positions, `nll`
// is their total in nats, ppl = exp(nll / tokens). --reference DIR scores the same windows with a second
// model (loaded after the first is freed) and prints the NLL difference per scored token, model minus
// reference.
int cmd_eval(const Argv& argv) {
  const std::string cmd = "eval";
  ArgSpec spec{
      {"--model", "--ids", "--text", "--window", "--device", "--tensor-parallel-size", "--reference"},
      {"--json", "--emulate-activation-quant"},
      0};
  add_engine_flags(spec);
  auto args = Args::parse(argv, spec);
  if (!args) return fail(cmd, args.message());
  const auto ids_text = args->get("--ids"), text_file = args->get("--text");
  if (!ids_text == !text_file) return fail(cmd, "give one of --ids 1,2,3,... or --text FILE");
  const auto reference = args->get("--reference");

  std::vector<int32_t> ids;
  std::string text;
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
    text = ss.str();
    auto tok = text::Tokenizer::load(model_dir(*args));
    if (!tok) return fail(cmd, tok.message());
    ids = tok->encode(text);
    if (ids.size() < 2) return fail(cmd, *text_file + ": fewer than 2 tokens");
  }
  if (reference) {
    auto st = check_reference(model_dir(*args), *reference, ids_text ? nullptr : &text, ids);
    if (!st) return fail(cmd, st.message());
  }

  long long window = 0;
  auto scored = score_windows(*args, model_dir(*args), ids, ids_text.has_value(), window);
  if (!scored) return fail(cmd, scored.message());
  std::optional<Scored> ref;
  if (reference) {
    auto r = score_windows(*args, *reference, ids, ids_text.has_value(), window);
    if (!r) return fail(cmd, r.message());
    ref = std::move(r).value();
  }
  const size_t n = scored->tokens();
  const double delta = ref ? (scored->nll - ref->nll) / static_cast<double>(n) : 0.0;
  if (args->has("--json")) {
    nlohmann::json out = {{"tokens", n}, {"nll", scored->nll}, {"ppl", scored->ppl()}};
    if (ids_text) out["logprobs"] = scored->logprobs;
    if (ref) {
      out["reference"] = {
          {"model", *reference}, {"tokens", ref->tokens()}, {"nll", ref->nll}, {"ppl", ref->ppl()}};
      if (ids_text) out["reference"]["logprobs"] = ref->logprobs;
      out["delta_nll_per_token"] = delta;
    }
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("tokens %zu  nll %.6f nats  ppl %.4f\n", n, scored->nll, scored->ppl());
    if (ref) {
      std::printf("reference tokens %zu  nll %.6f nats  ppl %.4f\n", ref->tokens(), ref->nll, ref->ppl());
      std::printf("delta nll per token (model - reference) %+.6f nats\n", delta);
    }
  }
  return 0;
}

}  // namespace deltaflow::cli
