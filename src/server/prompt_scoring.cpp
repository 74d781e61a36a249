#include "server/prompt_scoring.hpp"

#include <chrono>
#include <memory>
#include <mutex>

#include "server/routes.hpp"

namespace deltaflow::server {

std::vector<engine::ScoreResult> score_prompts(ServedModel& m,
                                               const std::vector<std::vector<int32_t>>& prompts, int top_k) {
  struct Shared {
    std::mutex mu;
    std::vector<engine::ScoreResult> results;
    std::vector<std::string> errors;
  };
  auto shared = std::make_shared<Shared>();
  shared->results.resize(prompts.size());
  shared->errors.resize(prompts.size());
  auto channel = std::make_shared<engine::ResponseChannel>();
  std::vector<engine::GenerationRequest> requests;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].size() < 2) continue;  // nothing to score: the first token has no context
    engine::GenerationRequest r;
    r.prompt = prompts[i];
    r.channel = channel;
    r.choice = static_cast<int>(i);
    r.task = [shared, channel, i, ids = prompts[i], top_k](backend::Backend& b) {
      auto s = engine::score(b, ids, top_k);
      {
        std::lock_guard<std::mutex> lock(shared->mu);
        if (s)
          shared->results[i] = std::move(*s);
        else
          shared->errors[i] = s.message();
      }
      engine::Event e;
      e.choice = static_cast<int>(i);
      e.finished = true;
      e.finish = s ? engine::FinishReason::kStop : engine::FinishReason::kError;
      channel->push(std::move(e));
    };
    requests.push_back(std::move(r));
  }
  size_t pending = requests.size();
  if (pending == 0) return shared->results;
  switch (m.scheduler().submit(std::move(requests))) {
    case engine::SubmitResult::kQueued:
      break;
    case engine::SubmitResult::kQueueFull:
      throw queue_full();
    case engine::SubmitResult::kStopped:
      throw unavailable("the server is shutting down");
  }
  std::vector<engine::Event> events;
  while (pending > 0) {
    if (!channel->wait(std::chrono::milliseconds(1000), events)) continue;
    for (const auto& e : events) {
      if (!e.finished) continue;
      --pending;
      if (e.finish == engine::FinishReason::kError) {
        std::lock_guard<std::mutex> lock(shared->mu);
        const std::string& why = shared->errors[static_cast<size_t>(e.choice)];
        if (pending > 0) channel->cancel();  // the rest is wasted work now
        throw internal_error("prompt scoring failed: " + (why.empty() ? e.error : why));
      }
    }
  }
  std::lock_guard<std::mutex> lock(shared->mu);
  return shared->results;
}

Json echo_logprobs(const text::Tokenizer& tok, const std::vector<int32_t>& prompt,
                   const engine::ScoreResult& s) {
  Json toks = Json::array(), lps = Json::array(), tops = Json::array(), offs = Json::array();
  size_t offset = 0;
  for (size_t i = 0; i < prompt.size(); ++i) {
    const std::string str = token_string(tok, prompt[i]);
    toks.push_back(str);
    offs.push_back(offset);
    offset += str.size();
    if (i == 0 || i - 1 >= s.logprobs.size()) {
      lps.push_back(nullptr);
      tops.push_back(nullptr);
      continue;
    }
    lps.push_back(s.logprobs[i - 1]);
    Json top = Json::object();
    if (i - 1 < s.top.size())
      for (const auto& a : s.top[i - 1]) top[token_string(tok, a.id)] = a.logprob;
    tops.push_back(std::move(top));
  }
  return {{"tokens", toks}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

Json vllm_prompt_logprobs(const text::Tokenizer& tok, const std::vector<int32_t>& prompt,
                          const engine::ScoreResult& s) {
  Json out = Json::array();
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (i == 0 || i - 1 >= s.logprobs.size()) {
      out.push_back(nullptr);
      continue;
    }
    Json at = Json::object();
    const int32_t id = prompt[i];
    at[std::to_string(id)] = {{"logprob", s.logprobs[i - 1]},
                              {"rank", i - 1 < s.ranks.size() ? s.ranks[i - 1] : 0},
                              {"decoded_token", token_string(tok, id)}};
    if (i - 1 < s.top.size()) {
      int64_t rank = 0;
      for (const auto& a : s.top[i - 1]) {
        ++rank;
        if (a.id == id) continue;
        at[std::to_string(a.id)] = {
            {"logprob", a.logprob}, {"rank", rank}, {"decoded_token", token_string(tok, a.id)}};
      }
    }
    out.push_back(std::move(at));
  }
  return out;
}

}  // namespace deltaflow::server
