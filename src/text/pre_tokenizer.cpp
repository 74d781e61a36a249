#include "text/pre_tokenizer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "text/tokenizer_unicode.hpp"

namespace deltaflow::text::tokenizer_impl {

// ---- MatchScratch ----

MatchScratch::MatchScratch() {
  // One ovector pair is enough: we only need the whole match (a short ovector makes pcre2_match return 0).
  data_ = pcre2_match_data_create(1, nullptr);
  context_ = pcre2_match_context_create(nullptr);
  // Bound backtracking so a hostile pattern cannot hang an encode.
  pcre2_set_match_limit(context_, 10'000'000);
  pcre2_set_depth_limit(context_, 100'000);
  jit_stack_ = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  if (jit_stack_ != nullptr) pcre2_jit_stack_assign(context_, nullptr, jit_stack_);
}

MatchScratch::~MatchScratch() {
  pcre2_jit_stack_free(jit_stack_);
  pcre2_match_context_free(context_);
  pcre2_match_data_free(data_);
}

// ---- Pattern rewrite ----

std::string onig_to_pcre2(std::string_view p) {
  // Oniguruma's Unicode \s: U+0009-000D, U+0085 and the Z categories (Zs, Zl, Zp) = White_Space.
  static constexpr std::string_view kSpace = R"(\t\n\x0B\f\r\x{85}\p{Z})";
  static constexpr std::string_view kWord = R"(\p{L}\p{M}\p{Nd}\p{Pc})";
  static constexpr std::string_view kHex = "0-9a-fA-F";
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  size_t class_body = 0;  // index where the class body starts (a ']' there is literal)
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[i + 1];
      if (d == 'Q') {  // \Q...\E: copy verbatim
        const size_t e = p.find("\\E", i + 2);
        const size_t stop = e == std::string_view::npos ? p.size() : e + 2;
        out.append(p.substr(i, stop - i));
        i = stop;
        continue;
      }
      std::string_view members;
      bool negated = false;
      switch (d) {
        case 's':
          members = kSpace;
          break;
        case 'S':
          members = kSpace;
          negated = true;
          break;
        case 'w':
          members = kWord;
          break;
        case 'W':
          members = kWord;
          negated = true;
          break;
        case 'h':
          members = kHex;
          break;
        case 'H':
          members = kHex;
          negated = true;
          break;
        default:
          break;
      }
      if (!members.empty() && !(in_class && negated)) {
        if (in_class) {
          out.append(members);
        } else {
          out.append(negated ? "[^" : "[");
          out.append(members);
          out.push_back(']');
        }
      } else {
        // Other escapes (and a negated class escape inside a class, which has no simple rewrite) pass
        // through.
        out.push_back(c);
        out.push_back(d);
      }
      i += 2;
      continue;
    }
    if (in_class) {
      if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX class [:alpha:]
        const size_t e = p.find(":]", i + 2);
        const size_t stop = e == std::string_view::npos ? i + 1 : e + 2;
        out.append(p.substr(i, stop - i));
        i = stop;
        continue;
      }
      if (c == ']' && i != class_body) in_class = false;
    } else if (c == '[') {
      in_class = true;
      class_body = i + 1;
      if (class_body < p.size() && p[class_body] == '^') ++class_body;
    }
    out.push_back(c);
    ++i;
  }
  return out;
}

// ---- Regex ----

core::Expected<Regex> Regex::compile(std::string_view pattern, bool literal) {
  Regex r;
  if (literal && pattern.empty()) {
    r.never_matches_ = true;
    return r;
  }
  std::string translated = literal ? std::string(pattern) : onig_to_pcre2(pattern);
  // PCRE2_LITERAL admits only a few options (UTF yes, UCP no).
  const uint32_t options = literal ? (PCRE2_UTF | PCRE2_LITERAL) : (PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE);
  pcre2_compile_context* cc = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   options, &err, &err_off, cc);
  pcre2_compile_context_free(cc);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return core::Error{"regex '" + std::string(pattern) + "' does not compile: " +
                       reinterpret_cast<const char*>(msg) + " at offset " + std::to_string(err_off)};
  }
  r.code_ = std::shared_ptr<pcre2_code>(code, pcre2_code_free);
  r.jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return r;
}

