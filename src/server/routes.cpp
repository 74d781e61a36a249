#include "server/routes.hpp"

#include <cstdio>
#include <ctime>
#include <random>

namespace deltaflow::server {

std::string dump(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string iso_time(std::chrono::system_clock::time_point t) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ns / 1'000'000'000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%09lldZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(ns % 1'000'000'000));
  return buf;
}

void send_json(http::Response& res, const Json& j, int status) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

void send_error(http::Response& res, const ApiError& e, bool ollama) {
  res.status = e.status;
  res.set_content(ollama ? ollama_error_body(e) : openai_error_body(e), "application/json");
}

http::Handler guarded(ServerContext& ctx, bool ollama, Handler h) {
  return [&ctx, ollama, h = std::move(h)](const http::Request& req, http::Response& res) {
    ServedModel* m = ctx.model.load();
    if (!m) return send_error(res, unavailable("the model is still loading"), ollama);
    try {
      h(req, res, *m);
    } catch (const ApiError& e) {
      send_error(res, e, ollama);
    } catch (const std::exception& e) {
      send_error(res, internal_error(std::string("internal error: ") + e.what()), ollama);
    } catch (...) {
      send_error(res, internal_error("internal error"), ollama);
    }
  };
}

void check_model(const Json& body, const ServedModel& m, bool required) {
  auto it = body.find("model");
  if (it == body.end() || it->is_null()) {
    if (required) throw bad_field("model", "'model' is required");
    return;
  }
  if (!it->is_string()) throw bad_field("model", "'model' must be a string");
  const std::string name = it->get<std::string>();
  if (!m.matches(name))
    throw ApiError{404, "The model '" + name + "' does not exist (this server serves '" + m.name() + "')",
                   "invalid_request_error", "model", "model_not_found"};
}

bool ends_in_thought(const std::string& prompt) {
  const size_t open = prompt.rfind("<think>");
  if (open == std::string::npos) return false;
  const size_t close = prompt.rfind("</think>");
  return close == std::string::npos || close < open;
}

std::vector<engine::GenerationRequest> make_requests(const ServedModel& m,
                                                     const std::vector<std::vector<int32_t>>& prompts,
                                                     const GenParams& p, bool in_reasoning,
                                                     const std::string& field) {
  static std::mutex seed_mu;
  static std::mt19937_64 seed_rng(std::random_device{}());
  const int64_t max_len = m.max_model_len();
  const int64_t vocab = m.config().vocab_size;
  std::vector<int32_t> forced;
  if (p.forced_text) forced = m.tokenizer().encode(*p.forced_text);
  engine::ThinkingBudget thinking;
  if (p.thinking_budget) {
    if (m.think_start_id() < 0 || m.think_end_id() < 0)
      throw bad_field("thinking_token_budget", "this model has no <think> / </think> tokens");
    thinking.max_tokens = *p.thinking_budget;
    thinking.start_id = m.think_start_id();
    thinking.end_id = m.think_end_id();
    thinking.open_at_start = in_reasoning;
    thinking.close_ids = m.tokenizer().encode("\n</think>\n\n");
  }
  std::vector<engine::GenerationRequest> out;
  int choice = 0;
  const std::vector<int32_t> newline = m.tokenizer().encode("\n");
  for (const auto& prompt : prompts) {
    // Where each rendered message ends (after <|im_end|> and its newline): prefix-cache checkpoints there let
    // the next turn of this conversation reuse everything up to the last message it leaves unchanged.
    std::vector<int64_t> message_ends;
    for (size_t i = 0; i < prompt.size(); ++i)
      if (prompt[i] == m.message_end_id()) {
        size_t end = i + 1;
        if (newline.size() == 1 && end < prompt.size() && prompt[end] == newline[0]) ++end;
        message_ends.push_back(static_cast<int64_t>(end));
      }
    const int64_t n_prompt = static_cast<int64_t>(prompt.size());
    if (prompt.empty()) throw bad_field(field, "the prompt is empty");
    for (int32_t id : prompt)
      if (id < 0 || id >= vocab)
        throw bad_field(field, "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                   std::to_string(vocab) + ")");
    int64_t max_tokens;
    if (p.max_tokens) {
      max_tokens = *p.max_tokens;
    } else {
      max_tokens = max_len - n_prompt;
      if (p.default_max_tokens) max_tokens = std::min(max_tokens, *p.default_max_tokens);
    }
    if (!p.max_tokens && n_prompt >= max_len)  // the prompt alone fills the context: no room to ask about
      throw ApiError{400,
                     "This model's maximum context length is " + std::to_string(max_len) +
                         " tokens. However, your " + field + " resulted in " + std::to_string(n_prompt) +
                         " tokens. Please reduce the length of the " + field + ".",
                     "invalid_request_error", field, "context_length_exceeded"};
    if (n_prompt + std::max<int64_t>(max_tokens, 1) > max_len)
      throw ApiError{400,
                     "This model's maximum context length is " + std::to_string(max_len) +
                         " tokens. However, you requested " + std::to_string(n_prompt + max_tokens) +
                         " tokens (" + std::to_string(n_prompt) + " in the " + field + ", " +
                         std::to_string(max_tokens) +
                         " in the completion). Please reduce the length of the " + field + " or completion.",
                     "invalid_request_error", field, "context_length_exceeded"};
    for (int k = 0; k < p.n; ++k, ++choice) {
      engine::GenerationRequest r;
      r.prompt = prompt;
      r.sampling = p.sampling;
      if (p.seed_given) {
        r.sampling.seed = p.sampling.seed + static_cast<uint64_t>(choice);
      } else {
        std::lock_guard<std::mutex> lock(seed_mu);
        r.sampling.seed = seed_rng();
      }
      r.max_tokens = static_cast<int>(max_tokens);
      if (!p.ignore_eos) r.stop_ids = m.eos_ids();
      for (int32_t id : p.stop_token_ids) r.stop_ids.push_back(id);
      r.logprobs = p.logprobs;
      r.top_logprobs = p.top_logprobs;
      r.thinking = thinking;
      r.forced_ids = forced;
      r.message_ends = message_ends;
      r.choice = choice;
      out.push_back(std::move(r));
    }
  }
  return out;
}

