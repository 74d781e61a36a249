// `deltaflow bench`: decode and prefill speed on the GPU, each figure set against a roofline measured in the
// same run (DESIGN.md §6): decode is a weight stream, judged by the bytes one step must read over a
// device-to-device copy bandwidth; prefill is compute, judged by its matmul FLOPs over a bf16 cuBLASLt GEMM
// rate.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/bench_cuda.hpp"
#include "cli/commands.hpp"
#include "model/config.hpp"
#include "model/param_counts.hpp"

#ifdef DELTAFLOW_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend.hpp"
#include "backend/cuda/cuda_check.hpp"
#include "backend/cuda/device.hpp"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/gemm.hpp"
#include "backend/cuda/tp_backend.hpp"
#include "cli/model_options.hpp"
#endif

namespace deltaflow::cli {

#ifdef DELTAFLOW_HAVE_CUDA
namespace {

using backend::cuda::CudaBackend;
using backend::cuda::TpBackend;
using model::LayerType;

// What the bench drives: one GPU's CudaBackend, or a TpBackend over several, through the same calls.
class BenchModel {
 public:
  virtual ~BenchModel() = default;
  virtual const backend::cuda::MemoryPlan& memory_plan() const = 0;  // per GPU
  virtual double load_seconds() const = 0;
  virtual std::unique_ptr<backend::SequenceState> new_sequence() = 0;
  virtual core::Status set_length(backend::SequenceState& s, int64_t length) = 0;
  virtual core::Status decode_greedy(std::span<backend::SequenceState* const> seqs,
                                     std::span<const int32_t> tokens, std::vector<int32_t>& ids) = 0;
  virtual core::Status prefill(std::span<const backend::PrefillItem> items, std::vector<float>& logits) = 0;
  virtual backend::cuda::OpProfile* profile() = 0;  // null: not profiled (tensor parallel)
  // What the load-time GEMM tuning chose (empty: not known here, as with tensor parallel).
  virtual std::vector<backend::cuda::GemmTuning> gemm_tunings() const = 0;
};

template <class B>
class BenchModelOf final : public BenchModel {
 public:
  explicit BenchModelOf(std::unique_ptr<B> b) : b_(std::move(b)) {}
  const backend::cuda::MemoryPlan& memory_plan() const override { return b_->memory_plan(); }
  double load_seconds() const override { return b_->load_seconds(); }
  std::unique_ptr<backend::SequenceState> new_sequence() override { return b_->new_sequence(); }
  core::Status set_length(backend::SequenceState& s, int64_t length) override {
    return b_->set_length(s, length);
  }
  core::Status decode_greedy(std::span<backend::SequenceState* const> seqs, std::span<const int32_t> tokens,
                             std::vector<int32_t>& ids) override {
    return b_->decode_greedy(seqs, tokens, ids);
  }
  core::Status prefill(std::span<const backend::PrefillItem> items, std::vector<float>& logits) override {
    return b_->prefill(items, logits);
  }
  std::vector<backend::cuda::GemmTuning> gemm_tunings() const override {
    if constexpr (requires { b_->gemm_tunings(); }) {
      return b_->gemm_tunings();
    } else {
      return {};
    }
  }
  backend::cuda::OpProfile* profile() override {
    if constexpr (requires { b_->profile(); }) {
      return &b_->profile();
    } else {
      return nullptr;
    }
  }

