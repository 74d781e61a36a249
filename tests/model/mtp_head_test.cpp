// The CPU backend's MTP head (speculative decoding) against references:
// - make-tiny presets dense, moe, next: tools/reference/make_mtp_goldens.py, a PyTorch transcription of
// vLLM's
//   qwen3_5_mtp.py built from transformers' decoder-layer classes, fp32 on the CPU. Logits of every row:
//   max |ours - ref| <= 5e-5 * max(1, max |ref|) (the main model's bound: the same fp32 math in another
//   order). The 3-token greedy draft chain: equal ids.
// - the default model (models/house): its trainer's own MTP evaluation (tests/fixtures/house_model/
//   goldens.json "mtp", fp32 on a GPU): over the held-out windows, the head's NLL within 0.5% and its top-1
//   accuracy within 0.005; the first window's argmax ids equal at >= 99.5% of the positions (near-ties may
//   flip between fp32 orders). Under ASan (CI's sanitizer run, ~10x slower) only the first window's ids.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../golden_file.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "backend/host_sampling.hpp"
#include "model/tiny_checkpoint.hpp"

namespace deltaflow {
namespace {

using backend::cpu::CpuBackend;
using testing_golden::GoldenFile;
using testing_golden::rel_err;

constexpr double kTol = 5e-5;
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

// Pools for one sequence of up to `rows` tokens in one step, with the MTP layer's KV.
void allocate_for(CpuBackend& b, int64_t rows) {
  backend::PoolRequest r;
  r.kv_pages = (rows + 16) / b.page_size() + 2;
  r.state_slots = 2;
  r.max_step_rows = rows;
  r.max_step_seqs = 2;
  r.draft = true;
  ASSERT_TRUE(b.allocate(r).is_ok());
}

std::vector<int32_t> identity_pages(int64_t n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  return p;
}

// The main model over `ids` (one run from position 0), then the head over rows [0, n-1) paired with ids[1..],
// logits of every row, and `chain` greedy drafts from the last row.
core::Status head_logits(CpuBackend& b, const std::vector<int32_t>& ids, int32_t chain,
                         backend::DraftOut& out) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const auto pages = identity_pages(b.pools().kv_pages);
  backend::SeqRun run;
  run.n_rows = static_cast<int32_t>(n);
  run.state_slot = 0;
  run.kv_pages = pages;
  run.logits = backend::RunLogits::kNone;
  backend::StepOut so;
  DF_TRY(b.step(backend::Step{ids, std::span<const backend::SeqRun>(&run, 1)}, so));
  backend::DraftRun d;
  d.n_rows = static_cast<int32_t>(n - 1);
  d.kv_pages = pages;
  d.next_token = ids.back();
  d.n_draft = chain;
  d.logits = backend::RunLogits::kAll;
  return b.draft(std::span<const backend::DraftRun>(&d, 1), out);
}

class MtpGoldens : public ::testing::TestWithParam<std::string> {};

TEST_P(MtpGoldens, LogitsAndDraftChainMatchReference) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("df_mtp_" + GetParam() + "_" + std::to_string(::getpid())))
          .string();
  ASSERT_TRUE(model::write_tiny_checkpoint(GetParam(), 1, dir).is_ok());
  auto loaded = CpuBackend::load(dir);
  ASSERT_TRUE(loaded.is_ok()) << loaded.message();
  auto& b = **loaded;
  ASSERT_TRUE(b.can_draft());
  GoldenFile g(std::string(DF_FIXTURES) + "/mtp/mtp_" + GetParam() + ".safetensors");
  const auto ids = g.i32("ids");
  ASSERT_EQ(ids.size(), 40u);
  allocate_for(b, 64);
  backend::DraftOut out;
  ASSERT_TRUE(head_logits(b, ids, 3, out).is_ok());
  EXPECT_LE(rel_err(out.logits, g.f32("mtp_logits")), kTol);
  EXPECT_EQ(out.tokens, g.i32("chain_ids"));
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Presets, MtpGoldens, ::testing::Values("dense", "moe", "next"));

