// The grammar engine: each front end (regex, EBNF, JSON schema) accepts and rejects the right strings, and
// token masks over the real Qwen3 vocabulary agree with advancing token by token (a masked-in id is
// accepted, a masked-out one is not), for a grammar without recursion (pure cache) and one with (uncertain
// ids checked on the stack).
#include <gtest/gtest.h>

#include <random>

#include "grammar/compile.hpp"
#include "grammar/ebnf.hpp"
#include "grammar/json_schema.hpp"
#include "server/grammar_constraint.hpp"
#include "text/tokenizer.hpp"

using namespace deltaflow;
using namespace deltaflow::grammar;

namespace {

// A byte-per-token vocabulary (ids 0..255 are the bytes) plus a few multi-byte tokens: enough to match any
// string byte by byte.
std::shared_ptr<const Vocabulary> byte_vocab() {
  static auto v = [] {
    std::vector<std::string> t;
    for (int b = 0; b < 256; ++b) t.push_back(std::string(1, static_cast<char>(b)));
    for (const char* s : {"\"", "\":", "\",", "{\"", "true", "null", "\"}", "12", "-0", "ab", "\n  "})
      t.push_back(s);
    return std::make_shared<const Vocabulary>(t, 300);
  }();
  return v;
}

bool matches(const Grammar& g, std::string_view s) {
  Matcher m(compile_grammar(g, byte_vocab()));
  return m.accept_bytes(s) && m.can_end();
}

bool schema_matches(const char* schema, std::string_view doc) {
  return matches(grammar_from_json_schema(Json::parse(schema)), doc);
}

std::string schema_error(const char* schema, bool strict = false) {
  try {
    compile_automaton(grammar_from_json_schema(Json::parse(schema), {strict}));
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(GrammarRegex, AcceptsAndRejects) {
  const Grammar g = grammar_from_regex(R"(^[a-z]{2,3}-\d+(\.\d{1,2})?$)");
  EXPECT_TRUE(matches(g, "ab-1"));
  EXPECT_TRUE(matches(g, "abc-123.45"));
  EXPECT_FALSE(matches(g, "a-1"));
  EXPECT_FALSE(matches(g, "abcd-1"));
  EXPECT_FALSE(matches(g, "ab-1.234"));
  EXPECT_FALSE(matches(g, "ab-"));
  EXPECT_TRUE(matches(grammar_from_regex("(cat|dog)s?"), "dogs"));
  EXPECT_FALSE(matches(grammar_from_regex("(cat|dog)s?"), "cow"));
  EXPECT_TRUE(matches(grammar_from_regex(R"([^\s]+ é.)"), "x\xC3\xA9 \xC3\xA9z"));
  EXPECT_TRUE(matches(grammar_from_regex(R"(\w+@\w+\.com)"), "me@host.com"));
  EXPECT_FALSE(matches(grammar_from_regex(R"(\w+@\w+\.com)"), "me@host.org"));
}

TEST(GrammarRegex, RefusesWhatItCannotMatch) {
  for (const char* bad :
       {"(a", "a)", "[a-", "a{3,1}", R"(\1)", "(?=a)", R"(\bword)", "*a", "a{99999}", "a+++", "a*{2}"})
    EXPECT_THROW(grammar_from_regex(bad), GrammarError) << bad;
}

TEST(GrammarRegex, AnAmbiguousDotStarIsBoundedByThePositionsItsStatesHold) {
  // fuzz_grammar's timeout (tests/fuzz/corpus/fuzz_grammar/dot-star-blowup): ".*" before many "."s makes
  // the subset construction's states hold dozens of pattern positions each; the work budget
  // (kMaxDfaEntries) ends it long before the state limit would.
  const std::string pattern = "{@" + std::string(13, '.') + "0" + std::string(14, '.') + "*" +
                              std::string(26, '.') + ">" + std::string(10, '.') + "0.....!" +
                              std::string(8, '.') + "*" + std::string(36, '.') + ":rot: ooo=";
  try {
    compile_automaton(grammar_from_regex(pattern));
    ADD_FAILURE() << "compiled";
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("pattern positions"), std::string::npos) << e.what();
  }
}

TEST(GrammarEbnf, AcceptsAndRejects) {
  const Grammar g = parse_ebnf(R"g(
    # arithmetic, recursive
    root ::= expr
    expr ::= term (("+" | "-") term)*
    term ::= num | "(" expr ")"
    num  ::= [0-9]+
  )g");
  EXPECT_TRUE(matches(g, "1+(2-3)"));
  EXPECT_TRUE(matches(g, "((4))"));
  EXPECT_FALSE(matches(g, "1+"));
  EXPECT_FALSE(matches(g, "(1"));
  EXPECT_TRUE(matches(parse_ebnf("root ::= [^\"]{2} 'x'?"), "ab"));
  EXPECT_TRUE(matches(parse_ebnf("root ::= \"\\u00e9\" [\\x41-\\x43]"),
                      "\xC3\xA9"
                      "B"));
}

TEST(GrammarEbnf, ErrorsNameThePlace) {
  try {
    parse_ebnf("root ::= \"a\"\nfoo ::= (\"b\"");
    FAIL();
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_ebnf("root ::= missing"), GrammarError);
  EXPECT_THROW(parse_ebnf("root = \"a\""), GrammarError);
  EXPECT_THROW(parse_ebnf(""), GrammarError);
  EXPECT_THROW(parse_ebnf("root ::= \"a\"\nroot ::= \"b\""), GrammarError);
}

TEST(GrammarJsonSchema, ObjectsWithRequiredAndOptionalProperties) {
  const char* s = R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                      "c": {"type": "boolean"}}, "required": ["b"]})";
  EXPECT_TRUE(schema_matches(s, R"({"b": "x"})"));
  EXPECT_TRUE(schema_matches(s, R"({"a": 1, "b": "x", "c": true})"));
  EXPECT_TRUE(schema_matches(s, R"({ "a":-5,"b":"q\"\\\n" })"));
  EXPECT_TRUE(schema_matches(s, R"({"b": "x", "c": false})"));
  EXPECT_FALSE(schema_matches(s, R"({"a": 1})"));              // b missing
  EXPECT_FALSE(schema_matches(s, R"({"b": "x", "d": 1})"));    // no additional properties
  EXPECT_FALSE(schema_matches(s, R"({"b": "x",})"));           // trailing comma
  EXPECT_FALSE(schema_matches(s, R"({"a": 1.5, "b": "x"})"));  // not an integer
  const char* extra =
      R"({"type": "object", "properties": {"a": {"type": "null"}}, "additionalProperties": {"type": "number"}})";
  EXPECT_TRUE(schema_matches(extra, R"({"a": null, "z": 2.5, "y": -1})"));
  EXPECT_TRUE(schema_matches(extra, R"({"z": 2})"));
  EXPECT_FALSE(schema_matches(extra, R"({"z": "no"})"));
}

