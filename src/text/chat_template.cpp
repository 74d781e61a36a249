#include "text/chat_template.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "text/content_literals.hpp"
#include "text/jinja/pystr.hpp"

namespace deltaflow::text {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

core::Expected<std::string> read_template_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return core::Error{"cannot read " + p.string()};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

core::Expected<Json> read_json(const fs::path& p) {
  DF_ASSIGN(std::string text, read_template_file(p));
  try {
    return Json::parse(text);
  } catch (const std::exception& e) {
    return core::Error{p.string() + ": invalid JSON: " + e.what()};
  }
}

// A special token as tokenizer_config.json writes it: a string or an AddedToken object.
bool token_string(const Json& v, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return true;
  }
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    *out = v["content"].get<std::string>();
    return true;
  }
  return false;
}

// HF's special_tokens_map: the named attributes, then model-specific "*_token" entries.
Json special_tokens_of(const Json& config, const Json* legacy_map) {
  static const char* kNamed[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                 "pad_token", "cls_token", "mask_token"};
  Json merged = config.is_object() ? config : Json::object();
  if (legacy_map && legacy_map->is_object() && !merged.contains("added_tokens_decoder")) {
    for (auto it = legacy_map->begin(); it != legacy_map->end(); ++it) merged[it.key()] = it.value();
  }
  Json out = Json::object();
  std::string s;
  for (const char* k : kNamed)
    if (merged.contains(k) && token_string(merged[k], &s)) out[k] = s;
  for (auto it = merged.begin(); it != merged.end(); ++it) {
    const std::string& k = it.key();
    bool named = false;
    for (const char* n : kNamed) named = named || k == n;
    if (named || k.size() < 6 || k.compare(k.size() - 6, 6, "_token") != 0) continue;
    if (token_string(it.value(), &s)) out[k] = s;
  }
  if (merged.contains("extra_special_tokens") && merged["extra_special_tokens"].is_object()) {
    const Json& extra = merged["extra_special_tokens"];
    for (auto it = extra.begin(); it != extra.end(); ++it)
      if (token_string(it.value(), &s)) out[it.key()] = s;
  }
  return out;
}

std::string flatten(const std::string& s) {
  std::string out;
  for (char c : s) out += (c == '\n') ? std::string("\\n") : std::string(1, c);
  return out;
}

}  // namespace

core::Status ChatTemplate::compile() {
  compiled_.clear();
  for (const auto& [name, src] : sources_) {
    jinja::TemplateError e;
    auto t = jinja::Template::parse(src, limits_, &e);
    if (!t) {
      std::string which = name.empty() ? "chat template" : "chat template '" + name + "'";
      return core::Error{which + " " + t.message()};
    }
    compiled_.emplace(name, std::move(t).value());
  }
  return core::Status::ok();
}

core::Expected<ChatTemplate> ChatTemplate::from_source(std::string_view source, const Json& special_tokens,
                                                       const jinja::Limits& limits) {
  ChatTemplate t;
  t.limits_ = limits;
  t.sources_[""] = std::string(source);
  if (special_tokens.is_object()) t.special_tokens_ = special_tokens;
  DF_TRY(t.compile());
  return t;
}

core::Expected<ChatTemplate> ChatTemplate::from_named(const std::map<std::string, std::string>& sources,
                                                      const Json& special_tokens,
                                                      const jinja::Limits& limits) {
  ChatTemplate t;
  t.limits_ = limits;
  t.sources_ = sources;
  if (t.sources_.empty()) return core::Error{"no chat templates given"};
  if (special_tokens.is_object()) t.special_tokens_ = special_tokens;
  DF_TRY(t.compile());
  return t;
}

core::Status ChatTemplate::set_source(std::string_view source) {
  sources_.clear();
  sources_[""] = std::string(source);
  return compile();
}

core::Expected<Json> ChatTemplate::load_special_tokens(const std::string& model_dir) {
  fs::path dir(model_dir);
  Json config = Json::object();
  if (fs::exists(dir / "tokenizer_config.json")) {
    DF_ASSIGN(config, read_json(dir / "tokenizer_config.json"));
    if (!config.is_object())
      return core::Error{(dir / "tokenizer_config.json").string() + ": not a JSON object"};
  }
  Json legacy;
  bool have_legacy = false;
  if (fs::exists(dir / "special_tokens_map.json")) {
    auto m = read_json(dir / "special_tokens_map.json");
    if (m) {
      legacy = *m;
      have_legacy = true;
    }
  }
  return special_tokens_of(config, have_legacy ? &legacy : nullptr);
}

