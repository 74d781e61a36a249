#include "text/jinja/pystr.hpp"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace deltaflow::text::jinja::py {

namespace {

utf8proc_category_t category(char32_t c) {
  if (c > 0x10FFFF) return UTF8PROC_CATEGORY_CN;
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

bool is_cased(char32_t c) {
  if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return false;
  auto cp = static_cast<utf8proc_int32_t>(c);
  return utf8proc_islower(cp) || utf8proc_isupper(cp) || category(c) == UTF8PROC_CATEGORY_LT;
}

char32_t simple_lower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return c;
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}
char32_t simple_upper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return c;
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}

// Unconditional multi-character mappings from SpecialCasing.txt that Python applies in upper()/title().
// The Greek iota-subscript forms are left out (rare in prompts).
struct Special {
  char32_t c;
  const char32_t* upper;
  const char32_t* title;
};
const Special kSpecials[] = {
    {0x00DF, U"\u0053\u0053", U"\u0053\u0073"},  // ß
    {0x0149, U"\u02BC\u004E", U"\u02BC\u004E"},  // ŉ
    {0x01F0, U"\u004A\u030C", U"\u004A\u030C"},  // ǰ
    {0x0390, U"\u0399\u0308\u0301", U"\u0399\u0308\u0301"},
    {0x03B0, U"\u03A5\u0308\u0301", U"\u03A5\u0308\u0301"},
    {0x0587, U"\u0535\u0552", U"\u0535\u0582"},  // և
    {0x1E96, U"\u0048\u0331", U"\u0048\u0331"},
    {0x1E97, U"\u0054\u0308", U"\u0054\u0308"},
    {0x1E98, U"\u0057\u030A", U"\u0057\u030A"},
    {0x1E99, U"\u0059\u030A", U"\u0059\u030A"},
    {0x1E9A, U"\u0041\u02BE", U"\u0041\u02BE"},
    {0xFB00, U"\u0046\u0046", U"\u0046\u0066"},  // ﬀ
    {0xFB01, U"\u0046\u0049", U"\u0046\u0069"},  // ﬁ
    {0xFB02, U"\u0046\u004C", U"\u0046\u006C"},  // ﬂ
    {0xFB03, U"\u0046\u0046\u0049", U"\u0046\u0066\u0069"},
    {0xFB04, U"\u0046\u0046\u004C", U"\u0046\u0066\u006C"},
    {0xFB05, U"\u0053\u0054", U"\u0053\u0074"},
    {0xFB06, U"\u0053\u0054", U"\u0053\u0074"},
    {0xFB13, U"\u0544\u0546", U"\u0544\u0576"},
    {0xFB14, U"\u0544\u0535", U"\u0544\u0565"},
    {0xFB15, U"\u0544\u053B", U"\u0544\u056B"},
    {0xFB16, U"\u054E\u0546", U"\u054E\u0576"},
    {0xFB17, U"\u0544\u053D", U"\u0544\u056D"},
};

const Special* find_special(char32_t c) {
  if (c < 0xDF) return nullptr;
  for (const auto& s : kSpecials)
    if (s.c == c) return &s;
  return nullptr;
}

std::u32string lower_char(char32_t c) {
  if (c == 0x0130) return U"i\u0307";  // İ lowercases to two code points
  return std::u32string(1, simple_lower(c));
}

// Python lowercases a capital sigma to final sigma at the end of a word (Final_Sigma condition).
bool final_sigma(const std::u32string& s, size_t i) {
  size_t j = i;
  bool before = false;
  while (j > 0) {
    --j;
    if (is_cased(s[j])) {
      before = true;
      break;
    }
    if (category(s[j]) != UTF8PROC_CATEGORY_MN && s[j] != '\'' && s[j] != 0x2019) break;
  }
  if (!before) return false;
  for (size_t k = i + 1; k < s.size(); ++k) {
    if (is_cased(s[k])) return false;
    if (category(s[k]) != UTF8PROC_CATEGORY_MN && s[k] != '\'' && s[k] != 0x2019) break;
  }
  return true;
}

void append_lower(std::u32string& out, const std::u32string& s, size_t i) {
  if (s[i] == 0x03A3) {
    out.push_back(final_sigma(s, i) ? 0x03C2 : 0x03C3);
    return;
  }
  out += lower_char(s[i]);
}

