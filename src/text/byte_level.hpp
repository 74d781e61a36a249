// GPT-2's byte-level alphabet: every byte maps to one printable code point, so that a BPE vocabulary made of
// strings can spell arbitrary bytes. `tokenizers` ByteLevel pre-tokenizer and decoder use the same table
// (bytes_to_unicode in GPT-2's encoder.py).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace deltaflow::text::tokenizer_impl {

class ByteLevelAlphabet {
 public:
  static const ByteLevelAlphabet& get();

  char32_t char_of(unsigned char b) const { return byte_to_char_[b]; }
  // The UTF-8 spelling of the character that stands for byte b (1 or 2 bytes).
  std::string_view utf8_of(unsigned char b) const { return {utf8_[b].data(), utf8_len_[b]}; }
  // The byte a character stands for, or -1 if the character is not in the alphabet.
  int byte_of(char32_t c) const { return c < 324 ? char_to_byte_[c] : -1; }

  // Appends the alphabet spelling of raw bytes.
  void encode(std::string_view bytes, std::string& out) const;
  // Decodes a vocabulary string back to bytes; false if some character is outside the alphabet
  // (then `out` is left with a partial result the caller discards).
  bool decode(std::string_view token, std::string& out) const;

 private:
  ByteLevelAlphabet();
  std::array<char32_t, 256> byte_to_char_{};
  std::array<int16_t, 324> char_to_byte_{};
  std::array<std::array<char, 2>, 256> utf8_{};
  std::array<uint8_t, 256> utf8_len_{};
};

}  // namespace deltaflow::text::tokenizer_impl
