// Speculative decoding on the CUDA backend (cuda_mtp.cpp): the MTP head's drafts against the CPU reference,
// and the engine's tokens with and without speculation. Label `gpu`.
//
// - HeadEqualsCpuReference: the same steps on both backends, through each step path that keeps hidden rows
//   on CUDA (a prompt as one run, a verification-like run of several rows, a fused step of a decode row and a
//   prompt, a decode-only step), each followed by a draft: the head's logits of every row within
//   5e-4 * max(1, max |cpu|) (exact mode: fp32 end to end, the same math in another order; the CPU head
//   itself is within 5e-5 of PyTorch, tests/model/mtp_head_test.cpp), and the greedy draft chains equal.
// - Engine: greedy and seeded sampled requests of mixed draft counts (1, 2, 3, 4 and off), in one batch,
//   give the tokens of decoding without speculation (exact mode; their log-probabilities within 1e-3: a
//   verification row's attention runs the prefill kernel, a plain decode row the split-K decode kernel, which
//   sum in another order). Fast mode: the same requests finish with the same number of tokens and drafts
//   are made and verified.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "../engine_jobs.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "backend/cuda/cuda_backend.hpp"
#include "backend/sequence_stepper.hpp"
#include "engine/scheduler.hpp"
#include "gpu_test_util.hpp"
#include "model/tiny_checkpoint.hpp"

namespace deltaflow {
namespace {

using backend::cuda::CudaBackend;
using backend::cuda::CudaOptions;

std::string temp_dir(const std::string& what) {
  return (std::filesystem::temp_directory_path() / (what + "_" + std::to_string(::getpid()))).string();
}

std::unique_ptr<backend::SequenceStepper> load_cuda(const std::string& dir, bool exact) {
  CudaOptions opt;
  opt.exact = exact;
  opt.engine_pools = true;
  opt.max_context = 1024;
  opt.mtp = true;
  auto b = CudaBackend::load(dir, opt);
  EXPECT_TRUE(b.is_ok()) << b.message();
  if (!b.is_ok()) return nullptr;
  return std::make_unique<backend::SequenceStepper>(std::move(b).value());
}

std::vector<int32_t> ids_of(int n, int salt, int64_t vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 131 + salt * 7919 + 3) % vocab));
  return p;
}

