// Incremental detokenization equals whole decoding, never splits a character; stop strings across deltas.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>

#include "text/detokenizer.hpp"
#include "text/tokenizer.hpp"
#include "text/tokenizer_unicode.hpp"

namespace {

using deltaflow::text::IncrementalDetokenizer;
using deltaflow::text::StopStringMatcher;
using deltaflow::text::Tokenizer;
using deltaflow::text::tokenizer_impl::is_valid_utf8;

const Tokenizer& tiny() {
  static std::unique_ptr<Tokenizer> tok = [] {
    auto t = Tokenizer::load(std::string(DF_SOURCE_DIR) + "/assets/tiny-tokenizer");
    EXPECT_TRUE(t) << t.message();
    return std::make_unique<Tokenizer>(std::move(t).value());
  }();
  return *tok;
}

const Tokenizer& qwen3() {
  static std::unique_ptr<Tokenizer> tok = [] {
    auto t = Tokenizer::load(std::string(DF_FIXTURES) + "/tokenizers/qwen3");
    EXPECT_TRUE(t) << t.message();
    return std::make_unique<Tokenizer>(std::move(t).value());
  }();
  return *tok;
}

// Feeds ids one at a time; checks every delta is whole UTF-8 and the total equals decode().
void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  IncrementalDetokenizer d(tok, skip);
  std::string all;
  for (int32_t id : ids) {
    const std::string delta = d.feed(id);
    ASSERT_TRUE(is_valid_utf8(delta));
    all += delta;
  }
  const std::string tail = d.finish();
  ASSERT_TRUE(is_valid_utf8(tail));
  all += tail;
  EXPECT_EQ(all, tok.decode(ids, skip));
}

TEST(IncrementalDetokenizer, RandomIdsEqualDecode) {
  for (const Tokenizer* tok : {&tiny(), &qwen3()}) {
    std::mt19937 rng(42);
    const auto n = static_cast<uint32_t>(tok->vocab_size());
    for (int rep = 0; rep < 300; ++rep) {
      std::vector<int32_t> ids(1 + rng() % 20);
      for (auto& id : ids) id = static_cast<int32_t>(rng() % (n + 10));  // a few unknown ids too
      check_stream(*tok, ids, false);
      check_stream(*tok, ids, true);
    }
  }
}

TEST(IncrementalDetokenizer, MultiByteCharactersAreHeldBack) {
  const Tokenizer& tok = tiny();
  // The tiny vocabulary has no merges for these, so each character is several byte tokens.
  const std::string text = "😀中é👨‍👩‍👧";
  const auto ids = tok.encode(text);
  ASSERT_GT(ids.size(), 4u);
  IncrementalDetokenizer d(tok);
  std::string all;
  size_t empty_deltas = 0;
  for (int32_t id : ids) {
    const std::string delta = d.feed(id);
    if (delta.empty()) ++empty_deltas;
    ASSERT_TRUE(is_valid_utf8(delta));
    all += delta;
  }
  EXPECT_EQ(d.pending_bytes(), 0u);
  EXPECT_EQ(all + d.finish(), text);
  EXPECT_GT(empty_deltas, 0u);  // something was held back
}

TEST(IncrementalDetokenizer, UnfinishedCharacterAtEnd) {
  const Tokenizer& tok = tiny();
  auto ids = tok.encode("a😀");
  ids.pop_back();  // drop the last byte of the emoji
  IncrementalDetokenizer d(tok);
  std::string all;
  for (int32_t id : ids) all += d.feed(id);
  EXPECT_EQ(all, "a");
  EXPECT_GT(d.pending_bytes(), 0u);
  EXPECT_EQ(all + d.finish(), tok.decode(ids));  // "a\uFFFD"
}

TEST(IncrementalDetokenizer, SkipsSpecialTokens) {
  const Tokenizer& tok = qwen3();
  const auto ids = tok.encode("<|im_start|>assistant\n<think>hi</think><|im_end|>");
  IncrementalDetokenizer skip(tok, true), keep(tok, false);
  std::string a, b;
  for (int32_t id : ids) {
    a += skip.feed(id);
    b += keep.feed(id);
  }
  EXPECT_EQ(a, "assistant\n<think>hi</think>");  // <think> is an added but not a special token
  EXPECT_EQ(b, "<|im_start|>assistant\n<think>hi</think><|im_end|>");
}

