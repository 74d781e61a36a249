#include "server/request_params.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace deltaflow::server {

namespace {

// Inside this file a bad field throws its ApiError; the public functions catch it and return it as a value.
struct Fields {
  const Json& body;
  std::string prefix;  // "options." for Ollama options

  const Json* get(const char* key) const {
    if (!body.is_object()) return nullptr;
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) return nullptr;
    return &*it;
  }
  std::string name(const char* key) const { return prefix + key; }

  std::optional<double> number(const char* key, double lo, double hi) const {
    const Json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) throw bad_field(name(key), "'" + name(key) + "' must be a number");
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi)
      throw bad_field(name(key), "'" + name(key) + "' must be between " + trim(lo) + " and " + trim(hi));
    return x;
  }
  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi) const {
    const Json* v = get(key);
    if (!v) return std::nullopt;
    int64_t x;
    if (v->is_number_unsigned()) {
      const uint64_t u = v->get<uint64_t>();
      x = u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
    } else if (v->is_number_integer()) {
      x = v->get<int64_t>();
    } else if (v->is_number_float() && std::isfinite(v->get<double>()) &&
               v->get<double>() == std::floor(v->get<double>()) && std::fabs(v->get<double>()) < 9e15) {
      x = static_cast<int64_t>(v->get<double>());
    } else {
      throw bad_field(name(key), "'" + name(key) + "' must be an integer");
    }
    if (x < lo || x > hi)
      throw bad_field(name(key), "'" + name(key) + "' must be between " + std::to_string(lo) + " and " +
                                     std::to_string(hi));
    return x;
  }
  std::optional<bool> boolean(const char* key) const {
    const Json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) throw bad_field(name(key), "'" + name(key) + "' must be a boolean");
    return v->get<bool>();
  }
  std::optional<std::string> string(const char* key) const {
    const Json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) throw bad_field(name(key), "'" + name(key) + "' must be a string");
    return v->get<std::string>();
  }
  static std::string trim(double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", x);
    return b;
  }
};

std::vector<std::string> parse_stop(const Fields& f, const char* key) {
  const Json* v = f.get(key);
  std::vector<std::string> out;
  if (!v) return out;
  const std::string n = f.name(key);
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > 16) throw bad_field(n, "'" + n + "' may hold at most 16 strings");
    for (const auto& s : *v) {
      if (!s.is_string()) throw bad_field(n, "'" + n + "' must be a string or a list of strings");
      out.push_back(s.get<std::string>());
    }
  } else {
    throw bad_field(n, "'" + n + "' must be a string or a list of strings");
  }
  for (const auto& s : out)
    if (s.size() > 4096) throw bad_field(n, "a stop string in '" + n + "' is longer than 4096 bytes");
  std::erase_if(out, [](const std::string& s) { return s.empty(); });
  return out;
}

void apply_common(GenParams& p, const GenerationDefaults& d) {
  p.sampling.temperature = d.temperature;
  p.sampling.top_p = d.top_p;
  p.sampling.top_k = d.top_k;
  p.sampling.min_p = d.min_p;
  p.sampling.repetition_penalty = d.repetition_penalty;
  p.sampling.presence_penalty = d.presence_penalty;
  p.sampling.frequency_penalty = d.frequency_penalty;
  p.default_max_tokens = d.max_tokens;
}

void parse_sampling(const Fields& f, GenParams& p, bool ollama) {
  if (auto v = f.number("temperature", 0, 2)) p.sampling.temperature = static_cast<float>(*v);
  if (auto v = f.number("top_p", 0, 1)) {
    if (*v <= 0) throw bad_field(f.name("top_p"), "'" + f.name("top_p") + "' must be in (0, 1]");
    p.sampling.top_p = static_cast<float>(*v);
  }
  if (auto v = f.integer("top_k", -1, 1 << 30)) p.sampling.top_k = *v < 0 ? 0 : static_cast<int>(*v);
  if (auto v = f.number("min_p", 0, 1)) p.sampling.min_p = static_cast<float>(*v);
  if (auto v = f.number("presence_penalty", -2, 2)) p.sampling.presence_penalty = static_cast<float>(*v);
  if (auto v = f.number("frequency_penalty", -2, 2)) p.sampling.frequency_penalty = static_cast<float>(*v);
  const char* rep = ollama ? "repeat_penalty" : "repetition_penalty";
  if (auto v = f.number(rep, 0, 10)) {
    if (*v <= 0) throw bad_field(f.name(rep), "'" + f.name(rep) + "' must be greater than 0");
    p.sampling.repetition_penalty = static_cast<float>(*v);
  }
  if (const Json* s = f.get("seed")) {
    if (!s->is_number_integer())
      throw bad_field(f.name("seed"), "'" + f.name("seed") + "' must be an integer");
    p.sampling.seed = s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
    p.seed_given = true;
  }
}