class CudaDraft : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaDraft, HeadEqualsCpuReference) {
  ASSERT_TRUE(gpu_test::have_gpu()) << "no GPU visible";
  const std::string dir = temp_dir("df_cuda_mtp_" + GetParam());
  ASSERT_TRUE(model::write_tiny_checkpoint(GetParam(), 1, dir).is_ok());
  auto cpu = backend::cpu::CpuBackend::load(dir);
  ASSERT_TRUE(cpu.is_ok()) << cpu.message();
  auto cuda = load_cuda(dir, true);
  ASSERT_TRUE(cuda);
  std::filesystem::remove_all(dir);
  backend::Backend* bs[2] = {cpu->get(), cuda.get()};
  ASSERT_TRUE(bs[1]->can_draft());
  const int64_t V = bs[0]->config().vocab_size;
  backend::PoolRequest req;
  req.kv_pages = 24;
  req.state_slots = 4;
  req.max_step_rows = 64;
  req.max_step_seqs = 4;
  req.draft = true;
  for (auto* b : bs) {
    ASSERT_EQ(b->page_size(), 16);
    ASSERT_TRUE(b->allocate(req).is_ok());
  }
  // Sequence 0 on pages 0..9 (slot 0), sequence 1 on pages 10..19 (slot 1).
  std::vector<int32_t> pages0, pages1;
  for (int32_t i = 0; i < 10; ++i) {
    pages0.push_back(i);
    pages1.push_back(10 + i);
  }
  struct Run {
    int32_t rows;
    int64_t start;
    int slot;
  };
  // One step and its draft on both backends; the draft's runs follow the step's (n_rows and n_draft each).
  int64_t len[2] = {0, 0};
  auto step_and_draft = [&](const std::vector<int32_t>& tokens, const std::vector<Run>& runs,
                            const std::vector<std::pair<int32_t, int32_t>>& drafts, const char* what) {
    backend::DraftOut got[2];
    backend::StepOut main[2];
    for (int k = 0; k < 2; ++k) {
      std::vector<backend::SeqRun> sr;
      int32_t row = 0;
      for (const Run& r : runs) {
        backend::SeqRun s;
        s.first_row = row;
        s.n_rows = r.rows;
        s.start_pos = r.start;
        s.state_slot = r.slot;
        s.kv_pages = r.slot == 0 ? pages0 : pages1;
        s.logits = backend::RunLogits::kLast;
        sr.push_back(s);
        row += r.rows;
      }
      ASSERT_TRUE(bs[k]->step(backend::Step{tokens, sr}, main[k]).is_ok()) << what;
      std::vector<backend::DraftRun> dr;
      for (size_t i = 0; i < runs.size(); ++i) {
        backend::DraftRun d;
        d.first_row = sr[i].first_row;
        d.n_rows = drafts[i].first;
        d.start_pos = sr[i].start_pos;
        d.kv_pages = sr[i].kv_pages;
        d.next_token = static_cast<int32_t>((tokens[static_cast<size_t>(sr[i].first_row)] * 7 + 11) % V);
        d.n_draft = drafts[i].second;
        d.logits = backend::RunLogits::kAll;
        dr.push_back(d);
      }
      const auto st = bs[k]->draft(dr, got[k]);
      ASSERT_TRUE(st.is_ok()) << what << ": " << st.message();
    }
    // The main model's last-row logits of each run (the rows the head reads are its hidden states), then the
    // head's logits row by row.
    const auto close = [&](const std::vector<float>& want, const std::vector<float>& have,
                           const char* which) {
      ASSERT_EQ(want.size(), have.size()) << what << " " << which;
      for (size_t r = 0; r * static_cast<size_t>(V) < want.size(); ++r) {
        double ref_max = 1, diff = 0;
        for (size_t i = r * static_cast<size_t>(V); i < (r + 1) * static_cast<size_t>(V); ++i) {
          ref_max = std::max(ref_max, std::fabs(static_cast<double>(want[i])));
          diff = std::max(diff, std::fabs(static_cast<double>(want[i]) - have[i]));
        }
        EXPECT_LE(diff, 5e-4 * ref_max) << what << " " << which << " row " << r;
      }
    };
    close(main[0].logits, main[1].logits, "main model");
    close(got[0].logits, got[1].logits, "head");
    EXPECT_EQ(got[0].tokens, got[1].tokens) << what;
  };
  const auto p0 = ids_of(30, 1, V), p1 = ids_of(10, 2, V);
  // A prompt as one run (the per-run prefill path); the head over 29 of its rows, three drafts.
  step_and_draft(p0, {{30, 0, 0}}, {{29, 3}}, "prompt");
  len[0] = 30;
  // A verification-like run of four rows (prefill path); the head over two of them, two drafts. The next
  // step goes on after those two, as the engine's does after one accepted draft: the head's KV then holds
  // every position it reads (the main model's recurrent state has taken all four rows, on both backends).
  step_and_draft(ids_of(4, 3, V), {{4, len[0], 0}}, {{2, 2}}, "verification");
  len[0] += 2;
  // A decode row of sequence 0 beside sequence 1's prompt: one fused pass.
  std::vector<int32_t> t = ids_of(1, 4, V);
  t.insert(t.end(), p1.begin(), p1.end());
  step_and_draft(t, {{1, len[0], 0}, {10, 0, 1}}, {{1, 4}, {10, 2}}, "fused");
  len[0] += 1;
  len[1] = 10;
  // A decode-only step of both (the batched decode, its graph).
  step_and_draft(ids_of(2, 5, V), {{1, len[0], 0}, {1, len[1], 1}}, {{1, 1}, {1, 5}}, "decode");
  len[0] += 1;
  len[1] += 1;
  // The same with the runs the other way round: the head's rows and rounds in another order.
  step_and_draft(ids_of(2, 6, V), {{1, len[1], 1}, {1, len[0], 0}}, {{1, 3}, {1, 2}}, "decode, swapped");
}

INSTANTIATE_TEST_SUITE_P(Presets, CudaDraft, ::testing::Values("dense", "moe", "next"));

struct EngineParam {
  std::string preset;
  bool exact;
};

