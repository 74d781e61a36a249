#include "server/prompt_scoring.hpp"

#include <chrono>
#include <memory>

#include "server/routes.hpp"

namespace deltaflow::server {

std::vector<engine::ScoreResult> score_prompts(ServedModel& m,
                                               const std::vector<std::vector<int32_t>>& prompts, int top_k,
                                               const std::vector<std::vector<engine::ImageInput>>& images) {
  // Prompts of one token have nothing to score (the first token has no context).
  std::vector<engine::ScoreResult> results(prompts.size());
  std::vector<std::vector<int32_t>> scored;
  std::vector<std::vector<engine::ImageInput>> scored_images;
  std::vector<size_t> at;
  for (size_t i = 0; i < prompts.size(); ++i)
    if (prompts[i].size() >= 2) {
      scored.push_back(prompts[i]);
      if (!images.empty()) scored_images.push_back(images[i]);
      at.push_back(i);
    }
  if (scored.empty()) return results;
  engine::ScoreError why;
  auto r = engine::score_all(m.scheduler(), scored, top_k, &why, scored_images);
  if (!r) {
    if (why.queue_full) throw queue_full();
    if (why.stopped) throw unavailable("the server is shutting down");
    throw internal_error("prompt scoring failed: " + r.message());
  }
  for (size_t k = 0; k < at.size(); ++k) results[at[k]] = std::move((*r)[k]);
  return results;
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