namespace {

const GenerationRun::DeltaFn kIgnoreDelta = [](int, const OutputDelta&) { return true; };

}  // namespace

void respond_when_done(http::Response& res, std::shared_ptr<GenerationRun> run, BodyFn make_body) {
  using namespace std::chrono;
  const auto deadline = steady_clock::now() + seconds(1);
  while (!run->done() && steady_clock::now() < deadline) run->pump(milliseconds(50), kIgnoreDelta, nullptr);
  if (run->done()) {
    auto [status, body] = make_body();
    res.status = status;
    res.set_content(body, "application/json");
    return;
  }
  res.status = 200;
  res.stream("application/json", [run, make_body](http::ChunkSink& sink) {
    while (!run->done()) {
      const auto start = steady_clock::now();
      while (!run->done() && steady_clock::now() - start < seconds(1)) {
        if (sink.gone()) return run->cancel();
        run->pump(milliseconds(100), kIgnoreDelta, nullptr);
      }
      if (!run->done() && !sink.write(" ")) return run->cancel();
    }
    const std::string body = make_body().second;
    sink.write(body);
  });
}

void respond_streaming(http::Response& res, const char* content_type, std::shared_ptr<GenerationRun> run,
                       StreamWriter writer) {
  using namespace std::chrono;
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.stream(content_type, [run, writer](http::ChunkSink& sink) {
    auto write = [&](const std::string& s) { return s.empty() || sink.write(s); };
    if (writer.on_start && !write(writer.on_start())) return run->cancel();
    std::string pending;
    const auto delta = [&](int i, const OutputDelta& d) {
      pending += writer.on_delta(i, d);
      return true;
    };
    const auto finish = [&](int i) {
      pending += writer.on_finish(i);
      return true;
    };
    auto last = steady_clock::now();
    while (!run->done()) {
      if (sink.gone()) return run->cancel();
      pending.clear();
      // Short waits: a client that closes is noticed (sink.gone) within one.
      run->pump(milliseconds(250), delta, finish);
      const auto now = steady_clock::now();
      if (!pending.empty()) {
        if (!sink.write(pending)) return run->cancel();
        last = now;
      } else if (!writer.heartbeat.empty() && now - last >= seconds(1)) {
        if (!sink.write(writer.heartbeat)) return run->cancel();
        last = now;
      }
    }
    if (writer.on_end) write(writer.on_end());
  });
}

std::string token_string(const text::Tokenizer& tok, int32_t id) {
  const int32_t ids[1] = {id};
  return tok.decode(std::span<const int32_t>(ids, 1), false);
}

Json token_bytes(const text::Tokenizer& tok, int32_t id) {
  Json a = Json::array();
  for (unsigned char c : tok.token_bytes(id)) a.push_back(static_cast<int>(c));
  return a;
}

}  // namespace deltaflow::server
