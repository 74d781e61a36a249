// Files compiled into the binary (generated from assets/ at configure time), so `make-tiny` writes a complete
// model directory without the source tree.
#pragma once

#include <string_view>
#include <vector>

namespace deltaflow::model {

struct EmbeddedAsset {
  const char* name;       // file name inside the model directory
  std::string_view text;  // exact bytes
};

// tokenizer.json, tokenizer_config.json and chat_template.jinja of the tiny tokenizer
// (assets/tiny-tokenizer/).
const std::vector<EmbeddedAsset>& tiny_tokenizer_assets();

// Special token ids of the tiny tokenizer: 1024 ids, the 26 Qwen added tokens at the top (998..1023) in the
// Qwen order: <|endoftext|>, <|im_start|>, <|im_end|>, ...
inline constexpr int kTinyPadTokenId = 998;           // <|endoftext|>
inline constexpr int kTinyEosTokenId = 1000;          // <|im_end|>
inline constexpr int kTinyVisionStartTokenId = 1007;  // <|vision_start|>
inline constexpr int kTinyVisionEndTokenId = 1008;    // <|vision_end|>
inline constexpr int kTinyImageTokenId = 1010;        // <|image_pad|>
inline constexpr int kTinyVideoTokenId = 1011;        // <|video_pad|>

}  // namespace deltaflow::model
