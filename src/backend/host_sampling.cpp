#include "backend/host_sampling.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/philox.hpp"

namespace deltaflow::backend {

int32_t argmax(std::span<const float> logits) {
  int32_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = static_cast<int32_t>(i);
  return best;
}

namespace {

// The penalised copy of `raw` in `work` (vLLM's order: repetition over prompt and output, then frequency and
// presence over the output).
void apply_penalties(std::span<const float> raw, const SamplingSpec& p, std::vector<float>& work) {
  work.assign(raw.begin(), raw.end());
  const size_t V = work.size();
  auto repeat = [&](int32_t id) {
    if (id < 0 || static_cast<size_t>(id) >= V) return;
    float& x = work[static_cast<size_t>(id)];
    x = x > 0 ? x / p.repetition_penalty : x * p.repetition_penalty;
  };
  if (p.repetition_penalty != 1.0f) {
    for (int32_t id : p.prompt_seen) repeat(id);
    for (const auto& g : p.generated)
      if (!std::binary_search(p.prompt_seen.begin(), p.prompt_seen.end(), g.id)) repeat(g.id);
  }
  for (const auto& g : p.generated) {
    if (g.id < 0 || static_cast<size_t>(g.id) >= V) continue;
    work[static_cast<size_t>(g.id)] -= p.frequency_penalty * static_cast<float>(g.count) + p.presence_penalty;
  }
}

}  // namespace

int32_t sample_row(std::span<const float> raw, const SamplingSpec& p, std::vector<float>& work) {
  std::span<const float> logits = raw;
  if (p.has_penalties()) {
    apply_penalties(raw, p, work);
    logits = work;
  }
  if (!p.logit_bias.empty()) {
    if (logits.data() != work.data()) work.assign(raw.begin(), raw.end());
    for (const auto& [id, bias] : p.logit_bias)
      if (id >= 0 && static_cast<size_t>(id) < work.size()) work[static_cast<size_t>(id)] += bias;
    logits = work;
  }
  if (p.temperature <= 0.0f) return argmax(logits);
  // Candidates sorted by logit, cut by top-k, softmax at temperature, cut by min-p and top-p, then drawn.
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  size_t n = idx.size();
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < n) {
    n = static_cast<size_t>(p.top_k);
    std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(n), idx.end(), better);
  } else {
    std::sort(idx.begin(), idx.end(), better);
  }
  std::vector<double> prob(n);
  const double m = logits[idx[0]];
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += prob[i] = std::exp((logits[idx[i]] - m) / p.temperature);
  for (auto& x : prob) x /= sum;
  if (p.min_p > 0.0f) {
    // prob[0] is the largest; the sorted order makes the kept set a prefix.
    const double floor = static_cast<double>(p.min_p) * prob[0];
    size_t keep = 1;
    while (keep < n && prob[keep] >= floor) ++keep;
    n = keep;
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += prob[i];
    for (size_t i = 0; i < n; ++i) prob[i] /= s;
  }
  if (p.top_p < 1.0f) {
    double c = 0;
    size_t keep = 0;
    while (keep < n) {
      c += prob[keep++];
      if (c >= p.top_p) break;
    }
    n = keep;
  }
  double total = 0;
  for (size_t i = 0; i < n; ++i) total += prob[i];
  double r = static_cast<double>(core::philox_uniform(p.seed, p.step)) * total;
  for (size_t i = 0; i < n; ++i) {
    r -= prob[i];
    if (r < 0) return idx[i];
  }
  return idx[n - 1];
}

}  // namespace deltaflow::backend
