// UTF-8 and Unicode helpers for the tokenizer: validation, lossy repair, code point classes, normalization.
// Lossy repair follows the Unicode "maximal subpart" practice, which is what both Python's
// bytes.decode("utf-8", "replace") and Rust's String::from_utf8_lossy do, so our output for invalid input
// equals the reference libraries' output for the repaired text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace deltaflow::text::tokenizer_impl {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Appends the UTF-8 encoding of cp (which must be a Unicode scalar value).
void append_utf8(std::string& out, char32_t cp);

// Decodes the code point starting at s[i] of a valid UTF-8 string; sets len to its byte length.
char32_t decode_utf8(std::string_view s, size_t i, size_t& len);

// Byte length of the UTF-8 sequence whose lead byte is b (1 for ASCII and for invalid leads).
inline size_t utf8_seq_len(unsigned char b) {
  if (b < 0xC0) return 1;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  return 4;
}

bool is_valid_utf8(std::string_view s);

// Appends s to out with each maximal invalid subpart replaced by U+FFFD. When `final` is false, an incomplete
// but so far valid sequence at the very end is not consumed (a later chunk may complete it). Returns the
// number of bytes of s consumed.
size_t append_utf8_lossy(std::string& out, std::string_view s, bool final = true);

inline std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  append_utf8_lossy(out, s);
  return out;
}

// Unicode White_Space (Rust char::is_whitespace, regex \s).
bool is_white_space(char32_t cp);
// Rust regex \w with Unicode: Alphabetic, Mark, Decimal_Number, Connector_Punctuation, Join_Control.
bool is_word_char(char32_t cp);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };

// True when `in` is certainly unchanged by the normalization (a cheap byte scan: e.g. NFC leaves text without
// code points >= U+0300 alone), so the common English case skips utf8proc.
bool normalization_is_identity(std::string_view in, NormalForm form);

// Normalizes valid UTF-8 text into out. Returns false only if utf8proc fails (out of memory).
bool normalize_unicode(std::string_view in, NormalForm form, std::string& out);

// NFC that only runs utf8proc on the stretches that need it: text is cut before every character that is
// NFC_Quick_Check=Yes with combining class 0 (a safe boundary, UAX #15), and only stretches holding another
// character are normalized. Returns false when `in` is already NFC (out untouched), true with out = NFC(in).
bool nfc_changed(std::string_view in, std::string& out);

}  // namespace deltaflow::text::tokenizer_impl