 private:
  std::unique_ptr<B> b_;
};

// tp == 0: the plain single-GPU backend; tp >= 1: a TpBackend over tp GPUs (1: the NCCL path on one GPU).
core::Expected<std::unique_ptr<BenchModel>> load_bench_model(const std::optional<std::string>& synth,
                                                             const std::optional<std::string>& dir,
                                                             const model::TextConfig& config,
                                                             const backend::cuda::CudaOptions& opt, int tp,
                                                             uint64_t seed) {
  if (tp == 0) {
    auto b = synth ? CudaBackend::synthetic(config, opt, seed) : CudaBackend::load(*dir, opt);
    if (!b) return b.error();
    return std::unique_ptr<BenchModel>(std::make_unique<BenchModelOf<CudaBackend>>(std::move(*b)));
  }
  backend::cuda::TpOptions t;
  t.world = tp;
  auto b = synth ? TpBackend::synthetic(config, opt, t, seed) : TpBackend::load(*dir, opt, t);
  if (!b) return b.error();
  return std::unique_ptr<BenchModel>(std::make_unique<BenchModelOf<TpBackend>>(std::move(*b)));
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

using OpTimes = std::vector<std::pair<std::string, double>>;

struct DecodeRow {
  int64_t batch, context;
  double step_s, tok_s, bytes, bw, ratio;
  OpTimes ops;  // --profile: GPU seconds per op over one step
};
struct PrefillRow {
  int64_t tokens;
  double seconds, tok_s, flops, rate, ratio;
  OpTimes ops;  // --profile: GPU seconds per op over the prefill
};

void print_ops(const OpTimes& ops, double total) {
  for (const auto& [name, sec] : ops)
    std::printf("      %-20s %9.3f ms  %5.1f%%\n", name.c_str(), sec * 1e3,
                total > 0 ? 100 * sec / total : 0.0);
}

}  // namespace

core::Expected<std::vector<int64_t>> int_list(const Args& args, const std::string& flag,
                                              const std::string& def) {
  std::vector<int64_t> out;
  std::stringstream ss(args.get_or(flag, def));
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (!end || *end != '\0' || v <= 0)
      return core::Error{"flag " + flag + ": '" + item + "' is not a positive integer"};
    out.push_back(v);
  }
  return out;
}

// Device-to-device copy bandwidth, counting bytes read plus bytes written (median of 10 copies of 2 GiB).
core::Expected<double> measure_copy_bandwidth() {
  const size_t bytes = size_t{2} << 30;
  void *a = nullptr, *b = nullptr;
  DF_CUDA_TRY(cudaMalloc(&a, bytes));
  if (cudaMalloc(&b, bytes) != cudaSuccess) {
    cudaFree(a);
    return core::Error{"bench: no memory for the copy-bandwidth buffers"};
  }
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  backend::cuda::fill_random(a, core::DType::kF32, static_cast<int64_t>(bytes / 4), 1, 1.0f, 0.0f, nullptr);
  std::vector<double> t;
  for (int i = 0; i < 13; ++i) {
    cudaEventRecord(e0);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i >= 3) t.push_back(ms * 1e-3);
  }
  const cudaError_t err = cudaGetLastError();
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  DF_CUDA_TRY(err);
  return 2.0 * static_cast<double>(bytes) / median(t);
}

// bf16 x bf16 -> fp32 cuBLASLt GEMM rate on random data, M = N = K = 8192 (the prefill matmuls'
// configuration).
core::Expected<double> measure_gemm_rate() {
  const int64_t n = 8192;
  backend::cuda::Gemm gemm;
  DF_TRY(gemm.init(32u << 20));
  void *w = nullptr, *x = nullptr;
  float* y = nullptr;
  DF_CUDA_TRY(cudaMalloc(&w, static_cast<size_t>(n * n) * 2));
  DF_CUDA_TRY(cudaMalloc(&x, static_cast<size_t>(n * n) * 2));
  DF_CUDA_TRY(cudaMalloc(&y, static_cast<size_t>(n * n) * 4));
  backend::cuda::fill_random(w, core::DType::kBF16, n * n, 2, 0.05f, 0.0f, nullptr);
  backend::cuda::fill_random(x, core::DType::kBF16, n * n, 3, 1.0f, 0.0f, nullptr);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> t;
  // The same load-time choice among cuBLASLt's candidates that the backend's matmuls get.
  core::Status st = gemm.tune(
      backend::cuda::GemmCall{w, core::DType::kBF16, n, n, x, n, y, core::DType::kF32, n}, 12, nullptr);
  for (int i = 0; i < 13 && st.is_ok(); ++i) {
    cudaEventRecord(e0);
    st = gemm.run(w, core::DType::kBF16, n, n, x, n, y, n, nullptr);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i >= 3) t.push_back(ms * 1e-3);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(w);
  cudaFree(x);
  cudaFree(y);
  DF_TRY(st);
  DF_CUDA_TRY(cudaGetLastError());
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / median(t);
}
#endif

