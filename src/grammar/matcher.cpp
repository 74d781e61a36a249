#include "grammar/matcher.hpp"

#include <algorithm>

namespace deltaflow::grammar {

int32_t StackPool::node(int32_t parent, int32_t state) {
  const int32_t depth = parent == kBottom || parent < 0 ? 1 : nodes_[static_cast<size_t>(parent)].depth + 1;
  if (depth > kMaxDepth) return kBottom;
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(parent)) << 32) | static_cast<uint32_t>(state);
  auto [it, fresh] = index_.try_emplace(key, static_cast<int32_t>(nodes_.size()));
  if (fresh) nodes_.push_back({parent, state, depth});
  return it->second;
}

int32_t StackPool::with_state(int32_t s, int32_t state) {
  return s < 0 ? floating(state) : node(nodes_[static_cast<size_t>(s)].parent, state);
}

namespace {

inline void set_bit(std::span<uint32_t> w, int32_t id) {
  w[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
}

// Expands `in` into the stacks whose top state can consume a byte: calls are pushed and finished frames
// popped. Popping a floating frame sets `escaped` (the token goes on in an unknown caller); popping a frame
// on kBottom sets `ended` (the whole grammar may end here).
void expand(const Automaton& a, StackPool& pool, const std::vector<int32_t>& in, std::vector<int32_t>& out,
            std::vector<int32_t>& work, bool& escaped, bool& ended) {
  out.clear();
  bool simple = true;
  for (int32_t s : in) {
    const auto st = static_cast<size_t>(pool.state(s));
    if (!a.calls[st].empty() || a.accepting[st]) {
      simple = false;
      break;
    }
  }
  if (simple) {
    out = in;
    return;
  }
  work.assign(in.begin(), in.end());
  std::vector<int32_t> seen;
  while (!work.empty()) {
    const int32_t s = work.back();
    work.pop_back();
    if (std::find(seen.begin(), seen.end(), s) != seen.end()) continue;
    seen.push_back(s);
    const int32_t st = pool.state(s);
    if (a.can_consume[static_cast<size_t>(st)]) out.push_back(s);
    for (const Call& c : a.calls[static_cast<size_t>(st)]) {
      const int32_t caller = pool.with_state(s, c.ret);
      if (caller == StackPool::kBottom) continue;
      const int32_t callee = pool.node(caller, a.rule_start[static_cast<size_t>(c.rule)]);
      if (callee != StackPool::kBottom) work.push_back(callee);
    }
    if (a.accepting[static_cast<size_t>(st)]) {
      if (s < 0) {
        escaped = true;
      } else if (const int32_t p = pool.parent(s); p == StackPool::kBottom) {
        ended = true;
      } else {
        work.push_back(p);
      }
    }
  }
}

void step_byte(const Automaton& a, StackPool& pool, const std::vector<int32_t>& expanded, uint8_t byte,
               std::vector<int32_t>& out) {
  out.clear();
  for (int32_t s : expanded) {
    const int32_t n = a.step(pool.state(s), byte);
    if (n == Automaton::kNone) continue;
    const int32_t t = pool.with_state(s, n);
    if (t != StackPool::kBottom) out.push_back(t);
  }
  if (out.size() > 1) {
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
}

}  // namespace

CompiledGrammar::CompiledGrammar(Automaton a, std::shared_ptr<const Vocabulary> vocab)
    : a_(std::move(a)), vocab_(std::move(vocab)), cache_(a_.states() * 2) {}

const MaskEntry& CompiledGrammar::entry(int32_t state, bool bottom) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = cache_[static_cast<size_t>(state) * 2 + (bottom ? 1 : 0)];
  if (!slot) slot = std::make_unique<MaskEntry>(compute(state, bottom));
  return *slot;
}

size_t CompiledGrammar::cached_entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<size_t>(
      std::count_if(cache_.begin(), cache_.end(), [](auto& p) { return p != nullptr; }));
}

