#include "engine/sampler.hpp"

#include "backend/host_sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace deltaflow::engine {

int32_t argmax(std::span<const float> logits) {
  return backend::argmax(logits);
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

int32_t Sampler::sample(std::span<const float> logits) {
  return backend::sample_row(logits, state_.spec(), work_);
}

}  // namespace deltaflow::engine