int cmd_bench(const Argv& argv) {
  const std::string cmd = "bench";
  // --requests: the serving benchmark through the engine (cmd_bench_serving.cpp; any backend).
  if (std::find(argv.begin(), argv.end(), "--requests") != argv.end() ||
      std::any_of(argv.begin(), argv.end(),
                  [](const std::string& a) { return a.rfind("--requests=", 0) == 0; }))
    return cmd_bench_serving(argv);
  // --gemv: the decode matmul alone (cmd_bench_gemv.cpp).
  if (std::any_of(argv.begin(), argv.end(),
                  [](const std::string& a) { return a == "--gemv" || a.rfind("--gemv=", 0) == 0; }))
    return cmd_bench_gemv(argv);
  // --images: the vision encoder (cmd_bench_images.cpp; any backend with one).
  if (std::any_of(argv.begin(), argv.end(),
                  [](const std::string& a) { return a == "--images" || a.rfind("--images=", 0) == 0; }))
    return cmd_bench_images(argv);
#ifndef DELTAFLOW_HAVE_CUDA
  (void)argv;
  return fail(cmd, "this build has no CUDA backend (configure with -DDELTAFLOW_CUDA=ON)");
#else
  ArgSpec spec{{"--synthetic", "--model", "--batches", "--contexts", "--prefill", "--steps", "--seed",
                "--prefill-chunk", "--tensor-parallel-size", "--kv-cache-dtype", "--quant"},
               {"--json", "--no-graphs", "--profile", "--weight-only"},
               0};
  auto args = Args::parse(argv, spec);
  if (!args) return fail(cmd, args.message());
  const auto synth = args->get("--synthetic"), dir = args->get("--model");
  if (synth.has_value() == dir.has_value())
    return fail(cmd, "give one of --synthetic CONFIG.json or --model DIR");
  auto batches = int_list(*args, "--batches", "1,8,32");
  auto contexts = int_list(*args, "--contexts", "512,8192,32768");
  auto prefills = int_list(*args, "--prefill", "512,8192,32768");
  if (!batches) return fail(cmd, batches.message());
  if (!contexts) return fail(cmd, contexts.message());
  if (!prefills) return fail(cmd, prefills.message());
  auto steps = args->get_int("--steps", 24);
  auto seed = args->get_int("--seed", 1);
  auto chunk = args->get_int("--prefill-chunk", 4096);
  if (!steps || *steps < 1) return fail(cmd, "flag --steps must be a positive integer");
  if (!seed) return fail(cmd, seed.message());
  if (!chunk || *chunk < 1) return fail(cmd, "flag --prefill-chunk must be a positive integer");
  const bool json = args->has("--json");
  const std::string kv_dtype = args->get("--kv-cache-dtype").value_or("auto");
  if (kv_dtype != "auto" && kv_dtype != "bf16" && kv_dtype != "fp8")
    return fail(cmd, "flag --kv-cache-dtype must be auto, bf16 or fp8, not '" + kv_dtype + "'");
  const std::string quant = args->get("--quant").value_or("");
  if (!quant.empty() && quant != "nvfp4" && quant != "fp8-block" && quant != "nvfp4-mixed")
    return fail(cmd, "flag --quant must be nvfp4, fp8-block or nvfp4-mixed, not '" + quant + "'");
  if (!quant.empty() && !synth)
    return fail(cmd, "--quant makes synthetic weights: give --synthetic CONFIG.json");
  auto tp_flag = parse_tensor_parallel(*args, engine::Device::kCuda);
  if (!tp_flag) return fail(cmd, tp_flag.message());
  // Given (even as 1): through TpBackend and NCCL; absent: the plain backend.
  const int tp = args->has("--tensor-parallel-size") ? *tp_flag : 0;
  const double gpus = std::max(tp, 1);

  const auto devices = backend::cuda::list_devices();
  if (devices.empty()) return fail(cmd, "no CUDA device is visible");

  model::TextConfig config;
  if (synth) {
    std::ifstream in(*synth, std::ios::binary);
    if (!in) return fail(cmd, *synth + ": cannot read");
    std::stringstream text;
    text << in.rdbuf();
    auto c = model::parse_text_config(text.str(), *synth);
    if (!c) return fail(cmd, c.message());
    config = *c;
  } else {
    auto c = model::load_text_config(*dir);
    if (!c) return fail(cmd, c.message());
    config = *c;
  }

  auto bw = measure_copy_bandwidth();
  if (!bw) return fail(cmd, bw.message());
  auto gemm_rate = measure_gemm_rate();
  if (!gemm_rate) return fail(cmd, gemm_rate.message());

  backend::cuda::CudaOptions opt;
  opt.max_sequences = static_cast<int>(*std::max_element(batches->begin(), batches->end()));
  int64_t need = 0;
  for (auto ctx : *contexts) need = std::max<int64_t>(need, ctx + *steps + 8);
  for (auto t : *prefills) need = std::max<int64_t>(need, t + 8);
  opt.max_context = std::min<int64_t>(need, config.max_position_embeddings);
  opt.prefill_chunk = *chunk;
  opt.kv_fp8 = kv_dtype == "fp8";
  opt.synthetic_quant = quant;
  opt.fp8_static_activations = !args->has("--weight-only");
  if (!quant.empty() && tp > 0)
    return fail(cmd, "--quant: one GPU only for now (not with --tensor-parallel-size)");
  if (opt.kv_fp8 && tp > 0) return fail(cmd, "--kv-cache-dtype fp8: not with --tensor-parallel-size yet");
  // --profile times every op with events, so decode runs without graphs (their launch gaps show as time).
  const bool profile = args->has("--profile");
  opt.cuda_graphs = !args->has("--no-graphs") && !profile;
  opt.progress = !json;
  auto loaded = load_bench_model(synth, dir, config, opt, tp, static_cast<uint64_t>(*seed));
  if (!loaded) return fail(cmd, loaded.message());
  BenchModel& b = **loaded;
  if (profile && !b.profile()) return fail(cmd, "--profile is not available with --tensor-parallel-size");
  if (profile) b.profile()->enable(true);
  const auto& plan = b.memory_plan();
  const model::ParamCounts mc = model::count_params(config);
  // Bytes per weight element: bf16 when synthetic; else what the checkpoint holds on average.
  const double all_params = mc.dense + mc.expert * mc.moe_layers * static_cast<double>(config.num_experts) +
                            (config.tie_word_embeddings ? 1 : 2) * mc.lm_head;
  // With --quant: the bytes the weights hold but the embedding (bf16, one row read a token), per element.
  const double embed_bytes = 2.0 * static_cast<double>(config.vocab_size * config.hidden_size);
  // (A tied embedding is read whole as lm_head: then every byte counts.)
  // Quantized routed experts: one expert's bytes as the layout holds them (NVFP4: codes, E4M3 group scales,
  // a row scale per row; FP8 block: codes and a scale per 128 x 128 block), counted apart from the rest.
  double expert_bytes = 0, expert_elems = 0;
  if (!quant.empty() && mc.moe_layers > 0) {
    const double H = static_cast<double>(config.hidden_size),
                 Im = static_cast<double>(config.moe_intermediate_size);
    expert_elems = mc.expert * mc.moe_layers * static_cast<double>(config.num_experts);
    expert_bytes = quant == "fp8-block" ? 3 * Im * H + (2 * Im / 128 * H / 128 + H / 128 * Im / 128) * 4
                                        : 3 * Im * H * (0.5 + 1.0 / 16) + (2 * Im + H) * 4;
  }
  const double all_expert_bytes = expert_bytes * mc.moe_layers * static_cast<double>(config.num_experts);
  const double wes =
      !quant.empty() && config.tie_word_embeddings
          ? (static_cast<double>(plan.weights) - all_expert_bytes) / (all_params - expert_elems)
      : !quant.empty()
          ? (static_cast<double>(plan.weights) - embed_bytes - all_expert_bytes) /
                (all_params - expert_elems - static_cast<double>(config.vocab_size * config.hidden_size))
      : synth ? 2.0
              : gpus * static_cast<double>(plan.weights) / all_params;
  // Bytes one routed expert's matrices hold: as the rest (wes per element), or counted above.
  const double one_expert = expert_bytes > 0 ? expert_bytes : mc.expert * wes;
  // Bytes per KV element; fp8 adds its row's 4-byte scale per head_dim elements.
  const double kv_es = plan.kv_f32   ? 4.0
                       : plan.kv_fp8 ? 1.0 + 4.0 / static_cast<double>(config.head_dim)
                                     : 2.0;
  std::mt19937 rng(static_cast<uint32_t>(*seed));
  auto random_ids = [&](size_t n) {
    std::vector<int32_t> v(n);
    for (auto& x : v) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(config.vocab_size));
    return v;
  };

  std::vector<DecodeRow> drows;
  for (int64_t ctx : *contexts) {
    for (int64_t batch : *batches) {
      if (ctx + *steps + 4 > plan.max_context) continue;
      std::vector<std::unique_ptr<backend::SequenceState>> seqs;
      std::vector<backend::SequenceState*> sp;
      for (int64_t i = 0; i < batch; ++i) {
        seqs.push_back(b.new_sequence());
        sp.push_back(seqs.back().get());
        if (auto st = b.set_length(*seqs.back(), ctx); !st) return fail(cmd, st.message());
      }
      std::vector<int32_t> tok = random_ids(static_cast<size_t>(batch)), next;
      for (int w = 0; w < 3; ++w) {
        if (auto st = b.decode_greedy(sp, tok, next); !st) return fail(cmd, st.message());
        tok = next;
      }
      if (profile) b.profile()->reset();
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t s = 0; s < *steps; ++s) {
        if (auto st = b.decode_greedy(sp, tok, next); !st) return fail(cmd, st.message());
        tok = next;
      }
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      DecodeRow r;
      r.batch = batch;
      r.context = ctx;
      r.step_s = dt / static_cast<double>(*steps);
      r.tok_s = static_cast<double>(batch) / r.step_s;
      // Bytes one step must read: every non-expert weight and lm_head once, the distinct experts the batch
      // routes to (expected count for uniform routing), each sequence's KV cache and recurrent state (read
      // and written).
      const double experts = model::distinct_experts(config, static_cast<double>(batch));
      const double weights = (mc.dense + mc.lm_head) * wes + experts * one_expert * mc.moe_layers;
      const double ctx_mid = static_cast<double>(ctx) + 3 + static_cast<double>(*steps) / 2;
      r.bytes =
          weights + static_cast<double>(batch) * (ctx_mid * mc.kv_per_token * kv_es + 2 * mc.state_bytes);
      r.bw = r.bytes / r.step_s;
      r.ratio = r.bw / (*bw * gpus);  // against the bandwidth of all the GPUs
      if (profile)
        for (auto [name, sec] : b.profile()->totals())
          r.ops.emplace_back(name, sec / static_cast<double>(*steps));
      drows.push_back(r);
    }
  }

  std::vector<PrefillRow> prows;
  for (int64_t T : *prefills) {
    if (T + 1 > plan.max_context) continue;
    std::vector<float> logits;
    {
      // Warm-up at the chunk shape: cuBLASLt picks its algorithms on first sight of a shape.
      auto s = b.new_sequence();
      const auto ids = random_ids(static_cast<size_t>(std::min<int64_t>(T, opt.prefill_chunk)));
      backend::PrefillItem item{s.get(), ids, false};
      if (auto st = b.prefill(std::span<const backend::PrefillItem>(&item, 1), logits); !st)
        return fail(cmd, st.message());
    }
    auto s = b.new_sequence();
    const auto ids = random_ids(static_cast<size_t>(T));
    backend::PrefillItem item{s.get(), ids, false};
    if (profile) b.profile()->reset();
    const auto t0 = std::chrono::steady_clock::now();
    if (auto st = b.prefill(std::span<const backend::PrefillItem>(&item, 1), logits); !st)
      return fail(cmd, st.message());
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    PrefillRow r;
    r.tokens = T;
    r.seconds = dt;
    r.tok_s = static_cast<double>(T) / dt;
    // Matmul FLOPs (2 per weight per token; routed experts: K per token), causal attention (QK^T and PV over
    // the keys each query sees), the delta rule (about 6 dk dv per head per token), one lm_head row.
    const double Td = static_cast<double>(T);
    const double K = mc.moe_layers > 0 ? static_cast<double>(config.num_experts_per_tok) : 0;
    double flops = 2 * Td * (mc.dense + K * mc.expert * mc.moe_layers) + 2 * mc.lm_head;
    const double n_full = static_cast<double>(config.count_layers(LayerType::kFullAttention));
    const double n_lin = static_cast<double>(config.count_layers(LayerType::kLinearAttention));
    flops +=
        n_full * 4 * static_cast<double>(config.num_attention_heads * config.head_dim) * Td * (Td + 1) / 2;
    flops += n_lin * 6 *
             static_cast<double>(config.linear_num_value_heads * config.linear_key_head_dim *
                                 config.linear_value_head_dim) *
             Td;
    r.flops = flops;
    r.rate = flops / dt;
    r.ratio = r.rate / (*gemm_rate * gpus);
    if (profile) r.ops = b.profile()->totals();
    prows.push_back(r);
  }

  const std::string name = synth ? *synth : *dir;
  if (json) {
    nlohmann::json out;
    out["model"] = name;
    out["synthetic"] = synth.has_value();
    out["device"] = devices[0].name;
    out["load_seconds"] = b.load_seconds();
    out["memory"] = {{"weights", plan.weights},     {"kv", plan.kv},       {"states", plan.states},
                     {"workspace", plan.workspace}, {"slots", plan.slots}, {"max_context", plan.max_context}};
    out["copy_bandwidth_bytes_per_s"] = *bw;
    out["gemm_bf16_flops_per_s"] = *gemm_rate;
    out["cuda_graphs"] = opt.cuda_graphs;
    out["tensor_parallel"] = tp;  // 0: the plain single-GPU backend
    for (const auto& r : drows)
      out["decode"].push_back({{"batch", r.batch},
                               {"context", r.context},
                               {"step_seconds", r.step_s},
                               {"tokens_per_s", r.tok_s},
                               {"bytes_per_step", r.bytes},
                               {"bytes_per_s", r.bw},
                               {"roofline_ratio", r.ratio},
                               {"profile_seconds", nlohmann::json(r.ops)}});
    for (const auto& r : prows)
      out["prefill"].push_back({{"tokens", r.tokens},
                                {"seconds", r.seconds},
                                {"tokens_per_s", r.tok_s},
                                {"flops", r.flops},
                                {"flops_per_s", r.rate},
                                {"roofline_ratio", r.ratio},
                                {"profile_seconds", nlohmann::json(r.ops)}});
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("model       %s%s%s\n", name.c_str(), synth ? " (synthetic random weights)" : "",
              quant.empty() ? "" : (" " + quant).c_str());
  std::printf(
      "device      %s%s\n", devices[0].name.c_str(),
      tp ? (" x " + std::to_string(tp) + ", tensor parallel through NCCL (memory per GPU)").c_str() : "");
  std::printf("load        %.2f s; weights %.2f GB, KV %.2f GB (%s), states %.2f GB, workspace %.2f GB\n",
              b.load_seconds(), plan.weights / 1e9, plan.kv / 1e9,
              plan.kv_f32   ? "fp32"
              : plan.kv_fp8 ? "fp8"
                            : "bf16",
              plan.states / 1e9, plan.workspace / 1e9);
  std::printf("rooflines   copy %.2f TB/s (read + write), bf16 GEMM %.1f TFLOP/s (8192^3, fp32 out)\n",
              *bw / 1e12, *gemm_rate / 1e12);
  std::printf("\ndecode%s\n  batch  context   step ms     tok/s   GB/step    TB/s  of roofline\n",
              opt.cuda_graphs ? " (CUDA graphs)" : "");
  for (const auto& r : drows)
    std::printf("  %5lld  %7lld  %8.3f  %8.1f  %8.2f  %6.2f  %9.1f%%\n", static_cast<long long>(r.batch),
                static_cast<long long>(r.context), r.step_s * 1e3, r.tok_s, r.bytes / 1e9, r.bw / 1e12,
                100 * r.ratio);
  if (profile)
    for (const auto& r : drows) {
      std::printf("\n  profile: decode batch %lld context %lld (GPU time per step, no graphs)\n",
                  static_cast<long long>(r.batch), static_cast<long long>(r.context));
      print_ops(r.ops, r.step_s);
    }
  std::printf("\nprefill\n  tokens   seconds     tok/s   TFLOP   TFLOP/s  of GEMM rate\n");
  for (const auto& r : prows)
    std::printf("  %6lld  %8.3f  %8.0f  %6.1f  %8.1f  %10.1f%%\n", static_cast<long long>(r.tokens),
                r.seconds, r.tok_s, r.flops / 1e12, r.rate / 1e12, 100 * r.ratio);
  if (profile)
    for (const auto& r : prows) {
      std::printf("\n  profile: prefill of %lld tokens (GPU time)\n", static_cast<long long>(r.tokens));
      print_ops(r.ops, r.seconds);
    }
  if (profile) {
    const auto tunings = b.gemm_tunings();
    if (!tunings.empty())
      std::printf(
          "\n  cuBLASLt tuning at load (prefill chunk shapes, N x K x T: first heuristic -> chosen)\n");
    for (const auto& t : tunings)
      std::printf("      %6lld x %6lld x %5lld  %8.3f ms -> %8.3f ms  (#%d of %d)\n",
                  static_cast<long long>(t.N), static_cast<long long>(t.K), static_cast<long long>(t.T),
                  t.heuristic_s * 1e3, t.best_s * 1e3, t.chosen, t.candidates);
  }
  return 0;
#endif
}

}  // namespace deltaflow::cli
