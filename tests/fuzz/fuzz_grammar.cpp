// The grammar front ends on untrusted text (request fields): JSON schema, regex, EBNF. The first byte picks
// the front end, the rest is its input. Any input must give a grammar or a GrammarError, never a crash or a
// hang; a grammar that compiles must mask consistently: over a small vocabulary, for a few steps, an id's
// mask bit equals whether the matcher accepts it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "grammar/compile.hpp"
#include "grammar/ebnf.hpp"
#include "grammar/json_schema.hpp"

using namespace deltaflow::grammar;

namespace {

std::shared_ptr<const Vocabulary> small_vocab() {
  static auto v = [] {
    std::vector<std::string> t;
    for (int b = 0; b < 128; ++b) t.push_back(std::string(1, static_cast<char>(b)));
    for (const char* s : {"\"", "\":", "\",", "{\"", "true", "null", "\"}", "12", "-0", "ab", "\n  ",
                          "\xC3\xA9", "\xC3", "\xA9", "0.", "e+", "]}", "[]"})
      t.push_back(s);
    return std::make_shared<const Vocabulary>(t, 160);
  }();
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > 4096) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  Grammar g;
  try {
    switch (data[0] % 3) {
      case 0: {
        const Json schema = Json::parse(text, nullptr, false);
        if (schema.is_discarded()) return 0;
        g = grammar_from_json_schema(schema, {(data[0] & 4) != 0});
        break;
      }
      case 1:
        g = grammar_from_regex(text);
        break;
      default:
        g = parse_ebnf(text);
    }
    (void)g.to_string();
    auto vocab = small_vocab();
    Matcher m(compile_grammar(g, vocab));
    std::vector<uint32_t> mask(vocab->mask_words());
    for (int step = 0; step < 4; ++step) {
      m.fill_mask(mask);
      int32_t pick = -1;
      for (size_t id = 0; id < vocab->ids(); ++id) {
        const bool bit = (mask[id / 32] >> (id % 32)) & 1u;
        const bool ok = m.accept_token(static_cast<int32_t>(id));
        if (ok) m.rollback(1);
        if (bit != ok) __builtin_trap();
        if (bit && pick < 0) pick = static_cast<int32_t>(id);
      }
      if (pick < 0 || !m.accept_token(pick)) break;
    }
  } catch (const GrammarError&) {
  }
  return 0;
}
