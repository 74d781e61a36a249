// Pre-tokenizers of a tokenizer.json: Split (a regex or literal pattern, any delimiter behaviour, invert),
// ByteLevel (optional prefix space, optional GPT-2 regex) and a Sequence of them.
//
// `tokenizers` runs Split patterns with Oniguruma (Ruby syntax). We compile them with PCRE2 (UTF, UCP, JIT)
// after rewriting the few escapes whose meaning differs: Oniguruma's \s is Unicode White_Space, where
// PCRE2's also matches U+180E; \w includes marks; \h is a hex digit. ^ and $ are line anchors in Ruby syntax,
// hence PCRE2_MULTILINE. Successive matches follow onig's find_iter (an empty match right after the previous
// match is skipped).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.hpp"

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_match_context_8;
struct pcre2_real_jit_stack_8;

namespace deltaflow::text::tokenizer_impl {

// Per-thread matching state (PCRE2 match data and JIT stack); not shared between concurrent encodes.
class MatchScratch {
 public:
  MatchScratch();
  ~MatchScratch();
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
  pcre2_real_match_data_8* data() const { return data_; }
  pcre2_real_match_context_8* context() const { return context_; }

 private:
  pcre2_real_match_data_8* data_ = nullptr;
  pcre2_real_match_context_8* context_ = nullptr;
  pcre2_real_jit_stack_8* jit_stack_ = nullptr;
};

// Rewrites an Oniguruma (Ruby syntax) pattern into an equivalent PCRE2 pattern (see the header comment).
std::string onig_to_pcre2(std::string_view pattern);

class Regex {
 public:
  // literal: match the pattern as plain text (Split {"String": ...}).
  static core::Expected<Regex> compile(std::string_view pattern, bool literal);
  // Appends (start, end) of the successive matches in s. Returns false if matching failed (PCRE2 resource
  // limits); the matches found up to then are kept.
  bool find_all(std::string_view s, MatchScratch& scratch, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  std::shared_ptr<pcre2_real_code_8> code_;
  bool jit_ = false;
  bool never_matches_ = false;  // empty literal
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel };
  Kind kind = Kind::kSplit;
  // Split; ByteLevel with use_regex uses `regex` too (the GPT-2 pattern, isolated).
  Regex regex;
  bool has_regex = false;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  // ByteLevel
  bool add_prefix_space = false;
};

// Scratch for one encode call: per step, the match list and a buffer for a prefixed piece.
struct PreTokenizerScratch {
  MatchScratch match;
  struct Level {
    std::vector<std::pair<size_t, size_t>> matches;
    std::vector<std::pair<std::pair<size_t, size_t>, bool>> splits;
    std::string buf;
  };
  std::vector<Level> levels;
};

class PreTokenizer {
 public:
  PreTokenizer() = default;
  explicit PreTokenizer(std::vector<PreTokenizerStep> steps) : steps_(std::move(steps)) {}

  // Calls emit(ctx, piece) for each non-empty pre-token of `text`, in order.
  using EmitFn = void (*)(void* ctx, std::string_view piece);
  void run(std::string_view text, PreTokenizerScratch& scratch, EmitFn emit, void* ctx) const;

  // True if the last step is ByteLevel: pieces are then raw bytes that the model spells in the GPT-2
  // alphabet.
  bool byte_level() const {
    return !steps_.empty() && steps_.back().kind == PreTokenizerStep::Kind::kByteLevel;
  }

 private:
  void run_step(size_t k, std::string_view piece, PreTokenizerScratch& scratch, EmitFn emit, void* ctx) const;
  std::vector<PreTokenizerStep> steps_;
};

// GPT-2's pre-tokenizer pattern (tokenizers ByteLevel with use_regex).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace deltaflow::text::tokenizer_impl
