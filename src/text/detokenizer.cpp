#include "text/detokenizer.hpp"

#include <algorithm>

#include "text/tokenizer_unicode.hpp"

namespace deltaflow::text {

// ---- IncrementalDetokenizer ----

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tok_(&tokenizer),
      skip_special_(skip_special_tokens),
      joins_with_space_(tokenizer.decoder_joins_with_space()) {}

void IncrementalDetokenizer::feed(int32_t id, std::string& out) {
  // The same filter as Tokenizer::decode: unknown ids vanish, special ones on request.
  if (!tok_->has_id(id)) return;
  if (skip_special_ && tok_->is_special(id)) return;
  if (joins_with_space_ && !first_) pending_.push_back(' ');
  first_ = false;
  pending_.append(tok_->token_bytes(id));
  // Emit every complete character (and U+FFFD for bytes that can no longer become one); keep an unfinished
  // character's bytes for the next id.
  const size_t used = tokenizer_impl::append_utf8_lossy(out, pending_, /*final=*/false);
  pending_.erase(0, used);
}

std::string IncrementalDetokenizer::finish() {
  std::string out;
  tokenizer_impl::append_utf8_lossy(out, pending_, /*final=*/true);
  pending_.clear();
  return out;
}

void IncrementalDetokenizer::reset() {
  pending_.clear();
  first_ = true;
}

// ---- StopStringMatcher ----

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop_strings) {
  for (size_t i = 0; i < stop_strings.size(); ++i) {
    if (stop_strings[i].empty()) continue;
    stops_.push_back(std::move(stop_strings[i]));
    index_.push_back(i);
  }
}

std::string StopStringMatcher::feed(std::string_view delta) {
  if (matched_) return {};
  pending_.append(delta);
  // The held-back text had no complete stop string, so any match involves the new text; take the earliest
  // (the first listed on a tie).
  size_t best = std::string::npos, which = 0;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t pos = pending_.find(stops_[i]);
    if (pos < best) {
      best = pos;
      which = i;
    }
  }
  if (best != std::string::npos) {
    std::string out = pending_.substr(0, best);
    pending_.clear();
    matched_ = index_[which];
    return out;
  }
  // Hold back the longest tail that is a proper prefix of a stop string.
  size_t hold = 0;
  const std::string_view p = pending_;
  for (const auto& s : stops_) {
    for (size_t k = std::min(s.size() - 1, p.size()); k > hold; --k) {
      if (p.substr(p.size() - k) == std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringMatcher::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace deltaflow::text
