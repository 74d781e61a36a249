// `deltaflow tokenize`: token ids of a text file, or (--chat) the rendered chat prompt of a request body.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/tokenize_chat.hpp"
#include "text/tokenizer.hpp"

namespace deltaflow::cli {

int cmd_tokenize(const Argv& argv) {
  const std::string cmd = "tokenize";
  // A positional TEXT is accepted too (DESIGN.md's short form); --file is the exact form for scripts.
  const ArgSpec spec{{"--model", "--file", "--chat", "--chat-template"}, {"--json"}, 1};
  auto args = Args::parse(argv, spec);
  if (!args) return fail(cmd, args.message());
  if (args->has("--chat")) {
    if (args->has("--file") || !args->positionals().empty())
      return fail(cmd, "give --file or --chat, not both");
    return tokenize_chat(*args);
  }
  if (args->has("--chat-template")) return fail(cmd, "--chat-template needs --chat");
  const auto file = args->get("--file");
  std::string text;
  if (file) {
    if (!args->positionals().empty()) return fail(cmd, "give --file or TEXT, not both");
    std::ifstream in(*file, std::ios::binary);
    if (!in) return fail(cmd, *file + ": cannot open");
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) return fail(cmd, *file + ": read error");
    text = ss.str();
  } else if (!args->positionals().empty()) {
    text = args->positionals()[0];
  } else {
    return fail(cmd, "missing --file F (or TEXT, or --chat F.json)");
  }

  // The directory may hold only tokenizer files: nothing else is read.
  auto tok = text::Tokenizer::load(args->get_or("--model", default_model_dir()));
  if (!tok) return fail(cmd, tok.message());
  const auto ids = tok->encode(text);

  const bool as_json = args->has("--json");
  std::string out = as_json ? "{\"ids\": [" : "";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += as_json ? ", " : " ";
    out += std::to_string(ids[i]);
  }
  out += as_json ? "]}\n" : "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace deltaflow::cli
