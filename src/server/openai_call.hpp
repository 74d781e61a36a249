// An OpenAI chat or completions request, validated, planned and queued on the engine, apart from how it is
// answered: the HTTP routes stream it or answer it whole, `deltaflow batch` writes its whole answer to a
// JSONL line. Both go through the same validation (a bad field throws its ApiError).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "server/routes.hpp"

namespace deltaflow::server {

struct StreamOptions {
  bool include_usage = false;
};

struct OpenAICall {
  std::shared_ptr<GenerationRun> run;  // queued; null when answered without generating (max_tokens 0)
  BodyFn whole;                        // the non-streamed response (status, JSON), once `run` is done
  bool stream = false;                 // the body asked for a stream
  StreamOptions stream_options;
  std::string id;
  int64_t created = 0;
  std::string model_name;
  bool logprobs = false;
};

// `body` is the parsed request; `arrival` when it came (metrics).
OpenAICall prepare_chat(const Json& body, ServedModel& m, ServerContext& ctx,
                        std::chrono::steady_clock::time_point arrival);
// Completions also fill `echo`: the streamed form's first chunk per choice (echoed prompt and its logprobs).
OpenAICall prepare_completions(const Json& body, ServedModel& m, ServerContext& ctx,
                               std::chrono::steady_clock::time_point arrival,
                               std::vector<Json>* echo = nullptr);

}  // namespace deltaflow::server
