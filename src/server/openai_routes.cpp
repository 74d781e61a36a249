// OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models, and vLLM's /tokenize and
// /detokenize.
#include <algorithm>

#include "server/image_inputs.hpp"
#include "server/openai_call.hpp"
#include "server/prompt_scoring.hpp"
#include "server/routes.hpp"
#include "server/structured_output.hpp"

namespace deltaflow::server {

namespace {

struct ToolChoice {
  enum Kind { kAuto, kNone, kRequired, kNamed } kind = kAuto;
  std::string name;
};

ToolChoice parse_tool_choice(const Json& body, const std::vector<text::ToolSpec>& tools, bool have_tools) {
  ToolChoice tc;
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return tc;
  if (it->is_string()) {
    const std::string s = it->get<std::string>();
    if (s == "auto")
      tc.kind = ToolChoice::kAuto;
    else if (s == "none")
      tc.kind = ToolChoice::kNone;
    else if (s == "required")
      tc.kind = ToolChoice::kRequired;
    else
      throw bad_field("tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or a named function");
  } else if (it->is_object() && it->contains("function") && (*it)["function"].is_object() &&
             (*it)["function"].contains("name") && (*it)["function"]["name"].is_string()) {
    tc.kind = ToolChoice::kNamed;
    tc.name = (*it)["function"]["name"].get<std::string>();
    if (std::none_of(tools.begin(), tools.end(), [&](const text::ToolSpec& t) { return t.name == tc.name; }))
      throw bad_field("tool_choice", "tool_choice names '" + tc.name + "', which is not in 'tools'");
  } else {
    throw bad_field("tool_choice",
                    "'tool_choice' must be 'auto', 'none', 'required' or {\"type\": \"function\", "
                    "\"function\": {\"name\": ...}}");
  }
  if ((tc.kind == ToolChoice::kRequired || tc.kind == ToolChoice::kNamed) && !have_tools)
    throw bad_field("tool_choice", "tool_choice '" +
                                       std::string(tc.kind == ToolChoice::kNamed ? "named" : "required") +
                                       "' needs 'tools'");
  return tc;
}

bool get_bool(const Json& body, const char* key, bool def) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return def;
  if (!it->is_boolean()) throw bad_field(key, std::string("'") + key + "' must be a boolean");
  return it->get<bool>();
}

StreamOptions parse_stream_options(const Json& body) {
  StreamOptions so;
  auto it = body.find("stream_options");
  if (it == body.end() || it->is_null()) return so;
  if (!it->is_object()) throw bad_field("stream_options", "'stream_options' must be an object");
  auto u = it->find("include_usage");
  if (u != it->end() && !u->is_null()) {
    if (!u->is_boolean())
      throw bad_field("stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
    so.include_usage = u->get<bool>();
  }
  return so;
}

Json usage_json(const GenerationRun& run) {
  return Json{{"prompt_tokens", run.prompt_tokens()},
              {"completion_tokens", run.completion_tokens()},
              {"total_tokens", run.prompt_tokens() + run.completion_tokens()},
              {"prompt_tokens_details", {{"cached_tokens", run.cached_tokens()}}}};
}

Json chat_logprob_entry(const text::Tokenizer& tok, const engine::SampledToken& t) {
  Json top = Json::array();
  for (const auto& a : t.top)
    top.push_back(
        {{"token", token_string(tok, a.id)}, {"logprob", a.logprob}, {"bytes", token_bytes(tok, a.id)}});
  return {{"token", token_string(tok, t.id)},
          {"logprob", t.logprob},
          {"bytes", token_bytes(tok, t.id)},
          {"top_logprobs", std::move(top)}};
}

// Legacy completions logprobs: parallel lists.
Json completion_logprobs(const text::Tokenizer& tok, const std::vector<engine::SampledToken>& tokens,
                         size_t offset0) {
  Json toks = Json::array(), lps = Json::array(), tops = Json::array(), offs = Json::array();
  size_t offset = offset0;
  for (const auto& t : tokens) {
    const std::string s = token_string(tok, t.id);
    toks.push_back(s);
    lps.push_back(t.logprob);
    Json top = Json::object();
    for (const auto& a : t.top) top[token_string(tok, a.id)] = a.logprob;
    tops.push_back(std::move(top));
    offs.push_back(offset);
    offset += s.size();
  }
  return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

// tool_calls delta entries: consecutive pieces of one call are merged into one entry.
Json tool_call_deltas(const std::vector<text::ToolCallDelta>& calls, const ChoiceState& c) {
  Json out = Json::array();
  for (const auto& d : calls) {
    if (!out.empty() && out.back()["index"] == d.index && !d.begin) {
      std::string a = out.back()["function"]["arguments"].get<std::string>();
      out.back()["function"]["arguments"] = a + d.arguments;
      continue;
    }
    Json e = {{"index", d.index}};
    if (d.begin) {
      e["id"] = static_cast<size_t>(d.index) < c.call_ids.size() ? c.call_ids[static_cast<size_t>(d.index)]
                                                                 : new_call_id();
      e["type"] = "function";
      e["function"] = {{"name", d.name}, {"arguments", d.arguments}};
    } else {
      e["function"] = {{"arguments", d.arguments}};
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::string sse(const Json& j) {
  return "data: " + dump(j) + "\n\n";
}

// Everything a chat request turns into before the engine sees it.
struct ChatPlan {
  std::vector<int32_t> prompt;
  std::vector<engine::ImageInput> images;  // in the order of the prompt's image placeholders
  bool in_reasoning = false;
  bool tools = false;
  std::vector<text::ToolSpec> tool_specs;
  std::string tool_prefix;
  std::optional<GrammarSpec> grammar;  // tool_choice required / named, else response_format & co.
};

ChatPlan plan_chat(const Json& body, ServedModel& m, const ServerContext& ctx) {
  ChatPlan plan;
  if (!body.contains("messages")) throw bad_field("messages", "'messages' is required");
  Json messages = take(normalize_messages(body["messages"]));
  const Json* tools_json = nullptr;
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    plan.tool_specs = take(parse_tools(*it));
    if (!plan.tool_specs.empty()) tools_json = &*it;
  }
  const ToolChoice tc = parse_tool_choice(body, plan.tool_specs, tools_json != nullptr);
  if (auto it = body.find("parallel_tool_calls"); it != body.end() && !it->is_null() && !it->is_boolean())
    throw bad_field("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
  plan.tools = tools_json && tc.kind != ToolChoice::kNone;

  Json kwargs = Json::object();
  bool enable_thinking = ctx.defaults.enable_thinking;
  if (auto it = body.find("reasoning_effort"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) throw bad_field("reasoning_effort", "'reasoning_effort' must be a string");
    if (it->get<std::string>() == "none") enable_thinking = false;
  }
  enable_thinking = get_bool(body, "enable_thinking", enable_thinking);
  if (auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) throw bad_field("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    for (auto kv = it->begin(); kv != it->end(); ++kv) {
      if (kv.key() == "messages" || kv.key() == "tools")
        throw bad_field("chat_template_kwargs", "'chat_template_kwargs' may not set '" + kv.key() + "'");
      kwargs[kv.key()] = kv.value();
    }
    if (auto e = it->find("enable_thinking"); e != it->end() && !e->is_null()) {
      if (!e->is_boolean())
        throw bad_field("chat_template_kwargs.enable_thinking",
                        "'chat_template_kwargs.enable_thinking' must be a boolean");
      enable_thinking = e->get<bool>();
    }
  }
  kwargs["enable_thinking"] = enable_thinking;
  const bool add_generation_prompt = get_bool(body, "add_generation_prompt", true);
  if (get_bool(body, "continue_final_message", false))
    throw bad_field("continue_final_message", "'continue_final_message' is not supported");
  auto rendered =
      m.render_chat(messages, plan.tools ? *tools_json : Json(nullptr), add_generation_prompt, kwargs);
  if (!rendered) throw bad_field("messages", "the chat template failed: " + rendered.message());
  text::RenderedChat prompt = std::move(*rendered);
  std::string& text = prompt.text;
  plan.in_reasoning = ends_in_thought(text);
  if (plan.tools && (tc.kind == ToolChoice::kRequired || tc.kind == ToolChoice::kNamed)) {
    // The prompt itself opens the call (an empty thought first), the parser starts inside it, and a grammar
    // makes the rest a call of a declared function with arguments that follow its schema.
    if (plan.in_reasoning) text += "\n</think>\n\n";
    plan.in_reasoning = false;
    if (m.xml_tool_calls()) {
      plan.tool_prefix =
          "<tool_call>\n<function=" + (tc.kind == ToolChoice::kNamed ? tc.name + ">\n" : std::string());
    } else {
      plan.tool_prefix = "<tool_call>\n{\"name\": \"" +
                         (tc.kind == ToolChoice::kNamed ? tc.name + "\", \"arguments\": " : std::string());
    }
    text += plan.tool_prefix;
    plan.grammar =
        tool_call_spec(*tools_json, tc.kind == ToolChoice::kNamed ? tc.name : "", m.xml_tool_calls());
  } else {
    plan.grammar = parse_structured_output(body, Api::kChat);
  }
  plan.prompt = m.encode_prompt(prompt);
  plan.images =
      take(load_prompt_images(message_image_urls(messages), m, ctx.options.images, "messages", plan.prompt));
  return plan;
}

}  // namespace

OpenAICall prepare_chat(const Json& body, ServedModel& m, ServerContext& ctx,
                        std::chrono::steady_clock::time_point arrival) {
  check_model(body, m);
  const bool stream = get_bool(body, "stream", false);
  const StreamOptions so = parse_stream_options(body);
  ChatPlan plan = plan_chat(body, m, ctx);
  const GenParams params = take(parse_gen_params(body, Api::kChat, ctx.defaults.generation,
                                                 m.config().vocab_size, ctx.options.enable_test_hooks));
  auto requests = make_requests(m, {plan.prompt}, params, plan.in_reasoning, "messages");
  for (auto& r : requests) r.images = plan.images;
  if (plan.grammar) attach_constraint(requests, *plan.grammar, m, plan.in_reasoning);
  // vLLM's prompt_logprobs: the rendered prompt scored teacher-forced before generating.
  Json prompt_lp = nullptr;
  if (params.prompt_logprobs) {
    if (stream) throw bad_field("prompt_logprobs", "'prompt_logprobs' is not available with streaming");
    const auto scores = score_prompts(m, {plan.prompt}, *params.prompt_logprobs, {plan.images});
    prompt_lp = vllm_prompt_logprobs(m.tokenizer(), plan.prompt, scores[0]);
  }
  std::vector<OutputOptions> outs;
  for (size_t i = 0; i < requests.size(); ++i) {
    OutputOptions o;
    o.reasoning = true;
    o.in_reasoning = plan.in_reasoning;
    o.tools = plan.tools;
    o.tool_specs = plan.tool_specs;
    o.tool_prefix = plan.tool_prefix;
    o.stop = params.stop;
    o.skip_special_tokens = params.skip_special_tokens;
    outs.push_back(std::move(o));
  }
  auto run = std::make_shared<GenerationRun>(m, ctx.metrics, std::move(requests), std::move(outs), arrival);
  run->set_prompt_tokens(static_cast<int64_t>(plan.prompt.size()));
  if (auto err = run->submit()) throw *err;

  const std::string id = new_request_id("chatcmpl-");
  const int64_t created = unix_now();
  const std::string model_name = m.name();
  const bool logprobs = params.logprobs;
  const text::Tokenizer* tok = &m.tokenizer();

  OpenAICall call{run, nullptr, stream, so, id, created, model_name, logprobs};
  call.whole = [run, id, created, model_name, logprobs, tok, prompt_lp]() -> std::pair<int, std::string> {
    if (auto e = run->error()) return {500, openai_error_body(internal_error(*e))};
    Json choices = Json::array();
    for (int i = 0; i < run->choices(); ++i) {
      ChoiceState& c = run->choice(i);
      Json msg = {{"role", "assistant"}};
      const bool has_calls = !c.calls.empty();
      msg["content"] = c.content.empty() && has_calls ? Json(nullptr) : Json(c.content);
      msg["reasoning_content"] = c.reasoning.empty() ? Json(nullptr) : Json(c.reasoning);
      if (has_calls) {
        Json calls = Json::array();
        for (size_t k = 0; k < c.calls.size(); ++k)
          calls.push_back({{"id", c.call_ids[k]},
                           {"type", "function"},
                           {"function", {{"name", c.calls[k].name}, {"arguments", c.calls[k].arguments}}}});
        msg["tool_calls"] = std::move(calls);
      }
      Json lp = nullptr;
      if (logprobs) {
        lp = {{"content", Json::array()}};
        for (const auto& t : c.tokens) lp["content"].push_back(chat_logprob_entry(*tok, t));
      }
      choices.push_back({{"index", i},
                         {"message", std::move(msg)},
                         {"logprobs", std::move(lp)},
                         {"finish_reason", c.finish_reason}});
    }
    Json out = {{"id", id},
                {"object", "chat.completion"},
                {"created", created},
                {"model", model_name},
                {"choices", std::move(choices)},
                {"usage", usage_json(*run)}};
    if (!prompt_lp.is_null()) out["prompt_logprobs"] = prompt_lp;
    return {200, dump(out)};
  };
  return call;
}

namespace {

void handle_openai_chat(const http::Request& req, http::Response& res, ServedModel& m, ServerContext& ctx) {
  const auto arrival = std::chrono::steady_clock::now();
  const Json body = take(parse_body(req.body));
  OpenAICall call = prepare_chat(body, m, ctx, arrival);
  if (!call.stream) return respond_when_done(res, call.run, call.whole);
  const auto run = call.run;
  const std::string id = call.id, model_name = call.model_name;
  const int64_t created = call.created;
  const bool logprobs = call.logprobs;
  const StreamOptions so = call.stream_options;
  const text::Tokenizer* tok = &m.tokenizer();

  auto chunk = [id, created, model_name, so](Json choices) {
    Json j = {{"id", id},
              {"object", "chat.completion.chunk"},
              {"created", created},
              {"model", model_name},
              {"choices", std::move(choices)}};
    if (so.include_usage) j["usage"] = nullptr;
    return sse(j);
  };
  StreamWriter w;
  w.on_start = [run, chunk]() {
    std::string s;
    for (int i = 0; i < run->choices(); ++i)
      s += chunk(Json::array({{{"index", i},
                               {"delta", {{"role", "assistant"}, {"content", ""}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}}}));
    return s;
  };
  w.on_delta = [run, chunk, logprobs, tok](int i, const OutputDelta& d) -> std::string {
    Json delta = Json::object();
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.content.empty()) delta["content"] = d.content;
    if (!d.calls.empty()) delta["tool_calls"] = tool_call_deltas(d.calls, run->choice(i));
    Json lp = nullptr;
    if (logprobs && !d.tokens.empty()) {
      lp = {{"content", Json::array()}};
      for (const auto& t : d.tokens) lp["content"].push_back(chat_logprob_entry(*tok, t));
    }
    if (delta.empty() && lp.is_null()) return "";
    return chunk(Json::array({{{"index", i},
                               {"delta", std::move(delta)},
                               {"logprobs", std::move(lp)},
                               {"finish_reason", nullptr}}}));
  };
  w.on_finish = [run, chunk](int i) -> std::string {
    ChoiceState& c = run->choice(i);
    if (!c.error.empty()) return sse(Json::parse(openai_error_body(internal_error(c.error))));
    return chunk(Json::array({{{"index", i},
                               {"delta", Json::object()},
                               {"logprobs", nullptr},
                               {"finish_reason", c.finish_reason}}}));
  };
  w.on_end = [run, id, created, model_name, so]() {
    std::string s;
    if (so.include_usage)
      s += sse({{"id", id},
                {"object", "chat.completion.chunk"},
                {"created", created},
                {"model", model_name},
                {"choices", Json::array()},
                {"usage", usage_json(*run)}});
    return s + "data: [DONE]\n\n";
  };
  w.heartbeat = ": keep-alive\n\n";
  respond_streaming(res, "text/event-stream", run, std::move(w));
}

// prompt: "text" | ["text", ...] | [1, 2, 3] | [[1, 2], [3]]
std::vector<std::vector<int32_t>> parse_prompts(const Json& body, const ServedModel& m) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) throw bad_field("prompt", "'prompt' is required");
  const Json& p = *it;
  std::vector<std::vector<int32_t>> out;
  auto ids = [&](const Json& a) {
    std::vector<int32_t> v;
    for (const auto& x : a) {
      if (!x.is_number_integer()) throw bad_field("prompt", "'prompt' token lists must hold integers");
      const int64_t id = x.get<int64_t>();
      if (id < 0 || id >= m.config().vocab_size)
        throw bad_field("prompt", "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                      std::to_string(m.config().vocab_size) + ")");
      v.push_back(static_cast<int32_t>(id));
    }
    return v;
  };
  if (p.is_string()) {
    out.push_back(m.tokenizer().encode(p.get<std::string>()));
  } else if (p.is_array() && !p.empty() &&
             std::all_of(p.begin(), p.end(), [](const Json& x) { return x.is_string(); })) {
    for (const auto& s : p) out.push_back(m.tokenizer().encode(s.get<std::string>()));
  } else if (p.is_array() && !p.empty() &&
             std::all_of(p.begin(), p.end(), [](const Json& x) { return x.is_number(); })) {
    out.push_back(ids(p));
  } else if (p.is_array() && !p.empty() &&
             std::all_of(p.begin(), p.end(), [](const Json& x) { return x.is_array(); })) {
    for (const auto& a : p) out.push_back(ids(a));
  } else {
    throw bad_field("prompt",
                    "'prompt' must be a string, a list of strings, a list of token ids, or a list of lists");
  }
  if (out.size() > 16) throw bad_field("prompt", "at most 16 prompts per request");
  for (const auto& v : out)
    if (v.empty()) throw bad_field("prompt", "a prompt is empty");
  return out;
}

// The n best of best_of candidates by cumulative log-probability (ties: the earlier), per prompt.
std::vector<int> best_choices(GenerationRun& run, int prompts, int n, int best_of) {
  std::vector<int> out;
  for (int p = 0; p < prompts; ++p) {
    std::vector<std::pair<double, int>> ranked;
    for (int k = 0; k < best_of; ++k) {
      const int i = p * best_of + k;
      double sum = 0;
      for (const auto& t : run.choice(i).tokens) sum += t.logprob;
      ranked.push_back({-sum, i});
    }
    std::stable_sort(ranked.begin(), ranked.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (int k = 0; k < n; ++k) out.push_back(ranked[static_cast<size_t>(k)].second);
  }
  return out;
}

// Merges the generated tokens' logprobs after an echoed prompt's.
Json join_logprobs(Json echo, const Json& generated) {
  const size_t base = echo["text_offset"].empty() ? 0
                                                  : echo["text_offset"].back().get<size_t>() +
                                                        echo["tokens"].back().get<std::string>().size();
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs"})
    for (const auto& x : generated[key]) echo[key].push_back(x);
  for (const auto& x : generated["text_offset"]) echo["text_offset"].push_back(base + x.get<size_t>());
  return echo;
}

}  // namespace

OpenAICall prepare_completions(const Json& body, ServedModel& m, ServerContext& ctx,
                               std::chrono::steady_clock::time_point arrival, std::vector<Json>* echo) {
  check_model(body, m);
  const bool stream = get_bool(body, "stream", false);
  const StreamOptions so = parse_stream_options(body);
  const auto prompts = parse_prompts(body, m);
  GenParams params = take(parse_gen_params(body, Api::kCompletions, ctx.defaults.generation,
                                           m.config().vocab_size, ctx.options.enable_test_hooks));
  const int n = params.n, best_of = params.best_of;
  if (static_cast<int>(prompts.size()) * best_of > 16)
    throw bad_field(best_of > n ? "best_of" : "n",
                    "prompts x " + std::string(best_of > n ? "best_of" : "n") + " must be at most 16");
  if (best_of > n && stream) throw bad_field("best_of", "'best_of' greater than n cannot be streamed");
  const bool logprobs = params.logprobs;
  const bool zero = params.max_tokens && *params.max_tokens == 0;
  if (zero && !params.echo)
    throw bad_field("max_tokens", "'max_tokens' 0 generates nothing: it needs 'echo' (to score the prompt)");

  for (const auto& p : prompts)
    if (static_cast<int64_t>(p.size()) > m.max_model_len())
      throw ApiError{400,
                     "This model's maximum context length is " + std::to_string(m.max_model_len()) +
                         " tokens. However, the prompt has " + std::to_string(p.size()) + " tokens.",
                     "invalid_request_error", "prompt", "context_length_exceeded"};
  // The prompt's own logprobs (echo with logprobs, or prompt_logprobs), scored before generating.
  const text::Tokenizer* tok = &m.tokenizer();
  const bool score_echo = params.echo && logprobs;
  std::vector<engine::ScoreResult> scores;
  if (score_echo || params.prompt_logprobs) {
    const int k = std::max(score_echo ? params.top_logprobs : 0, params.prompt_logprobs.value_or(0));
    scores = score_prompts(m, prompts, k);
  }
  // Echoed text: the prompt as given when it was text, else its detokenization.
  std::vector<std::string> echo_text(prompts.size());
  if (params.echo) {
    const Json& p = body["prompt"];
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (p.is_string())
        echo_text[i] = p.get<std::string>();
      else if (p.is_array() && p[i].is_string())
        echo_text[i] = p[i].get<std::string>();
      else
        echo_text[i] = tok->decode(prompts[i], false);
    }
  }
  const bool prompt_lp = params.prompt_logprobs.has_value();
  auto prompt_extras = [tok, prompts, scores, score_echo, prompt_lp](size_t p, Json& choice,
                                                                     const Json* generated_lp) {
    if (score_echo) {
      Json lp = echo_logprobs(*tok, prompts[p], scores[p]);
      choice["logprobs"] = generated_lp ? join_logprobs(std::move(lp), *generated_lp) : std::move(lp);
    }
    if (prompt_lp) choice["prompt_logprobs"] = vllm_prompt_logprobs(*tok, prompts[p], scores[p]);
  };
  int64_t prompt_tokens = 0;
  for (const auto& p : prompts) prompt_tokens += static_cast<int64_t>(p.size());
  OpenAICall call;
  call.stream = stream;
  call.stream_options = so;
  call.id = new_request_id("cmpl-");
  call.created = unix_now();
  call.model_name = m.name();
  call.logprobs = logprobs;

  if (zero) {
    Json choices = Json::array();
    for (size_t p = 0; p < prompts.size(); ++p)
      for (int k = 0; k < n; ++k) {
        Json c = {{"index", choices.size()},
                  {"text", echo_text[p]},
                  {"logprobs", nullptr},
                  {"finish_reason", "length"}};
        prompt_extras(p, c, nullptr);
        choices.push_back(std::move(c));
      }
    const Json usage = {{"prompt_tokens", prompt_tokens},
                        {"completion_tokens", 0},
                        {"total_tokens", prompt_tokens},
                        {"prompt_tokens_details", {{"cached_tokens", 0}}}};
    const Json out = {{"id", call.id},
                      {"object", "text_completion"},
                      {"created", call.created},
                      {"model", call.model_name},
                      {"choices", std::move(choices)},
                      {"usage", usage}};
    call.whole = [out]() -> std::pair<int, std::string> { return {200, dump(out)}; };
    return call;
  }

  GenParams gen = params;
  gen.n = best_of;
  auto requests = make_requests(m, prompts, gen, false, "prompt");
  if (auto spec = parse_structured_output(body, Api::kCompletions))
    attach_constraint(requests, *spec, m, false);
  if (best_of > n)
    for (auto& r : requests) r.logprobs = true;  // the ranking reads every token's logprob
  std::vector<OutputOptions> outs(requests.size());
  for (auto& o : outs) {
    o.stop = params.stop;
    o.skip_special_tokens = params.skip_special_tokens;
  }
  auto run = std::make_shared<GenerationRun>(m, ctx.metrics, std::move(requests), std::move(outs), arrival);
  run->set_prompt_tokens(prompt_tokens);
  if (auto err = run->submit()) throw *err;
  call.run = run;
  call.whole = [run, id = call.id, created = call.created, model_name = call.model_name, logprobs, tok, n,
                best_of, echo_text, prompt_extras,
                nprompts = static_cast<int>(prompts.size())]() -> std::pair<int, std::string> {
    if (auto e = run->error()) return {500, openai_error_body(internal_error(*e))};
    Json choices = Json::array();
    const std::vector<int> picked = best_choices(*run, nprompts, n, best_of);
    for (size_t j = 0; j < picked.size(); ++j) {
      ChoiceState& c = run->choice(picked[j]);
      const size_t p = static_cast<size_t>(picked[j] / best_of);
      const Json lp = logprobs ? completion_logprobs(*tok, c.tokens, 0) : Json(nullptr);
      Json choice = {{"index", j},
                     {"text", echo_text[p] + c.content},
                     {"logprobs", lp},
                     {"finish_reason", c.finish_reason}};
      prompt_extras(p, choice, logprobs ? &lp : nullptr);
      choices.push_back(std::move(choice));
    }
    Json out = {{"id", id},
                {"object", "text_completion"},
                {"created", created},
                {"model", model_name},
                {"choices", std::move(choices)},
                {"usage", usage_json(*run)}};
    return {200, dump(out)};
  };
  if (echo && (params.echo || prompt_lp)) {
    // The streamed form's first chunk per choice: the echoed prompt and its logprobs.
    for (int i = 0; i < run->choices(); ++i) {
      const size_t p = static_cast<size_t>(i / n);
      Json c = {{"index", i}, {"text", echo_text[p]}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
      prompt_extras(p, c, nullptr);
      echo->push_back(std::move(c));
    }
  }
  return call;
}

namespace {

void handle_completions(const http::Request& req, http::Response& res, ServedModel& m, ServerContext& ctx) {
  const auto arrival = std::chrono::steady_clock::now();
  const Json body = take(parse_body(req.body));
  std::vector<Json> echo;
  OpenAICall call = prepare_completions(body, m, ctx, arrival, &echo);
  const auto& so = call.stream_options;
  auto chunk = [id = call.id, created = call.created, model_name = call.model_name, so](Json choice) {
    Json j = {{"id", id},
              {"object", "text_completion"},
              {"created", created},
              {"model", model_name},
              {"choices", Json::array({std::move(choice)})}};
    if (so.include_usage) j["usage"] = nullptr;
    return sse(j);
  };
  if (!call.run) {  // answered without generating (max_tokens 0)
    auto [status, text] = call.whole();
    if (!call.stream) {
      res.status = status;
      return res.set_content(text, "application/json");
    }
    Json out = Json::parse(text);
    std::string events;
    for (auto& c : out["choices"]) events += chunk(c);
    if (so.include_usage) {
      out["choices"] = Json::array();
      events += sse(out);
    }
    res.set_header("Cache-Control", "no-cache");
    return res.set_content(events + "data: [DONE]\n\n", "text/event-stream");
  }
  if (!call.stream) return respond_when_done(res, call.run, call.whole);
  const auto run = call.run;
  const bool logprobs = call.logprobs;
  const text::Tokenizer* tok = &m.tokenizer();
  auto offsets = std::make_shared<std::vector<size_t>>(static_cast<size_t>(run->choices()), 0);
  StreamWriter w;
  if (!echo.empty()) {
    for (size_t i = 0; i < echo.size(); ++i)
      if (echo[i]["logprobs"].is_object()) (*offsets)[i] = echo[i]["text"].get<std::string>().size();
    w.on_start = [chunk, echo]() {
      std::string s;
      for (const auto& c : echo) s += chunk(c);
      return s;
    };
  }
  w.on_delta = [chunk, logprobs, tok, offsets](int i, const OutputDelta& d) -> std::string {
    if (d.content.empty() && !(logprobs && !d.tokens.empty())) return "";
    Json lp = nullptr;
    if (logprobs) {
      lp = completion_logprobs(*tok, d.tokens, (*offsets)[static_cast<size_t>(i)]);
      for (const auto& t : d.tokens) (*offsets)[static_cast<size_t>(i)] += token_string(*tok, t.id).size();
    }
    return chunk(
        {{"index", i}, {"text", d.content}, {"logprobs", std::move(lp)}, {"finish_reason", nullptr}});
  };
  w.on_finish = [run, chunk](int i) -> std::string {
    ChoiceState& c = run->choice(i);
    if (!c.error.empty()) return sse(Json::parse(openai_error_body(internal_error(c.error))));
    return chunk({{"index", i}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", c.finish_reason}});
  };
  w.on_end = [run, id = call.id, created = call.created, model_name = call.model_name, so]() {
    std::string s;
    if (so.include_usage)
      s += sse({{"id", id},
                {"object", "text_completion"},
                {"created", created},
                {"model", model_name},
                {"choices", Json::array()},
                {"usage", usage_json(*run)}});
    return s + "data: [DONE]\n\n";
  };
  w.heartbeat = ": keep-alive\n\n";
  respond_streaming(res, "text/event-stream", run, std::move(w));
}

Json model_card(const ServedModel& m, const ServerContext& ctx) {
  return {
      {"id", m.name()},  {"object", "model"}, {"created", ctx.started_unix},       {"owned_by", "deltaflow"},
      {"root", m.dir()}, {"parent", nullptr}, {"max_model_len", m.max_model_len()}};
}

void handle_tokenize(const http::Request& req, http::Response& res, ServedModel& m, ServerContext& ctx) {
  const Json body = take(parse_body(req.body));
  check_model(body, m);
  std::vector<int32_t> ids;
  if (body.contains("messages") && !body["messages"].is_null()) {
    Json kwargs = Json::object();
    if (auto it = body.find("chat_template_kwargs"); it != body.end() && it->is_object())
      for (auto kv = it->begin(); kv != it->end(); ++kv) kwargs[kv.key()] = kv.value();
    if (!kwargs.contains("enable_thinking")) kwargs["enable_thinking"] = ctx.defaults.enable_thinking;
    const Json messages = take(normalize_messages(body["messages"]));
    Json tools = nullptr;
    if (auto it = body.find("tools"); it != body.end() && it->is_array()) {
      (void)take(parse_tools(*it));
      tools = *it;
    }
    auto text = m.render_chat(messages, tools, get_bool(body, "add_generation_prompt", true), kwargs);
    if (!text) throw bad_field("messages", "the chat template failed: " + text.message());
    ids = m.encode_prompt(*text);
    // Each image's placeholder expanded to the tokens the model sees for it, as a chat request would.
    (void)take(load_prompt_images(message_image_urls(messages), m, ctx.options.images, "messages", ids));
  } else {
    auto it = body.find("prompt");
    if (it == body.end() || !it->is_string())
      throw bad_field("prompt", "'prompt' (a string) or 'messages' is required");
    ids = m.tokenizer().encode(it->get<std::string>());
  }
  Json out = {{"count", ids.size()}, {"max_model_len", m.max_model_len()}, {"tokens", ids}};
  if (get_bool(body, "return_token_strs", false)) {
    Json strs = Json::array();
    for (int32_t id : ids) strs.push_back(m.tokenizer().id_to_token(id).value_or(""));
    out["token_strs"] = std::move(strs);
  }
  send_json(res, out);
}

void handle_detokenize(const http::Request& req, http::Response& res, ServedModel& m) {
  const Json body = take(parse_body(req.body));
  check_model(body, m);
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) throw bad_field("tokens", "'tokens' must be a list of token ids");
  std::vector<int32_t> ids;
  for (const auto& x : *it) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= m.config().vocab_size)
      throw bad_field("tokens",
                      "'tokens' must hold token ids in [0, " + std::to_string(m.config().vocab_size) + ")");
    ids.push_back(x.get<int32_t>());
  }
  send_json(res, {{"prompt", m.tokenizer().decode(ids, false)}});
}

}  // namespace

void add_openai_routes(http::Server& svr, ServerContext& ctx) {
  svr.route("POST", "/v1/chat/completions",
            guarded(ctx, false, [&ctx](const http::Request& q, http::Response& r, ServedModel& m) {
              handle_openai_chat(q, r, m, ctx);
            }));
  svr.route("POST", "/v1/completions",
            guarded(ctx, false, [&ctx](const http::Request& q, http::Response& r, ServedModel& m) {
              handle_completions(q, r, m, ctx);
            }));
  svr.route("GET", "/v1/models",
            guarded(ctx, false, [&ctx](const http::Request&, http::Response& r, ServedModel& m) {
              send_json(r, {{"object", "list"}, {"data", Json::array({model_card(m, ctx)})}});
            }));
  svr.route("GET", "/v1/models/*",
            guarded(ctx, false, [&ctx](const http::Request& q, http::Response& r, ServedModel& m) {
              const std::string name = q.matches[1];
              if (!m.matches(name))
                throw ApiError{404, "The model '" + name + "' does not exist", "invalid_request_error",
                               "model", "model_not_found"};
              send_json(r, model_card(m, ctx));
            }));
  svr.route("POST", "/tokenize",
            guarded(ctx, false, [&ctx](const http::Request& q, http::Response& r, ServedModel& m) {
              handle_tokenize(q, r, m, ctx);
            }));
  svr.route("POST", "/detokenize",
            guarded(ctx, false, [](const http::Request& q, http::Response& r, ServedModel& m) {
              handle_detokenize(q, r, m);
            }));
}

}  // namespace deltaflow::server
