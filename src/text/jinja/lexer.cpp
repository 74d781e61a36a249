#include "text/jinja/lexer.hpp"

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "text/jinja/error.hpp"
#include "text/jinja/pystr.hpp"

namespace deltaflow::text::jinja {

std::string normalize_source(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    char c = source[i];
    if (c == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(c);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

namespace {

[[noreturn]] void syntax_error(const std::string& msg, size_t off) {
  throw_error("TemplateSyntaxError", msg, off);
}

class Lexer {
 public:
  Lexer(const std::string& src, const LexerOptions& opt) : s_(src), n_(src.size()), opt_(opt) {}

  std::vector<Token> run() {
    while (pos_ < n_) root();
    Token eof{Tok::kEof, "", 0, 0, n_};
    out_.push_back(eof);
    return std::move(out_);
  }

 private:
  const std::string& s_;
  size_t n_;
  LexerOptions opt_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  std::vector<Token> out_;

  // Python's \s at position i: returns the byte length of the whitespace character there, or 0.
  size_t space_at(size_t i) const {
    unsigned char c = static_cast<unsigned char>(s_[i]);
    if (c < 0x80) return py::is_space(c) ? 1 : 0;
    if (c == 0xC2 && i + 1 < n_) {
      unsigned char d = static_cast<unsigned char>(s_[i + 1]);
      return (d == 0x85 || d == 0xA0) ? 2 : 0;
    }
    if ((c == 0xE1 || c == 0xE2 || c == 0xE3) && i + 2 < n_) {
      char32_t cp = ((c & 0x0F) << 12) | ((s_[i + 1] & 0x3F) << 6) | (s_[i + 2] & 0x3F);
      if ((static_cast<unsigned char>(s_[i + 1]) & 0xC0) != 0x80) return 0;
      return py::is_space(cp) ? 3 : 0;
    }
    return 0;
  }
  size_t skip_spaces(size_t i) const {
    while (i < n_) {
      size_t k = space_at(i);
      if (!k) break;
      i += k;
    }
    return i;
  }
  bool starts(size_t i, std::string_view lit) const { return s_.compare(i, lit.size(), lit) == 0; }

  void emit(Tok t, std::string v, size_t off) {
    Token tok;
    tok.type = t;
    tok.value = std::move(v);
    tok.offset = off;
    out_.push_back(std::move(tok));
  }

  // jinja2's OptionalLStrip: the text before a tag loses trailing whitespace with `-`, or with
  // lstrip_blocks the indentation on the tag's own line (not for `{{`, not with `+`).
  std::string strip_text(std::string text, char sign, bool is_variable) const {
    if (sign == '-') {
      return py::strip(text, nullptr, false, true);
    }
    if (sign != '+' && opt_.lstrip_blocks && !is_variable) {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && l_pos < text.size()) {
        std::u32string tail = py::decode(std::string_view(text).substr(l_pos));
        bool all_space = true;
        for (char32_t c : tail)
          if (!py::is_space(c)) {
            all_space = false;
            break;
          }
        if (all_space) text.resize(l_pos);
      }
    }
    return text;
  }

  void emit_data(std::string text, size_t off) {
    if (!text.empty()) emit(Tok::kData, std::move(text), off);
  }

  // `{%[-+]?\s*raw\s*(-%}\s*|%})` at i; returns the end or npos.
  size_t match_raw_begin(size_t i) const {
    size_t q = i + 2;
    if (q < n_ && (s_[q] == '-' || s_[q] == '+')) ++q;
    q = skip_spaces(q);
    if (!starts(q, "raw")) return std::string::npos;
    q = skip_spaces(q + 3);
    if (starts(q, "-%}")) return skip_spaces(q + 3);
    if (starts(q, "%}")) return q + 2;
    return std::string::npos;
  }

  void root() {
    size_t t = pos_;
    while (true) {
      t = s_.find('{', t);
      if (t == std::string::npos || t + 1 >= n_) {
        t = std::string::npos;
        break;
      }
      char k = s_[t + 1];
      if (k == '{' || k == '%' || k == '#') break;
      ++t;
    }
    if (t == std::string::npos) {
      emit_data(s_.substr(pos_), pos_);
      pos_ = n_;
      return;
    }
    char kind = s_[t + 1];
    size_t after = t + 2;
    char sign = 0;
    if (after < n_ && (s_[after] == '-' || s_[after] == '+')) sign = s_[after++];
    size_t raw_end = kind == '%' ? match_raw_begin(t) : std::string::npos;
    std::string text = strip_text(s_.substr(pos_, t - pos_), sign, kind == '{');
    emit_data(std::move(text), pos_);
    if (raw_end != std::string::npos) {
      line_starting_ = s_[raw_end - 1] == '\n';
      raw_body(t, raw_end);
      return;
    }
    line_starting_ = false;
    if (kind == '#') {
      comment(t, after);
      return;
    }
    emit(kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, "", t);
    pos_ = after;
    tag(kind == '{');
  }

  void raw_body(size_t begin, size_t body) {
    size_t i = body;
    while (true) {
      i = s_.find("{%", i);
      if (i == std::string::npos) syntax_error("Missing end of raw directive", begin);
      size_t q = i + 2;
      char sign = 0;
      if (q < n_ && (s_[q] == '-' || s_[q] == '+')) sign = s_[q++];
      q = skip_spaces(q);
      if (starts(q, "endraw")) {
        q = skip_spaces(q + 6);
        size_t end = std::string::npos;
        if (starts(q, "+%}")) {
          end = q + 3;
        } else if (starts(q, "-%}")) {
          end = skip_spaces(q + 3);
        } else if (starts(q, "%}")) {
          end = q + 2;
          if (opt_.trim_blocks && end < n_ && s_[end] == '\n') ++end;
        }
        if (end != std::string::npos) {
          emit_data(strip_text(s_.substr(body, i - body), sign, false), body);
          pos_ = end;
          line_starting_ = s_[end - 1] == '\n';
          return;
        }
      }
      i += 2;
    }
  }

  void comment(size_t begin, size_t from) {
    for (size_t i = from; i < n_; ++i) {
      size_t end = std::string::npos;
      if (starts(i, "+#}")) {
        end = i + 3;
      } else if (starts(i, "-#}")) {
        end = skip_spaces(i + 3);
      } else if (starts(i, "#}")) {
        end = i + 2;
        if (opt_.trim_blocks && end < n_ && s_[end] == '\n') ++end;
      }
      if (end != std::string::npos) {
        pos_ = end;
        line_starting_ = s_[end - 1] == '\n';
        return;
      }
    }
    syntax_error("Missing end of comment tag", begin);
  }

  // Matches `(\d+_)*\d+` at i; returns the end or i when there is no digit.
  size_t digits_us(size_t i) const {
    if (i >= n_ || !isdigit(static_cast<unsigned char>(s_[i]))) return i;
    while (true) {
      while (i < n_ && isdigit(static_cast<unsigned char>(s_[i]))) ++i;
      if (i + 1 < n_ && s_[i] == '_' && isdigit(static_cast<unsigned char>(s_[i + 1]))) {
        ++i;
        continue;
      }
      return i;
    }
  }

  size_t match_float(size_t i) const {
    if (i > 0 && s_[i - 1] == '.') return 0;
    size_t a = digits_us(i);
    if (a == i) return 0;
    // alternative 1: optional fraction, then a required exponent
    auto exponent = [&](size_t p) -> size_t {
      if (p < n_ && (s_[p] == 'e' || s_[p] == 'E')) {
        size_t q = p + 1;
        if (q < n_ && (s_[q] == '+' || s_[q] == '-')) ++q;
        size_t r = digits_us(q);
        if (r > q) return r;
      }
      return 0;
    };
    if (a < n_ && s_[a] == '.') {
      size_t f = digits_us(a + 1);
      if (f > a + 1) {
        if (size_t e = exponent(f)) return e - i;
      }
    }
    if (size_t e = exponent(a)) return e - i;
    if (a < n_ && s_[a] == '.') {
      size_t f = digits_us(a + 1);
      if (f > a + 1) return f - i;
    }
    return 0;
  }

  size_t match_integer(size_t i, int* base) const {
    auto lower = [&](size_t p) { return static_cast<char>(tolower(static_cast<unsigned char>(s_[p]))); };
    auto prefixed = [&](char p, int b) -> size_t {
      if (i + 1 < n_ && s_[i] == '0' && lower(i + 1) == p) {
        size_t q = i + 2, count = 0;
        while (true) {
          size_t r = q;
          if (r < n_ && s_[r] == '_') ++r;
          if (r >= n_) break;
          char c = lower(r);
          bool ok = (b == 2 && (c == '0' || c == '1')) || (b == 8 && c >= '0' && c <= '7') ||
                    (b == 16 && (isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f')));
          if (!ok) break;
          q = r + 1;
          ++count;
        }
        if (count) {
          *base = b;
          return q - i;
        }
      }
      return 0;
    };
    if (size_t k = prefixed('b', 2)) return k;
    if (size_t k = prefixed('o', 8)) return k;
    if (size_t k = prefixed('x', 16)) return k;
    *base = 10;
    if (s_[i] >= '1' && s_[i] <= '9') {
      size_t q = i + 1;
      while (true) {
        size_t r = q;
        if (r < n_ && s_[r] == '_') ++r;
        if (r < n_ && isdigit(static_cast<unsigned char>(s_[r])))
          q = r + 1;
        else
          break;
      }
      return q - i;
    }
    if (s_[i] == '0') {
      size_t q = i + 1;
      while (true) {
        size_t r = q;
        if (r < n_ && s_[r] == '_') ++r;
        if (r < n_ && s_[r] == '0')
          q = r + 1;
        else
          break;
      }
      return q - i;
    }
    return 0;
  }

  size_t match_name(size_t i) const {
    size_t q = i;
    bool first = true;
    while (q < n_) {
      unsigned char c = static_cast<unsigned char>(s_[q]);
      if (c < 0x80) {
        if (c == '_' || isalpha(c) || (!first && isdigit(c))) {
          ++q;
          first = false;
          continue;
        }
        break;
      }
      // Non-ASCII: accept letters (and marks/digits after the first), as Python identifiers do.
      size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
      if (q + len > n_) break;
      std::u32string cp = py::decode(std::string_view(s_).substr(q, len));
      if (cp.size() != 1) break;
      std::string probe = first ? s_.substr(q, len) : "a" + s_.substr(q, len);
      if (!py::is_identifier(probe)) break;
      q += len;
      first = false;
    }
    return q - i;
  }

  static void append_backslashreplace(std::string& out, char32_t c) {
    char buf[16];
    if (c < 0x100)
      std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
    else if (c < 0x10000)
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
    else
      std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
    out += buf;
  }

  // Python's unicode_escape decoding, as jinja2 applies it to string literals.
  std::string unescape(std::string_view body, size_t off) const {
    std::u32string in = py::decode(body);
    std::string out;
    auto hexval = [](char32_t c) -> int {
      if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
      if (c >= 'a' && c <= 'f') return static_cast<int>(c - 'a' + 10);
      if (c >= 'A' && c <= 'F') return static_cast<int>(c - 'A' + 10);
      return -1;
    };
    for (size_t i = 0; i < in.size(); ++i) {
      char32_t c = in[i];
      if (c != '\\') {
        py::append_utf8(out, c);
        continue;
      }
      if (i + 1 >= in.size()) syntax_error("\\ at end of string", off);
      char32_t e = in[++i];
      switch (e) {
        case '\n':
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
        case 'u':
        case 'U': {
          int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          char32_t v = 0;
          for (int k = 0; k < digits; ++k) {
            int h = i + 1 < in.size() ? hexval(in[i + 1]) : -1;
            if (h < 0) {
              syntax_error(e == 'x'   ? "truncated \\xXX escape"
                           : e == 'u' ? "truncated \\uXXXX escape"
                                      : "truncated \\UXXXXXXXX escape",
                           off);
            }
            v = v * 16 + static_cast<char32_t>(h);
            ++i;
          }
          if (v > 0x10FFFF) syntax_error("illegal Unicode character", off);
          py::append_utf8(out, v);
          break;
        }
        case 'N':
          syntax_error("\\N{...} escapes are not supported", off);
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = e - '0';
            for (int k = 0; k < 2 && i + 1 < in.size() && in[i + 1] >= '0' && in[i + 1] <= '7'; ++k)
              v = v * 8 + (in[++i] - '0');
            py::append_utf8(out, v);
          } else if (e >= 0x80) {
            // The source char was backslash-replaced before decoding, so `\` + `é` reads as "\xe9".
            append_backslashreplace(out, e);
          } else {
            out.push_back('\\');
            py::append_utf8(out, e);
          }
      }
    }
    return out;
  }

  size_t codepoint_index(size_t off) const { return py::length(std::string_view(s_).substr(0, off)); }

  void tag(bool is_var) {
    std::vector<char> balance;
    while (pos_ < n_) {
      size_t i = pos_;
      if (balance.empty()) {
        size_t end = std::string::npos;
        if (is_var) {
          if (starts(i, "-}}"))
            end = skip_spaces(i + 3);
          else if (starts(i, "}}"))
            end = i + 2;
        } else {
          if (starts(i, "+%}")) {
            end = i + 3;
          } else if (starts(i, "-%}")) {
            end = skip_spaces(i + 3);
          } else if (starts(i, "%}")) {
            end = i + 2;
            if (opt_.trim_blocks && end < n_ && s_[end] == '\n') ++end;
          }
        }
        if (end != std::string::npos) {
          emit(is_var ? Tok::kVarEnd : Tok::kBlockEnd, "", i);
          pos_ = end;
          line_starting_ = s_[end - 1] == '\n';
          return;
        }
      }
      if (size_t k = skip_spaces(i); k > i) {
        line_starting_ = s_[k - 1] == '\n';
        pos_ = k;
        continue;
      }
      line_starting_ = false;
      unsigned char c = static_cast<unsigned char>(s_[i]);
      if (size_t k = isdigit(c) ? match_float(i) : 0) {
        std::string text;
        for (size_t q = i; q < i + k; ++q)
          if (s_[q] != '_') text.push_back(s_[q]);
        Token tok;
        tok.type = Tok::kFloat;
        tok.fval = std::strtod(text.c_str(), nullptr);
        tok.value = s_.substr(i, k);
        tok.offset = i;
        out_.push_back(std::move(tok));
        pos_ = i + k;
        continue;
      }
      int base = 10;
      if (size_t k = isdigit(c) ? match_integer(i, &base) : 0) {
        std::string text;
        for (size_t q = i + (base == 10 ? 0 : 2); q < i + k; ++q)
          if (s_[q] != '_') text.push_back(s_[q]);
        errno = 0;
        char* endp = nullptr;
        unsigned long long v = std::strtoull(text.c_str(), &endp, base);
        if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX))
          throw_error("OverflowError", "integer literal too large for 64 bits", i);
        Token tok;
        tok.type = Tok::kInteger;
        tok.ival = static_cast<int64_t>(v);
        tok.value = s_.substr(i, k);
        tok.offset = i;
        out_.push_back(std::move(tok));
        pos_ = i + k;
        continue;
      }
      if (size_t k = match_name(i)) {
        emit(Tok::kName, s_.substr(i, k), i);
        pos_ = i + k;
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t q = i + 1;
        bool closed = false;
        while (q < n_) {
          if (s_[q] == '\\') {
            q += 2;
            continue;
          }
          if (s_[q] == static_cast<char>(c)) {
            closed = true;
            break;
          }
          ++q;
        }
        if (closed) {
          emit(Tok::kString, unescape(std::string_view(s_).substr(i + 1, q - i - 1), i), i);
          pos_ = q + 1;
          continue;
        }
      }
      static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                   "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};
      std::string op;
      for (const char* o : kOps)
        if (starts(i, o)) {
          op = o;
          break;
        }
      if (op.empty()) {
        std::u32string ch = py::decode(std::string_view(s_).substr(i, 4));
        std::string one;
        py::append_utf8(one, ch.empty() ? U'?' : ch[0]);
        syntax_error("unexpected char " + py::repr(one) + " at " + std::to_string(codepoint_index(i)), i);
      }
      if (op == "{" || op == "(" || op == "[") {
        balance.push_back(op == "{" ? '}' : op == "(" ? ')' : ']');
      } else if (op == "}" || op == ")" || op == "]") {
        if (balance.empty()) syntax_error("unexpected '" + op + "'", i);
        char expected = balance.back();
        balance.pop_back();
        if (expected != op[0])
          syntax_error("unexpected '" + op + "', expected '" + std::string(1, expected) + "'", i);
      }
      emit(Tok::kOp, op, i);
      pos_ = i + op.size();
    }
  }
};

}  // namespace

std::vector<Token> tokenize(const std::string& source, const LexerOptions& opt) {
  return Lexer(source, opt).run();
}

}  // namespace deltaflow::text::jinja