core::Expected<ChatTemplate> ChatTemplate::load(const std::string& model_dir, const jinja::Limits& limits) {
  fs::path dir(model_dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return core::Error{"model directory not found: " + model_dir};
  DF_ASSIGN(Json special, load_special_tokens(model_dir));
  Json config = Json::object();
  if (fs::exists(dir / "tokenizer_config.json")) {
    DF_ASSIGN(config, read_json(dir / "tokenizer_config.json"));
  }
  std::map<std::string, std::string> sources;
  bool have_file = fs::exists(dir / "chat_template.jinja");
  if (have_file) {
    DF_ASSIGN(sources["default"], read_template_file(dir / "chat_template.jinja"));
  }
  fs::path extra = dir / "additional_chat_templates";
  if (fs::is_directory(extra, ec)) {
    for (const auto& e : fs::directory_iterator(extra, ec)) {
      if (e.path().extension() != ".jinja") continue;
      DF_ASSIGN(sources[e.path().stem().string()], read_template_file(e.path()));
    }
  }
  if (sources.size() == 1 && have_file) return from_source(sources["default"], special, limits);
  if (!sources.empty()) return from_named(sources, special, limits);

  if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    const Json& ct = config["chat_template"];
    if (ct.is_string()) return from_source(ct.get<std::string>(), special, limits);
    if (ct.is_array()) {
      for (const auto& item : ct) {
        if (!item.is_object() || !item.contains("name") || !item.contains("template") ||
            !item["name"].is_string() || !item["template"].is_string())
          return core::Error{
              "tokenizer_config.json: chat_template list entries need string 'name' and 'template'"};
        sources[item["name"].get<std::string>()] = item["template"].get<std::string>();
      }
      return from_named(sources, special, limits);
    }
    return core::Error{"tokenizer_config.json: chat_template must be a string or a list"};
  }
  if (fs::exists(dir / "chat_template.json")) {
    DF_ASSIGN(Json j, read_json(dir / "chat_template.json"));
    if (j.is_object() && j.contains("chat_template") && j["chat_template"].is_string())
      return from_source(j["chat_template"].get<std::string>(), special, limits);
  }
  return core::Error{"no chat template in " + model_dir +
                     " (looked for chat_template.jinja and tokenizer_config.json 'chat_template')"};
}

core::Expected<const jinja::Template*> ChatTemplate::select(bool has_tools, std::string* source) const {
  auto pick = [&](const std::string& name) -> const jinja::Template* {
    if (source) *source = sources_.at(name);
    return &compiled_.at(name);
  };
  if (compiled_.count("")) return pick("");
  if (has_tools && compiled_.count("tool_use")) return pick("tool_use");
  if (compiled_.count("default")) return pick("default");
  std::string names;
  for (const auto& [n, _] : sources_) names += (names.empty() ? "'" : ", '") + n + "'";
  return core::Error{
      "This model has multiple chat templates with no default specified! Available template names are [" +
      names + "]."};
}

core::Expected<std::string> render_chat(const ChatTemplate& tmpl, const Json& messages,
                                        const ChatRenderOptions& opt, jinja::TemplateError* detail) {
  DF_ASSIGN(RenderedChat r, render_chat_spans(tmpl, messages, opt, detail));
  return std::move(r.text);
}