// Drafting is batch-invariant: two sequences' drafts in one call equal each drafted alone (bitwise), after a
// step of both prompts and after a step of a decode row each (the runs of one row that the CUDA backend
// batches as decode rows).
TEST_P(MtpGoldens, DraftsTogetherEqualDraftsAlone) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("df_mtp_b_" + GetParam() + "_" + std::to_string(::getpid())))
          .string();
  ASSERT_TRUE(model::write_tiny_checkpoint(GetParam(), 1, dir).is_ok());
  auto a = CpuBackend::load(dir), b = CpuBackend::load(dir);
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  std::filesystem::remove_all(dir);
  const int64_t V = (*a)->config().vocab_size;
  for (auto* be : {a->get(), b->get()}) {
    backend::PoolRequest r;
    r.kv_pages = 24;
    r.state_slots = 4;
    r.max_step_rows = 64;
    r.max_step_seqs = 4;
    r.draft = true;
    ASSERT_TRUE(be->allocate(r).is_ok());
  }
  std::vector<int32_t> pages0, pages1;
  for (int32_t i = 0; i < 10; ++i) {
    pages0.push_back(i);
    pages1.push_back(10 + i);
  }
  const auto ids = [&](int n, int salt) {
    std::vector<int32_t> p;
    for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 131 + salt * 7919 + 3) % V));
    return p;
  };
  // A step of both sequences' runs (n0 and n1 rows at start0 and start1), then the head over their rows.
  const auto round = [&](int n0, int64_t start0, int n1, int64_t start1, int d0, int d1) {
    std::vector<int32_t> tokens = ids(n0, start0 + 1);
    const auto t1 = ids(n1, start1 + 2);
    tokens.insert(tokens.end(), t1.begin(), t1.end());
    backend::SeqRun r0, r1;
    r0.n_rows = n0;
    r0.start_pos = start0;
    r0.state_slot = 0;
    r0.kv_pages = pages0;
    r1.first_row = n0;
    r1.n_rows = n1;
    r1.start_pos = start1;
    r1.state_slot = 1;
    r1.kv_pages = pages1;
    const backend::SeqRun runs[2] = {r0, r1};
    backend::DraftRun d[2];
    for (int i = 0; i < 2; ++i) {
      d[i].first_row = runs[i].first_row;
      d[i].n_rows = runs[i].n_rows;
      d[i].start_pos = runs[i].start_pos;
      d[i].kv_pages = runs[i].kv_pages;
      d[i].next_token = static_cast<int32_t>((17 * i + start0 + 5) % V);
      d[i].n_draft = i == 0 ? d0 : d1;
      d[i].logits = backend::RunLogits::kAll;
    }
    backend::StepOut so;
    backend::DraftOut together, alone[2];
    ASSERT_TRUE((*a)->step(backend::Step{tokens, runs}, so).is_ok());
    ASSERT_TRUE((*a)->draft(d, together).is_ok());
    ASSERT_TRUE((*b)->step(backend::Step{tokens, runs}, so).is_ok());
    for (int i = 0; i < 2; ++i) ASSERT_TRUE((*b)->draft(std::span(d + i, 1), alone[i]).is_ok());
    auto tokens_alone = alone[0].tokens;
    auto logits_alone = alone[0].logits;
    tokens_alone.insert(tokens_alone.end(), alone[1].tokens.begin(), alone[1].tokens.end());
    logits_alone.insert(logits_alone.end(), alone[1].logits.begin(), alone[1].logits.end());
    EXPECT_EQ(together.tokens, tokens_alone) << "runs of " << n0 << " and " << n1;
    EXPECT_TRUE(together.logits == logits_alone) << "runs of " << n0 << " and " << n1;
  };
  round(30, 0, 10, 0, 3, 2);
  round(1, 30, 1, 10, 1, 5);
  round(1, 31, 1, 11, 4, 4);
}

TEST(MtpHead, CheckpointWithoutHeadCannotDraft) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("df_mtp_vl_" + std::to_string(::getpid()))).string();
  ASSERT_TRUE(model::write_tiny_checkpoint("vl", 1, dir).is_ok());
  auto b = CpuBackend::load(dir);
  ASSERT_TRUE(b.is_ok()) << b.message();
  EXPECT_FALSE((*b)->can_draft());
  backend::PoolRequest r{4, 1, 8, 1, true};
  const auto st = (*b)->allocate(r);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("MTP head"), std::string::npos) << st.message();
  std::filesystem::remove_all(dir);
}

TEST(MtpHead, DefaultModelMatchesItsTrainer) {
  const std::string fixtures = std::string(DF_FIXTURES) + "/house_model/";
  std::ifstream gf(fixtures + "goldens.json");
  const auto g = nlohmann::json::parse(gf);
  const auto& h = g["heldout"];
  const auto& m = g["mtp"];
  const std::vector<int32_t> all = h["ids"].get<std::vector<int32_t>>();
  const int64_t window = h["window"].get<int64_t>();
  auto loaded = CpuBackend::load(std::string(DF_SOURCE_DIR) + "/models/house");
  ASSERT_TRUE(loaded.is_ok()) << loaded.message();
  auto& b = **loaded;
  allocate_for(b, window);
  const int64_t V = b.config().vocab_size;
  double nll = 0;
  int64_t tokens = 0, top1 = 0, same_first = 0;
  const auto first_ref = m["first_window_argmax_ids"].get<std::vector<int32_t>>();
  const int64_t end = kSanitized ? window : static_cast<int64_t>(all.size());
  for (int64_t w0 = 0; w0 < end; w0 += window) {
    const int64_t n = std::min<int64_t>(window, static_cast<int64_t>(all.size()) - w0);
    if (n < 3) continue;
    // Rows 0..n-3 predict ids n+2 (the trainer scores i <= n-3): the head over the first n-1 tokens.
    std::vector<int32_t> ids(all.begin() + w0, all.begin() + w0 + n - 1);
    backend::DraftOut out;
    ASSERT_TRUE(head_logits(b, ids, 0, out).is_ok());
    ASSERT_EQ(out.logits.size(), static_cast<size_t>((n - 2) * V));
    for (int64_t i = 0; i + 2 < n; ++i) {
      const std::span<const float> row(out.logits.data() + i * V, static_cast<size_t>(V));
      const int32_t want = all[static_cast<size_t>(w0 + i + 2)];
      const int32_t arg = backend::argmax(row);
      double mx = row[0], s = 0;
      for (float x : row) mx = std::max<double>(mx, x);
      for (float x : row) s += std::exp(static_cast<double>(x) - mx);
      nll += -(static_cast<double>(row[static_cast<size_t>(want)]) - mx - std::log(s));
      ++tokens;
      top1 += arg == want;
      if (w0 == 0 && static_cast<size_t>(i) < first_ref.size())
        same_first += arg == first_ref[static_cast<size_t>(i)];
    }
  }
  EXPECT_GE(static_cast<double>(same_first), 0.995 * static_cast<double>(first_ref.size()));
  if (kSanitized) return;
  EXPECT_EQ(tokens, m["tokens"].get<int64_t>());
  const double ref_nll = m["nll"].get<double>();
  EXPECT_NEAR(nll, ref_nll, 0.005 * ref_nll);
  EXPECT_NEAR(static_cast<double>(top1) / static_cast<double>(tokens), m["top1_acc"].get<double>(), 0.005);
}

}  // namespace
}  // namespace deltaflow
