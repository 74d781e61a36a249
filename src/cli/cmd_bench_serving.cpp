// `deltaflow bench --requests N --input-len L --output-len M [--max-concurrency C]`: the serving benchmark.
// N requests of L random prompt tokens and M generated tokens (no early stop) go straight to the engine (no
// HTTP), at most C in flight; it reports total and output tokens per second, TTFT and TPOT percentiles, and
// each decode step's time against its roofline: bytes = the weights the step reads (every non-expert
// matrix and lm_head, and for a MoE model the distinct experts its rows route to, expected for uniform
// routing; not the embedding table) + the KV the decode rows read + the recurrent states read and written,
// over the copy bandwidth measured in the same run (CUDA). `--prefix-hit
// K` then measures TTFT for a cached K-token prefix plus 50 new tokens.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "backend/sequence_stepper.hpp"
#include "cli/args.hpp"
#include "cli/bench_cuda.hpp"
#include "cli/commands.hpp"
#include "cli/model_options.hpp"
#include "engine/generate.hpp"
#include "engine/scheduler.hpp"
#include "model/config.hpp"
#include "model/param_counts.hpp"

#ifdef DELTAFLOW_HAVE_CUDA
#include "backend/cuda/cuda_backend.hpp"
#endif

namespace deltaflow::cli {
namespace {

using Clock = std::chrono::steady_clock;

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

struct Roofline {
  double copy_bw = 0;    // bytes/s (0: not measured: no ratios)
  double gemm_rate = 0;  // FLOP/s
  model::TextConfig config;
  model::ParamCounts counts;
  double weight_elem_bytes = 2;  // bytes per weight element (bf16 synthetic weights)
  // The weight bytes a decode step of `rows` rows reads.
  double step_weight_bytes(double rows) const {
    return weight_elem_bytes * (counts.dense + counts.lm_head +
                                model::distinct_experts(config, rows) * counts.expert * counts.moe_layers);
  }
  // FLOPs of one prefill row's matmuls (its routed experts only; lm_head is for the last rows alone).
  double row_flops() const {
    const double K = counts.moe_layers > 0 ? static_cast<double>(config.num_experts_per_tok) : 0.0;
    return 2.0 * (counts.dense + K * counts.expert * counts.moe_layers);
  }
  double kv_bytes_per_pos = 0;
};

struct Work {
  std::vector<int32_t> prompt;
  int max_tokens = 1;
  Clock::time_point submitted;
  std::optional<Clock::time_point> first, last;
  int64_t tokens = 0, cached = 0;
  bool done = false;
  std::string error;
};

// Runs `work` through the engine, at most `concurrency` in flight. Every 30 s a progress line goes to stderr
// (requests finished, output tokens so far), so a run cut short by a time limit still says how far it got.
core::Status drive(engine::Scheduler& s, std::vector<Work>& work, int concurrency) {
  auto ch = std::make_shared<engine::ResponseChannel>();
  size_t next = 0, finished = 0;
  int inflight = 0;
  int64_t out_tokens = 0, in_tokens_done = 0;
  std::vector<engine::Event> events;
  const auto start = Clock::now();
  auto report_at = start + std::chrono::seconds(30);
  while (finished < work.size()) {
    if (Clock::now() >= report_at) {
      const double t = std::chrono::duration<double>(Clock::now() - start).count();
      std::fprintf(stderr,
                   "bench: %.0f s: %zu of %zu requests finished, %lld output tokens (%.0f tok/s), "
                   "%lld prompt tokens of finished requests\n",
                   t, finished, work.size(), static_cast<long long>(out_tokens),
                   static_cast<double>(out_tokens) / t, static_cast<long long>(in_tokens_done));
      report_at += std::chrono::seconds(30);
    }
    while (inflight < concurrency && next < work.size()) {
      engine::GenerationRequest r;
      r.prompt = work[next].prompt;
      r.max_tokens = work[next].max_tokens;
      r.channel = ch;
      r.choice = static_cast<int>(next);
      work[next].submitted = Clock::now();
      std::vector<engine::GenerationRequest> one;
      one.push_back(std::move(r));
      if (s.submit(std::move(one)) != engine::SubmitResult::kQueued)
        return core::Error{"the engine refused a request (queue full or stopped)"};
      ++next;
      ++inflight;
    }
    if (!ch->wait(std::chrono::milliseconds(100), events)) continue;
    const auto now = Clock::now();
    for (const auto& e : events) {
      Work& w = work[static_cast<size_t>(e.choice)];
      if (!e.tokens.empty()) {
        if (!w.first) w.first = now;
        w.last = now;
        w.tokens += static_cast<int64_t>(e.tokens.size());
        out_tokens += static_cast<int64_t>(e.tokens.size());
      }
      if (e.finished) {
        w.done = true;
        in_tokens_done += static_cast<int64_t>(w.prompt.size());
        w.cached = e.cached_tokens;
        if (e.finish == engine::FinishReason::kError) return core::Error{"a request failed: " + e.error};
        ++finished;
        --inflight;
      }
    }
  }
  return core::Status();
}

std::vector<int32_t> random_ids(std::mt19937_64& rng, int64_t n, int64_t vocab) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return v;
}

struct Loaded {
  std::unique_ptr<backend::Backend> backend;
  Roofline roof;
  // --profile (synthetic CUDA): GPU seconds by op over the run, graphs off.
  std::function<std::vector<std::pair<std::string, double>>()> profile;
};

core::Expected<Loaded> load(const Args& args, const engine::SchedulerOptions& eo, uint64_t seed) {
  Loaded l;
  const auto synth = args.get("--synthetic");
  if (synth.has_value() == args.has("--model"))
    return core::Error{"give one of --synthetic CONFIG.json or --model DIR"};
#ifdef DELTAFLOW_HAVE_CUDA
  if (synth) {
    std::ifstream in(*synth, std::ios::binary);
    if (!in) return core::Error{*synth + ": cannot read"};
    std::stringstream text;
    text << in.rdbuf();
    DF_ASSIGN(model::TextConfig config, model::parse_text_config(text.str(), *synth));
    backend::cuda::CudaOptions opt;
    opt.engine_pools = true;
    opt.max_context = eo.max_model_len;
    opt.prefill_chunk = std::max<int64_t>(opt.prefill_chunk, eo.max_num_batched_tokens);
    opt.kv_fp8 = eo.kv_cache_dtype == backend::KvCacheDtype::kFp8;
    opt.mtp = eo.speculative_tokens > 0;  // a random head when the config has one
    const bool profile = args.has("--profile");
    opt.cuda_graphs = !profile;  // events inside a graph are not read back
    DF_ASSIGN(auto b, backend::cuda::CudaBackend::synthetic(config, opt, seed));
    if (profile) {
      b->profile().enable(true);
      l.profile = [p = &b->profile()] { return p->totals(); };
    }
    const auto& c = b->config();
    l.roof.config = c;
    l.roof.counts = model::count_params(c);
    // bf16: 2 bytes an element; fp8: 1 byte and a 4-byte scale per (position, kv head).
    const double hd = static_cast<double>(c.head_dim);
    l.roof.kv_bytes_per_pos = l.roof.counts.kv_per_token * (opt.kv_fp8 ? 1.0 + 4.0 / hd : 2.0);
    DF_ASSIGN(l.roof.copy_bw, measure_copy_bandwidth());
    DF_ASSIGN(l.roof.gemm_rate, measure_gemm_rate());
    l.backend = std::make_unique<backend::SequenceStepper>(std::move(b));
    return l;
  }
#else
  (void)seed;
  if (synth)
    return core::Error{"--synthetic: this build has no CUDA backend (configure with -DDELTAFLOW_CUDA=ON)"};
#endif
  if (args.has("--profile")) return core::Error{"flag --profile: with --synthetic only"};
  DF_ASSIGN(l.backend, open_backend(args, eo));
  return l;
}

// --accept-rates: comma-separated shares of verification steps that accept each draft position.
core::Expected<std::vector<double>> accept_rates(const std::string& text) {
  DF_ASSIGN(std::vector<double> v, parse_number_list(text, "--accept-rates"));
  if (v.size() > static_cast<size_t>(engine::kMaxSpeculativeTokens))
    return core::Error{"flag --accept-rates takes 1 to " + std::to_string(engine::kMaxSpeculativeTokens) +
                       " rates"};
  return v;
}

}  // namespace