std::u32string title_char_full(char32_t c) {
  if (const Special* sp = find_special(c)) return sp->title;
  return std::u32string(1, to_title_char(c));
}

}  // namespace

std::u32string decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0, n = s.size();
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  while (i < n) {
    unsigned char c = b[i];
    if (c < 0x80) {
      out.push_back(c);
      ++i;
      continue;
    }
    int len = 0;
    char32_t cp = 0, min = 0;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    }
    bool ok = len > 0 && i + len <= n;
    for (int k = 1; ok && k < len; ++k) {
      if ((b[i + k] & 0xC0) != 0x80)
        ok = false;
      else
        cp = (cp << 6) | (b[i + k] & 0x3F);
    }
    if (ok && (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))) ok = false;
    if (!ok) {
      out.push_back(0xDC00 + c);  // surrogateescape
      ++i;
      continue;
    }
    out.push_back(cp);
    i += len;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp >= 0xDC80 && cp <= 0xDCFF) {
    out.push_back(static_cast<char>(cp - 0xDC00));  // an escaped raw byte
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

size_t length(std::string_view s) {
  bool ascii = true;
  for (unsigned char c : s)
    if (c >= 0x80) {
      ascii = false;
      break;
    }
  return ascii ? s.size() : decode(s).size();
}

bool is_space(char32_t c) {
  if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_alpha(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  auto k = category(c);
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
         k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_LO;
}

bool is_decimal(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return category(c) == UTF8PROC_CATEGORY_ND;
}

bool is_digit(char32_t c) {
  if (is_decimal(c)) return true;
  // Numeric_Type=Digit characters outside Nd: superscripts, subscripts, circled digits.
  return c == 0xB2 || c == 0xB3 || c == 0xB9 || c == 0x2070 || (c >= 0x2074 && c <= 0x2079) ||
         (c >= 0x2080 && c <= 0x2089) || (c >= 0x2460 && c <= 0x2468) || (c >= 0x2474 && c <= 0x247C) ||
         (c >= 0x2488 && c <= 0x2490) || c == 0x24EA || (c >= 0x24F5 && c <= 0x24FD) || c == 0x24FF ||
         (c >= 0x2776 && c <= 0x277E) || (c >= 0x2780 && c <= 0x2788) || (c >= 0x278A && c <= 0x2792) ||
         (c >= 0x1369 && c <= 0x1371);
}

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  auto k = category(c);
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}

bool is_alnum(char32_t c) {
  return is_alpha(c) || is_decimal(c) || is_digit(c) || is_numeric(c);
}
bool is_word(char32_t c) {
  return c == '_' || is_alnum(c);
}

bool is_lower_cased(char32_t c) {
  if (c < 0x80) return c >= 'a' && c <= 'z';
  if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return false;
  return utf8proc_islower(static_cast<utf8proc_int32_t>(c));
}
bool is_upper_cased(char32_t c) {
  if (c < 0x80) return c >= 'A' && c <= 'Z';
  if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return false;
  return utf8proc_isupper(static_cast<utf8proc_int32_t>(c));
}

bool is_printable(char32_t c) {
  if (c == ' ') return true;
  if (c < 0x20 || c == 0x7F) return false;
  if (c < 0x7F) return true;
  switch (category(c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return !(c >= 0xD800 && c <= 0xDFFF);
  }
}

bool is_line_break(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

char32_t to_title_char(char32_t c) {
  if (c < 0x80) return simple_upper(c);
  if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return c;
  return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}

std::u32string upper_char(char32_t c) {
  if (const Special* sp = find_special(c)) return sp->upper;
  return std::u32string(1, simple_upper(c));
}

std::string upper(std::string_view s) {
  std::u32string in = decode(s), out;
  out.reserve(in.size());
  for (char32_t c : in) out += upper_char(c);
  return encode(out);
}

std::string lower(std::string_view s) {
  std::u32string in = decode(s), out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) append_lower(out, in, i);
  return encode(out);
}

std::string title(std::string_view s) {
  std::u32string in = decode(s), out;
  bool prev_cased = false;
  for (size_t i = 0; i < in.size(); ++i) {
    if (prev_cased)
      append_lower(out, in, i);
    else
      out += title_char_full(in[i]);
    prev_cased = is_cased(in[i]);
  }
  return encode(out);
}

std::string capitalize(std::string_view s) {
  std::u32string in = decode(s), out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (i == 0)
      out += title_char_full(in[0]);
    else
      append_lower(out, in, i);
  }
  return encode(out);
}

std::string swapcase(std::string_view s) {
  std::u32string in = decode(s), out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (is_upper_cased(in[i]))
      append_lower(out, in, i);
    else if (is_lower_cased(in[i]))
      out += upper_char(in[i]);
    else
      out.push_back(in[i]);
  }
  return encode(out);
}