void CompiledGrammar::precompute() {
  // Bottom entries exist for the root rule's states: those reachable from its start through bytes and the
  // return states of calls.
  std::vector<uint8_t> in_root(a_.states(), 0);
  std::vector<int32_t> todo = {a_.rule_start[static_cast<size_t>(a_.root)]};
  while (!todo.empty()) {
    const int32_t s = todo.back();
    todo.pop_back();
    if (s < 0 || in_root[static_cast<size_t>(s)]) continue;
    in_root[static_cast<size_t>(s)] = 1;
    for (int b = 0; b < 256; ++b) todo.push_back(a_.step(s, static_cast<uint8_t>(b)));
    for (const Call& c : a_.calls[static_cast<size_t>(s)]) todo.push_back(c.ret);
  }
  for (size_t s = 0; s < a_.states(); ++s) {
    if (a_.rule_start.size() > 1 || !in_root[s]) entry(static_cast<int32_t>(s), false);
    if (in_root[s]) entry(static_cast<int32_t>(s), true);
  }
}

MaskEntry CompiledGrammar::compute(int32_t state, bool bottom) const {
  const Vocabulary& v = *vocab_;
  MaskEntry e;
  e.accepted.assign(v.mask_words(), 0);
  StackPool pool;
  // The walk starts from a floating frame either way: below a bottom frame there is nothing, so its end
  // only means that no further byte may follow (not an escape into an unknown caller).
  const int32_t init = StackPool::floating(state);
  const size_t max_len = v.max_token_bytes();
  // cfg[d]: the stacks after the first d bytes of the current token; esc[d]: the rule below which the walk
  // knows nothing may have ended within those d bytes.
  std::vector<std::vector<int32_t>> cfg(max_len + 1);
  std::vector<uint8_t> esc(max_len + 1, 0);
  std::vector<int32_t> expanded, work;
  cfg[0] = {init};
  size_t computed = 0;
  const auto& sorted = v.sorted();
  const auto& lcp = v.lcp();
  const size_t n = sorted.size();
  // A floating frame in a state without calls steps by a table lookup alone; so does one in an accepting
  // state when nothing lies below (bottom).
  auto simple = [&](int32_t st) {
    return a_.calls[static_cast<size_t>(st)].empty() && (bottom || !a_.accepting[static_cast<size_t>(st)]);
  };
  for (size_t k = 0; k < n;) {
    const std::string_view t = v.sorted_bytes(k);
    computed = std::min<size_t>(computed, lcp[k]);
    size_t d = computed;
    while (d < t.size() && (d == 0 || !cfg[d].empty())) {
      const std::vector<int32_t>& cur = cfg[d];
      std::vector<int32_t>& nxt = cfg[d + 1];
      const auto byte = static_cast<uint8_t>(t[d]);
      if (cur.size() == 1 && cur[0] < 0 && simple(~cur[0])) {
        const int32_t st = a_.step(~cur[0], byte);
        nxt.clear();
        if (st != Automaton::kNone) nxt.push_back(~st);
        esc[d + 1] = esc[d];
      } else {
        bool escaped = false, ended = false;
        expand(a_, pool, cur, expanded, work, escaped, ended);
        esc[d + 1] = esc[d] || (escaped && !bottom);
        step_byte(a_, pool, expanded, byte, nxt);
      }
      ++d;
    }
    computed = d;
    if (d == t.size() && !cfg[d].empty()) {
      set_bit(e.accepted, sorted[k]);
      ++k;
      continue;
    }
    // Dead after d bytes: every following id that shares those d bytes has the same fate. They are
    // contiguous in sorted order; a short scan, then a binary search for the end of a long block.
    size_t j = k + 1;
    for (int probe = 0; probe < 8 && j < n && lcp[j] >= d; ++probe) ++j;
    if (j < n && lcp[j] >= d) {
      const std::string_view prefix = t.substr(0, d);
      size_t lo = j, hi = n;
      while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (v.sorted_bytes(mid).substr(0, d) == prefix)
          lo = mid + 1;
        else
          hi = mid;
      }
      j = lo;
    }
    if (esc[d])
      for (size_t x = k; x < j; ++x) e.uncertain.push_back(sorted[x]);
    k = j;
  }
  return e;
}

