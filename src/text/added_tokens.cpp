#include "text/added_tokens.hpp"

#include <algorithm>
#include <cstring>

#include "text/tokenizer_unicode.hpp"

namespace deltaflow::text::tokenizer_impl {

// ---- TokenTrie ----

void TokenTrie::build(const std::vector<std::string>& patterns) {
  nodes_.assign(1, Node{});
  edges_.clear();
  first_byte_.fill(false);
  for (size_t p = 0; p < patterns.size(); ++p) {
    const std::string& s = patterns[p];
    if (s.empty()) continue;
    first_byte_[static_cast<unsigned char>(s[0])] = true;
    int32_t node = 0;
    for (char ch : s) {
      const auto b = static_cast<unsigned char>(ch);
      int32_t next = child(node, b);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.push_back(Node{});
        edges_.emplace((uint64_t(uint32_t(node)) << 8) | b, next);
      }
      node = next;
    }
    // With equal patterns the first one wins, as in aho-corasick.
    if (nodes_[static_cast<size_t>(node)].pattern < 0)
      nodes_[static_cast<size_t>(node)].pattern = static_cast<int64_t>(p);
  }
}

void TokenTrie::find_all(std::string_view s, std::vector<Match>& out) const {
  out.clear();
  if (empty()) return;
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (!first_byte_[static_cast<unsigned char>(s[i])]) {
      ++i;
      continue;
    }
    int32_t node = 0;
    int64_t best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < n; ++j) {
      node = child(node, static_cast<unsigned char>(s[j]));
      if (node < 0) break;
      if (nodes_[static_cast<size_t>(node)].pattern >= 0) {
        best = nodes_[static_cast<size_t>(node)].pattern;
        best_end = j + 1;
      }
    }
    if (best >= 0) {
      out.push_back({i, best_end, static_cast<size_t>(best)});
      i = best_end;
    } else {
      ++i;
    }
  }
}

// ---- AddedVocabulary ----

int32_t AddedVocabulary::resolve_id(const std::string& content, const BpeModel& model) const {
  if (auto it = by_content_.find(content); it != by_content_.end()) return it->second;
  if (auto id = model.token_to_id(content)) return *id;
  return -1;
}

void AddedVocabulary::add_tokens(const std::vector<AddedToken>& tokens, const BpeModel& model,
                                 const Normalizer& normalizer) {
  model_size_ = model.size();
  for (const auto& t : tokens) {
    if (t.special && !t.content.empty() && !special_set_.count(t.content)) {
      special_.push_back(t);
      special_set_.insert(t.content);
    }
  }
  for (const auto& t : tokens) {
    if (t.content.empty()) continue;
    // An identical token is ignored. (Content always keeps its first id, so the only candidate is there.)
    if (auto it = by_content_.find(t.content); it != by_content_.end()) {
      auto e = by_id_.find(it->second);
      if (e != by_id_.end() && e->second == t) continue;
    }
    int32_t id = resolve_id(t.content, model);
    if (id < 0) {
      // tokenizers: the next id after the largest added id, or the model's vocabulary size.
      const auto vsize = static_cast<int64_t>(model_size_);
      const int64_t max_id = max_added_id_;
      if (max_id < 0)
        id = static_cast<int32_t>(vsize);
      else
        id = static_cast<int32_t>((max_id >= vsize || vsize == 0) ? max_id + 1 : vsize);
    }
    if (t.normalized && !normalizer.empty() && is_valid_utf8(t.content)) {
      std::string buf;
      const std::string_view normed = normalizer.apply(t.content, buf);
      if (normed != t.content) normalized_form_[id] = std::string(normed);
    }
    by_content_[t.content] = id;
    max_added_id_ = std::max<int64_t>(max_added_id_, id);
    by_id_[id] = t;
    if (!special_set_.count(t.content)) added_.push_back(t);
  }
  refresh(model, normalizer);
}

