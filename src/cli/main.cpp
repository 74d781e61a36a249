// deltaflow: one binary, many jobs (DESIGN.md §1).
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "cli/commands.hpp"
#include "cli/help.hpp"

namespace {

struct Command {
  int (*run)(const deltaflow::cli::Argv&);
  const char* help;
};

const std::map<std::string, Command>& commands() {
  using namespace deltaflow::cli;
  static const std::map<std::string, Command> table = {
      {"batch",
       {cmd_batch, "OpenAI Batch JSONL through the engine: --input IN.jsonl --output OUT.jsonl [--resume]"}},
      {"chat", {cmd_chat, "interactive chat with the model's template: [--model DIR] [--system TEXT]"}},
      {"generate",
       {cmd_generate,
        "one completion: [--model DIR] (--prompt TEXT | --prompt-ids 1,2,3) [--max-tokens N] [--json]"}},
      {"bench",
       {cmd_bench,
        "GPU speed vs rooflines: (--synthetic CONFIG | --model DIR) [--batches 1,8,32] [--contexts ...] "
        "[--prefill ...] [--profile] [--json]"}},
      {"eval",
       {cmd_eval, "teacher-forced NLL: [--model DIR] (--ids 1,2,3 | --text FILE [--window N]) [--json]"}},
      {"inspect", {cmd_inspect, "DIR: architecture, layer pattern, parameters, tensor formats, bytes"}},
      {"make-tiny", {cmd_make_tiny, "--preset NAME --seed N --out DIR: a random-weight checkpoint"}},
      {"quantize", {cmd_quantize, "--model DIR --out DIR --format fp8-block|nvfp4: a quantized checkpoint"}},
      {"serve",
       {cmd_serve, "OpenAI + Ollama HTTP API: [--model DIR] [--host H] [--port N] [--api-key KEY] ..."}},
      {"tokenize", {cmd_tokenize, "--model DIR (--file F | --chat F.json) [--json]"}},
  };
  return table;
}

void usage(FILE* to) {
  std::fprintf(to, "usage: deltaflow <command> [options]\n\ncommands:\n");
  for (const auto& [name, c] : commands()) std::fprintf(to, "  %-10s %s\n", name.c_str(), c.help);
  std::fprintf(to, "\n'deltaflow <command> --help' lists a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    usage(stdout);
    return 0;
  }
  auto it = commands().find(name);
  if (it == commands().end()) {
    std::fprintf(stderr, "deltaflow: unknown command '%s' (try 'deltaflow --help')\n", name.c_str());
    return 2;
  }
  if (deltaflow::cli::wants_help(argc - 2, argv + 2)) {
    // bench --requests, --images and --gemv: those modes' own flags.
    std::string topic = name;
    for (int i = 2; i < argc && name == "bench"; ++i) {
      const std::string a = argv[i];
      if (a.rfind("--requests", 0) == 0) topic = "bench --requests";
      if (a.rfind("--images", 0) == 0) topic = "bench --images";
      if (a.rfind("--gemv", 0) == 0) topic = "bench --gemv";
    }
    deltaflow::cli::print_help(topic, stdout);
    return 0;
  }
  deltaflow::cli::Argv args(argv + 2, argv + argc);
  return it->second.run(args);
}