Matcher::Matcher(std::shared_ptr<CompiledGrammar> g) : g_(std::move(g)) {
  const Automaton& a = g_->automaton();
  stacks_ = {pool_.node(StackPool::kBottom, a.rule_start[static_cast<size_t>(a.root)])};
}

bool Matcher::step(const std::vector<int32_t>& from, std::string_view bytes, std::vector<int32_t>& to) {
  const Automaton& a = g_->automaton();
  to = from;
  for (char c : bytes) {
    bool escaped = false, ended = false;
    expand(a, pool_, to, scratch_a_, work_, escaped, ended);
    step_byte(a, pool_, scratch_a_, static_cast<uint8_t>(c), to);
    if (to.empty()) return false;
  }
  return true;
}

bool Matcher::accept_bytes(std::string_view bytes) {
  std::vector<int32_t> next;
  if (!step(stacks_, bytes, next)) return false;
  history_.push_back(std::move(stacks_));
  stacks_ = std::move(next);
  return true;
}

bool Matcher::accept_token(int32_t id) {
  const Vocabulary& v = g_->vocab();
  if (id < 0 || static_cast<size_t>(id) >= v.ids()) return false;
  const std::string_view b = v.bytes(id);
  if (b.empty()) return false;
  return accept_bytes(b);
}

void Matcher::rollback(int n) {
  for (; n > 0 && !history_.empty(); --n) {
    stacks_ = std::move(history_.back());
    history_.pop_back();
  }
}

void Matcher::fill_mask(std::span<uint32_t> words) {
  std::fill(words.begin(), words.end(), 0u);
  const Vocabulary& v = g_->vocab();
  const Automaton& a = g_->automaton();
  if (cfg_.size() < v.max_token_bytes() + 1) cfg_.resize(v.max_token_bytes() + 1);
  for (int32_t s : stacks_) {
    const bool bottom = pool_.parent(s) == StackPool::kBottom;
    const MaskEntry& e = g_->entry(pool_.state(s), bottom);
    const size_t n = std::min(words.size(), e.accepted.size());
    for (size_t i = 0; i < n; ++i) words[i] |= e.accepted[i];
    // The uncertain ids come in sorted order: walk them against the real stack, reusing the states of the
    // prefix each shares with the one before (they mostly start alike: `",`, `"}`, `"]`, ...).
    cfg_[0] = {s};
    size_t computed = 0;
    std::string_view prev;
    for (int32_t id : e.uncertain) {
      const std::string_view t = v.bytes(id);
      size_t l = 0;
      while (l < prev.size() && l < t.size() && prev[l] == t[l]) ++l;
      prev = t;
      computed = std::min(computed, l);
      size_t d = computed;
      while (d < t.size() && (d == 0 || !cfg_[d].empty())) {
        bool escaped = false, ended = false;
        expand(a, pool_, cfg_[d], scratch_a_, work_, escaped, ended);
        step_byte(a, pool_, scratch_a_, static_cast<uint8_t>(t[d]), cfg_[d + 1]);
        ++d;
      }
      computed = d;
      if (d == t.size() && !cfg_[d].empty() && static_cast<size_t>(id) / 32 < words.size())
        set_bit(words, id);
    }
  }
}

bool Matcher::can_end() {
  bool escaped = false, ended = false;
  expand(g_->automaton(), pool_, stacks_, scratch_b_, work_, escaped, ended);
  return ended;
}

bool Matcher::finished() {
  bool escaped = false, ended = false;
  expand(g_->automaton(), pool_, stacks_, scratch_b_, work_, escaped, ended);
  return ended && scratch_b_.empty();
}

}  // namespace deltaflow::grammar
