// A Grammar compiled for matching: each rule that must stay a rule (one that reaches itself through
// references, and the root) becomes a deterministic automaton over bytes whose edges are bytes or calls of
// other rules; every other reference is inlined, so a grammar without recursion (most JSON schemas) is one
// automaton and its token masks are pure table lookups. States of all rules share one numbering.
#pragma once

#include <cstdint>
#include <vector>

#include "grammar/grammar.hpp"

namespace deltaflow::grammar {

struct Call {
  int32_t rule = 0;  // index into Automaton::rule_start
  int32_t ret = 0;   // the state the caller goes on from once the rule is matched
};

struct Automaton {
  static constexpr int32_t kNone = -1;
  std::vector<int32_t> next;         // [state * 256 + byte] -> state, or kNone
  std::vector<uint8_t> accepting;    // [state]: the rule may end here
  std::vector<uint8_t> can_consume;  // [state]: some byte edge leaves it
  std::vector<std::vector<Call>> calls;
  std::vector<int32_t> rule_start;  // [compiled rule] -> its start state
  std::vector<std::string> rule_names;
  int32_t root = 0;  // compiled rule index of the root

  size_t states() const { return accepting.size(); }
  int32_t step(int32_t state, uint8_t byte) const { return next[static_cast<size_t>(state) * 256 + byte]; }
};

// Limits that keep a hostile schema or grammar from taking the process down: exceeding one is a
// GrammarError that names it.
constexpr size_t kMaxNfaStates = 400'000;
constexpr size_t kMaxDfaStates = 60'000;
// NFA states summed over the DFA states' sets: bounds the subset construction's time where each state holds
// many (a pattern like ".*" followed by many "."s: under 0.2 s here, where 60,000 such states took 0.5 s).
constexpr size_t kMaxDfaEntries = 1'000'000;

// Throws GrammarError.
Automaton compile_automaton(const Grammar& g);

}  // namespace deltaflow::grammar
