// Ollama-compatible routes: /api/chat, /api/generate (NDJSON streaming, the default), /api/tags, /api/show,
// /api/ps, /api/version; enough for the `ollama` Python client and tools built on it.
#include <cmath>

#include "server/image_inputs.hpp"
#include "server/routes.hpp"
#include "server/structured_output.hpp"

namespace deltaflow::server {

namespace {

constexpr const char* kVersion = "0.1.0";

std::string now_iso() {
  return iso_time(std::chrono::system_clock::now());
}

std::string family(const ServedModel& m) {
  switch (m.config().architecture) {
    case model::Architecture::kQwen35Dense:
      return "qwen35";
    case model::Architecture::kQwen35Moe:
      return "qwen35moe";
    case model::Architecture::kQwen3Next:
      return "qwen3next";
  }
  return "qwen35";
}

std::string parameter_size(int64_t n) {
  char b[32];
  if (n >= 1'000'000'000)
    std::snprintf(b, sizeof b, "%.1fB", static_cast<double>(n) / 1e9);
  else if (n >= 1'000'000)
    std::snprintf(b, sizeof b, "%.1fM", static_cast<double>(n) / 1e6);
  else
    std::snprintf(b, sizeof b, "%lldK", static_cast<long long>(n / 1000));
  return b;
}

Json details(const ServedModel& m) {
  return {{"parent_model", ""},
          {"format", "safetensors"},
          {"family", family(m)},
          {"families", Json::array({family(m)})},
          {"parameter_size", parameter_size(m.parameter_count())},
          {"quantization_level", "BF16"}};
}

std::string modified_iso(const ServedModel& m) {
  return iso_time(std::chrono::system_clock::time_point(std::chrono::seconds(m.modified_unix())));
}

bool think_flag(const Json& body, bool def) {
  auto it = body.find("think");
  if (it == body.end() || it->is_null()) return def;
  if (it->is_boolean()) return it->get<bool>();
  if (it->is_string()) {
    const std::string s = it->get<std::string>();
    if (s == "high" || s == "medium" || s == "low") return true;
  }
  throw bad_field("think", "'think' must be a boolean or one of high, medium, low");
}

bool stream_flag(const Json& body) {
  auto it = body.find("stream");
  if (it == body.end() || it->is_null()) return true;  // Ollama streams unless told not to
  if (!it->is_boolean()) throw bad_field("stream", "'stream' must be a boolean");
  return it->get<bool>();
}

void refuse_unsupported(const Json& body) {
  if (auto it = body.find("suffix"); it != body.end() && it->is_string() && !it->get<std::string>().empty())
    throw bad_field("suffix", "'suffix' is not supported");
}

// Ollama's base64 `images` -> OpenAI image_url parts before the text (server/image_inputs.cpp loads them).
Json image_parts(const Json& images, const std::string& field, const Json& text) {
  if (!images.is_array()) throw bad_field(field, "'" + field + "' must be a list of base64 strings");
  Json parts = Json::array();
  for (size_t k = 0; k < images.size(); ++k) {
    if (!images[k].is_string())
      throw bad_field(field + "[" + std::to_string(k) + "]",
                      "'" + field + "' must be a list of base64 strings");
    parts.push_back(
        {{"type", "image_url"}, {"image_url", {{"url", "data:;base64," + images[k].get<std::string>()}}}});
  }
  if (text.is_string() && !text.get<std::string>().empty())
    parts.push_back({{"type", "text"}, {"text", text}});
  return parts;
}

// Ollama messages -> OpenAI-style messages for normalize_messages().
Json convert_messages(const Json& messages) {
  if (!messages.is_array()) throw bad_field("messages", "'messages' must be a list");
  Json out = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    Json m = messages[i];
    if (!m.is_object()) throw bad_field("messages[" + std::to_string(i) + "]", "a message must be an object");
    if (auto it = m.find("images"); it != m.end() && !it->is_null() && !(it->is_array() && it->empty()))
      m["content"] =
          image_parts(*it, "messages[" + std::to_string(i) + "].images", m.value("content", Json()));
    m.erase("images");
    if (auto it = m.find("thinking"); it != m.end()) {
      if (it->is_string()) m["reasoning_content"] = *it;
      m.erase("thinking");
    }
    out.push_back(std::move(m));
  }
  return out;
}

Json ollama_logprobs(const text::Tokenizer& tok, const std::vector<engine::SampledToken>& tokens) {
  Json a = Json::array();
  for (const auto& t : tokens) {
    Json top = Json::array();
    for (const auto& x : t.top) top.push_back({{"token", token_string(tok, x.id)}, {"logprob", x.logprob}});
    a.push_back(
        {{"token", token_string(tok, t.id)}, {"logprob", t.logprob}, {"top_logprobs", std::move(top)}});
  }
  return a;
}

Json final_fields(Json j, const GenerationRun& run, const ChoiceState& c) {
  j["done"] = true;
  j["done_reason"] = c.finish_reason == "tool_calls" ? "stop" : c.finish_reason;
  j["total_duration"] = run.total_ns();
  j["load_duration"] = 0;
  // Ollama counts only the prompt tokens it evaluated: those the prefix cache served are not.
  j["prompt_eval_count"] = run.prompt_tokens() - run.cached_tokens();
  j["prompt_eval_duration"] = run.prompt_eval_ns();
  j["eval_count"] = c.completion_tokens;
  j["eval_duration"] = run.eval_ns();
  return j;
}

Json tool_call_json(const text::ToolCall& call) {
  Json args = Json::parse(call.arguments, nullptr, false);
  if (args.is_discarded() || !args.is_object()) args = Json::object();
  return {{"function", {{"name", call.name}, {"arguments", std::move(args)}}}};
}

// The common tail of /api/chat and /api/generate.
void run_ollama(const http::Request&, http::Response& res, ServedModel& m, ServerContext& ctx,
                const Json& body, const Json& messages, const text::RenderedChat& prompt, bool chat,
                bool tools, std::vector<text::ToolSpec> specs,
                std::chrono::steady_clock::time_point arrival) {
  const GenParams params = take(parse_gen_params(body, Api::kOllama, ctx.defaults.generation,
                                                 m.config().vocab_size, ctx.options.enable_test_hooks));
  const bool in_reasoning = ends_in_thought(prompt.text);
  std::vector<int32_t> ids = m.encode_prompt(prompt);
  const std::string field = chat ? "messages" : "prompt";
  auto images = take(load_prompt_images(message_image_urls(messages), m, ctx.options.images, field, ids));
  auto requests = make_requests(m, {ids}, params, in_reasoning, field);
  for (auto& r : requests) r.images = images;
  if (auto spec = parse_structured_output(body, Api::kOllama))
    attach_constraint(requests, *spec, m, in_reasoning);
  OutputOptions o;
  o.reasoning = true;
  o.in_reasoning = in_reasoning;
  o.tools = tools;
  o.tool_specs = std::move(specs);
  o.stop = params.stop;
  std::vector<OutputOptions> outs = {o};
  auto run = std::make_shared<GenerationRun>(m, ctx.metrics, std::move(requests), std::move(outs), arrival);
  if (auto err = run->submit()) throw *err;
  const std::string model_name = m.name();
  const bool logprobs = params.logprobs;
  const text::Tokenizer* tok = &m.tokenizer();
  const char* text_key = chat ? "content" : "response";

  if (!stream_flag(body)) {
    respond_when_done(res, run,
                      [run, model_name, chat, text_key, logprobs, tok]() -> std::pair<int, std::string> {
                        if (auto e = run->error()) return {500, ollama_error_body(internal_error(*e))};
                        ChoiceState& c = run->choice(0);
                        Json j = {{"model", model_name}, {"created_at", now_iso()}};
                        if (chat) {
                          Json msg = {{"role", "assistant"}, {"content", c.content}};
                          if (!c.reasoning.empty()) msg["thinking"] = c.reasoning;
                          if (!c.calls.empty()) {
                            msg["tool_calls"] = Json::array();
                            for (const auto& call : c.calls)
                              msg["tool_calls"].push_back(tool_call_json(call));
                          }
                          j["message"] = std::move(msg);
                        } else {
                          j[text_key] = c.content;
                          if (!c.reasoning.empty()) j["thinking"] = c.reasoning;
                        }
                        if (logprobs) j["logprobs"] = ollama_logprobs(*tok, c.tokens);
                        return {200, dump(final_fields(std::move(j), *run, c))};
                      });
    return;
  }
  auto emitted_calls = std::make_shared<size_t>(0);
  StreamWriter w;
  w.on_delta = [run, model_name, chat, text_key, logprobs, tok, emitted_calls](
                   int, const OutputDelta& d) -> std::string {
    ChoiceState& c = run->choice(0);
    // Ollama sends whole calls: each goes out once its arguments are complete JSON.
    Json calls = Json::array();
    while (*emitted_calls < c.calls.size()) {
      Json args = Json::parse(c.calls[*emitted_calls].arguments, nullptr, false);
      if (args.is_discarded() || !args.is_object()) break;
      calls.push_back(tool_call_json(c.calls[*emitted_calls]));
      ++*emitted_calls;
    }
    if (d.content.empty() && d.reasoning.empty() && calls.empty() && !(logprobs && !d.tokens.empty()))
      return "";
    Json j = {{"model", model_name}, {"created_at", now_iso()}};
    if (chat) {
      Json msg = {{"role", "assistant"}, {"content", d.content}};
      if (!d.reasoning.empty()) msg["thinking"] = d.reasoning;
      if (!calls.empty()) msg["tool_calls"] = std::move(calls);
      j["message"] = std::move(msg);
    } else {
      j[text_key] = d.content;
      if (!d.reasoning.empty()) j["thinking"] = d.reasoning;
    }
    if (logprobs && !d.tokens.empty()) j["logprobs"] = ollama_logprobs(*tok, d.tokens);
    j["done"] = false;
    return dump(j) + "\n";
  };
  w.on_finish = [run, model_name, chat, text_key, emitted_calls](int) -> std::string {
    ChoiceState& c = run->choice(0);
    if (!c.error.empty()) return ollama_error_body(internal_error(c.error)) + "\n";
    Json j = {{"model", model_name}, {"created_at", now_iso()}};
    if (chat) {
      Json msg = {{"role", "assistant"}, {"content", ""}};
      if (*emitted_calls < c.calls.size()) {
        msg["tool_calls"] = Json::array();
        for (; *emitted_calls < c.calls.size(); ++*emitted_calls)
          msg["tool_calls"].push_back(tool_call_json(c.calls[*emitted_calls]));
      }
      j["message"] = std::move(msg);
    } else {
      j[text_key] = "";
    }
    return dump(final_fields(std::move(j), *run, c)) + "\n";
  };
  respond_streaming(res, "application/x-ndjson", run, std::move(w));
}

void handle_ollama_chat(const http::Request& req, http::Response& res, ServedModel& m, ServerContext& ctx) {
  const auto arrival = std::chrono::steady_clock::now();
  const Json body = take(parse_body(req.body));
  check_model(body, m, true);
  refuse_unsupported(body);
  auto mit = body.find("messages");
  Json messages =
      take(normalize_messages(convert_messages(mit == body.end() || mit->is_null() ? Json::array() : *mit)));
  std::vector<text::ToolSpec> specs;
  Json tools_json = nullptr;
  if (auto it = body.find("tools"); it != body.end() && it->is_array() && !it->empty()) {
    specs = take(parse_tools(*it));
    tools_json = *it;
  }
  const Json kwargs = {{"enable_thinking", think_flag(body, ctx.defaults.enable_thinking)}};
  auto text = m.render_chat(messages, tools_json, true, kwargs);
  if (!text) throw bad_field("messages", "the chat template failed: " + text.message());
  const bool tools = !specs.empty();
  run_ollama(req, res, m, ctx, body, messages, *text, true, tools, std::move(specs), arrival);
}

void handle_generate(const http::Request& req, http::Response& res, ServedModel& m, ServerContext& ctx) {
  const auto arrival = std::chrono::steady_clock::now();
  const Json body = take(parse_body(req.body));
  check_model(body, m, true);
  refuse_unsupported(body);
  std::string prompt;
  if (auto it = body.find("prompt"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) throw bad_field("prompt", "'prompt' must be a string");
    prompt = it->get<std::string>();
  }
  if (prompt.empty()) {
    // Ollama answers an empty prompt by loading the model: it is loaded.
    send_json(res, {{"model", m.name()},
                    {"created_at", now_iso()},
                    {"response", ""},
                    {"done", true},
                    {"done_reason", "load"}});
    return;
  }
  bool raw = false;
  if (auto it = body.find("raw"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) throw bad_field("raw", "'raw' must be a boolean");
    raw = it->get<bool>();
  }
  text::RenderedChat text{prompt, {}};  // raw: the client wrote the whole prompt, tokens and all
  Json messages = Json::array();
  const auto images = body.find("images");
  const bool has_images =
      images != body.end() && !images->is_null() && !(images->is_array() && images->empty());
  if (raw && has_images) throw bad_field("images", "'images' cannot go with a raw prompt");
  if (!raw) {
    if (auto it = body.find("system"); it != body.end() && !it->is_null()) {
      if (!it->is_string()) throw bad_field("system", "'system' must be a string");
      messages.push_back({{"role", "system"}, {"content", *it}});
    }
    messages.push_back(
        {{"role", "user"}, {"content", has_images ? image_parts(*images, "images", prompt) : Json(prompt)}});
    const Json kwargs = {{"enable_thinking", think_flag(body, ctx.defaults.enable_thinking)}};
    auto r = m.render_chat(messages, nullptr, true, kwargs);
    if (!r) throw bad_field("prompt", "the chat template failed: " + r.message());
    text = std::move(*r);
  }
  run_ollama(req, res, m, ctx, body, messages, text, false, false, {}, arrival);
}

Json ps_entry(const ServedModel& m) {
  const bool gpu = std::string(m.device_name()) != "cpu";
  return {{"name", m.name()},
          {"model", m.name()},
          {"size", m.weight_bytes()},
          {"digest", m.digest()},
          {"details", details(m)},
          {"expires_at", "2999-01-01T00:00:00Z"},
          {"size_vram", gpu ? m.weight_bytes() : 0},
          {"context_length", m.max_model_len()}};
}

}  // namespace

void add_ollama_routes(http::Server& svr, ServerContext& ctx) {
  svr.route("POST", "/api/chat",
            guarded(ctx, true, [&ctx](const http::Request& q, http::Response& r, ServedModel& m) {
              handle_ollama_chat(q, r, m, ctx);
            }));
  svr.route("POST", "/api/generate",
            guarded(ctx, true, [&ctx](const http::Request& q, http::Response& r, ServedModel& m) {
              handle_generate(q, r, m, ctx);
            }));
  svr.route("GET", "/api/tags",
            guarded(ctx, true, [](const http::Request&, http::Response& r, ServedModel& m) {
              send_json(r, {{"models", Json::array({{{"name", m.name()},
                                                     {"model", m.name()},
                                                     {"modified_at", modified_iso(m)},
                                                     {"size", m.weight_bytes()},
                                                     {"digest", m.digest()},
                                                     {"details", details(m)}}})}});
            }));
  svr.route("POST", "/api/show",
            guarded(ctx, true, [](const http::Request& q, http::Response& r, ServedModel& m) {
              const Json body = take(parse_body(q.body));
              Json b = body;
              if (!b.contains("model") && b.contains("name")) b["model"] = b["name"];  // older clients
              check_model(b, m, true);
              const auto& d = m.defaults();
              char params[256];
              std::snprintf(params, sizeof params, "temperature %g\ntop_k %d\ntop_p %g", d.temperature,
                            d.top_k, d.top_p);
              const std::string fam = family(m);
              Json info = {{"general.architecture", fam},
                           {"general.parameter_count", m.parameter_count()},
                           {fam + ".context_length", m.max_model_len()},
                           {fam + ".embedding_length", m.config().hidden_size},
                           {fam + ".block_count", m.config().num_hidden_layers}};
              Json caps = Json::array({"completion"});
              if (m.has_chat_template()) caps.push_back("tools");
              if (m.think_end_id() >= 0) caps.push_back("thinking");
              send_json(r, {{"modelfile", "# served by deltaflow from " + m.dir() + "\n"},
                            {"parameters", params},
                            {"template", m.chat_template_source()},
                            {"details", details(m)},
                            {"model_info", std::move(info)},
                            {"capabilities", std::move(caps)},
                            {"modified_at", modified_iso(m)}});
            }));
  svr.route("GET", "/api/ps", guarded(ctx, true, [](const http::Request&, http::Response& r, ServedModel& m) {
              send_json(r, {{"models", Json::array({ps_entry(m)})}});
            }));
  svr.route("GET", "/api/version", [](const http::Request&, http::Response& r) {
    send_json(r, {{"version", kVersion}});
  });
}

}  // namespace deltaflow::server
