// Images through the engine (scheduler + CPU backend) on the make-tiny vl checkpoint, held to
// Qwen3_5ForConditionalGeneration's logits (tests/fixtures/vision/logits.safetensors,
// tools/reference/make_vision_goldens.py) for a prompt with one image and one with two of different sizes.
//
// The engine reports log-probabilities, not logits: every prompt position's log p(next prompt token) and the
// first generated token's, against log_softmax of the reference logits. Tolerance: 1e-4 absolute (both sides
// fp32 over the same bf16 weights; the encoder alone is within 1.6e-6, the text model within 5e-5 relative).
// Then: the same image prompt from the prefix cache gives the cold run's tokens bit for bit, and a prompt
// that differs only in its image resumes no further than that image.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "../engine_jobs.hpp"
#include "../vision_goldens.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "engine/scheduler.hpp"
#include "io/safetensors.hpp"
#include "model/tiny_checkpoint.hpp"
#include "vision/image_decode.hpp"
#include "vision/preprocess.hpp"
#include "vision/processor_config.hpp"

namespace deltaflow::engine {
namespace {

using namespace std::chrono_literals;

struct Outcome {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  std::vector<double> prompt_lp;
  int64_t cached = 0;
  std::string error;
};

class EngineVision : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() / ("df_engine_vision_" + std::to_string(::getpid())))
               .string();
    ASSERT_TRUE(model::write_tiny_checkpoint("vl", 1, dir_).is_ok());
    auto b = backend::cpu::CpuBackend::load(dir_);
    ASSERT_TRUE(b.is_ok()) << b.message();
    backend_ = std::move(b).value();
    auto pc = vision::load_processor_config(dir_);
    ASSERT_TRUE(pc.is_ok()) << pc.message();
    processor_ = *pc;
    auto f = io::SafetensorsFile::open(testing_vision::fixture_dir() + "/logits.safetensors");
    ASSERT_TRUE(f.is_ok()) << f.message();
    logits_ = std::move(f).value();
  }
  void TearDown() override {
    sched_.reset();
    std::filesystem::remove_all(dir_);
  }
  void start(bool cache, int64_t budget, double kv_pages = 0) {
    sched_.reset();
    const double page_gb = static_cast<double>(backend_->page_bytes()) / (1ull << 30);
    auto s = Scheduler::start(*backend_, {.max_model_len = 256,
                                          .max_num_seqs = 4,
                                          .max_num_batched_tokens = budget,
                                          .kv_cache_gb = kv_pages * page_gb,
                                          .prefix_cache = cache});
    ASSERT_TRUE(s.is_ok()) << s.message();
    sched_ = std::move(s).value();
  }
  template <class T>
  std::vector<T> tensor(const std::string& name, int64_t* cols = nullptr) const {
    for (const auto& e : logits_->header().tensors)
      if (e.name == name) {
        std::vector<T> v(static_cast<size_t>(e.numel()));
        std::memcpy(v.data(), logits_->tensor_data(e), v.size() * sizeof(T));
        if (cols) *cols = e.shape.back();
        return v;
      }
    ADD_FAILURE() << name << " missing";
    return {};
  }
  ImageInput image(const std::string& name) const {
    vision::Image im;
    if (name.rfind("synth_", 0) == 0) {
      const int64_t h = std::stoll(name.substr(6)), w = std::stoll(name.substr(name.find('x') + 1));
      im = vision::Image{w, h, testing_vision::synthetic_rgb(h, w)};
    } else {
      const auto bytes = testing_vision::read_bytes(testing_vision::fixture_dir() + "/images/" + name);
      auto d = vision::decode_image(bytes);
      EXPECT_TRUE(d.is_ok()) << d.message();
      im = std::move(d).value();
    }
    auto pv = vision::preprocess_image(im, processor_);
    EXPECT_TRUE(pv.is_ok()) << pv.message();
    ImageInput in;
    in.grid = {pv->grid_t, pv->grid_h, pv->grid_w};
    in.pixel_values = std::move(pv->data);
    in.hash = image_content_hash(in.pixel_values, in.grid);
    return in;
  }
  // A scheduler for large images (4,096 positions).
  void start_large() {
    sched_.reset();
    auto st = Scheduler::start(*backend_,
                               {.max_model_len = 4096, .max_num_seqs = 4, .max_num_batched_tokens = 4096});
    ASSERT_TRUE(st.is_ok()) << st.message();
    sched_ = std::move(st).value();
  }
  // A side x side patch grid of patterned pixel values (the encoder's time does not depend on them), and a
  // prompt `before`, <|vision_start|>, its placeholders, <|vision_end|>, `after`.
  ImageInput grid_image(int64_t side) const {
    const model::VisionConfig& vc = *backend_->vision();
    ImageInput im;
    im.grid = {1, side, side};
    im.pixel_values.resize(static_cast<size_t>(side * side * vc.patch_dim()));
    for (size_t i = 0; i < im.pixel_values.size(); ++i)
      im.pixel_values[i] = static_cast<float>(static_cast<int64_t>(i * 2654435761u % 2001) - 1000) / 1000.f;
    im.hash = image_content_hash(im.pixel_values, im.grid);
    return im;
  }
  std::vector<int32_t> grid_prompt(int64_t side, std::vector<int32_t> before,
                                   const std::vector<int32_t>& after) const {
    const model::VisionConfig& vc = *backend_->vision();
    before.push_back(static_cast<int32_t>(vc.vision_start_token_id));
    before.insert(before.end(), static_cast<size_t>(side * side / vc.merge_unit()),
                  static_cast<int32_t>(vc.image_token_id));
    before.push_back(static_cast<int32_t>(vc.vision_end_token_id));
    before.insert(before.end(), after.begin(), after.end());
    return before;
  }
  struct Ask {
    std::vector<int32_t> prompt;
    std::vector<ImageInput> images;
    int max_tokens = 1;
    bool prompt_lp = false;
  };
  // Submits every request at once and waits for all.
  std::vector<Outcome> run_all(std::vector<Ask> asks) {
    auto ch = std::make_shared<ResponseChannel>();
    std::vector<GenerationRequest> reqs;
    for (size_t i = 0; i < asks.size(); ++i) {
      GenerationRequest r;
      r.prompt = std::move(asks[i].prompt);
      r.images = std::move(asks[i].images);
      r.max_tokens = asks[i].max_tokens;
      r.logprobs = true;
      r.prompt_logprobs = asks[i].prompt_lp;
      r.channel = ch;
      r.choice = static_cast<int>(i);
      reqs.push_back(std::move(r));
    }
    EXPECT_EQ(sched_->submit(std::move(reqs)), SubmitResult::kQueued);
    std::vector<Outcome> out(asks.size());
    std::vector<Event> evs;
    size_t done = 0;
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (done < out.size() && std::chrono::steady_clock::now() < deadline) {
      if (!ch->wait(50ms, evs)) continue;
      for (auto& e : evs) {
        Outcome& o = out[static_cast<size_t>(e.choice)];
        for (const auto& t : e.tokens) {
          o.ids.push_back(t.id);
          o.logprobs.push_back(t.logprob);
        }
        if (e.finished) {
          ++done;
          o.cached = e.cached_tokens;
          o.error = e.error;
          o.prompt_lp = e.prompt_logprobs;
        }
      }
    }
    EXPECT_EQ(done, out.size()) << "timed out";
    return out;
  }
  Outcome run(std::vector<int32_t> prompt, std::vector<ImageInput> images, int max_tokens, bool prompt_lp) {
    std::vector<Ask> asks;
    asks.push_back({std::move(prompt), std::move(images), max_tokens, prompt_lp});
    return run_all(std::move(asks))[0];
  }

  std::string dir_;
  std::unique_ptr<backend::cpu::CpuBackend> backend_;
  vision::ProcessorConfig processor_;
  std::unique_ptr<io::SafetensorsFile> logits_;
  std::unique_ptr<Scheduler> sched_;
};