core::Expected<RenderedChat> render_chat_spans(const ChatTemplate& tmpl, const Json& messages,
                                               const ChatRenderOptions& opt, jinja::TemplateError* detail) {
  using jinja::Value;
  if (!messages.is_array()) return core::Error{"messages must be a list"};
  if (messages.empty())
    return core::Error{"Cannot apply chat template to an empty conversation. Provide at least one message."};
  if (messages[0].is_array()) return core::Error{"batched conversations are not supported"};
  if (!opt.tools.is_null()) {
    if (!opt.tools.is_array()) return core::Error{"tools must be a list"};
    for (const auto& t : opt.tools)
      if (!t.is_object())
        return core::Error{
            "Tools should either be a JSON schema, or a callable function with type hints and a "
            "docstring suitable for auto-conversion to a schema."};
  }
  if (!opt.documents.is_null()) {
    if (!opt.documents.is_array()) return core::Error{"documents must be a list"};
    for (const auto& d : opt.documents)
      if (!d.is_object())
        return core::Error{"Documents should be a list of dicts with 'title' and 'text' keys!"};
  }
  std::string source;
  DF_ASSIGN(const jinja::Template* t, tmpl.select(!opt.tools.is_null(), &source));

  // Untrusted strings with their special-token spellings masked (content_literals.hpp); no-op when
  // opt.literal_tokens is empty.
  ContentLiterals literals(opt.literal_tokens, source);
  if (literals.active()) literals.prepare(Json::array({messages, opt.tools, opt.documents, opt.kwargs}));
  Json chat = literals.escape(messages);
  const Json tools = literals.escape(opt.tools);
  const Json documents = literals.escape(opt.documents);
  const Json user_kwargs = literals.escape(opt.kwargs);
  std::string final_message;
  const std::string tag = "CONTINUE_FINAL_MESSAGE_TAG ";
  const std::string& field = opt.continue_final_message;
  if (!field.empty()) {
    if (opt.add_generation_prompt)
      return core::Error{
          "continue_final_message and add_generation_prompt are not compatible. Use "
          "continue_final_message when you want the model to continue the final message, and "
          "add_generation_prompt when you want to add a header that will prompt it to start a new "
          "assistant message instead."};
    Json& last = chat.back();
    if (!last.is_object() || !last.contains(field) || last[field].is_null())
      return core::Error{"continue_final_message is set but the final message has no \"" + field +
                         "\" to continue!"};
    if (source.find(field) == std::string::npos)
      return core::Error{"continue_final_message is set to \"" + field +
                         "\" but this is not an accepted field in the chat_template"};
    Json& fm = last[field];
    if (fm.is_array()) {
      bool found = false;
      for (auto it = fm.rbegin(); it != fm.rend(); ++it) {
        if (it->is_object() && it->contains("text") && (*it)["text"].is_string()) {
          final_message = (*it)["text"].get<std::string>();
          (*it)["text"] = final_message + tag;
          found = true;
          break;
        }
      }
      if (!found)
        return core::Error{
            "continue_final_message is set but we could not find any text to continue in the final message!"};
    } else if (fm.is_string()) {
      final_message = fm.get<std::string>();
      fm = final_message + tag;
    } else {
      return core::Error{"continue_final_message: the final message's \"" + field +
                         "\" must be a string or a list"};
    }
  }

  // render(messages=..., tools=..., documents=..., add_generation_prompt=..., **{**special_tokens, **kwargs})
  Value vars = Value::dict();
  auto& d = vars.dict_data();
  d.set(Value::string("messages"), jinja::from_json(chat));
  d.set(Value::string("tools"), tools.is_null() ? Value::none() : jinja::from_json(tools));
  d.set(Value::string("documents"), documents.is_null() ? Value::none() : jinja::from_json(documents));
  d.set(Value::string("add_generation_prompt"), Value::boolean(opt.add_generation_prompt));
  Json kw = tmpl.special_tokens();
  if (user_kwargs.is_object())
    for (auto it = user_kwargs.begin(); it != user_kwargs.end(); ++it) kw[it.key()] = it.value();
  else if (!user_kwargs.is_null())
    return core::Error{"chat template kwargs must be an object"};
  for (auto it = kw.begin(); it != kw.end(); ++it) {
    const std::string& k = it.key();
    if (k == "messages" || k == "tools" || k == "documents" || k == "add_generation_prompt")
      return core::Error{"render() got multiple values for keyword argument '" + k + "'"};
    d.set(Value::string(k), jinja::from_json(it.value()));
  }

  jinja::TemplateError err;
  auto r = t->render(vars, &err);
  if (!r) {
    if (detail) *detail = err;
    return core::Error{"chat template " + flatten(r.message())};
  }
  std::string rendered = std::move(r).value();
  if (!field.empty()) {
    std::string tag_core = "CONTINUE_FINAL_MESSAGE_TAG";
    std::string stripped = jinja::py::strip(final_message, nullptr, true, true);
    if (rendered.find(stripped) == std::string::npos || rendered.find(tag_core) == std::string::npos)
      return core::Error{
          "continue_final_message is set but the final message does not appear in the chat after "
          "applying the chat template!"};
    size_t loc = rendered.rfind(tag_core);
    if (rendered.compare(loc, tag.size(), tag) == 0)
      rendered.resize(loc);
    else
      rendered = jinja::py::strip(rendered.substr(0, loc), nullptr, false, true);
  }
  RenderedChat out;
  out.text = literals.resolve(rendered, out.literal);
  return out;
}

