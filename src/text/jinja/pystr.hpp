// Python `str` semantics on UTF-8 bytes. Templates index, slice, strip and case-map strings the way
// Python does (by code point, with Unicode whitespace and case tables), so these helpers do the same.
// Invalid UTF-8 bytes decode to U+DC80..U+DCFF and encode back to the same byte (Python's
// "surrogateescape"), so any byte string survives a decode/encode round trip.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace deltaflow::text::jinja::py {

std::u32string decode(std::string_view s);
std::string encode(std::u32string_view s);
void append_utf8(std::string& out, char32_t cp);
size_t length(std::string_view s);  // in code points

// Character classes as Python's str methods define them.
bool is_space(char32_t c);  // str.isspace
bool is_alpha(char32_t c);
bool is_decimal(char32_t c);
bool is_digit(char32_t c);
bool is_numeric(char32_t c);
bool is_alnum(char32_t c);
bool is_word(char32_t c);  // regex \w (Unicode)
bool is_lower_cased(char32_t c);
bool is_upper_cased(char32_t c);
bool is_printable(char32_t c);   // str.isprintable, used by repr()
bool is_line_break(char32_t c);  // str.splitlines separators

std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title(std::string_view s);       // str.title
std::string capitalize(std::string_view s);  // str.capitalize
std::string swapcase(std::string_view s);
char32_t to_title_char(char32_t c);
std::u32string upper_char(char32_t c);  // full mapping ("ß" -> "SS")

// strip with Python semantics: chars == nullptr strips whitespace.
std::string strip(std::string_view s, const std::string* chars, bool left, bool right);
std::vector<std::string> split_whitespace(std::string_view s, long long maxsplit, bool from_right);
std::vector<std::string> split_sep(std::string_view s, std::string_view sep, long long maxsplit,
                                   bool from_right);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
std::string replace(std::string_view s, std::string_view old, std::string_view with, long long count);
long long count(std::string_view s, std::string_view sub);
// find in code-point indices over [start, end); -1 if absent.
long long find(std::string_view s, std::string_view sub, long long start, long long end, bool from_right);

std::string repr(std::string_view s);  // Python repr of a str, quotes included
std::string float_repr(double x);      // Python repr(float)

bool is_identifier(std::string_view s);

}  // namespace deltaflow::text::jinja::py
