#include "text/content_literals.hpp"

#include <algorithm>
#include <array>
#include <cstdint>

namespace deltaflow::text {

using Json = nlohmann::ordered_json;

namespace {

// U+E000 + k as UTF-8 (k < 6400: the Private Use Area).
std::string private_use(size_t k) {
  const uint32_t cp = 0xE000u + static_cast<uint32_t>(k);
  std::string s;
  s += static_cast<char>(0xE0 | (cp >> 12));
  s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
  s += static_cast<char>(0x80 | (cp & 0x3F));
  return s;
}

}  // namespace

ContentLiterals::ContentLiterals(std::vector<std::string> tokens, std::string_view avoid) : avoid_(avoid) {
  for (auto& t : tokens)
    if (!t.empty()) tokens_.push_back(std::move(t));
  std::stable_sort(tokens_.begin(), tokens_.end(),
                   [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  pick(0);
}

void ContentLiterals::pick(size_t from) {
  // 3,200 pairs of the Private Use Area; a text that holds all of them leaves the last pair (and is 19 KB of
  // private-use characters: it gets an exact, if odd, rendering of those characters).
  for (candidate_ = from; candidate_ + 1 < 3200; ++candidate_) {
    open_ = private_use(2 * candidate_);
    close_ = private_use(2 * candidate_ + 1);
    if (avoid_.find(open_) == std::string::npos && avoid_.find(close_) == std::string::npos) return;
  }
}

bool ContentLiterals::occurs(const Json& j) const {
  auto in = [&](const std::string& s) {
    return s.find(open_) != std::string::npos || s.find(close_) != std::string::npos;
  };
  if (j.is_string()) return in(j.get_ref<const std::string&>());
  if (j.is_array()) return std::any_of(j.begin(), j.end(), [&](const Json& e) { return occurs(e); });
  if (j.is_object())
    for (auto it = j.begin(); it != j.end(); ++it)
      if (in(it.key()) || occurs(it.value())) return true;
  return false;
}

std::string ContentLiterals::escape_string(std::string_view s) const {
  std::array<bool, 256> first{};
  for (const auto& t : tokens_) first[static_cast<unsigned char>(t[0])] = true;
  std::string out;
  size_t copied = 0;
  for (size_t i = 0; i < s.size();) {
    if (!first[static_cast<unsigned char>(s[i])]) {
      ++i;
      continue;
    }
    size_t k = 0;
    while (k < tokens_.size() && s.compare(i, tokens_[k].size(), tokens_[k]) != 0) ++k;
    if (k == tokens_.size()) {
      ++i;
      continue;
    }
    out.append(s, copied, i - copied);
    out += open_ + std::to_string(k) + close_;
    i += tokens_[k].size();
    copied = i;
  }
  if (copied == 0) return std::string(s);
  out.append(s, copied, std::string_view::npos);
  return out;
}

Json ContentLiterals::escape_rec(const Json& j) const {
  if (j.is_string()) return escape_string(j.get_ref<const std::string&>());
  if (j.is_array()) {
    Json out = Json::array();
    for (const auto& e : j) out.push_back(escape_rec(e));
    return out;
  }
  if (j.is_object()) {
    Json out = Json::object();
    for (auto it = j.begin(); it != j.end(); ++it) out[escape_string(it.key())] = escape_rec(it.value());
    return out;
  }
  return j;
}

void ContentLiterals::prepare(const Json& inputs) {
  if (!active()) return;
  while (occurs(inputs) && candidate_ + 2 < 3200) pick(candidate_ + 1);
}

Json ContentLiterals::escape(const Json& j) const {
  return active() ? escape_rec(j) : j;
}

std::string ContentLiterals::resolve(std::string_view rendered, std::vector<TextSpan>& literal) const {
  if (!active()) return std::string(rendered);
  std::string out;
  out.reserve(rendered.size());
  size_t i = 0;
  while (i < rendered.size()) {
    const size_t at = rendered.find(open_, i);
    if (at == std::string_view::npos) break;
    out.append(rendered, i, at - i);
    size_t p = at + open_.size();
    size_t index = 0, digits = 0;
    while (p < rendered.size() && rendered[p] >= '0' && rendered[p] <= '9' && digits < 6) {
      index = index * 10 + static_cast<size_t>(rendered[p] - '0');
      ++p;
      ++digits;
    }
    if (digits > 0 && index < tokens_.size() && rendered.compare(p, close_.size(), close_) == 0) {
      literal.push_back({out.size(), out.size() + tokens_[index].size()});
      out += tokens_[index];
      i = p + close_.size();
    } else {  // cut by the template (a slice): keep what is there, as text
      out += open_;
      i = at + open_.size();
    }
  }
  out.append(rendered, i, std::string_view::npos);
  return out;
}

}  // namespace deltaflow::text