core::Expected<std::string> render_chat(const ChatTemplate& tmpl, const Json& messages, const Json& tools,
                                        bool add_generation_prompt, const Json& extra_kwargs,
                                        jinja::TemplateError* detail) {
  ChatRenderOptions opt;
  opt.tools = tools;
  opt.add_generation_prompt = add_generation_prompt;
  opt.kwargs = extra_kwargs;
  return render_chat(tmpl, messages, opt, detail);
}

core::Expected<std::string> render_chat_request(const ChatTemplate& tmpl, const Json& body,
                                                jinja::TemplateError* detail) {
  if (!body.is_object()) return core::Error{"chat request must be a JSON object"};
  if (!body.contains("messages")) return core::Error{"chat request has no 'messages'"};
  ChatRenderOptions opt;
  opt.tools = body.contains("tools") ? body["tools"] : Json();
  opt.documents = body.contains("documents") ? body["documents"] : Json();
  opt.add_generation_prompt = true;
  if (body.contains("add_generation_prompt")) {
    if (!body["add_generation_prompt"].is_boolean())
      return core::Error{"'add_generation_prompt' must be a boolean"};
    opt.add_generation_prompt = body["add_generation_prompt"].get<bool>();
  }
  if (body.contains("continue_final_message")) {
    const Json& c = body["continue_final_message"];
    if (c.is_boolean())
      opt.continue_final_message = c.get<bool>() ? "content" : "";
    else if (c.is_string())
      opt.continue_final_message = c.get<std::string>();
    else
      return core::Error{"'continue_final_message' must be a boolean or a string"};
    // vLLM's default: continuing a message means no new generation prompt.
    if (!opt.continue_final_message.empty() && !body.contains("add_generation_prompt"))
      opt.add_generation_prompt = false;
  }
  Json kwargs = Json::object();
  if (body.contains("enable_thinking")) kwargs["enable_thinking"] = body["enable_thinking"];
  if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
    const Json& k = body["chat_template_kwargs"];
    if (!k.is_object()) return core::Error{"'chat_template_kwargs' must be an object"};
    for (auto it = k.begin(); it != k.end(); ++it) {
      if (it.key() == "add_generation_prompt") {
        if (!it.value().is_boolean()) return core::Error{"'add_generation_prompt' must be a boolean"};
        opt.add_generation_prompt = it.value().get<bool>();
        continue;
      }
      kwargs[it.key()] = it.value();
    }
  }
  opt.kwargs = std::move(kwargs);
  return render_chat(tmpl, parse_tool_call_arguments(body["messages"]), opt, detail);
}

Json parse_tool_call_arguments(const Json& messages) {
  Json out = messages;
  if (!out.is_array()) return out;
  for (auto& m : out) {
    if (!m.is_object() || !m.contains("tool_calls") || !m["tool_calls"].is_array()) continue;
    for (auto& tc : m["tool_calls"]) {
      if (!tc.is_object()) continue;
      Json& fn = (tc.contains("function") && tc["function"].is_object()) ? tc["function"] : tc;
      if (!fn.contains("arguments") || !fn["arguments"].is_string()) continue;
      try {
        Json parsed = Json::parse(fn["arguments"].get<std::string>());
        if (parsed.is_object()) fn["arguments"] = std::move(parsed);
      } catch (const std::exception&) {
        // Not JSON: leave it to the template, as a string.
      }
    }
  }
  return out;
}

}  // namespace deltaflow::text