const std::map<std::string, std::vector<std::string>> kPrompts = {
    {"one", {"rgb_67x45.png"}}, {"two", {"photo_80x50.jpg", "synth_100x150"}}};

TEST_F(EngineVision, LogProbabilitiesMatchTransformers) {
  for (int64_t budget : {4096, 7}) {  // the prompt in one step, and in chunks that cut through the images
    start(false, budget);
    for (const auto& [name, files] : kPrompts) {
      SCOPED_TRACE(name + " budget " + std::to_string(budget));
      const auto ids = tensor<int32_t>("ids/" + name);
      int64_t V = 0;
      const auto ref = tensor<float>("logits/" + name, &V);
      std::vector<ImageInput> images;
      for (const auto& f : files) images.push_back(image(f));
      const Outcome o = run(ids, std::move(images), 1, true);
      ASSERT_TRUE(o.error.empty()) << o.error;
      ASSERT_EQ(o.prompt_lp.size(), ids.size() - 1);
      ASSERT_EQ(o.ids.size(), 1u);
      auto ref_lp = [&](size_t row, int32_t id) {
        const float* l = ref.data() + row * static_cast<size_t>(V);
        double m = l[0], s = 0;
        for (int64_t j = 0; j < V; ++j) m = std::max<double>(m, l[j]);
        for (int64_t j = 0; j < V; ++j) s += std::exp(static_cast<double>(l[j]) - m);
        return static_cast<double>(l[id]) - m - std::log(s);
      };
      double worst = 0;
      for (size_t i = 0; i + 1 < ids.size(); ++i)
        worst = std::max(worst, std::fabs(o.prompt_lp[i] - ref_lp(i, ids[i + 1])));
      // The first generated token: greedy, the reference's argmax of the last row.
      const float* last = ref.data() + (ids.size() - 1) * static_cast<size_t>(V);
      EXPECT_EQ(o.ids[0], static_cast<int32_t>(std::max_element(last, last + V) - last));
      worst = std::max(worst, std::fabs(o.logprobs[0] - ref_lp(ids.size() - 1, o.ids[0])));
      std::printf("[ %s budget %lld ] max |log p - ref| %.3g\n", name.c_str(), static_cast<long long>(budget),
                  worst);
      EXPECT_LE(worst, 1e-4);
    }
  }
}

