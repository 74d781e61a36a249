#include "engine/sampler.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace deltaflow::engine {

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  return best;
}

namespace {

// max and log(sum(exp(x - max))) of a row, in double.
void log_sum_exp(std::span<const float> logits, double& m, double& lse) {
  m = -INFINITY;
  for (float x : logits) m = std::max(m, static_cast<double>(x));
  double s = 0;
  for (float x : logits) s += std::exp(static_cast<double>(x) - m);
  lse = std::log(s);
}

}  // namespace

double log_prob(std::span<const float> logits, int32_t i) {
  double m, lse;
  log_sum_exp(logits, m, lse);
  return static_cast<double>(logits[static_cast<size_t>(i)]) - m - lse;
}

TokenLogprob chosen_logprob(std::span<const float> logits, int32_t chosen) {
  return {chosen, static_cast<float>(log_prob(logits, chosen))};
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int k) {
  std::vector<TokenLogprob> out;
  if (k <= 0 || logits.empty()) return out;
  const size_t n = std::min(logits.size(), static_cast<size_t>(k));
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(n), idx.end(), better);
  double m, lse;
  log_sum_exp(logits, m, lse);
  for (size_t i = 0; i < n; ++i)
    out.push_back({idx[i], static_cast<float>(static_cast<double>(logits[idx[i]]) - m - lse)});
  return out;
}

void Sampler::add_prompt(std::span<const int32_t> ids) {
  prompt_seen_.insert(prompt_seen_.end(), ids.begin(), ids.end());
  std::sort(prompt_seen_.begin(), prompt_seen_.end());
  prompt_seen_.erase(std::unique(prompt_seen_.begin(), prompt_seen_.end()), prompt_seen_.end());
}

void Sampler::accept(int32_t id) {
  ++output_counts_[id];
}

bool Sampler::has_penalties() const {
  return p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f || p_.repetition_penalty != 1.0f;
}

int32_t Sampler::sample(std::span<const float> raw) {
  std::span<const float> logits = raw;
  if (has_penalties()) {
    // Order as vLLM: repetition (prompt + output), then frequency and presence (output only).
    work_.assign(raw.begin(), raw.end());
    const size_t V = work_.size();
    auto repeat = [&](int32_t id) {
      if (id < 0 || static_cast<size_t>(id) >= V) return;
      float& x = work_[static_cast<size_t>(id)];
      x = x > 0 ? x / p_.repetition_penalty : x * p_.repetition_penalty;
    };
    if (p_.repetition_penalty != 1.0f) {
      for (int32_t id : prompt_seen_) repeat(id);
      for (const auto& [id, count] : output_counts_)
        if (!std::binary_search(prompt_seen_.begin(), prompt_seen_.end(), id)) repeat(id);
    }
    for (const auto& [id, count] : output_counts_) {
      if (id < 0 || static_cast<size_t>(id) >= V) continue;
      work_[static_cast<size_t>(id)] -=
          p_.frequency_penalty * static_cast<float>(count) + p_.presence_penalty;
    }
    logits = work_;
  }
  if (!p_.logit_bias.empty()) {
    if (logits.data() != work_.data()) work_.assign(raw.begin(), raw.end());
    for (const auto& [id, bias] : p_.logit_bias)
      if (id >= 0 && static_cast<size_t>(id) < work_.size()) work_[static_cast<size_t>(id)] += bias;
    logits = work_;
  }
  if (p_.temperature <= 0.0f) return argmax(logits);
  // Candidates sorted by logit, cut by top-k, softmax at temperature, cut by min-p and top-p, then drawn.
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  size_t n = idx.size();
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
    n = static_cast<size_t>(p_.top_k);
    std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(n), idx.end(), better);
  } else {
    std::sort(idx.begin(), idx.end(), better);
  }
  std::vector<double> prob(n);
  const double m = logits[idx[0]];
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += prob[i] = std::exp((logits[idx[i]] - m) / p_.temperature);
  for (auto& x : prob) x /= sum;
  if (p_.min_p > 0.0f) {
    // prob[0] is the largest; the sorted order makes the kept set a prefix.
    const double floor = static_cast<double>(p_.min_p) * prob[0];
    size_t keep = 1;
    while (keep < n && prob[keep] >= floor) ++keep;
    n = keep;
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += prob[i];
    for (size_t i = 0; i < n; ++i) prob[i] /= s;
  }
  if (p_.top_p < 1.0f) {
    double c = 0;
    size_t keep = 0;
    while (keep < n) {
      c += prob[keep++];
      if (c >= p_.top_p) break;
    }
    n = keep;
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += prob[i];
  std::uniform_real_distribution<double> u(0.0, total);
  double r = u(rng_);
  for (size_t i = 0; i < n; ++i) {
    r -= prob[i];
    if (r <= 0) return idx[i];
  }
  return idx[n - 1];
}

}  // namespace deltaflow::engine
