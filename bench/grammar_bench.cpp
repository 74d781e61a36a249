// Token-mask cost of grammar-constrained decoding:
//   grammar_bench TOKENIZER_DIR (--schema FILE | --json | --regex RE | --grammar FILE) [--tokens N] [--runs
//   R]
//                 [--vocab V]
// Builds the vocabulary, compiles the grammar, then generates an output of at most N tokens R times over
// (the same path each time), choosing uniformly among the allowed ids (which keeps the walk inside strings,
// where the most ids are allowed and masks cost the most). Prints the compile time and the mean / p50 / p99
// fill_mask time per token: run 1 is cold (each automaton state's mask computed on first use, as the first
// request with a schema sees), the rest warm (repeated requests with the same schema share the compiled
// grammar and its masks through the server's cache). Exit 1 if a masked-in id is then refused.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "grammar/compile.hpp"
#include "grammar/ebnf.hpp"
#include "grammar/json_schema.hpp"
#include "text/tokenizer.hpp"

using namespace deltaflow;

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::string read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "grammar_bench: cannot read %s\n", path);
    std::exit(2);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void report(const char* label, std::vector<double> us) {
  if (us.empty()) return;
  std::sort(us.begin(), us.end());
  double sum = 0;
  for (double x : us) sum += x;
  std::printf("%-5s %6zu tokens  mean %8.1f us  p50 %8.1f us  p99 %8.1f us  max %8.1f us\n", label, us.size(),
              sum / static_cast<double>(us.size()), us[us.size() / 2], us[us.size() * 99 / 100], us.back());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(
        stderr,
        "usage: %s TOKENIZER_DIR (--schema FILE | --json | --regex RE | --grammar FILE) [--tokens N] "
        "[--runs R] [--vocab V] [--precompute]\n",
        argv[0]);
    return 2;
  }
  std::string kind, arg;
  int tokens = 256, runs = 4;
  size_t vocab_size = 0;
  bool precompute = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "grammar_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--schema" || a == "--regex" || a == "--grammar") {
      kind = a;
      arg = value();
    } else if (a == "--precompute") {
      precompute = true;
    } else if (a == "--json") {
      kind = a;
    } else if (a == "--tokens") {
      tokens = std::max(1, std::atoi(value()));
    } else if (a == "--runs") {
      runs = std::max(1, std::atoi(value()));
    } else if (a == "--vocab") {
      vocab_size = static_cast<size_t>(std::atol(value()));
    } else {
      std::fprintf(stderr, "grammar_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  auto tok = text::Tokenizer::load(argv[1]);
  if (!tok) {
    std::fprintf(stderr, "grammar_bench: %s\n", tok.message().c_str());
    return 2;
  }
  auto t0 = std::chrono::steady_clock::now();
  auto vocab = grammar::Vocabulary::from_tokenizer(*tok, std::max(vocab_size, tok->vocab_size()));
  std::printf("vocabulary: %zu ids (%zu with bytes) in %.1f ms\n", vocab->mask_size(), vocab->sorted().size(),
              ms_since(t0));
  grammar::Grammar g;
  try {
    t0 = std::chrono::steady_clock::now();
    if (kind == "--schema")
      g = grammar::grammar_from_json_schema(grammar::Json::parse(read_file(arg.c_str())));
    else if (kind == "--regex")
      g = grammar::grammar_from_regex(arg);
    else if (kind == "--grammar")
      g = grammar::parse_ebnf(read_file(arg.c_str()));
    else
      g = grammar::grammar_any_json_object();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "grammar_bench: %s\n", e.what());
    return 2;
  }
  std::shared_ptr<grammar::CompiledGrammar> cg;
  try {
    cg = grammar::compile_grammar(g, vocab);
  } catch (const grammar::GrammarError& e) {
    std::fprintf(stderr, "grammar_bench: %s\n", e.what());
    return 2;
  }
  std::printf("compile: %zu automaton states in %.1f ms\n", cg->automaton().states(), ms_since(t0));

  std::mt19937_64 rng(1);
  std::vector<uint32_t> mask(vocab->mask_words());
  std::vector<int32_t> allowed;
  std::vector<double> cold, warm;
  for (int run = 0; run < runs; ++run) {
    rng.seed(1);  // every run takes the same path: run 1 fills the mask cache, the others find it filled
    grammar::Matcher m(cg);
    for (int t = 0; t < tokens; ++t) {
      const auto a = std::chrono::steady_clock::now();
      m.fill_mask(mask);
      (run == 0 ? cold : warm).push_back(ms_since(a) * 1000.0);
      allowed.clear();
      for (size_t w = 0; w < mask.size(); ++w)
        for (uint32_t bits = mask[w]; bits; bits &= bits - 1)
          allowed.push_back(static_cast<int32_t>(w * 32 + static_cast<size_t>(__builtin_ctz(bits))));
      if (allowed.empty() || (m.can_end() && rng() % 8 == 0)) break;
      const int32_t id = allowed[rng() % allowed.size()];
      if (!m.accept_token(id)) {
        std::fprintf(stderr, "grammar_bench: id %d was masked in but refused\n", id);
        return 1;
      }
    }
  }
  std::printf("mask entries cached: %zu\n", cg->cached_entries());
  report("cold", cold);
  report("warm", warm);
  if (precompute) {  // every state's mask, as an eager compile would (slow for large schemas)
    t0 = std::chrono::steady_clock::now();
    cg->precompute();
    std::printf("precompute of every state's mask: %.1f ms (%zu entries)\n", ms_since(t0),
                cg->cached_entries());
  }
  return 0;
}