TEST_F(EngineVision, PrefixCacheEqualsColdAndADifferentImageBreaksIt) {
  const auto ids = tensor<int32_t>("ids/one");
  start(false, 4096);
  const Outcome cold = run(ids, {image("rgb_67x45.png")}, 6, false);
  ASSERT_TRUE(cold.error.empty()) << cold.error;
  // Another image of the same grid: the same prompt ids, only the pixels differ.
  ImageInput other = image("rgb_67x45.png");
  for (float& v : other.pixel_values) v = -v;
  other.hash = image_content_hash(other.pixel_values, other.grid);
  const Outcome other_cold = run(ids, {other}, 6, false);
  ASSERT_TRUE(other_cold.error.empty()) << other_cold.error;
  EXPECT_NE(other_cold.logprobs, cold.logprobs);  // the image reaches the model

  start(true, 4096);
  const Outcome first = run(ids, {image("rgb_67x45.png")}, 6, false);
  const Outcome again = run(ids, {image("rgb_67x45.png")}, 6, false);
  const Outcome swapped = run(ids, {other}, 6, false);
  EXPECT_EQ(first.ids, cold.ids);
  EXPECT_EQ(first.logprobs, cold.logprobs);
  EXPECT_EQ(again.ids, cold.ids);
  EXPECT_EQ(again.logprobs, cold.logprobs);
  EXPECT_EQ(again.cached, static_cast<int64_t>(ids.size()) - 1);
  // The image starts after "<text> <text> <text> <|vision_start|>": nothing past it is reused.
  size_t first_image = 0;
  while (ids[first_image] != backend_->vision()->image_token_id) ++first_image;
  EXPECT_LE(swapped.cached, static_cast<int64_t>(first_image));
  EXPECT_EQ(swapped.ids, other_cold.ids);
  EXPECT_EQ(swapped.logprobs, other_cold.logprobs);
}