std::string run_stops(StopStringMatcher& m, const std::vector<std::string>& deltas,
                      std::vector<std::string>* emitted = nullptr) {
  std::string out;
  for (const auto& d : deltas) {
    const std::string e = m.feed(d);
    if (emitted) emitted->push_back(e);
    out += e;
  }
  return out + m.flush();
}

TEST(StopStringMatcher, MatchAcrossDeltas) {
  StopStringMatcher m({"<|stop|>", "END"});
  std::vector<std::string> emitted;
  const std::string out = run_stops(m, {"Hello <|st", "op|> ignored", "more"}, &emitted);
  EXPECT_EQ(out, "Hello ");
  ASSERT_TRUE(m.stopped());
  EXPECT_EQ(m.matched_index(), 0u);
  EXPECT_EQ(emitted[0], "Hello ");  // "<|st" held back
  EXPECT_EQ(emitted[1], "");
}

TEST(StopStringMatcher, HoldsBackOnlyPossiblePrefixes) {
  StopStringMatcher m({"abc"});
  EXPECT_EQ(m.feed("xxab"), "xx");
  EXPECT_EQ(m.held_back(), 2u);
  EXPECT_EQ(m.feed("d"), "abd");  // "abd" cannot become "abc"
  EXPECT_EQ(m.held_back(), 0u);
  EXPECT_EQ(m.feed("a"), "");
  EXPECT_EQ(m.feed("a"), "a");  // "aa": only the last "a" may start "abc"
  EXPECT_EQ(m.flush(), "a");
  EXPECT_FALSE(m.stopped());
}

TEST(StopStringMatcher, EarliestMatchWins) {
  StopStringMatcher m({"world", "lo w"});
  EXPECT_EQ(run_stops(m, {"hello world"}), "hel");
  EXPECT_EQ(m.matched_index(), 1u);
}

TEST(StopStringMatcher, OverlappingPrefixes) {
  StopStringMatcher m({"aab"});
  std::vector<std::string> emitted;
  EXPECT_EQ(run_stops(m, {"a", "a", "a", "b", "c"}, &emitted), "a");
  EXPECT_TRUE(m.stopped());
}

TEST(StopStringMatcher, NoStopStrings) {
  StopStringMatcher m({"", ""});
  EXPECT_EQ(m.feed("anything"), "anything");
  EXPECT_EQ(m.flush(), "");
  EXPECT_FALSE(m.stopped());
}

TEST(StopStringMatcher, StopAtStart) {
  StopStringMatcher m({"\n\n"});
  EXPECT_EQ(run_stops(m, {"\n", "\nrest"}), "");
  EXPECT_TRUE(m.stopped());
}

// Random deltas over random text: the output is the text up to the first stop string, whatever the split.
TEST(StopStringMatcher, RandomSplitsMatchWholeText) {
  std::mt19937 rng(5);
  const std::vector<std::string> stops = {"ab", "bca", "ccc", "é!"};
  const std::vector<std::string> alphabet = {"a", "b", "c", "é", "!", " "};
  for (int rep = 0; rep < 2000; ++rep) {
    std::string text;
    for (int k = 0, n = static_cast<int>(rng() % 30); k < n; ++k) text += alphabet[rng() % alphabet.size()];
    size_t first = std::string::npos;
    for (const auto& s : stops) first = std::min(first, text.find(s));
    const std::string want = first == std::string::npos ? text : text.substr(0, first);
    std::vector<std::string> deltas;
    for (size_t pos = 0; pos < text.size();) {
      size_t len = 1 + rng() % 4;
      while (pos + len < text.size() && (static_cast<unsigned char>(text[pos + len]) & 0xC0) == 0x80) ++len;
      deltas.push_back(text.substr(pos, len));
      pos += len;
    }
    StopStringMatcher m(stops);
    std::vector<std::string> emitted;
    ASSERT_EQ(run_stops(m, deltas, &emitted), want) << text;
    EXPECT_EQ(m.stopped(), first != std::string::npos);
    for (const auto& e : emitted) ASSERT_TRUE(is_valid_utf8(e));
  }
}

TEST(DetokenizerAndStops, StreamGeneratedText) {
  const Tokenizer& tok = qwen3();
  const auto ids = tok.encode("The answer is 42.<|im_end|>\nignored");
  IncrementalDetokenizer d(tok, false);
  StopStringMatcher m({"<|im_end|>"});
  std::string out;
  for (int32_t id : ids) {
    out += m.feed(d.feed(id));
    if (m.stopped()) break;
  }
  EXPECT_EQ(out, "The answer is 42.");
}

}  // namespace