void AddedVocabulary::refresh(const BpeModel& model, const Normalizer& normalizer) {
  std::vector<std::string> raw_patterns, norm_patterns;
  raw_.ids.clear();
  normalized_.ids.clear();
  std::string buf;
  auto visit = [&](const AddedToken& t) {
    const int32_t id = resolve_id(t.content, model);
    if (t.normalized) {
      std::string_view v = t.content;
      if (!normalizer.empty() && is_valid_utf8(v)) v = normalizer.apply(v, buf);
      norm_patterns.emplace_back(v);
      normalized_.ids.push_back(id);
    } else {
      raw_patterns.push_back(t.content);
      raw_.ids.push_back(id);
    }
  };
  for (const auto& t : special_) visit(t);
  for (const auto& t : added_) visit(t);
  raw_.trie.build(raw_patterns);
  normalized_.trie.build(norm_patterns);
}

namespace {

// Last / first code point of a valid UTF-8 string.
char32_t last_char(std::string_view s) {
  size_t i = s.size();
  while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i;
  if (i == 0) return 0;
  size_t len;
  return decode_utf8(s, i - 1, len);
}

char32_t first_char(std::string_view s) {
  size_t len;
  return decode_utf8(s, 0, len);
}

// Start of the run of white space that ends s (tokenizers: regex \s*$).
size_t trailing_space_start(std::string_view s) {
  size_t i = s.size();
  while (i > 0) {
    size_t j = i - 1;
    while (j > 0 && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) --j;
    size_t len;
    if (!is_white_space(decode_utf8(s, j, len))) break;
    i = j;
  }
  return i;
}

// Length of the run of white space that starts s (tokenizers: regex ^\s*).
size_t leading_space_len(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t len;
    if (!is_white_space(decode_utf8(s, i, len))) break;
    i += len;
  }
  return i;
}

}  // namespace

void AddedVocabulary::split(std::string_view sentence, bool normalized_set, std::vector<Split>& out,
                            std::span<const TextSpan> literal, bool no_special) const {
  out.clear();
  const MatchingSet& set = normalized_set ? normalized_ : raw_;
  if (sentence.empty()) return;
  thread_local std::vector<TokenTrie::Match> matches;
  set.trie.find_all(sentence, matches);
  size_t start_offset = 0;
  for (const auto& m : matches) {
    size_t start = m.begin, stop = m.end;
    const int32_t id = set.ids[m.pattern];
    const AddedToken* tok = token_of(id);
    if (tok == nullptr) continue;
    if (no_special && tok->special) continue;
    if (!literal.empty()) {
      auto after = std::lower_bound(literal.begin(), literal.end(), start,
                                    [](const TextSpan& l, size_t pos) { return l.end <= pos; });
      if (after != literal.end() && after->begin < stop) continue;  // overlaps a literal range
    }
    if (tok->single_word) {
      const bool start_space = start == 0 || !is_word_char(last_char(sentence.substr(0, start)));
      const bool stop_space = stop == sentence.size() || !is_word_char(first_char(sentence.substr(stop)));
      if (!start_space || !stop_space) continue;
    }
    if (tok->lstrip) start = std::max(trailing_space_start(sentence.substr(0, start)), start_offset);
    if (tok->rstrip) stop += leading_space_len(sentence.substr(stop));
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, id});
    start_offset = stop;
  }
  if (start_offset < sentence.size()) out.push_back({start_offset, sentence.size(), -1});
}

std::optional<int32_t> AddedVocabulary::token_to_id(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

const AddedToken* AddedVocabulary::token_of(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

const std::string* AddedVocabulary::decode_form(int32_t id) const {
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return nullptr;
  auto n = normalized_form_.find(id);
  return n == normalized_form_.end() ? &it->second.content : &n->second;
}

std::vector<std::pair<int32_t, AddedToken>> AddedVocabulary::tokens_by_id() const {
  std::vector<std::pair<int32_t, AddedToken>> v(by_id_.begin(), by_id_.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return v;
}

}  // namespace deltaflow::text::tokenizer_impl