bool Regex::find_all(std::string_view s, MatchScratch& m, std::vector<std::pair<size_t, size_t>>& out) const {
  if (never_matches_ || !code_) return true;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  const size_t n = s.size();
  size_t last_end = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (last_end <= n) {
    const int rc =
        jit_ ? pcre2_jit_match(code_.get(), subject, n, last_end, 0, m.data(), m.context())
             : pcre2_match(code_.get(), subject, n, last_end, PCRE2_NO_UTF_CHECK, m.data(), m.context());
    if (rc == PCRE2_ERROR_NOMATCH) return true;
    if (rc < 0) return false;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data());
    const size_t ms = ov[0], me = ov[1];
    if (ms > me || me > n) return false;  // \K tricks; not a shape tokenizers' patterns produce
    if (ms == me && have_last && last_match_end == me) {
      // onig's find_iter: no empty match right after the previous match; step one character.
      last_end += last_end < n ? utf8_seq_len(static_cast<unsigned char>(s[last_end])) : 1;
      continue;
    }
    last_end = me;
    have_last = true;
    last_match_end = me;
    out.emplace_back(ms, me);
  }
  return true;
}

// ---- PreTokenizer ----

void PreTokenizer::run(std::string_view text, PreTokenizerScratch& scratch, EmitFn emit, void* ctx) const {
  if (scratch.levels.size() < steps_.size()) scratch.levels.resize(steps_.size());
  run_step(0, text, scratch, emit, ctx);
}

void PreTokenizer::run_step(size_t k, std::string_view piece, PreTokenizerScratch& scratch, EmitFn emit,
                            void* ctx) const {
  if (piece.empty()) return;
  if (k == steps_.size()) {
    emit(ctx, piece);
    return;
  }
  const PreTokenizerStep& step = steps_[k];
  auto& level = scratch.levels[k];
  if (step.kind == PreTokenizerStep::Kind::kByteLevel) {
    if (step.add_prefix_space && piece[0] != ' ') {
      level.buf.assign(1, ' ');
      level.buf.append(piece);
      piece = level.buf;
    }
    if (!step.has_regex) {
      run_step(k + 1, piece, scratch, emit, ctx);
      return;
    }
  }
  // Split (or ByteLevel's regex, isolated): tokenizers' NormalizedString::split.
  level.matches.clear();
  if (!step.regex.find_all(piece, scratch.match, level.matches)) {
    // PCRE2 gave up (resource limits): keep what was found and leave the rest unsplit.
  }
  // (offsets, is_match) covering the whole piece.
  auto& splits = level.splits;
  splits.clear();
  size_t prev = 0;
  for (const auto& [s, e] : level.matches) {
    if (s < prev) continue;
    if (prev != s) splits.push_back({{prev, s}, false});
    splits.push_back({{s, e}, true});
    prev = e;
  }
  if (prev != piece.size()) splits.push_back({{prev, piece.size()}, false});
  if (step.invert)
    for (auto& sp : splits) sp.second = !sp.second;

  // Each entry becomes (offsets, remove?) per the delimiter behaviour.
  const SplitBehavior behavior =
      step.kind == PreTokenizerStep::Kind::kByteLevel ? SplitBehavior::kIsolated : step.behavior;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (auto& sp : splits) sp.second = false;
      break;
    case SplitBehavior::kRemoved:
      break;
    case SplitBehavior::kContiguous: {
      size_t w = 0;
      bool previous_match = false;
      for (size_t r = 0; r < splits.size(); ++r) {
        const bool is_match = splits[r].second;
        if (is_match == previous_match && w > 0) {
          splits[w - 1].first.second = splits[r].first.second;
        } else {
          splits[w++] = {splits[r].first, false};
        }
        previous_match = is_match;
      }
      splits.resize(w);
      break;
    }
    case SplitBehavior::kMergedWithPrevious: {
      size_t w = 0;
      bool previous_match = false;
      for (size_t r = 0; r < splits.size(); ++r) {
        const bool is_match = splits[r].second;
        if (is_match && !previous_match && w > 0) {
          splits[w - 1].first.second = splits[r].first.second;
        } else {
          splits[w++] = {splits[r].first, false};
        }
        previous_match = is_match;
      }
      splits.resize(w);
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      // Folded from the right, then reversed, as tokenizers does.
      std::vector<std::pair<std::pair<size_t, size_t>, bool>> acc;
      acc.reserve(splits.size());
      bool previous_match = false;
      for (size_t r = splits.size(); r-- > 0;) {
        const bool is_match = splits[r].second;
        if (is_match && !previous_match && !acc.empty()) {
          acc.back().first.first = splits[r].first.first;
        } else {
          acc.push_back({splits[r].first, false});
        }
        previous_match = is_match;
      }
      splits.assign(acc.rbegin(), acc.rend());
      break;
    }
  }
  // Recursion into later steps may reuse deeper levels only, so iterating our own list is safe; copy the
  // piece view first since `level.buf` (which it may point into) stays untouched below this level.
  for (size_t idx = 0; idx < splits.size(); ++idx) {
    const auto [b, e] = splits[idx].first;
    if (splits[idx].second || e <= b) continue;
    run_step(k + 1, piece.substr(b, e - b), scratch, emit, ctx);
  }
}

}  // namespace deltaflow::text::tokenizer_impl