void parse_forced(const Fields& f, GenParams& p, bool hooks) {
  if (const Json* forced = f.get("deltaflow_forced_tokens")) {
    if (!hooks)
      throw bad_field("deltaflow_forced_tokens",
                      "'deltaflow_forced_tokens' needs a server started with --enable-test-hooks");
    if (!forced->is_string())
      throw bad_field("deltaflow_forced_tokens", "'deltaflow_forced_tokens' must be a string");
    p.forced_text = forced->get<std::string>();
  }
}

void parse_openai(const Json& body, Api api, GenParams& p, int64_t vocab, bool hooks) {
  const Fields f{body, ""};
  parse_sampling(f, p, false);
  const int64_t kMaxTokens = 1 << 30;
  // Completions take max_tokens 0: with echo and logprobs, only the prompt is scored (lm-evaluation-harness).
  if (auto v = f.integer("max_tokens", api == Api::kCompletions ? 0 : 1, kMaxTokens)) p.max_tokens = *v;
  if (api == Api::kChat)
    if (auto v = f.integer("max_completion_tokens", 1, kMaxTokens)) p.max_tokens = *v;
  p.stop = parse_stop(f, "stop");
  if (const Json* ids = f.get("stop_token_ids")) {
    if (!ids->is_array()) throw bad_field("stop_token_ids", "'stop_token_ids' must be a list of integers");
    for (const auto& x : *ids) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= vocab)
        throw bad_field("stop_token_ids",
                        "'stop_token_ids' must hold token ids in [0, " + std::to_string(vocab) + ")");
      p.stop_token_ids.push_back(x.get<int32_t>());
    }
  }
  if (auto v = f.boolean("ignore_eos")) p.ignore_eos = *v;
  if (auto v = f.boolean("skip_special_tokens")) p.skip_special_tokens = *v;
  if (api == Api::kChat) {
    if (auto v = f.boolean("logprobs")) p.logprobs = *v;
    if (auto v = f.integer("top_logprobs", 0, 20)) {
      if (!p.logprobs && *v > 0) throw bad_field("top_logprobs", "'top_logprobs' requires 'logprobs': true");
      p.top_logprobs = static_cast<int>(*v);
    }
  } else {
    // Completions: `logprobs` is the number of alternatives (0..5 in OpenAI; 20 here as in chat).
    if (auto v = f.integer("logprobs", 0, 20)) {
      p.logprobs = true;
      p.top_logprobs = static_cast<int>(*v);
    }
    if (auto v = f.boolean("echo")) p.echo = *v;
    if (auto v = f.string("suffix"); v && !v->empty())
      throw bad_field("suffix",
                      "'suffix' is not supported: this server does not do insertion (fill-in-the-middle) "
                      "completions; leave it out, or put the model's own FIM tokens in the prompt");
  }
  if (auto v = f.integer("n", 1, 16)) p.n = static_cast<int>(*v);
  p.best_of = p.n;
  if (auto v = f.integer("best_of", 1, 16)) {
    if (api != Api::kCompletions && *v != p.n)
      throw bad_field("best_of", "'best_of' is a /v1/completions field (here it must equal n)");
    if (*v < p.n) throw bad_field("best_of", "'best_of' must be at least n");
    p.best_of = static_cast<int>(*v);
  }
  if (auto v = f.integer("prompt_logprobs", 0, 20)) p.prompt_logprobs = static_cast<int>(*v);
  if (auto v = f.boolean("use_beam_search"); v && *v)
    throw bad_field("use_beam_search", "beam search is not supported");
  if (const Json* lb = f.get("logit_bias")) {
    if (!lb->is_object())
      throw bad_field("logit_bias", "'logit_bias' must be an object mapping token ids to biases");
    if (lb->size() > 1024) throw bad_field("logit_bias", "'logit_bias' may hold at most 1024 entries");
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string& key = it.key();
      char* end = nullptr;
      errno = 0;
      const long long id = key.empty() ? -1 : std::strtoll(key.c_str(), &end, 10);
      if (key.empty() || *end != '\0' || errno != 0 || id < 0 || id >= vocab)
        throw bad_field("logit_bias", "'logit_bias' key '" + key + "' is not a token id in [0, " +
                                          std::to_string(vocab) + ")");
      if (!it.value().is_number() || !std::isfinite(it.value().get<double>()) ||
          std::fabs(it.value().get<double>()) > 100)
        throw bad_field("logit_bias",
                        "'logit_bias' value for token " + key + " must be a number in [-100, 100]");
      p.sampling.logit_bias.emplace_back(static_cast<int32_t>(id), it.value().get<float>());
    }
  }
  // response_format and the other structured-output fields: server/structured_output.cpp.
  if (api == Api::kChat)
    if (auto v = f.integer("thinking_token_budget", -1, kMaxTokens); v && *v >= 0)
      p.thinking_budget = static_cast<int>(*v);
  parse_forced(f, p, hooks);
}