int cmd_bench_serving(const Argv& argv) {
  const std::string cmd = "bench";
  ArgSpec spec{{"--synthetic", "--model", "--device", "--requests", "--input-len", "--output-len",
                "--max-concurrency", "--prefix-hit", "--seed", "--tensor-parallel-size", "--accept-rates"},
               {"--json", "--profile"},
               0};
  add_engine_flags(spec);
  auto args = Args::parse(argv, spec);
  if (!args) return fail(cmd, args.message());
  auto n = args->get_int("--requests", 0);
  auto in_len = args->get_int("--input-len", 512);
  auto out_len = args->get_int("--output-len", 128);
  if (!n || *n < 1 || *n > 100000) return fail(cmd, "flag --requests must be in [1, 100000]");
  if (!in_len || *in_len < 1) return fail(cmd, "flag --input-len must be a positive integer");
  if (!out_len || *out_len < 1) return fail(cmd, "flag --output-len must be a positive integer");
  auto conc = args->get_int("--max-concurrency", *n);
  if (!conc || *conc < 1) return fail(cmd, "flag --max-concurrency must be a positive integer");
  auto hit = args->get_int("--prefix-hit", 0);
  if (!hit || *hit < 0) return fail(cmd, "flag --prefix-hit must be a non-negative integer");
  auto seed = args->get_int("--seed", 1);
  if (!seed) return fail(cmd, seed.message());
  auto eo = parse_engine_options(*args);
  if (!eo) return fail(cmd, eo.message());
  if (auto rates = args->get("--accept-rates")) {
    auto p = accept_rates(*rates);
    if (!p) return fail(cmd, p.message());
    eo->forced_acceptance = *p;
  }
  const int64_t need_len = std::max<int64_t>(*in_len + *out_len, *hit + 51);
  if (!args->has("--max-num-seqs")) eo->max_num_seqs = static_cast<int32_t>(std::min<long long>(*conc, 256));
  if (eo->max_model_len == 0) eo->max_model_len = need_len;
  if (eo->max_model_len < need_len)
    return fail(cmd, "flag --max-model-len " + std::to_string(eo->max_model_len) + " is shorter than " +
                         std::to_string(need_len) + " (input + output, or the prefix-hit prompt)");

  std::mutex steps_mu;
  std::vector<engine::StepInfo> steps;
  eo->on_step = [&](const engine::StepInfo& s) {
    std::lock_guard<std::mutex> lock(steps_mu);
    steps.push_back(s);
  };
  auto loaded = load(*args, *eo, static_cast<uint64_t>(*seed));
  if (!loaded) return fail(cmd, loaded.message());
  auto sched = engine::Scheduler::start(*loaded->backend, *eo);
  if (!sched) return fail(cmd, sched.message());
  const Roofline roof = loaded->roof;
  const int64_t vocab = loaded->backend->config().vocab_size;

  std::mt19937_64 rng(static_cast<uint64_t>(*seed));
  std::vector<Work> work(static_cast<size_t>(*n));
  for (auto& w : work) {
    w.prompt = random_ids(rng, *in_len, vocab);
    w.max_tokens = static_cast<int>(*out_len);
  }
  const auto t0 = Clock::now();
  if (auto st = drive(**sched, work, static_cast<int>(*conc)); !st) return fail(cmd, st.message());
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<engine::StepInfo> run_steps;
  {
    std::lock_guard<std::mutex> lock(steps_mu);
    run_steps.swap(steps);
  }

  std::vector<double> ttft, tpot;
  int64_t out_tokens = 0;
  for (const auto& w : work) {
    out_tokens += w.tokens;
    if (w.first) ttft.push_back(std::chrono::duration<double>(*w.first - w.submitted).count());
    if (w.first && w.last && w.tokens > 1)
      tpot.push_back(std::chrono::duration<double>(*w.last - *w.first).count() /
                     static_cast<double>(w.tokens - 1));
  }
  const double in_tokens = static_cast<double>(*n * *in_len);
  nlohmann::ordered_json out = {{"backend", loaded->backend->name()},
                                {"requests", *n},
                                {"input_len", *in_len},
                                {"output_len", *out_len},
                                {"max_concurrency", *conc},
                                {"max_num_seqs", eo->max_num_seqs},
                                {"max_num_batched_tokens", eo->max_num_batched_tokens},
                                {"wall_s", wall},
                                {"total_tok_s", (in_tokens + static_cast<double>(out_tokens)) / wall},
                                {"output_tok_s", static_cast<double>(out_tokens) / wall},
                                {"ttft_p50_ms", 1e3 * percentile(ttft, 0.5)},
                                {"ttft_p99_ms", 1e3 * percentile(ttft, 0.99)},
                                {"tpot_p50_ms", 1e3 * percentile(tpot, 0.5)},
                                {"tpot_p99_ms", 1e3 * percentile(tpot, 0.99)},
                                {"steps", run_steps.size()}};

  // Decode steps against the weight-stream roofline; steps with prefill rows against the GEMM rate.
  std::vector<double> dec_ms, dec_rows, dec_ratio, mixed_ratio;
  for (const auto& s : run_steps) {
    if (s.decode_rows > 0 && s.prefill_rows == 0) {
      dec_ms.push_back(1e3 * s.seconds);
      dec_rows.push_back(static_cast<double>(s.decode_rows));
      if (roof.copy_bw > 0) {
        const double bytes = roof.step_weight_bytes(static_cast<double>(s.decode_rows)) +
                             roof.kv_bytes_per_pos * static_cast<double>(s.kv_positions) +
                             2.0 * roof.counts.state_bytes * static_cast<double>(s.decode_rows);
        dec_ratio.push_back(bytes / s.seconds / roof.copy_bw);
      }
    } else if (s.prefill_rows > 0 && roof.gemm_rate > 0) {
      const double flops = roof.row_flops() * static_cast<double>(s.prefill_rows + s.decode_rows);
      mixed_ratio.push_back(flops / s.seconds / roof.gemm_rate);
    }
  }
  out["decode_steps"] = {{"count", dec_ms.size()},
                         {"median_ms", percentile(dec_ms, 0.5)},
                         {"median_rows", percentile(dec_rows, 0.5)}};
  if (roof.copy_bw > 0) {
    out["copy_bandwidth_gb_s"] = roof.copy_bw / 1e9;
    out["gemm_tflop_s"] = roof.gemm_rate / 1e12;
    out["decode_steps"]["roofline_median"] = percentile(dec_ratio, 0.5);
    out["decode_steps"]["roofline_p10"] = percentile(dec_ratio, 0.1);
    out["prefill_steps"] = {{"count", mixed_ratio.size()},
                            {"gemm_rate_median", percentile(mixed_ratio, 0.5)}};
  }

  if (*hit > 0) {
    // A K-token prefix computed once (its checkpoint sits at K), then five prompts of it plus 50 new tokens.
    const auto prefix = random_ids(rng, *hit, vocab);
    std::vector<Work> warm(1);
    warm[0].prompt = prefix;
    warm[0].prompt.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)));
    if (auto st = drive(**sched, warm, 1); !st) return fail(cmd, st.message());
    std::vector<double> hit_ttft;
    int64_t cached = 0;
    for (int i = 0; i < 5; ++i) {
      std::vector<Work> one(1);
      one[0].prompt = prefix;
      const auto tail = random_ids(rng, 50, vocab);
      one[0].prompt.insert(one[0].prompt.end(), tail.begin(), tail.end());
      if (auto st = drive(**sched, one, 1); !st) return fail(cmd, st.message());
      if (one[0].first)
        hit_ttft.push_back(std::chrono::duration<double>(*one[0].first - one[0].submitted).count());
      cached = one[0].cached;
    }
    out["prefix_hit"] = {{"prefix_tokens", *hit},
                         {"new_tokens", 50},
                         {"cached_tokens", cached},
                         {"ttft_median_ms", 1e3 * percentile(hit_ttft, 0.5)}};
  }
  const auto st = (*sched)->stats();
  out["preemptions"] = st.preemptions;
  out["prefix_hit_tokens"] = st.prefix_hit_tokens;
  // Speculative decoding: drafts verified and accepted at each draft position; a verification step emits
  // 1 + its accepted drafts.
  int64_t verify_steps = 0, accepted = 0, drafted = 0;
  for (size_t k = 0; k < st.drafted_at.size(); ++k) {
    drafted += st.drafted_at[k];
    accepted += st.accepted_at[k];
  }
  if (!st.drafted_at.empty()) verify_steps = st.drafted_at[0];
  // Verification steps (decode rows with drafts, no prompt rows) and the draft call after each step.
  std::vector<double> verify_ms, draft_ms;
  for (const auto& s : run_steps) {
    if (s.draft_rows > 0 && s.prefill_rows == 0) verify_ms.push_back(1e3 * s.seconds);
    if (s.draft_seconds > 0) draft_ms.push_back(1e3 * s.draft_seconds);
  }
  if (verify_steps > 0) {
    out["speculative"] = {
        {"drafted", drafted},
        {"accepted", accepted},
        {"drafted_at", st.drafted_at},
        {"accepted_at", st.accepted_at},
        {"tokens_per_verify", 1.0 + static_cast<double>(accepted) / static_cast<double>(verify_steps)},
        {"verify_step_ms_p50", percentile(verify_ms, 0.5)},
        {"draft_ms_p50", percentile(draft_ms, 0.5)}};
    if (!eo->forced_acceptance.empty()) out["speculative"]["forced_acceptance"] = eo->forced_acceptance;
    out["speculative"]["turned_off"] = st.speculation_off;
  }

  std::vector<std::pair<std::string, double>> ops;
  if (loaded->profile) {
    ops = loaded->profile();
    nlohmann::ordered_json per_step;
    for (const auto& [name, sec] : ops) per_step[name] = 1e3 * sec / static_cast<double>(run_steps.size());
    out["profile_ms_per_step"] = per_step;
  }
  if (args->has("--json")) {
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("%s: %lld requests x (%lld in + %lld out), concurrency %lld\n",
              out["backend"].get<std::string>().c_str(), static_cast<long long>(*n),
              static_cast<long long>(*in_len), static_cast<long long>(*out_len),
              static_cast<long long>(*conc));
  std::printf("  wall %.2f s  total %.1f tok/s  output %.1f tok/s\n", wall, out["total_tok_s"].get<double>(),
              out["output_tok_s"].get<double>());
  std::printf("  TTFT p50 %.1f ms  p99 %.1f ms   TPOT p50 %.2f ms  p99 %.2f ms\n",
              out["ttft_p50_ms"].get<double>(), out["ttft_p99_ms"].get<double>(),
              out["tpot_p50_ms"].get<double>(), out["tpot_p99_ms"].get<double>());
  std::printf("  steps %zu; decode-only steps %zu, median %.2f ms at %.0f rows", run_steps.size(),
              dec_ms.size(), percentile(dec_ms, 0.5), percentile(dec_rows, 0.5));
  if (roof.copy_bw > 0)
    std::printf(", %.1f%% of the roofline (copy %.0f GB/s)", 100 * percentile(dec_ratio, 0.5),
                roof.copy_bw / 1e9);
  std::printf("\n  preemptions %lld\n", static_cast<long long>(st.preemptions));
  if (out.contains("speculative")) {
    std::printf(
        "  speculative: %lld drafted, %lld accepted (%.1f%%); %.2f tokens per verification step; "
        "accepted by position:",
        static_cast<long long>(drafted), static_cast<long long>(accepted),
        100.0 * static_cast<double>(accepted) / static_cast<double>(std::max<int64_t>(drafted, 1)),
        out["speculative"]["tokens_per_verify"].get<double>());
    for (size_t k = 0; k < st.drafted_at.size(); ++k)
      std::printf(" %.0f%%", 100.0 * static_cast<double>(st.accepted_at[k]) /
                                 static_cast<double>(std::max<int64_t>(st.drafted_at[k], 1)));
    std::printf("\n  verification steps p50 %.2f ms, draft calls p50 %.2f ms\n",
                out["speculative"]["verify_step_ms_p50"].get<double>(),
                out["speculative"]["draft_ms_p50"].get<double>());
    if (!eo->forced_acceptance.empty())
      std::printf(
          "  acceptance forced by --accept-rates (a timing profile: the tokens are not the model's, and "
          "synthetic weights accept nothing by themselves)\n");
    if (st.speculation_off)
      std::printf("  speculation turned itself off: %.3f ms per token with drafts, %.3f ms without\n",
                  1e3 * st.speculative_cost_per_token, 1e3 * st.plain_cost_per_token);
  }
  if (!ops.empty()) {
    double total = 0;
    for (const auto& op : ops) total += op.second;
    std::printf("  profile: GPU time per step over all %zu steps and their draft calls (graphs off)\n",
                run_steps.size());
    for (const auto& [name, sec] : ops)
      std::printf("      %-22s %8.3f ms  %5.1f%%\n", name.c_str(),
                  1e3 * sec / static_cast<double>(run_steps.size()), 100 * sec / std::max(total, 1e-12));
  }
  if (*hit > 0)
    std::printf("  prefix hit: %lld-token prefix + 50 new: TTFT %.1f ms (%lld tokens from the cache)\n",
                static_cast<long long>(*hit), out["prefix_hit"]["ttft_median_ms"].get<double>(),
                static_cast<long long>(out["prefix_hit"]["cached_tokens"].get<int64_t>()));
  return 0;
}

}  // namespace deltaflow::cli
