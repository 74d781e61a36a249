#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/model_options.hpp"
#include "engine/generate.hpp"
#include "text/detokenizer.hpp"
#include "text/tokenizer.hpp"

namespace deltaflow::cli {

// `--prompt-ids 1,2,3` runs ids straight through the model (no tokenizer needed) and prints ids;
// `--prompt TEXT` tokenizes the raw text (no chat template: a plain completion) and streams the text.
int cmd_generate(const Argv& argv) {
  const std::string cmd = "generate";
  ArgSpec spec{{"--model", "--prompt", "--prompt-ids", "--max-tokens", "--temperature", "--top-k", "--top-p",
                "--min-p", "--seed", "--device", "--presence-penalty", "--frequency-penalty",
                "--repetition-penalty", "--tensor-parallel-size"},
               {"--json", "--ignore-eos"},
               0};
  add_engine_flags(spec);
  auto args = Args::parse(argv, spec);
  if (!args) return fail(cmd, args.message());
  const auto ids_text = args->get("--prompt-ids"), prompt_text = args->get("--prompt");
  if (!ids_text == !prompt_text) return fail(cmd, "give one of --prompt TEXT or --prompt-ids 1,2,3");
  auto max_tokens = args->get_int("--max-tokens", 32);
  if (!max_tokens) return fail(cmd, max_tokens.message());
  if (*max_tokens < 0 || *max_tokens > 1'000'000)
    return fail(cmd, "flag --max-tokens must be in [0, 1000000]");
  engine::GenerateOptions opt;
  opt.max_tokens = static_cast<int>(*max_tokens);
  auto sampling = parse_sampling(*args);
  if (!sampling) return fail(cmd, sampling.message());
  opt.sampling = *sampling;

  std::vector<int32_t> prompt;
  std::optional<text::Tokenizer> tok;
  if (ids_text) {
    auto parsed = parse_id_list(*ids_text, "--prompt-ids");
    if (!parsed) return fail(cmd, parsed.message());
    prompt.assign(parsed->begin(), parsed->end());
  } else {
    auto t = text::Tokenizer::load(model_dir(*args));
    if (!t) return fail(cmd, t.message());
    tok.emplace(std::move(t).value());
    prompt = tok->encode(*prompt_text);
    if (prompt.empty()) return fail(cmd, "--prompt is empty");
  }

  auto engine = open_engine(*args);
  if (!engine) return fail(cmd, engine.message());
  if (!args->has("--ignore-eos"))
    for (auto id : engine->backend->config().eos_token_ids) opt.stop_ids.push_back(static_cast<int32_t>(id));

  const bool json = args->has("--json");
  std::optional<text::IncrementalDetokenizer> detok;
  if (tok) detok.emplace(*tok, /*skip_special_tokens=*/true);
  std::string text_out;
  auto r = engine::generate(*engine->scheduler, prompt, opt, [&](int32_t id) {
    if (detok) {
      const std::string delta = detok->feed(id);
      text_out += delta;
      if (!json) std::fputs(delta.c_str(), stdout);
    } else if (!json) {
      std::printf("%d ", id);
    }
    if (!json) std::fflush(stdout);
    return true;
  });
  if (!r) return fail(cmd, r.message());
  if (detok) {
    const std::string tail = detok->finish();
    text_out += tail;
    if (!json) std::fputs(tail.c_str(), stdout);
  }
  if (json) {
    nlohmann::json out = {{"ids", r->ids}, {"finish_reason", r->finish_reason}};
    if (args->has("--speculative-tokens"))
      out["speculative"] = {{"drafted", r->drafted_tokens}, {"accepted", r->accepted_tokens}};
    if (tok) {
      out["prompt_ids"] = prompt;
      out["text"] = text_out;
    }
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("\n");
  }
  return 0;
}

}  // namespace deltaflow::cli
