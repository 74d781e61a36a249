#include "grammar/compile.hpp"

#include "grammar/regex.hpp"

namespace deltaflow::grammar {

Grammar grammar_from_regex(std::string_view pattern) {
  Grammar g;
  const int32_t root = g.new_rule("root");
  g.define(root, parse_regex(g, pattern, false));
  g.set_root(root);
  return g;
}

Grammar grammar_from_choices(const std::vector<std::string>& choices) {
  if (choices.empty()) throw GrammarError("the choice list is empty");
  Grammar g;
  std::vector<int32_t> alts;
  for (const auto& c : choices) {
    if (c.empty()) throw GrammarError("a choice is empty");
    alts.push_back(g.literal(c));
  }
  const int32_t root = g.new_rule("root");
  g.define(root, g.alt(std::move(alts)));
  g.set_root(root);
  return g;
}

std::shared_ptr<CompiledGrammar> compile_grammar(const Grammar& g, std::shared_ptr<const Vocabulary> vocab) {
  return std::make_shared<CompiledGrammar>(compile_automaton(g), std::move(vocab));
}

std::shared_ptr<CompiledGrammar> GrammarCache::get(const std::string& key,
                                                   const std::function<Grammar()>& make,
                                                   const std::shared_ptr<const Vocabulary>& vocab) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(key); it != index_.end() && &it->second->second->vocab() == vocab.get()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      return it->second->second;
    }
  }
  auto compiled = compile_grammar(make(), vocab);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(key); it != index_.end()) {
    lru_.erase(it->second);
    index_.erase(it);
  }
  lru_.emplace_front(key, compiled);
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return compiled;
}

}  // namespace deltaflow::grammar
