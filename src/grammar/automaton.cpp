#include "grammar/automaton.hpp"

#include <algorithm>
#include <map>
#include <span>
#include <unordered_map>

namespace deltaflow::grammar {

namespace {

struct ByteEdge {
  uint8_t lo, hi;
  int32_t to;
};
struct CallEdge {
  int32_t rule;  // grammar rule index
  int32_t to;
};
struct NState {
  std::vector<ByteEdge> bytes;
  std::vector<int32_t> eps;
  std::vector<CallEdge> calls;
};

// The UTF-8 byte-range sequences that encode exactly the code points [lo, hi] (same encoded length, no
// surrogates): the splitting of Rust's regex-syntax utf8 module.
using ByteSeq = std::vector<std::pair<uint8_t, uint8_t>>;

void utf8_split_same_length(uint32_t lo, uint32_t hi, std::vector<ByteSeq>& out) {
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_split_same_length(lo, lo | m, out);
        utf8_split_same_length((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_split_same_length(lo, (hi & ~m) - 1, out);
        utf8_split_same_length(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  append_utf8(a, lo);
  append_utf8(b, hi);
  ByteSeq s;
  for (size_t k = 0; k < a.size(); ++k)
    s.emplace_back(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k]));
  out.push_back(std::move(s));
}

void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteSeq>& out) {
  static constexpr uint32_t kBounds[][2] = {
      {0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, 0x10FFFF}};
  for (const auto& bnd : kBounds) {
    const uint32_t a = std::max(lo, bnd[0]), b = std::min(hi, bnd[1]);
    if (a <= b) utf8_split_same_length(a, b, out);
  }
}

class Builder {
 public:
  Builder(const Grammar& g, const std::vector<uint8_t>& recursive) : g_(g), recursive_(recursive) {}

  int32_t add_state() {
    if (states_.size() >= kMaxNfaStates)
      throw GrammarError("the grammar is too large (more than " + std::to_string(kMaxNfaStates) +
                         " automaton states); lower the bounds on repeats, lengths or items");
    states_.emplace_back();
    return static_cast<int32_t>(states_.size() - 1);
  }

  void build(int32_t ei, int32_t from, int32_t to, int depth) {
    if (depth > 200) throw GrammarError("the grammar nests too deeply");
    const Expr& e = g_.expr(ei);
    switch (e.kind) {
      case Expr::Kind::kEmpty:
        st(from).eps.push_back(to);
        return;
      case Expr::Kind::kBytes: {
        int32_t cur = from;
        for (size_t k = 0; k < e.bytes.size(); ++k) {
          const int32_t nx = k + 1 == e.bytes.size() ? to : add_state();
          const auto c = static_cast<uint8_t>(e.bytes[k]);
          st(cur).bytes.push_back({c, c, nx});
          cur = nx;
        }
        return;
      }
      case Expr::Kind::kClass: {
        std::vector<ByteSeq> seqs;
        for (const auto& r : positive_ranges(e.ranges, e.negated)) utf8_sequences(r.lo, r.hi, seqs);
        // Sequences sharing their leading byte ranges share states (a small trie), which keeps the
        // automaton of a wide class (any character) small.
        std::map<std::pair<int32_t, std::pair<uint8_t, uint8_t>>, int32_t> shared;
        for (const auto& s : seqs) {
          int32_t cur = from;
          for (size_t k = 0; k < s.size(); ++k) {
            if (k + 1 == s.size()) {
              st(cur).bytes.push_back({s[k].first, s[k].second, to});
              break;
            }
            auto key = std::make_pair(cur, s[k]);
            auto it = shared.find(key);
            if (it == shared.end()) {
              const int32_t nx = add_state();
              st(cur).bytes.push_back({s[k].first, s[k].second, nx});
              it = shared.emplace(key, nx).first;
            }
            cur = it->second;
          }
        }
        return;
      }
      case Expr::Kind::kSeq: {
        int32_t cur = from;
        for (size_t k = 0; k < e.children.size(); ++k) {
          const int32_t nx = k + 1 == e.children.size() ? to : add_state();
          build(e.children[k], cur, nx, depth + 1);
          cur = nx;
        }
        return;
      }
      case Expr::Kind::kAlt:
        for (int32_t c : e.children) {
          // Own entry and exit states keep one alternative's loops from leaking into another.
          const int32_t a = add_state(), b = add_state();
          st(from).eps.push_back(a);
          build(c, a, b, depth + 1);
          st(b).eps.push_back(to);
        }
        return;
      case Expr::Kind::kRepeat: {
        int32_t cur = from;
        for (int32_t k = 0; k < e.min; ++k) {
          const int32_t nx = add_state();
          build(e.children[0], cur, nx, depth + 1);
          cur = nx;
        }
        if (e.max < 0) {
          const int32_t loop = add_state(), body_end = add_state();
          st(cur).eps.push_back(loop);
          build(e.children[0], loop, body_end, depth + 1);
          st(body_end).eps.push_back(loop);
          st(loop).eps.push_back(to);
        } else {
          for (int32_t k = e.min; k < e.max; ++k) {
            st(cur).eps.push_back(to);
            const int32_t nx = add_state();
            build(e.children[0], cur, nx, depth + 1);
            cur = nx;
          }
          st(cur).eps.push_back(to);
        }
        return;
      }
      case Expr::Kind::kRef: {
        if (recursive_[static_cast<size_t>(e.rule)]) {
          st(from).calls.push_back({e.rule, to});
        } else {
          build(g_.rules()[static_cast<size_t>(e.rule)].body, from, to, depth + 1);
        }
        return;
      }
    }
  }