// KV pages for about one and a half sequences and three image requests at once, in chunks of 16 tokens:
// sequences are preempted and recomputed (their images' rows and positions with them), and each gives the
// tokens and log-probabilities it gives alone.
TEST_F(EngineVision, PreemptionGivesTheSameOutputs) {
  const auto one = tensor<int32_t>("ids/one"), two = tensor<int32_t>("ids/two");
  auto asks = [&] {
    std::vector<Ask> a;
    a.push_back({one, {image("rgb_67x45.png")}, 40, false});
    a.push_back({two, {image("photo_80x50.jpg"), image("synth_100x150")}, 40, false});
    a.push_back({one, {image("lossy_50x34.webp")}, 40, false});  // the same grid as rgb_67x45.png
    return a;
  };
  start(false, 4096);
  std::vector<Outcome> alone;
  for (auto& a : asks()) alone.push_back(run_all({a})[0]);
  start(false, 16, 7.5);  // "two" and its 40 tokens need 5 pages of 16
  const auto got = run_all(asks());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(got[i].error.empty()) << got[i].error;
    EXPECT_EQ(got[i].ids, alone[i].ids) << "request " << i;
    EXPECT_EQ(got[i].logprobs, alone[i].logprobs) << "request " << i;
  }
  EXPECT_GT(sched_->stats().preemptions, 0);
}

TEST_F(EngineVision, PlaceholdersThatDoNotMatchTheImagesFailTheRequest) {
  start(true, 4096);
  const auto ids = tensor<int32_t>("ids/one");
  const Outcome o = run(ids, {image("rgb_67x45.png"), image("rgb_67x45.png")}, 1, false);
  EXPECT_FALSE(o.error.empty());
  // The engine goes on serving.
  EXPECT_TRUE(run(ids, {image("rgb_67x45.png")}, 1, false).error.empty());
}

// Images are encoded on the encoder thread, not the engine thread: a text request submitted with (after) an
// image request whose encoding takes a second or so (a 64 x 64 patch grid, 1,024 image tokens) is answered
// before the image request's first token, and the image request's answer is what it is alone.
TEST_F(EngineVision, ATextRequestIsNotHeldBehindAnImageBeingEncoded) {
  start_large();
  const ImageInput big = grid_image(64);
  const std::vector<int32_t> image_prompt = grid_prompt(64, {11, 12}, {13});

  auto ch = std::make_shared<ResponseChannel>();
  std::vector<GenerationRequest> reqs(2);
  reqs[0].prompt = image_prompt;
  reqs[0].images.push_back(big);
  reqs[0].max_tokens = 2;
  reqs[1].prompt = {21, 22, 23, 24};
  reqs[1].max_tokens = 3;
  for (int i = 0; i < 2; ++i) {
    reqs[static_cast<size_t>(i)].channel = ch;
    reqs[static_cast<size_t>(i)].choice = i;
  }
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(sched_->submit(std::move(reqs)), SubmitResult::kQueued);
  std::vector<int> order;  // choices in the order their first event with tokens (or their end) came
  std::vector<int32_t> image_ids;
  std::vector<Event> evs;
  int done = 0;
  double text_done_s = 0, image_first_s = 0;
  while (done < 2 && std::chrono::steady_clock::now() - t0 < 120s) {
    if (!ch->wait(20ms, evs)) continue;
    const double at = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (auto& e : evs) {
      if (e.choice == 0)
        for (const auto& t : e.tokens) {
          if (image_ids.empty()) image_first_s = at;
          image_ids.push_back(t.id);
        }
      if (e.finished) {
        ++done;
        EXPECT_TRUE(e.error.empty()) << e.error;
        if (e.choice == 1) text_done_s = at;
        order.push_back(e.choice);
      }
    }
  }
  ASSERT_EQ(done, 2);
  RecordProperty("text_done_s", std::to_string(text_done_s));
  RecordProperty("image_first_token_s", std::to_string(image_first_s));
  ASSERT_EQ(order, (std::vector<int>{1, 0}))
      << "text finished at " << text_done_s << " s, the image's first token at " << image_first_s << " s";
  EXPECT_LT(text_done_s, image_first_s);
  expect_idle(*sched_);
  // Alone, the image request answers the same.
  const Outcome alone = run(image_prompt, {big}, 2, false);
  EXPECT_EQ(alone.ids, image_ids);
}

