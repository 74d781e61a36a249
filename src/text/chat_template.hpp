// Chat templates as transformers 5.17 applies them (`tokenizer.apply_chat_template(..., tokenize=False)`):
// which template a model directory provides, which variables the template sees, and the checks HF makes
// around rendering. Used by `deltaflow tokenize --chat` and by the HTTP server.
//
// Template source, in HF's order of precedence:
//   model_dir/chat_template.jinja (+ additional_chat_templates/*.jinja, then they form a named set with
//   "default"), else tokenizer_config.json "chat_template" (a string, or a list of {name, template}),
//   else chat_template.json "chat_template" (processor files).
// Variables: messages, tools (None when not given), documents (None), add_generation_prompt, the special
// tokens of tokenizer_config.json (bos_token, eos_token, unk/sep/pad/cls/mask_token and model-specific
// *_token entries, as HF's special_tokens_map), then the caller's kwargs (enable_thinking, ...).
// render_chat passes messages exactly as given, like apply_chat_template: tool-call arguments given as a
// JSON string stay a string. render_chat_request (an OpenAI body, where arguments are always strings)
// first parses them, as transformers' own `serve` and vLLM do (parse_tool_call_arguments).
//
// JSON objects must be nlohmann::ordered_json: templates print tools with `tojson`, and the key order
// of the request is part of the prompt.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.hpp"
#include "text/jinja/template.hpp"
#include "text/text_span.hpp"

namespace deltaflow::text {

class ChatTemplate {
 public:
  static core::Expected<ChatTemplate> load(const std::string& model_dir, const jinja::Limits& limits = {});
  // A template given as text; special_tokens: e.g. {"eos_token": "<|im_end|>"} (may be null).
  static core::Expected<ChatTemplate> from_source(std::string_view source,
                                                  const nlohmann::ordered_json& special_tokens = {},
                                                  const jinja::Limits& limits = {});
  // Named templates, as tokenizer_config.json's list form.
  static core::Expected<ChatTemplate> from_named(const std::map<std::string, std::string>& sources,
                                                 const nlohmann::ordered_json& special_tokens = {},
                                                 const jinja::Limits& limits = {});

  // The special tokens HF would pass for model_dir (an empty object when it has no tokenizer_config.json).
  static core::Expected<nlohmann::ordered_json> load_special_tokens(const std::string& model_dir);

  // Replaces the template(s), keeping the special tokens (`--chat-template FILE`).
  core::Status set_source(std::string_view source);

  // HF get_chat_template(chat_template=None, tools): the single template, or from a named set "tool_use"
  // when tools are given and it exists, else "default".
  core::Expected<const jinja::Template*> select(bool has_tools, std::string* source = nullptr) const;

  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }
  const std::map<std::string, std::string>& sources() const { return sources_; }

 private:
  jinja::Limits limits_;
  std::map<std::string, std::string> sources_;  // "" for a single template, else names
  std::map<std::string, jinja::Template> compiled_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();

  core::Status compile();
};

struct ChatRenderOptions {
  bool add_generation_prompt = false;
  nlohmann::ordered_json tools;      // null: not given (the template sees None)
  nlohmann::ordered_json documents;  // null: None
  nlohmann::ordered_json kwargs;     // extra template variables (object or null)
  // HF continue_final_message: "" off; "content" (or another field) leaves the last message open.
  std::string continue_final_message;
  // Special tokens whose text inside messages, tools, documents and kwargs stays text (content_literals.hpp):
  // RenderedChat::literal says where they are. Empty: the permissive behaviour (--allow-special-in-content),
  // and what apply_chat_template does.
  std::vector<std::string> literal_tokens;
};

// The rendered prompt and the byte ranges in it that came from untrusted text as special-token spellings:
// Tokenizer::encode_literal tokenizes those as text.
struct RenderedChat {
  std::string text;
  std::vector<TextSpan> literal;
};

// The prompt text exactly as apply_chat_template(tokenize=False) returns it. Errors: template errors as
// "chat template L:C: message" (raise_exception text verbatim), HF's own ValueErrors as their text.
core::Expected<std::string> render_chat(const ChatTemplate& tmpl, const nlohmann::ordered_json& messages,
                                        const ChatRenderOptions& options,
                                        jinja::TemplateError* detail = nullptr);

// The same, keeping the literal spans of options.literal_tokens.
core::Expected<RenderedChat> render_chat_spans(const ChatTemplate& tmpl,
                                               const nlohmann::ordered_json& messages,
                                               const ChatRenderOptions& options,
                                               jinja::TemplateError* detail = nullptr);

// Convenience form of the above.
core::Expected<std::string> render_chat(const ChatTemplate& tmpl, const nlohmann::ordered_json& messages,
                                        const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                        const nlohmann::ordered_json& extra_kwargs,
                                        jinja::TemplateError* detail = nullptr);

// An OpenAI chat-completions request body: `messages` (tool-call arguments parsed from JSON strings),
// `tools`, `add_generation_prompt` (default true), `chat_template_kwargs` (an object), a top-level
// `enable_thinking` (chat_template_kwargs wins), and the vLLM-style extras `continue_final_message` and
// `documents`.
core::Expected<std::string> render_chat_request(const ChatTemplate& tmpl, const nlohmann::ordered_json& body,
                                                jinja::TemplateError* detail = nullptr);

// What transformers' OpenAI server does before templating (cli/serving/utils.py): tool-call `arguments`
// given as a JSON string are parsed into an object, since templates walk them as a mapping. Returns a copy;
// arguments that are not valid JSON objects stay as they are.
nlohmann::ordered_json parse_tool_call_arguments(const nlohmann::ordered_json& messages);

}  // namespace deltaflow::text