class CudaSpeculation : public ::testing::TestWithParam<EngineParam> {};

TEST_P(CudaSpeculation, TokensEqualDecodingWithoutIt) {
  ASSERT_TRUE(gpu_test::have_gpu()) << "no GPU visible";
  const std::string dir = temp_dir("df_cuda_spec_" + GetParam().preset);
  ASSERT_TRUE(model::write_tiny_checkpoint(GetParam().preset, 1, dir).is_ok());
  auto stepper = load_cuda(dir, GetParam().exact);
  ASSERT_TRUE(stepper);
  // The same backend with the short-runs segments (DELTAFLOW_CUDA_SHORT_RUNS=1, read at load): its batched
  // verifications must give the same tokens too.
  ::setenv("DELTAFLOW_CUDA_SHORT_RUNS", "1", 1);
  auto short_runs = load_cuda(dir, GetParam().exact);
  ::unsetenv("DELTAFLOW_CUDA_SHORT_RUNS");
  ASSERT_TRUE(short_runs);
  std::filesystem::remove_all(dir);
  const int64_t V = stepper->config().vocab_size;
  std::vector<engine::Job> jobs;
  const int lens[] = {9, 40, 3, 75, 20, 12};
  const int spec[] = {-1, 1, 2, 4, 0, 3};
  for (int i = 0; i < 6; ++i) {
    engine::Job j = engine::job(ids_of(lens[i], 40 + i, V), 20 + 5 * i);
    if (i % 2) {
      j.temperature = 0.8f;
      j.seed = 7 + static_cast<uint64_t>(i);
    }
    j.speculative = spec[i];
    jobs.push_back(j);
  }
  auto run = [&](int32_t k, backend::Backend* b = nullptr) {
    engine::SchedulerOptions o{.max_num_seqs = 8, .max_num_batched_tokens = 256, .prefix_cache = false};
    o.max_model_len = 1024;
    o.speculative_tokens = k;
    auto s = engine::Scheduler::start(b ? *b : *stepper, o);
    EXPECT_TRUE(s.is_ok()) << s.message();
    auto out = engine::run_jobs(**s, jobs);
    engine::expect_idle(**s);
    return out;
  };
  const auto ref = run(0);
  for (int32_t k : {1, 4, -4}) {  // -4: K = 4 on the short-runs backend
    const auto got = k > 0 ? run(k) : run(-k, short_runs.get());
    int64_t drafted = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      ASSERT_TRUE(got[i].error.empty()) << got[i].error;
      drafted += got[i].drafted;
      EXPECT_LE(got[i].accepted, got[i].drafted);
      if (jobs[i].speculative == 0) {
        EXPECT_EQ(got[i].drafted, 0) << "job " << i;
      }
      EXPECT_EQ(got[i].ids.size(), ref[i].ids.size()) << "job " << i << " k " << k;
      if (GetParam().exact) {
        EXPECT_EQ(got[i].ids, ref[i].ids) << "job " << i << " k " << k;
        double d = got[i].logprobs.size() == ref[i].logprobs.size() ? 0 : INFINITY;
        for (size_t t = 0; t < got[i].logprobs.size() && std::isfinite(d); ++t)
          d = std::max(d, std::fabs(static_cast<double>(got[i].logprobs[t]) - ref[i].logprobs[t]));
        EXPECT_LE(d, 1e-3) << "job " << i << " k " << k;
      } else if (!got[i].ids.empty() && !ref[i].ids.empty()) {
        EXPECT_EQ(got[i].ids[0], ref[i].ids[0]) << "job " << i << " k " << k;
      }
    }
    EXPECT_GT(drafted, 0) << "k " << k;
  }
}

std::vector<EngineParam> engine_params() {
  std::vector<EngineParam> p;
  for (const char* preset : {"dense", "moe", "next"})
    for (bool exact : {true, false}) p.push_back({preset, exact});
  return p;
}

INSTANTIATE_TEST_SUITE_P(Presets, CudaSpeculation, ::testing::ValuesIn(engine_params()),
                         [](const ::testing::TestParamInfo<EngineParam>& p) {
                           return p.param.preset + (p.param.exact ? "_exact" : "_fast");
                         });

}  // namespace
}  // namespace deltaflow