std::string strip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::u32string in = decode(s);
  std::u32string set;
  if (chars) set = decode(*chars);
  auto strip_it = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : is_space(c); };
  size_t b = 0, e = in.size();
  if (left)
    while (b < e && strip_it(in[b])) ++b;
  if (right)
    while (e > b && strip_it(in[e - 1])) --e;
  return encode(std::u32string_view(in).substr(b, e - b));
}

std::vector<std::string> split_whitespace(std::string_view s, long long maxsplit, bool from_right) {
  std::u32string in = decode(s);
  std::vector<std::string> out;
  if (maxsplit < 0) maxsplit = static_cast<long long>(in.size()) + 1;
  if (!from_right) {
    size_t i = 0, n = in.size();
    while (i < n) {
      while (i < n && is_space(in[i])) ++i;
      if (i == n) break;
      if (static_cast<long long>(out.size()) == maxsplit) {
        size_t e = n;
        while (e > i && is_space(in[e - 1])) --e;
        out.push_back(encode(std::u32string_view(in).substr(i, e - i)));
        break;
      }
      size_t j = i;
      while (j < n && !is_space(in[j])) ++j;
      out.push_back(encode(std::u32string_view(in).substr(i, j - i)));
      i = j;
    }
  } else {
    size_t e = in.size();
    while (e > 0) {
      while (e > 0 && is_space(in[e - 1])) --e;
      if (e == 0) break;
      if (static_cast<long long>(out.size()) == maxsplit) {
        size_t b = 0;
        while (b < e && is_space(in[b])) ++b;
        out.push_back(encode(std::u32string_view(in).substr(b, e - b)));
        break;
      }
      size_t j = e;
      while (j > 0 && !is_space(in[j - 1])) --j;
      out.push_back(encode(std::u32string_view(in).substr(j, e - j)));
      e = j;
    }
    std::reverse(out.begin(), out.end());
  }
  return out;
}

