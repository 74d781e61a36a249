// `deltaflow chat`: an interactive terminal chat. Each turn renders the whole conversation with the model's
// chat template, generates until an end-of-turn token, and streams the text. Ctrl-C ends the current turn (or
// clears the input line), not the program; Ctrl-D or /exit quits; /reset starts over.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/model_options.hpp"
#include "engine/generate.hpp"
#include "text/chat_template.hpp"
#include "text/detokenizer.hpp"
#include "text/tokenizer.hpp"

namespace deltaflow::cli {
namespace {

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_sigint(int) {
  g_interrupted = 1;
}

// SIGINT without SA_RESTART: a blocked read of the input line returns, and generation sees the flag.
void install_sigint() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, nullptr);
}

}  // namespace

int cmd_chat(const Argv& argv) {
  const std::string cmd = "chat";
  ArgSpec spec{
      {"--model", "--max-tokens", "--temperature", "--top-k", "--top-p", "--min-p", "--presence-penalty",
       "--frequency-penalty", "--repetition-penalty", "--seed", "--device", "--system", "--enable-thinking"},
      {"--allow-special-in-content"},
      0};
  add_engine_flags(spec);
  auto args = Args::parse(argv, spec);
  if (!args) return fail(cmd, args.message());
  auto max_tokens = args->get_int("--max-tokens", 1024);
  if (!max_tokens) return fail(cmd, max_tokens.message());
  auto sampling = parse_sampling(*args);
  if (!sampling) return fail(cmd, sampling.message());
  const std::string thinking = args->get_or("--enable-thinking", "false");
  if (thinking != "true" && thinking != "false")
    return fail(cmd, "flag --enable-thinking must be true or false");

  const std::string dir = model_dir(*args);
  auto tok = text::Tokenizer::load(dir);
  if (!tok) return fail(cmd, tok.message());
  auto tmpl = text::ChatTemplate::load(dir);
  if (!tmpl) return fail(cmd, tmpl.message());
  auto engine = open_engine(*args);
  if (!engine) return fail(cmd, engine.message());

  engine::GenerateOptions opt;
  opt.max_tokens = static_cast<int>(*max_tokens);
  opt.sampling = *sampling;
  for (auto id : engine->backend->config().eos_token_ids) opt.stop_ids.push_back(static_cast<int32_t>(id));
  int32_t im_end_id = -1;
  if (auto im_end = tok->token_to_id("<|im_end|>")) {
    opt.stop_ids.push_back(*im_end);
    im_end_id = *im_end;
  }

  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (auto sys = args->get("--system")) messages.push_back({{"role", "system"}, {"content", *sys}});
  text::ChatRenderOptions render;
  render.add_generation_prompt = true;
  render.kwargs = {{"enable_thinking", thinking == "true"}};
  // What the user types stays text, special-token spellings included, unless --allow-special-in-content.
  if (!args->has("--allow-special-in-content")) render.literal_tokens = tok->special_token_texts();
  install_sigint();
  std::fprintf(stderr,
               "deltaflow chat: %s on %s. Ctrl-C ends a turn, Ctrl-D or /exit quits, /reset clears.\n",
               dir.c_str(), engine->backend->name());
  for (;;) {
    std::fputs("\n> ", stdout);
    std::fflush(stdout);
    g_interrupted = 0;
    std::string line;
    if (!std::getline(std::cin, line)) {
      if (g_interrupted) {  // Ctrl-C at the prompt: drop the line, ask again
        std::cin.clear();
        continue;
      }
      break;  // EOF
    }
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      messages = nlohmann::ordered_json::array();
      if (auto sys = args->get("--system")) messages.push_back({{"role", "system"}, {"content", *sys}});
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    auto prompt_text = text::render_chat_spans(*tmpl, messages, render);
    if (!prompt_text) {
      std::fprintf(stderr, "deltaflow chat: %s\n", prompt_text.message().c_str());
      messages.erase(messages.size() - 1);
      continue;
    }
    const auto prompt = tok->encode_literal(prompt_text->text, prompt_text->literal);
    // A turn may use what is left of the context, at most --max-tokens.
    const int64_t room = engine->scheduler->max_model_len() - static_cast<int64_t>(prompt.size());
    if (room <= 0) {
      std::fprintf(stderr,
                   "deltaflow chat: the conversation (%zu tokens) fills the context; /reset to start over\n",
                   prompt.size());
      messages.erase(messages.size() - 1);
      continue;
    }
    opt.max_tokens = static_cast<int>(std::min<int64_t>(*max_tokens, room));
    text::IncrementalDetokenizer detok(*tok, /*skip_special_tokens=*/true);
    std::string reply;
    // Checkpoints after each message: the next turn reuses this conversation from the prefix cache.
    opt.message_ends.clear();
    for (size_t i = 0; i < prompt.size(); ++i)
      if (prompt[i] == im_end_id) opt.message_ends.push_back(static_cast<int64_t>(i) + 1);
    auto r = engine::generate(*engine->scheduler, prompt, opt, [&](int32_t id) {
      if (g_interrupted) return false;
      if (std::find(opt.stop_ids.begin(), opt.stop_ids.end(), id) != opt.stop_ids.end()) return true;
      const std::string d = detok.feed(id);
      reply += d;
      std::fputs(d.c_str(), stdout);
      std::fflush(stdout);
      return true;
    });
    reply += detok.finish();
    if (!r) {
      std::fprintf(stderr, "\ndeltaflow chat: %s\n", r.message().c_str());
      messages.erase(messages.size() - 1);
      continue;
    }
    if (g_interrupted) std::fputs(" [interrupted]", stdout);
    std::fputs("\n", stdout);
    messages.push_back({{"role", "assistant"}, {"content", reply}});
  }
  std::fputs("\n", stdout);
  return 0;
}

}  // namespace deltaflow::cli