// --max-tokens-limit: an explicit ask above it is refused, naming the field that asked; the served default
// and Ollama's "unlimited" (num_predict <= 0) are capped to it.
void apply_max_tokens_limit(const Json& body, Api api, std::optional<int64_t> limit, GenParams& p) {
  if (!limit) return;
  p.default_max_tokens = std::min(p.default_max_tokens.value_or(*limit), *limit);
  if (!p.max_tokens || *p.max_tokens <= *limit) return;
  std::string field = "max_tokens";
  if (api == Api::kOllama)
    field = "options.num_predict";
  else if (api == Api::kChat && body.contains("max_completion_tokens") &&
           !body["max_completion_tokens"].is_null())
    field = "max_completion_tokens";
  throw bad_field(field, "'" + field + "' is " + std::to_string(*p.max_tokens) +
                             "; this server allows at most " + std::to_string(*limit) +
                             " tokens per request (--max-tokens-limit)");
}

void parse_ollama(const Json& body, GenParams& p, bool hooks) {
  const Fields top{body, ""};
  if (const Json* o = top.get("options")) {
    if (!o->is_object()) throw bad_field("options", "'options' must be an object");
    const Fields f{*o, "options."};
    parse_sampling(f, p, true);
    if (auto v = f.integer("num_predict", -2, 1 << 30)) {
      if (*v > 0)
        p.max_tokens = *v;
      else
        p.max_tokens.reset();  // -1: unlimited, -2: fill the context; 0 treated as unlimited too
    }
    p.stop = parse_stop(f, "stop");
  }
  if (auto v = top.boolean("logprobs")) p.logprobs = *v;
  if (auto v = top.integer("top_logprobs", 0, 20)) p.top_logprobs = static_cast<int>(*v);
  parse_forced(top, p, hooks);
}

std::vector<std::string> schema_types(const Json& schema) {
  std::vector<std::string> out;
  if (!schema.is_object()) return out;
  if (auto t = schema.find("type"); t != schema.end()) {
    if (t->is_string()) out.push_back(t->get<std::string>());
    if (t->is_array())
      for (const auto& x : *t)
        if (x.is_string()) out.push_back(x.get<std::string>());
  }
  for (const char* key : {"anyOf", "oneOf", "allOf"}) {
    if (auto a = schema.find(key); a != schema.end() && a->is_array())
      for (const auto& sub : *a)
        for (auto& t : schema_types(sub)) out.push_back(std::move(t));
  }
  if (out.empty() && schema.contains("enum")) out.push_back("string");
  return out;
}

}  // namespace

Parsed<GenParams> parse_gen_params(const Json& body, Api api, const GenerationDefaults& defaults,
                                   int64_t vocab, bool test_hooks) {
  try {
    GenParams p;
    apply_common(p, defaults);
    if (api == Api::kOllama) {
      parse_ollama(body, p, test_hooks);
    } else {
      parse_openai(body, api, p, vocab, test_hooks);
    }
    apply_max_tokens_limit(body, api, defaults.max_tokens_limit, p);
    return p;
  } catch (const ApiError& e) {
    return e;
  } catch (const std::exception& e) {
    return bad_field("", std::string("malformed request: ") + e.what());
  }
}

Parsed<Json> parse_body(const std::string& body, int max_depth) {
  // Depth pre-scan outside strings, so nothing below ever recurses deeply on client input.
  int depth = 0;
  bool in_string = false, escape = false;
  for (char c : body) {
    if (in_string) {
      if (escape)
        escape = false;
      else if (c == '\\')
        escape = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '{' || c == '[') {
      if (++depth > max_depth)
        return ApiError{400, "request body nests deeper than " + std::to_string(max_depth) + " levels",
                        "invalid_request_error", "", ""};
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  Json j = Json::parse(body, nullptr, false);
  if (j.is_discarded()) {
    // Re-parse with exceptions for the position in the message.
    try {
      Json again = Json::parse(body);
      (void)again;
    } catch (const std::exception& e) {
      return ApiError{400, std::string("request body is not valid JSON: ") + e.what(),
                      "invalid_request_error", "", ""};
    }
    return ApiError{400, "request body is not valid JSON", "invalid_request_error", "", ""};
  }
  if (!j.is_object())
    return ApiError{400, "request body must be a JSON object", "invalid_request_error", "", ""};
  return j;
}

Parsed<std::vector<text::ToolSpec>> parse_tools(const Json& tools, const std::string& field) {
  std::vector<text::ToolSpec> out;
  if (!tools.is_array()) return bad_field(field, "'" + field + "' must be a list");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = field + "[" + std::to_string(i) + "]";
    const Json& t = tools[i];
    if (!t.is_object()) return bad_field(at, "'" + at + "' must be an object");
    if (t.contains("type") && !(t["type"].is_string() && t["type"].get<std::string>() == "function"))
      return bad_field(at + ".type", "only tools of type 'function' are supported");
    if (!t.contains("function") || !t["function"].is_object())
      return bad_field(at + ".function", "'" + at + ".function' must be an object");
    const Json& fn = t["function"];
    if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty())
      return bad_field(at + ".function.name", "'" + at + ".function.name' must be a non-empty string");
    text::ToolSpec spec;
    spec.name = fn["name"].get<std::string>();
    if (fn.contains("parameters") && !fn["parameters"].is_null()) {
      const Json& params = fn["parameters"];
      if (!params.is_object())
        return bad_field(at + ".function.parameters",
                         "'" + at + ".function.parameters' must be a JSON schema object");
      if (auto props = params.find("properties"); props != params.end() && props->is_object())
        for (auto it = props->begin(); it != props->end(); ++it)
          spec.param_types[it.key()] = schema_types(it.value());
    }
    out.push_back(std::move(spec));
  }
  return out;
}

