// engine::TokenConstraint over a grammar::Matcher, with what a generation needs around the grammar: a
// reasoning block before it (any id but a stop id until </think>; then whitespace-only ids are accepted,
// though not offered, until the grammar's first byte, as the forced close "\n</think>\n\n" of a thinking
// budget has them), and the stop ids once the grammar may end.
#pragma once

#include <memory>
#include <vector>

#include "engine/constraint.hpp"
#include "grammar/matcher.hpp"

namespace deltaflow::server {

class GrammarConstraint : public engine::TokenConstraint {
 public:
  struct Options {
    std::vector<int32_t> stop_ids;
    bool in_reasoning = false;  // the prompt ends inside <think>: the grammar starts after </think>
    int32_t think_end_id = -1;
    size_t vocab = 0;  // the model's vocabulary (ids a mask covers)
  };
  GrammarConstraint(std::shared_ptr<grammar::CompiledGrammar> g, Options o);

  void fill_mask(std::span<uint32_t> words) override;
  bool accept(int32_t id) override;
  bool finished() const override;
  void rollback(int n) override;

 private:
  enum class Phase : uint8_t { kThinking, kLeadingSpace, kGrammar, kDone };
  struct Step {
    Phase before;
    bool matcher_advanced;
  };
  bool is_stop(int32_t id) const;

  mutable grammar::Matcher m_;
  Options o_;
  Phase phase_;
  std::vector<Step> history_;
};

}  // namespace deltaflow::server
