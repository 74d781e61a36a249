// The entry points: a grammar from each kind of request (regex, choice list; JSON schema and EBNF live in
// json_schema.hpp and ebnf.hpp), compiled for a vocabulary, and a cache of compiled grammars so repeated
// requests with the same schema reuse its token masks.
#pragma once

#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "grammar/matcher.hpp"

namespace deltaflow::grammar {

Grammar grammar_from_regex(std::string_view pattern);
Grammar grammar_from_choices(const std::vector<std::string>& choices);

// Throws GrammarError (too many states).
std::shared_ptr<CompiledGrammar> compile_grammar(const Grammar& g, std::shared_ptr<const Vocabulary> vocab);

class GrammarCache {
 public:
  explicit GrammarCache(size_t capacity = 32) : capacity_(capacity) {}
  // The compiled grammar for `key` (the request's kind and text), built with `make` on a miss. Throws what
  // `make` or the compilation throws.
  std::shared_ptr<CompiledGrammar> get(const std::string& key, const std::function<Grammar()>& make,
                                       const std::shared_ptr<const Vocabulary>& vocab);

 private:
  size_t capacity_;
  std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<CompiledGrammar>>> lru_;  // most recent first
  std::unordered_map<std::string, decltype(lru_)::iterator> index_;
};

}  // namespace deltaflow::grammar
