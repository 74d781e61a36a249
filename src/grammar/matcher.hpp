// Grammar-constrained decoding: which token ids may come next, and advancing over the chosen one.
//
// The matcher is a pushdown automaton over bytes. A configuration is a stack of (rule automaton, state)
// frames; several may be live at once where the grammar is ambiguous. Stacks are interned in a StackPool as
// (parent, state) nodes, so copying and comparing one is an integer.
//
// The token mask (xgrammar's adaptive token mask cache): for each automaton state, computed once per
// compiled grammar and cached, the ids whose bytes are decided by that state alone (accepted: all bytes
// consumed inside the rule and the rules it calls; rejected) and the few "uncertain" ids that can only be
// decided with the frames below (the rule may end mid-token and the caller go on). At a step the mask is the
// cached accepted set of the top state plus the uncertain ids checked against the whole stack. A grammar
// without recursion is one automaton whose bottom frame has no caller, so nothing is uncertain and a mask is
// a copy of a cached bitset.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/automaton.hpp"
#include "grammar/vocabulary.hpp"

namespace deltaflow::grammar {

// Interned stacks. An id >= 0 is a node {parent, state}; an id < 0 is a frame with nothing known below it
// (state ~id), used for the context-independent walk; kBottom as a parent means "nothing below: the grammar
// ends when this frame does".
class StackPool {
 public:
  static constexpr int32_t kBottom = INT32_MIN;
  static constexpr int kMaxDepth = 256;

  int32_t node(int32_t parent, int32_t state);  // -1 when the stack would be deeper than kMaxDepth
  static int32_t floating(int32_t state) { return ~state; }
  int32_t state(int32_t s) const { return s < 0 ? ~s : nodes_[static_cast<size_t>(s)].state; }
  // The stack below the top frame; for a floating frame there is none (returns 0 with *floating set).
  int32_t parent(int32_t s) const { return nodes_[static_cast<size_t>(s)].parent; }
  int32_t with_state(int32_t s, int32_t state);  // the same stack with its top frame moved to `state`
  size_t size() const { return nodes_.size(); }

 private:
  struct Node {
    int32_t parent, state, depth;
  };
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> index_;
};

struct MaskEntry {
  std::vector<uint32_t> accepted;  // bitset over the vocabulary
  std::vector<int32_t> uncertain;  // ids decided only by the full stack
};

// An automaton with its vocabulary and mask cache; shared by every matcher of the same grammar (n > 1,
// repeated requests). Thread-safe.
class CompiledGrammar {
 public:
  CompiledGrammar(Automaton a, std::shared_ptr<const Vocabulary> vocab);

  const Automaton& automaton() const { return a_; }
  const Vocabulary& vocab() const { return *vocab_; }
  // The cached mask of a state (bottom: no frame below it). Computed on first use.
  const MaskEntry& entry(int32_t state, bool bottom);
  // Computes every entry now (benchmarks separate this cost from the per-token one).
  void precompute();
  size_t cached_entries() const;

 private:
  MaskEntry compute(int32_t state, bool bottom) const;

  Automaton a_;
  std::shared_ptr<const Vocabulary> vocab_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<MaskEntry>> cache_;  // [state * 2 + bottom]
};

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<CompiledGrammar> g);

  // Advances over the bytes of `id`; false (and no change) when the grammar does not allow them.
  bool accept_token(int32_t id);
  bool accept_bytes(std::string_view bytes);
  // Undoes the last n accepted tokens / byte strings.
  void rollback(int n);

  // Sets the bit of every id that may come next (clears the others): words.size() >= vocab().mask_words().
  void fill_mask(std::span<uint32_t> words);
  // The grammar may end here (a stop token may come next).
  bool can_end();
  // The grammar may end here and no byte can follow.
  bool finished();

  const CompiledGrammar& grammar() const { return *g_; }

 private:
  // Expands stacks into those that can consume a byte (calls pushed, ended rules popped).
  void closure(const std::vector<int32_t>& in, std::vector<int32_t>& out, bool& ended);
  bool step(const std::vector<int32_t>& from, std::string_view bytes, std::vector<int32_t>& to);

  std::shared_ptr<CompiledGrammar> g_;
  StackPool pool_;
  std::vector<int32_t> stacks_;                // current configurations (not yet expanded)
  std::vector<std::vector<int32_t>> history_;  // stacks_ before each accepted token
  std::vector<int32_t> scratch_a_, scratch_b_, work_;
  std::vector<std::vector<int32_t>> cfg_;  // fill_mask's walk: stacks after each prefix length
};

}  // namespace deltaflow::grammar
