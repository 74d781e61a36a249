// Streaming text out of generated ids.
//
// IncrementalDetokenizer turns ids, one at a time, into UTF-8 text deltas that never split a character: the
// bytes of a character spread over several byte-level tokens are held back until it is complete. The
// concatenation of all deltas plus finish() equals Tokenizer::decode(ids, skip_special_tokens) exactly,
// including U+FFFD for bytes that can never form a character.
//
// StopStringMatcher watches the text deltas for stop strings across token boundaries. It holds back only the
// longest tail that is a prefix of some stop string (it could still become one), emits everything else at
// once, and on a match emits the text before the stop string and nothing after it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer.hpp"

namespace deltaflow::text {

class IncrementalDetokenizer {
 public:
  // The tokenizer must outlive the detokenizer.
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = true);

  // Appends the text that id completes to `out` (possibly nothing).
  void feed(int32_t id, std::string& out);
  std::string feed(int32_t id) {
    std::string s;
    feed(id, s);
    return s;
  }
  // End of the stream: held-back bytes of an unfinished character become U+FFFD, as decode() would.
  std::string finish();
  void reset();
  // Bytes held back waiting for the rest of a character (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  bool joins_with_space_;
  bool first_ = true;
  std::string pending_;
};

class StopStringMatcher {
 public:
  // Empty stop strings are ignored.
  explicit StopStringMatcher(std::vector<std::string> stop_strings);

  // Feeds a text delta; returns the text that is safe to emit now. After a match it returns the text before
  // the stop string once, then nothing.
  std::string feed(std::string_view delta);
  // End of the stream without a match: returns the held-back text.
  std::string flush();

  bool stopped() const { return matched_.has_value(); }
  // Index (into the constructor's list) of the stop string that matched.
  std::optional<size_t> matched_index() const { return matched_; }
  size_t held_back() const { return pending_.size(); }

 private:
  std::vector<std::string> stops_;
  std::vector<size_t> index_;  // stops_[i] came from stop_strings[index_[i]]
  std::string pending_;
  std::optional<size_t> matched_;
};

}  // namespace deltaflow::text
