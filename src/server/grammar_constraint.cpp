#include "server/grammar_constraint.hpp"

#include <algorithm>

namespace deltaflow::server {

GrammarConstraint::GrammarConstraint(std::shared_ptr<grammar::CompiledGrammar> g, Options o)
    : m_(std::move(g)),
      o_(std::move(o)),
      phase_(o_.in_reasoning && o_.think_end_id >= 0 ? Phase::kThinking : Phase::kGrammar) {}

bool GrammarConstraint::is_stop(int32_t id) const {
  return std::find(o_.stop_ids.begin(), o_.stop_ids.end(), id) != o_.stop_ids.end();
}

void GrammarConstraint::fill_mask(std::span<uint32_t> words) {
  auto set = [&](int32_t id) {
    if (id >= 0 && static_cast<size_t>(id) / 32 < words.size())
      words[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  };
  switch (phase_) {
    case Phase::kThinking: {
      std::fill(words.begin(), words.end(), 0u);
      const size_t n = std::min(o_.vocab, words.size() * 32);
      for (size_t i = 0; i < n / 32; ++i) words[i] = ~0u;
      for (size_t i = n / 32 * 32; i < n; ++i) set(static_cast<int32_t>(i));
      for (int32_t id : o_.stop_ids)
        if (id >= 0 && static_cast<size_t>(id) / 32 < words.size())
          words[static_cast<size_t>(id) / 32] &= ~(1u << (id % 32));
      return;
    }
    case Phase::kLeadingSpace:
    case Phase::kGrammar: {
      // Whitespace before the grammar's first byte is accepted (a forced "\n</think>\n\n") but never offered:
      // a model fond of blank lines could otherwise put the answer off for ever.
      m_.fill_mask(words);
      if (m_.can_end())
        for (int32_t id : o_.stop_ids) set(id);
      return;
    }
    case Phase::kDone:
      std::fill(words.begin(), words.end(), 0u);
      return;
  }
}

bool GrammarConstraint::accept(int32_t id) {
  Step s{phase_, false};
  switch (phase_) {
    case Phase::kThinking:
      if (id == o_.think_end_id) phase_ = Phase::kLeadingSpace;
      break;
    case Phase::kLeadingSpace:
    case Phase::kGrammar:
      if (is_stop(id)) {
        if (!m_.can_end()) return false;
        phase_ = Phase::kDone;
      } else if (m_.accept_token(id)) {
        s.matcher_advanced = true;
        phase_ = Phase::kGrammar;
      } else {
        const auto ws = m_.grammar().vocab().whitespace_mask();
        const bool space = id >= 0 && static_cast<size_t>(id) / 32 < ws.size() &&
                           ((ws[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u);
        if (!(phase_ == Phase::kLeadingSpace && space)) return false;
      }
      break;
    case Phase::kDone:
      return false;
  }
  history_.push_back(s);
  return true;
}

bool GrammarConstraint::finished() const {
  return phase_ == Phase::kDone || (phase_ == Phase::kGrammar && m_.finished());
}

void GrammarConstraint::rollback(int n) {
  for (; n > 0 && !history_.empty(); --n) {
    const Step s = history_.back();
    history_.pop_back();
    if (s.matcher_advanced) m_.rollback(1);
    phase_ = s.before;
  }
}

}  // namespace deltaflow::server