std::vector<std::string> split_sep(std::string_view s, std::string_view sep, long long maxsplit,
                                   bool from_right) {
  std::vector<std::string> out;
  if (maxsplit < 0) maxsplit = static_cast<long long>(s.size()) + 1;
  if (!from_right) {
    size_t pos = 0;
    while (static_cast<long long>(out.size()) < maxsplit) {
      size_t f = s.find(sep, pos);
      if (f == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, f - pos));
      pos = f + sep.size();
    }
    out.emplace_back(s.substr(pos));
  } else {
    size_t end = s.size();
    std::vector<std::string> rev;
    while (static_cast<long long>(rev.size()) < maxsplit) {
      if (end < sep.size()) break;
      size_t f = s.rfind(sep, end - sep.size());
      if (f == std::string_view::npos) break;
      rev.emplace_back(s.substr(f + sep.size(), end - f - sep.size()));
      end = f;
    }
    rev.emplace_back(s.substr(0, end));
    out.assign(rev.rbegin(), rev.rend());
  }
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::u32string in = decode(s);
  std::vector<std::string> out;
  size_t i = 0, n = in.size();
  while (i < n) {
    size_t j = i;
    while (j < n && !is_line_break(in[j])) ++j;
    size_t eol = j;
    if (j < n) {
      if (in[j] == '\r' && j + 1 < n && in[j + 1] == '\n')
        j += 2;
      else
        j += 1;
    }
    out.push_back(encode(std::u32string_view(in).substr(i, (keepends ? j : eol) - i)));
    i = j;
  }
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view with, long long count) {
  std::string out;
  if (count < 0) count = static_cast<long long>(s.size()) + 2;
  if (old.empty()) {
    // Python inserts `with` before every code point and at the end.
    std::u32string in = decode(s);
    long long done = 0;
    for (char32_t c : in) {
      if (done < count) {
        out += with;
        ++done;
      }
      append_utf8(out, c);
    }
    if (done < count) out += with;
    return out;
  }
  size_t pos = 0;
  long long done = 0;
  while (done < count) {
    size_t f = s.find(old, pos);
    if (f == std::string_view::npos) break;
    out.append(s.substr(pos, f - pos));
    out.append(with);
    pos = f + old.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

long long count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<long long>(length(s)) + 1;
  long long n = 0;
  size_t pos = 0;
  while ((pos = s.find(sub, pos)) != std::string_view::npos) {
    ++n;
    pos += sub.size();
  }
  return n;
}

long long find(std::string_view s, std::string_view sub, long long start, long long end, bool from_right) {
  std::u32string in = decode(s), needle = decode(sub);
  long long n = static_cast<long long>(in.size());
  if (start < 0) start = std::max(0LL, start + n);
  if (end < 0) end = std::max(0LL, end + n);
  if (end > n) end = n;
  if (start > end || end - start < static_cast<long long>(needle.size())) {
    return (needle.empty() && start <= n && start <= end) ? (from_right ? end : start) : -1;
  }
  std::u32string_view hay(in.data() + start, static_cast<size_t>(end - start));
  size_t f = from_right ? hay.rfind(needle) : hay.find(needle);
  if (f == std::u32string_view::npos) return -1;
  return start + static_cast<long long>(f);
}

std::string repr(std::string_view s) {
  std::u32string in = decode(s);
  bool has_single = in.find(U'\'') != std::u32string::npos;
  bool has_double = in.find(U'"') != std::u32string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  char buf[16];
  for (char32_t c : in) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c >= 0xDC80 && c <= 0xDCFF) {
      std::snprintf(buf, sizeof buf, "\\udc%02x", static_cast<unsigned>(c - 0xDC00));
      out += buf;
    } else if (!is_printable(c)) {
      if (c < 0x100)
        std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      else if (c < 0x10000)
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      else
        std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      out += buf;
    } else {
      append_utf8(out, c);
    }
  }
  out.push_back(quote);
  return out;
}

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  // Shortest round-trip digits (what Python's repr uses), then Python's layout rule: positional notation
  // when -4 < exponent+1 <= 16, scientific otherwise.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string out;
  size_t p = 0;
  if (sci[0] == '-') {
    out.push_back('-');
    p = 1;
  }
  size_t epos = sci.find('e');
  std::string digits;
  for (size_t i = p; i < epos; ++i)
    if (sci[i] != '.') digits.push_back(sci[i]);
  int exp = std::atoi(sci.c_str() + epos + 1);
  int decpt = exp + 1;
  int nd = static_cast<int>(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-decpt), '0');
      out += digits;
    } else if (decpt >= nd) {
      out += digits;
      out.append(static_cast<size_t>(decpt - nd), '0');
      out += ".0";
    } else {
      out += digits.substr(0, decpt);
      out.push_back('.');
      out += digits.substr(decpt);
    }
  } else {
    out.push_back(digits[0]);
    if (nd > 1) {
      out.push_back('.');
      out += digits.substr(1);
    }
    out.push_back('e');
    out.push_back(exp < 0 ? '-' : '+');
    int a = exp < 0 ? -exp : exp;
    if (a < 10) out.push_back('0');
    out += std::to_string(a);
  }
  return out;
}

bool is_identifier(std::string_view s) {
  if (s.empty()) return false;
  std::u32string in = decode(s);
  for (size_t i = 0; i < in.size(); ++i) {
    char32_t c = in[i];
    bool ok = c == '_' || is_alpha(c) ||
              (i > 0 && (is_decimal(c) || category(c) == UTF8PROC_CATEGORY_MN ||
                         category(c) == UTF8PROC_CATEGORY_MC || category(c) == UTF8PROC_CATEGORY_PC));
    if (!ok) return false;
  }
  return true;
}

}  // namespace deltaflow::text::jinja::py