  NState& st(int32_t i) { return states_[static_cast<size_t>(i)]; }
  std::vector<NState>& states() { return states_; }

 private:
  const Grammar& g_;
  const std::vector<uint8_t>& recursive_;
  std::vector<NState> states_;
};

// Rules that reach themselves through references stay rules; the rest are inlined.
std::vector<uint8_t> find_recursive(const Grammar& g) {
  const size_t n = g.rules().size();
  std::vector<std::vector<int32_t>> refs(n);
  for (size_t r = 0; r < n; ++r) {
    std::vector<int32_t> todo = {g.rules()[r].body};
    while (!todo.empty()) {
      const Expr& e = g.expr(todo.back());
      todo.pop_back();
      if (e.kind == Expr::Kind::kRef) refs[r].push_back(e.rule);
      for (int32_t c : e.children) todo.push_back(c);
    }
  }
  std::vector<uint8_t> rec(n, 0);
  for (size_t r = 0; r < n; ++r) {
    std::vector<uint8_t> seen(n, 0);
    std::vector<int32_t> todo(refs[r].begin(), refs[r].end());
    while (!todo.empty() && !rec[r]) {
      const auto x = static_cast<size_t>(todo.back());
      todo.pop_back();
      if (x == r) rec[r] = 1;
      if (seen[x]) continue;
      seen[x] = 1;
      for (int32_t y : refs[x]) todo.push_back(y);
    }
  }
  return rec;
}

}  // namespace

Automaton compile_automaton(const Grammar& g) {
  g.check();
  std::vector<uint8_t> recursive = find_recursive(g);
  Builder b(g, recursive);

  // The rules to compile: the root, and every recursive rule (called, never inlined).
  std::vector<int32_t> compiled;  // grammar rule ids
  std::vector<int32_t> compiled_of(g.rules().size(), -1);
  compiled.push_back(g.root());
  compiled_of[static_cast<size_t>(g.root())] = 0;
  for (size_t r = 0; r < g.rules().size(); ++r)
    if (recursive[r] && compiled_of[r] < 0) {
      compiled_of[r] = static_cast<int32_t>(compiled.size());
      compiled.push_back(static_cast<int32_t>(r));
    }
  std::vector<std::pair<int32_t, int32_t>> nfa_ends;  // per compiled rule: start, accept
  for (int32_t r : compiled) {
    const int32_t s = b.add_state(), t = b.add_state();
    b.build(g.rules()[static_cast<size_t>(r)].body, s, t, 0);
    nfa_ends.emplace_back(s, t);
  }

  auto& ns = b.states();
  std::vector<uint8_t> is_accept(ns.size(), 0);
  for (auto& [s, t] : nfa_ends) is_accept[static_cast<size_t>(t)] = 1;

  Automaton a;
  // The DFA states' NFA-state sets, all in one array (`set_begin[d]` .. `set_begin[d + 1]`), found by hash:
  // a hostile pattern makes tens of thousands of sets, and one allocation per set (or a second copy as a map
  // key) was most of the construction's time under ASan.
  std::vector<int32_t> set_items;
  std::vector<size_t> set_begin = {0};
  std::unordered_multimap<uint64_t, int32_t> ids;
  const auto set_of = [&](size_t d) {
    return std::span<const int32_t>(set_items.data() + set_begin[d], set_begin[d + 1] - set_begin[d]);
  };
  const auto hash_of = [](std::span<const int32_t> v) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 0x100000001b3ull;
    return h ^ (h >> 29);
  };
  std::vector<uint32_t> mark(ns.size(), 0);
  uint32_t epoch = 0;
  std::vector<int32_t> closure_out;
  // The epsilon closure of `seed` (consumed), sorted, in closure_out.
  auto closure = [&](std::vector<int32_t>& seed) {
    ++epoch;
    closure_out.clear();
    while (!seed.empty()) {
      const int32_t x = seed.back();
      seed.pop_back();
      if (mark[static_cast<size_t>(x)] == epoch) continue;
      mark[static_cast<size_t>(x)] = epoch;
      closure_out.push_back(x);
      for (int32_t y : ns[static_cast<size_t>(x)].eps) seed.push_back(y);
    }
    std::sort(closure_out.begin(), closure_out.end());
  };
  // The DFA state of the set in closure_out, made if new.
  auto intern = [&]() -> int32_t {
    if (closure_out.empty()) return Automaton::kNone;
    const std::span<const int32_t> set(closure_out);
    const uint64_t h = hash_of(set);
    for (auto [it, last] = ids.equal_range(h); it != last; ++it) {
      const auto other = set_of(static_cast<size_t>(it->second));
      if (std::equal(set.begin(), set.end(), other.begin(), other.end())) return it->second;
    }
    const size_t n_sets = set_begin.size() - 1;
    if (n_sets >= kMaxDfaStates)
      throw GrammarError("the grammar is too large (more than " + std::to_string(kMaxDfaStates) +
                         " automaton states); lower the bounds on repeats, lengths or items");
    if (set_items.size() + set.size() > kMaxDfaEntries)
      throw GrammarError("the grammar is too large (its automaton states hold more than " +
                         std::to_string(kMaxDfaEntries) +
                         " pattern positions); lower the bounds on repeats, lengths or items, or make a "
                         "pattern's '.*' less ambiguous");
    const auto id = static_cast<int32_t>(n_sets);
    ids.emplace(h, id);
    set_items.insert(set_items.end(), set.begin(), set.end());
    set_begin.push_back(set_items.size());
    return id;
  };
  std::vector<int32_t> seed;
  for (auto& [s, t] : nfa_ends) {
    seed.assign(1, s);
    closure(seed);
    a.rule_start.push_back(intern());
  }
  for (int32_t r : compiled) a.rule_names.push_back(g.rules()[static_cast<size_t>(r)].name);
  a.root = 0;

