// What the route files share: the server context, JSON and error responses, building engine requests from
// prompts, and the two ways of answering a generation (streamed, or whole when done).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "http/server.hpp"
#include "server/api_error.hpp"
#include "server/generation_run.hpp"
#include "server/metrics.hpp"
#include "server/request_defaults.hpp"
#include "server/request_params.hpp"
#include "server/served_model.hpp"
#include "server/server.hpp"

namespace deltaflow::server {

struct ServerContext {
  ServeOptions options;
  std::atomic<ServedModel*> model{nullptr};  // set once loaded; lives until the HTTP server has stopped
  Metrics metrics;
  RequestDefaults defaults;  // resolved when the model is loaded, before `model` is set
  int64_t started_unix = 0;
  // SIGINT/SIGTERM seen: requests that still arrive are answered 503 (server.cpp's drain).
  std::atomic<bool> draining{false};
};

std::string dump(const Json& j);
int64_t unix_now();
// "2024-05-01T12:00:00.123456789Z"
std::string iso_time(std::chrono::system_clock::time_point t);

void send_json(http::Response& res, const Json& j, int status = 200);
void send_error(http::Response& res, const ApiError& e, bool ollama);

// Wraps a handler: a thrown ApiError becomes its response, anything else a 500; the model must be loaded
// (else 503). Handlers run on the HTTP threads.
using Handler = std::function<void(const http::Request&, http::Response&, ServedModel&)>;
http::Handler guarded(ServerContext& ctx, bool ollama, Handler h);

// Throws the ApiError of a failed parse.
template <class T>
T take(Parsed<T>&& p) {
  if (auto* e = std::get_if<ApiError>(&p)) throw *e;
  return std::move(std::get<T>(p));
}

// The request's "model" must name the served model when given (404 model_not_found otherwise).
void check_model(const Json& body, const ServedModel& m, bool required = false);

// Whether the rendered prompt ends inside an open <think>.
bool ends_in_thought(const std::string& prompt);

// One engine request per prompt (and per n), with the context-length check (400 context_length_exceeded
// naming `field`), seeds (seed + choice index, or random), stop ids, logprobs, thinking budget and forced
// tokens.
std::vector<engine::GenerationRequest> make_requests(const ServedModel& m,
                                                     const std::vector<std::vector<int32_t>>& prompts,
                                                     const GenParams& p, bool in_reasoning,
                                                     const std::string& field);

// Answers with make_body() once the run is done. Short runs get a plain response; past a second the answer
// turns chunked and a space is written each second while waiting (JSON allows leading whitespace), which
// keeps proxies and clients from timing out; a client that closes its connection cancels the run.
using BodyFn = std::function<std::pair<int, std::string>()>;
void respond_when_done(http::Response& res, std::shared_ptr<GenerationRun> run, BodyFn make_body);

// Streams a run: on_start once, then deltas and finishes through the callbacks, then on_end. `heartbeat`
// (may be empty) is written when nothing happened for a second (SSE comments), to keep the connection
// alive through proxies. A client that closes its connection cancels the run.
struct StreamWriter {
  std::function<std::string()> on_start;
  std::function<std::string(int, const OutputDelta&)> on_delta;
  std::function<std::string(int)> on_finish;
  std::function<std::string()> on_end;
  std::string heartbeat;
};
void respond_streaming(http::Response& res, const char* content_type, std::shared_ptr<GenerationRun> run,
                       StreamWriter writer);

// Registers the routes of each API.
void add_openai_routes(http::Server& svr, ServerContext& ctx);
void add_ollama_routes(http::Server& svr, ServerContext& ctx);
// The chat page (web_routes.cpp); its paths need no API key.
void add_web_routes(http::Server& svr);
bool is_web_path(const std::string& path);

// Logprob entry fields shared by the APIs.
std::string token_string(const text::Tokenizer& tok, int32_t id);
Json token_bytes(const text::Tokenizer& tok, int32_t id);

}  // namespace deltaflow::server
