// The checkpoint's tokenizer, read from a Hugging Face tokenizer.json and reproducing the `tokenizers`
// library id for id: encode(text) == Tokenizer.encode(text, add_special_tokens=False).ids, and decode(ids,
// skip)
// == Tokenizer.decode(ids, skip_special_tokens=skip).
//
// Supported components (anything else is refused at load with an error naming it):
//   model         BPE (vocab; merges as "a b" strings or ["a", "b"] pairs; unk_token, fuse_unk,
//   byte_fallback,
//                 continuing_subword_prefix, end_of_word_suffix, ignore_merges; no dropout)
//   added_tokens  special, normalized, lstrip, rstrip, single_word
//   normalizer    null, NFC, NFD, NFKC, NFKD, Sequence of those
//   pre_tokenizer null, Split (Regex or String; any behavior; invert), ByteLevel (add_prefix_space,
//                 use_regex), Sequence of those with ByteLevel last
//   decoder       null, ByteLevel
// post_processor, truncation and padding are ignored: they only act when special tokens are added or
// batches padded, which encode() never does.
//
// Text that is not valid UTF-8 is repaired first (each maximal invalid subpart becomes U+FFFD, as Python's
// bytes.decode("utf-8", "replace") would), so encode never fails.
//
// Thread safety: all const methods may be called concurrently. Merged words are cached in a few bounded
// caches that concurrent encodes take in turn (an encode that finds them all busy runs uncached).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.hpp"
#include "text/text_span.hpp"

namespace deltaflow::text {

class Tokenizer {
 public:
  // Reads model_dir/tokenizer.json and, if present, model_dir/tokenizer_config.json (eos/bos/pad/unk tokens,
  // added_tokens_decoder entries missing from tokenizer.json).
  static core::Expected<Tokenizer> load(const std::string& model_dir);
  // The same from file contents; config_json may be empty.
  static core::Expected<Tokenizer> load_from_json_text(std::string_view tokenizer_json,
                                                       std::string_view config_json = {});

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // No special tokens are added; added/special token text inside `text` is matched as tokenizers does.
  std::vector<int32_t> encode(std::string_view text) const;
  // Appends to out.
  void encode_append(std::string_view text, std::vector<int32_t>& out) const;
  // The same, except that added tokens overlapping a `literal` range (sorted, disjoint byte ranges of
  // text) are not matched there: that text is tokenized as ordinary text, in context with what surrounds
  // it (tokenizers' split_special_tokens, for those ranges only). Special tokens whose matching happens after
  // normalization are then not matched anywhere in a segment that holds a literal range.
  std::vector<int32_t> encode_literal(std::string_view text, std::span<const TextSpan> literal) const;
  // The contents of the added tokens marked special, in id order.
  std::vector<std::string> special_token_texts() const;
  // Unknown ids are skipped, as tokenizers does.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The vocabulary string (GPT-2 alphabet spelling for byte-level vocabularies) or added token content.
  std::optional<std::string> id_to_token(int32_t id) const;
  // One past the largest id (model vocabulary and added tokens): the id space the embedding must cover.
  size_t vocab_size() const;
  bool is_special(int32_t id) const;
  bool is_added(int32_t id) const;

  // What decoding one id contributes: raw bytes for the ByteLevel decoder (possibly part of a UTF-8
  // character), the token string without a decoder. Empty for unknown ids.
  std::string_view token_bytes(int32_t id) const;
  bool has_id(int32_t id) const;
  // Without a decoder, tokenizers joins token strings with a space.
  bool decoder_joins_with_space() const;

  // From tokenizer_config.json, when given there.
  const std::optional<std::string>& eos_token() const;
  const std::optional<std::string>& bos_token() const;
  const std::optional<std::string>& pad_token() const;
  std::optional<int32_t> eos_token_id() const;
  std::optional<int32_t> bos_token_id() const;
  std::optional<int32_t> pad_token_id() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace deltaflow::text
