// Hostile chat messages through the real chat template (the tiny tokenizer's Qwen3.5 template) and the
// tokenizer. The input is a JSON request body ({"messages", "tools", ...}); what the template renders with
// the special tokens of the content kept as text must be the same text as the permissive rendering, its
// literal spans must spell special tokens inside the text, and the prompt ids must hold exactly the
// template's own control tokens: as many <|im_start|> as the permissive rendering of the same conversation
// with every special-token spelling removed from the input.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/embedded_assets.hpp"
#include "text/chat_template.hpp"
#include "text/tokenizer.hpp"

using namespace deltaflow;
using Json = nlohmann::ordered_json;

namespace {

std::string asset(const char* name) {
  for (const auto& a : model::tiny_tokenizer_assets())
    if (std::string(a.name) == name) return std::string(a.text);
  __builtin_trap();
}

struct Fixture {
  text::Tokenizer tok;
  text::ChatTemplate tmpl;
  std::vector<std::string> special;
  int32_t im_start;
};

const Fixture& fixture() {
  static const Fixture f = [] {
    auto tok = text::Tokenizer::load_from_json_text(asset("tokenizer.json"), asset("tokenizer_config.json"));
    text::jinja::Limits limits;
    limits.max_steps = 200000;
    limits.max_output_bytes = 1 << 18;
    auto tmpl =
        text::ChatTemplate::from_source(asset("chat_template.jinja"), {{"eos_token", "<|im_end|>"}}, limits);
    if (!tok || !tmpl) __builtin_trap();
    auto special = tok->special_token_texts();
    const int32_t im_start = *tok->token_to_id("<|im_start|>");
    return Fixture{std::move(tok).value(), std::move(tmpl).value(), std::move(special), im_start};
  }();
  return f;
}

// Every string and key with the special tokens' spellings removed.
Json strip_special(const Json& j, const std::vector<std::string>& special) {
  // Each spelling becomes "x" (removing it could join two halves into a new one).
  auto strip = [&](std::string s) {
    for (const auto& t : special)
      for (size_t at; (at = s.find(t)) != std::string::npos;) s.replace(at, t.size(), "x");
    return s;
  };
  if (j.is_string()) return strip(j.get<std::string>());
  if (j.is_array()) {
    Json out = Json::array();
    for (const auto& e : j) out.push_back(strip_special(e, special));
    return out;
  }
  if (j.is_object()) {
    Json out = Json::object();
    for (auto it = j.begin(); it != j.end(); ++it) out[strip(it.key())] = strip_special(it.value(), special);
    return out;
  }
  return j;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Fixture& f = fixture();
  Json body = Json::parse(reinterpret_cast<const char*>(data), reinterpret_cast<const char*>(data) + size,
                          nullptr, false);
  if (body.is_discarded() || !body.is_object() || !body.contains("messages")) return 0;
  text::ChatRenderOptions opt;
  const auto agp = body.find("add_generation_prompt");
  opt.add_generation_prompt = agp == body.end() || !agp->is_boolean() || agp->get<bool>();
  if (body.contains("tools")) opt.tools = body["tools"];
  opt.kwargs = {{"enable_thinking", (size & 1) != 0}};
  const auto plain = text::render_chat_spans(f.tmpl, body["messages"], opt);
  opt.literal_tokens = f.special;
  const auto safe = text::render_chat_spans(f.tmpl, body["messages"], opt);
  if (!plain || !safe) {
    if (static_cast<bool>(plain) != static_cast<bool>(safe) && plain) __builtin_trap();
    return 0;
  }
  if (!plain->literal.empty() || safe->text != plain->text) __builtin_trap();
  size_t prev = 0;
  for (const auto& l : safe->literal) {
    if (l.begin < prev || l.end <= l.begin || l.end > safe->text.size()) __builtin_trap();
    const std::string spelled = safe->text.substr(l.begin, l.end - l.begin);
    if (std::find(f.special.begin(), f.special.end(), spelled) == f.special.end()) __builtin_trap();
    prev = l.end;
  }
  const auto ids = f.tok.encode_literal(safe->text, safe->literal);
  const Json stripped = strip_special(body["messages"], f.special);
  opt.literal_tokens.clear();
  if (body.contains("tools")) opt.tools = strip_special(body["tools"], f.special);
  const auto reference = text::render_chat_spans(f.tmpl, stripped, opt);
  if (reference) {
    const auto ref_ids = f.tok.encode(reference->text);
    if (std::count(ids.begin(), ids.end(), f.im_start) !=
        std::count(ref_ids.begin(), ref_ids.end(), f.im_start))
      __builtin_trap();
  }
  return 0;
}