TEST(GrammarJsonSchema, ArraysEnumsConstAnyOfRefs) {
  const char* arr = R"({"type": "array", "items": {"enum": ["x", 2, null]}, "minItems": 1, "maxItems": 3})";
  EXPECT_TRUE(schema_matches(arr, R"(["x"])"));
  EXPECT_TRUE(schema_matches(arr, R"([2, null, "x"])"));
  EXPECT_FALSE(schema_matches(arr, "[]"));
  EXPECT_FALSE(schema_matches(arr, R"([2, 2, 2, 2])"));
  EXPECT_FALSE(schema_matches(arr, R"(["y"])"));
  EXPECT_TRUE(schema_matches(R"({"const": {"k": [1, "v"]}})", R"({"k":[1,"v"]})"));
  const char* any = R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]})";
  EXPECT_TRUE(schema_matches(any, "42"));
  EXPECT_TRUE(schema_matches(any, "\"ab\""));
  EXPECT_FALSE(schema_matches(any, "\"abc\""));
  const char* tree = R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}}, "$ref": "#/$defs/node"})";
  EXPECT_TRUE(schema_matches(tree, R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": []}]})"));
  EXPECT_FALSE(schema_matches(tree, R"({"v": 1, "kids": [{}]})"));
}

TEST(GrammarJsonSchema, StringFormatsAndPatterns) {
  EXPECT_TRUE(schema_matches(R"({"type": "string", "format": "date"})", R"("2024-12-31")"));
  EXPECT_FALSE(schema_matches(R"({"type": "string", "format": "date"})", R"("2024-02-30")"));
  EXPECT_FALSE(schema_matches(R"({"type": "string", "format": "date"})", R"("2024-13-01")"));
  EXPECT_TRUE(schema_matches(R"({"type": "string", "format": "date-time"})", R"("2024-01-02T03:04:05Z")"));
  EXPECT_TRUE(
      schema_matches(R"({"type": "string", "format": "date-time"})", R"("2024-01-02T03:04:05.123+05:30")"));
  EXPECT_FALSE(schema_matches(R"({"type": "string", "format": "date-time"})", R"("2024-01-02 03:04:05")"));
  EXPECT_TRUE(
      schema_matches(R"({"type": "string", "format": "uuid"})", R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_FALSE(schema_matches(R"({"type": "string", "format": "uuid"})", R"("123e4567")"));
  EXPECT_TRUE(schema_matches(R"({"type": "string", "format": "email"})", R"("a.b@example.com")"));
  EXPECT_FALSE(schema_matches(R"({"type": "string", "format": "email"})", R"("a.b.example.com")"));
  EXPECT_TRUE(schema_matches(R"({"type": "string", "pattern": "^a\"b$"})", R"("a\"b")"));
  EXPECT_FALSE(schema_matches(R"({"type": "string", "pattern": "^a\"b$"})", R"("a"b")"));
  EXPECT_TRUE(
      schema_matches(R"({"type": "string", "minLength": 2, "maxLength": 3})", "\"\xC3\xA9\xC3\xA9\""));
  EXPECT_FALSE(schema_matches(R"({"type": "string", "minLength": 2, "maxLength": 3})", R"("abcd")"));
}

TEST(GrammarJsonSchema, IntegerBoundsAreExact) {
  for (auto [lo, hi] : std::vector<std::pair<int, int>>{{0, 0}, {-7, 13}, {5, 120}, {-250, -3}, {99, 1001}}) {
    const std::string s = R"({"type": "integer", "minimum": )" + std::to_string(lo) + R"(, "maximum": )" +
                          std::to_string(hi) + "}";
    Grammar g = grammar_from_json_schema(Json::parse(s));
    auto cg = compile_grammar(g, byte_vocab());
    for (int x = -300; x <= 1100; ++x) {
      Matcher m(cg);
      const bool ok = m.accept_bytes(std::to_string(x)) && m.can_end();
      ASSERT_EQ(ok, x >= lo && x <= hi) << s << " x=" << x;
    }
    Matcher m(cg);
    EXPECT_FALSE(m.accept_bytes("007") && m.can_end());
  }
  EXPECT_TRUE(schema_matches(R"({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 3})", "2"));
  EXPECT_FALSE(schema_matches(R"({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 3})", "3"));
}

TEST(GrammarJsonSchema, NumberBounds) {
  const char* s = R"({"type": "number", "minimum": -2, "maximum": 3})";
  for (const char* ok : {"-2", "-1.5", "-0.25", "0", "2.999", "3", "1"})
    EXPECT_TRUE(schema_matches(s, ok)) << ok;
  for (const char* bad : {"-2.5", "3.5", "4", "-3", "1e3"}) EXPECT_FALSE(schema_matches(s, bad)) << bad;
  EXPECT_TRUE(schema_matches(R"({"type": "number"})", "-12.5e+3"));
}

TEST(GrammarJsonSchema, InvalidSchemasAreClearErrors) {
  EXPECT_NE(schema_error(R"({"type": "wizard"})").find("wizard"), std::string::npos);
  EXPECT_NE(schema_error(R"({"$ref": "#/$defs/none"})").find("points at nothing"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type": "string", "pattern": "(a"})").find("regex"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type": "array", "minItems": 3, "maxItems": 1})").find("maxItems"),
            std::string::npos);
  EXPECT_NE(schema_error(R"({"type": "integer", "minimum": 0.2, "maximum": 0.8})").find("no integer"),
            std::string::npos);
  EXPECT_NE(schema_error(R"({"type": "string", "not": {"const": "a"}})", true).find("'not'"),
            std::string::npos);
  EXPECT_EQ(schema_error(R"({"type": "string", "not": {"const": "a"}})", false), "");
  EXPECT_NE(schema_error(R"({"type": "string", "maxLength": 100000})").find("maxLength"), std::string::npos);
  EXPECT_NE(
      schema_error(R"({"type": "array", "items": {"type": "string", "maxLength": 9000}, "maxItems": 1000})")
          .find("too large"),
      std::string::npos);
}

namespace {

const text::Tokenizer& qwen3() {
  static auto tok = [] {
    auto t = text::Tokenizer::load(std::string(DF_FIXTURES) + "/tokenizers/qwen3");
    if (!t) throw std::runtime_error(t.message());
    return std::move(*t);
  }();
  return tok;
}

std::shared_ptr<const Vocabulary> qwen3_vocab() {
  static auto v = Vocabulary::from_tokenizer(qwen3(), 151936);
  return v;
}

// Walks `steps` random allowed tokens; at each step the mask bit of every allowed id, and of a sample of the
// others, must equal whether the matcher accepts that id (then undone).
void check_masks_agree(const Grammar& g, int steps, uint64_t seed) {
  auto vocab = qwen3_vocab();
  auto cg = compile_grammar(g, vocab);
  Matcher m(cg);
  std::vector<uint32_t> mask(vocab->mask_words());
  std::mt19937_64 rng(seed);
  for (int s = 0; s < steps; ++s) {
    m.fill_mask(mask);
    std::vector<int32_t> allowed;
    for (size_t id = 0; id < vocab->ids(); ++id) {
      const bool bit = (mask[id / 32] >> (id % 32)) & 1u;
      if (!bit && rng() % 16 != 0) continue;
      const bool ok = m.accept_token(static_cast<int32_t>(id));
      if (ok) m.rollback(1);
      ASSERT_EQ(bit, ok) << "step " << s << " id " << id << " '" << vocab->bytes(static_cast<int32_t>(id))
                         << "'";
      if (bit) allowed.push_back(static_cast<int32_t>(id));
    }
    for (size_t id = vocab->ids(); id < 151936; ++id) ASSERT_FALSE((mask[id / 32] >> (id % 32)) & 1u);
    if (allowed.empty()) {
      EXPECT_TRUE(m.can_end());
      return;
    }
    ASSERT_TRUE(m.accept_token(allowed[rng() % allowed.size()]));
  }
}

}  // namespace

TEST(GrammarMask, Qwen3MasksAgreeWithMatchingForASchema) {
  check_masks_agree(grammar_from_json_schema(Json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 12}, "when": {"type": "string", "format": "date"},
      "n": {"type": "integer", "minimum": -5, "maximum": 500}}, "required": ["name", "when", "n"]})")),
                    6, 1);
}