// Stopping the engine while an image is being encoded (or waits for the encoder) ends every request with a
// final event, at once after the encode in flight: nothing hangs, nothing is left.
TEST_F(EngineVision, StoppingWhileImagesAreEncodedFinishesEveryRequest) {
  start_large();
  const ImageInput big = grid_image(32);
  const std::vector<int32_t> prompt = grid_prompt(32, {11}, {});
  auto ch = std::make_shared<ResponseChannel>();
  std::vector<GenerationRequest> reqs(3);
  for (int i = 0; i < 3; ++i) {
    reqs[static_cast<size_t>(i)].prompt = prompt;
    reqs[static_cast<size_t>(i)].images.push_back(big);
    reqs[static_cast<size_t>(i)].max_tokens = 2;
    reqs[static_cast<size_t>(i)].channel = ch;
    reqs[static_cast<size_t>(i)].choice = i;
  }
  ASSERT_EQ(sched_->submit(std::move(reqs)), SubmitResult::kQueued);
  std::this_thread::sleep_for(50ms);  // the first is being encoded, the others wait for the encoder
  const auto t0 = std::chrono::steady_clock::now();
  sched_->stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 60s);  // one encode at most (seconds under TSan)
  std::vector<Event> evs;
  int finished = 0;
  while (ch->wait(10ms, evs))
    for (const auto& e : evs) finished += e.finished ? 1 : 0;
  EXPECT_EQ(finished, 3);
}

// The default model (models/house) has a vision_config but no trained tower: a request with an image fails
// with the reason, naming the missing `model.visual.*` weights, and the engine goes on.
TEST(EngineVisionTextOnly, TheDefaultModelFailsAnImageRequestNamingTheMissingWeights) {
  auto b = backend::cpu::CpuBackend::load(std::string(DF_SOURCE_DIR) + "/models/house");
  ASSERT_TRUE(b.is_ok()) << b.message();
  EXPECT_EQ((*b)->vision(), nullptr);
  EXPECT_NE((*b)->vision_error().find("missing tensor 'model.visual.patch_embed.proj.weight'"),
            std::string::npos)
      << (*b)->vision_error();
  auto s = Scheduler::start(**b, {.max_model_len = 64, .max_num_seqs = 1});
  ASSERT_TRUE(s.is_ok()) << s.message();
  auto submit = [&](bool with_image) {
    auto ch = std::make_shared<ResponseChannel>();
    GenerationRequest r;
    r.prompt = {1, 2, 3};
    r.max_tokens = 1;
    if (with_image) r.images.push_back({std::vector<float>(16, 0.f), {1, 2, 2}, 1});
    r.channel = ch;
    std::vector<GenerationRequest> reqs;
    reqs.push_back(std::move(r));
    EXPECT_EQ((*s)->submit(std::move(reqs)), SubmitResult::kQueued);
    std::vector<Event> evs;
    for (int i = 0; i < 400; ++i)
      if (ch->wait(50ms, evs))
        for (auto& e : evs)
          if (e.finished) return e;
    ADD_FAILURE() << "timed out";
    return Event{};
  };
  const Event failed = submit(true);
  EXPECT_EQ(failed.finish, FinishReason::kError);
  EXPECT_EQ(failed.error, (*b)->vision_error());
  const Event text = submit(false);
  EXPECT_EQ(text.finish, FinishReason::kLength);
  s->reset();
}

}  // namespace
}  // namespace deltaflow::engine