Parsed<Json> normalize_messages(const Json& messages, const std::string& field) {
  if (!messages.is_array() || messages.empty())
    return bad_field(field, "'" + field + "' must be a non-empty list");
  Json out = Json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string at = field + "[" + std::to_string(i) + "]";
    Json m = messages[i];
    if (!m.is_object()) return bad_field(at, "'" + at + "' must be an object");
    if (!m.contains("role") || !m["role"].is_string())
      return bad_field(at + ".role", "'" + at + ".role' must be a string");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      return bad_field(at + ".role",
                       "'" + at + ".role' must be one of system, developer, user, assistant, tool");
    m["role"] = role;
    if (m.contains("content")) {
      Json& c = m["content"];
      if (c.is_array()) {
        for (size_t k = 0; k < c.size(); ++k) {
          const std::string pat = at + ".content[" + std::to_string(k) + "]";
          const Json& part = c[k];
          if (!part.is_object()) return bad_field(pat, "'" + pat + "' must be an object");
          const std::string type =
              part.contains("type") && part["type"].is_string() ? part["type"].get<std::string>() : "";
          if (type == "image_url") {
            // {"url": "..."} (OpenAI) or the URL itself; server/image_inputs.cpp loads it.
            const auto iu = part.find("image_url");
            if (iu == part.end() ||
                !(iu->is_string() || (iu->is_object() && iu->contains("url") && (*iu)["url"].is_string())))
              return bad_field(pat + ".image_url", "'" + pat + ".image_url' must be {\"url\": string}");
            continue;
          }
          if (type != "text")
            return bad_field(pat + ".type",
                             "content part type '" + type + "' is not supported (text and image_url)");
          if (!part.contains("text") || !part["text"].is_string())
            return bad_field(pat + ".text", "'" + pat + ".text' must be a string");
        }
      } else if (!c.is_string() && !c.is_null()) {
        return bad_field(at + ".content", "'" + at + ".content' must be a string, a list of parts, or null");
      }
    }
    if (m.contains("reasoning_content") && !m["reasoning_content"].is_string() &&
        !m["reasoning_content"].is_null())
      return bad_field(at + ".reasoning_content", "'" + at + ".reasoning_content' must be a string");
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      Json& calls = m["tool_calls"];
      if (!calls.is_array()) return bad_field(at + ".tool_calls", "'" + at + ".tool_calls' must be a list");
      for (size_t k = 0; k < calls.size(); ++k) {
        const std::string cat = at + ".tool_calls[" + std::to_string(k) + "]";
        Json& call = calls[k];
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
          return bad_field(cat + ".function", "'" + cat + ".function' must be an object");
        Json& fn = call["function"];
        if (!fn.contains("name") || !fn["name"].is_string())
          return bad_field(cat + ".function.name", "'" + cat + ".function.name' must be a string");
        if (fn.contains("arguments")) {
          Json& args = fn["arguments"];
          if (args.is_string()) {
            // The template iterates the arguments as a mapping (vLLM converts the same way).
            Json parsed = Json::parse(args.get<std::string>(), nullptr, false);
            if (parsed.is_discarded() || !parsed.is_object())
              return bad_field(cat + ".function.arguments",
                               "'" + cat + ".function.arguments' must be a JSON object text");
            args = std::move(parsed);
          } else if (!args.is_object()) {
            return bad_field(cat + ".function.arguments",
                             "'" + cat + ".function.arguments' must be a JSON object text");
          }
        }
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace deltaflow::server