TEST(GrammarMask, Qwen3MasksAgreeWithMatchingForRecursiveJson) {
  check_masks_agree(grammar_any_json_object(), 8, 2);
  check_masks_agree(parse_ebnf(R"(root ::= "[" item ("," item)* "]"
                                  item ::= [a-z]+ | root)"),
                    6, 3);
}

TEST(GrammarMask, SpecialTokensAreNeverAllowed) {
  auto vocab = qwen3_vocab();
  Matcher m(compile_grammar(grammar_from_regex(".*"), vocab));
  std::vector<uint32_t> mask(vocab->mask_words());
  m.fill_mask(mask);
  const int32_t im_end = *qwen3().token_to_id("<|im_end|>");
  const int32_t call_end = *qwen3().token_to_id("</tool_call>");  // added, not special: its text
  EXPECT_FALSE((mask[im_end / 32] >> (im_end % 32)) & 1u);
  EXPECT_TRUE((mask[call_end / 32] >> (call_end % 32)) & 1u);
  const int32_t a = *qwen3().token_to_id("a");
  EXPECT_TRUE((mask[a / 32] >> (a % 32)) & 1u);
}

TEST(GrammarConstraint, ThinkingThenGrammarThenStop) {
  auto vocab = qwen3_vocab();
  const int32_t think_end = *qwen3().token_to_id("</think>");
  const int32_t eos = *qwen3().token_to_id("<|im_end|>");
  server::GrammarConstraint c(compile_grammar(grammar_from_choices({"yes", "no"}), vocab),
                              {{eos}, /*in_reasoning=*/true, think_end, 151936});
  std::vector<uint32_t> mask(vocab->mask_words());
  auto bit = [&](int32_t id) { return ((mask[id / 32] >> (id % 32)) & 1u) != 0; };
  c.fill_mask(mask);
  const int32_t hello = qwen3().encode("hello")[0];
  EXPECT_TRUE(bit(hello));
  EXPECT_FALSE(bit(eos));  // no ending inside the thought
  ASSERT_TRUE(c.accept(hello));
  ASSERT_TRUE(c.accept(think_end));
  c.fill_mask(mask);
  const int32_t nl = qwen3().encode("\n\n")[0];
  EXPECT_FALSE(bit(nl));  // not offered, but accepted (a forced close of the thought ends with it)
  EXPECT_FALSE(bit(hello));
  ASSERT_TRUE(c.accept(nl));
  const int32_t yes = qwen3().encode("yes")[0];
  c.fill_mask(mask);
  EXPECT_TRUE(bit(yes));
  EXPECT_FALSE(bit(eos));
  ASSERT_TRUE(c.accept(yes));
  EXPECT_TRUE(c.finished());
  c.fill_mask(mask);
  EXPECT_TRUE(bit(eos));
  EXPECT_EQ(std::count_if(mask.begin(), mask.end(), [](uint32_t w) { return w != 0; }), 1);
  EXPECT_FALSE(c.accept(nl));
  c.rollback(1);
  EXPECT_FALSE(c.finished());
  EXPECT_FALSE(c.accept(eos));
}