  // Each state's byte edges as ranges, written into the 256-entry rows once the state count is known.
  struct Range {
    int32_t state, target;
    int lo, hi;
  };
  std::vector<Range> ranges;
  std::vector<ByteEdge> edges;
  std::vector<int> cuts;
  std::vector<std::vector<int32_t>> range_targets;
  for (size_t d = 0; d + 1 < set_begin.size(); ++d) {
    a.accepting.push_back(0);
    a.can_consume.push_back(0);
    a.calls.emplace_back();
    edges.clear();
    std::map<int32_t, std::vector<int32_t>> call_targets;
    for (size_t i = set_begin[d]; i < set_begin[d + 1]; ++i) {
      const int32_t x = set_items[i];  // by index: intern() grows set_items
      const NState& s = ns[static_cast<size_t>(x)];
      if (is_accept[static_cast<size_t>(x)]) a.accepting[d] = 1;
      edges.insert(edges.end(), s.bytes.begin(), s.bytes.end());
      for (const auto& c : s.calls) call_targets[c.rule].push_back(c.to);
    }
    cuts.assign({0, 256});
    for (const auto& e : edges) {
      cuts.push_back(e.lo);
      cuts.push_back(e.hi + 1);
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    // The byte ranges between cuts, each with the targets of the edges that cover it (each edge lands in
    // the ranges it spans, found by binary search: work in proportion to what the ranges receive).
    if (range_targets.size() < cuts.size() - 1) range_targets.resize(cuts.size() - 1);
    for (const auto& e : edges) {
      const auto first = std::lower_bound(cuts.begin(), cuts.end(), static_cast<int>(e.lo)) - cuts.begin();
      for (auto k = first; cuts[static_cast<size_t>(k)] <= e.hi; ++k)
        range_targets[static_cast<size_t>(k)].push_back(e.to);
    }
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      if (range_targets[k].empty()) continue;
      closure(range_targets[k]);  // leaves range_targets[k] empty for the next state
      const int32_t t = intern();
      ranges.push_back({static_cast<int32_t>(d), t, cuts[k], cuts[k + 1] - 1});
      a.can_consume[d] = 1;
    }
    for (auto& [rule, targets] : call_targets) {
      closure(targets);
      a.calls[d].push_back({compiled_of[static_cast<size_t>(rule)], intern()});
    }
  }
  a.next.assign(a.accepting.size() * 256, Automaton::kNone);
  for (const Range& r : ranges)
    std::fill_n(a.next.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(r.state) * 256 + r.lo),
                r.hi - r.lo + 1, r.target);
  return a;
}

}  // namespace deltaflow::grammar
