#include "text/byte_level.hpp"

#include "text/tokenizer_unicode.hpp"

namespace deltaflow::text::tokenizer_impl {

const ByteLevelAlphabet& ByteLevelAlphabet::get() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

ByteLevelAlphabet::ByteLevelAlphabet() {
  // Printable Latin-1 bytes stand for themselves; the rest (controls, space, DEL, NBSP, soft hyphen) are
  // moved, in byte order, to U+0100 onwards.
  char_to_byte_.fill(-1);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const char32_t c = keep ? static_cast<char32_t>(b) : static_cast<char32_t>(next++);
    byte_to_char_[b] = c;
    char_to_byte_[c] = static_cast<int16_t>(b);
    std::string s;
    append_utf8(s, c);
    utf8_len_[b] = static_cast<uint8_t>(s.size());
    for (size_t k = 0; k < s.size(); ++k) utf8_[b][k] = s[k];
  }
}

void ByteLevelAlphabet::encode(std::string_view bytes, std::string& out) const {
  for (char ch : bytes) out.append(utf8_of(static_cast<unsigned char>(ch)));
}

bool ByteLevelAlphabet::decode(std::string_view token, std::string& out) const {
  size_t i = 0;
  while (i < token.size()) {
    const auto b0 = static_cast<unsigned char>(token[i]);
    char32_t c;
    size_t len;
    if (b0 < 0x80) {
      c = b0;
      len = 1;
    } else if (b0 >= 0xC2 && b0 <= 0xDF && i + 1 < token.size()) {
      // Only 2-byte characters can be in the alphabet (all are below U+0800).
      c = (char32_t(b0 & 0x1F) << 6) | (static_cast<unsigned char>(token[i + 1]) & 0x3F);
      len = 2;
    } else {
      return false;
    }
    const int b = byte_of(c);
    if (b < 0) return false;
    out.push_back(static_cast<char>(b));
    i += len;
  }
  return true;
}

}  // namespace deltaflow::text::tokenizer_impl
