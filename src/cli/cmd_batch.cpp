// `deltaflow batch`: an OpenAI Batch JSONL file through the engine (src/server/batch_file.hpp for the
// format). Requests go through the server's own validation and planning (prepare_chat / prepare_completions)
// and are kept in flight together (--max-queue), so the engine's scheduler batches them as it batches a busy
// server. Results are appended in completion order, each line written whole and fsynced; --resume skips the
// custom_ids already written, so a job killed at any moment loses and duplicates nothing. SIGTERM or SIGINT
// stops it cleanly: no new requests, the ones in flight cancelled and not written (a resume redoes them), the
// file closed, exit 1 with a line saying how far it got.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <thread>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/model_options.hpp"
#include "server/batch_file.hpp"
#include "server/openai_call.hpp"

namespace deltaflow::cli {

namespace {

using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int sig) {
  g_stop_signal = sig;
}

void install_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

core::Expected<bool> parse_bool_flag(const std::string& flag, const std::string& v) {
  if (v == "true" || v == "1" || v == "yes") return true;
  if (v == "false" || v == "0" || v == "no") return false;
  return core::Error{"flag " + flag + ": '" + v + "' is not true or false"};
}

std::string clock_text(double seconds) {
  const long s = static_cast<long>(seconds + 0.5);
  char b[32];
  if (s >= 3600)
    std::snprintf(b, sizeof b, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(b, sizeof b, "%ld:%02ld", s / 60, s % 60);
  return b;
}

// A one-line progress bar on stderr, redrawn at most ten times a second.
class Progress {
 public:
  Progress(size_t total, bool enabled) : total_(total), enabled_(enabled), start_(Clock::now()) {}
  void update(size_t done, bool force = false) {
    if (!enabled_) return;
    const auto now = Clock::now();
    if (!force && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const double secs = std::chrono::duration<double>(now - start_).count();
    const double frac = total_ ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
    const int width = 30, filled = static_cast<int>(frac * width);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(width, '.');
    std::string eta = "--:--";
    if (done > 0 && done < total_)
      eta = clock_text(secs / static_cast<double>(done) * static_cast<double>(total_ - done));
    if (done >= total_) eta = "0:00";
    std::fprintf(stderr, "\r[%s] %zu/%zu %3.0f%%  %.1f req/s  elapsed %s  ETA %s ", bar.c_str(), done, total_,
                 100 * frac, secs > 0 ? static_cast<double>(done) / secs : 0.0, clock_text(secs).c_str(),
                 eta.c_str());
    std::fflush(stderr);
  }
  void end() {
    if (enabled_) std::fprintf(stderr, "\n");
  }

 private:
  size_t total_;
  bool enabled_;
  Clock::time_point start_, last_{};
};

struct InFlight {
  const server::BatchLine* line;
  server::OpenAICall call;
};

}  // namespace

int cmd_batch(const Argv& argv) {
  const std::string cmd = "batch";
  ArgSpec spec{{"--input", "--output", "--model", "--device", "--tensor-parallel-size", "--max-model-len",
                "--max-queue", "--default-max-tokens", "--default-enable-thinking", "--served-model-name"},
               {"--resume", "--no-progress", "--allow-special-in-content"},
               0};
  auto args = Args::parse(argv, spec);
  if (!args) return fail(cmd, args.message());
  install_stop_signals();
  const auto input = args->get("--input"), output = args->get("--output");
  if (!input) return fail(cmd, "missing --input IN.jsonl");
  if (!output) return fail(cmd, "missing --output OUT.jsonl");
  const bool resume = args->has("--resume");
  auto window = args->get_int("--max-queue", 64);
  if (!window) return fail(cmd, window.message());
  if (*window < 1 || *window > 4096) return fail(cmd, "flag --max-queue must be in [1, 4096]");
  auto len = args->get_int("--max-model-len", 0);
  if (!len) return fail(cmd, len.message());
  if (*len < 0) return fail(cmd, "flag --max-model-len must be positive");
  auto max_tokens = args->get_int("--default-max-tokens", 0);
  if (!max_tokens) return fail(cmd, max_tokens.message());
  if (*max_tokens < 0 || *max_tokens > (1 << 30))
    return fail(cmd, "flag --default-max-tokens must be in [1, 1073741824] (0: the model's default)");
  std::optional<bool> thinking;
  if (auto t = args->get("--default-enable-thinking")) {
    auto b = parse_bool_flag("--default-enable-thinking", *t);
    if (!b) return fail(cmd, b.message());
    thinking = *b;
  }
  auto device = parse_device(*args);
  if (!device) return fail(cmd, device.message());
  auto tp = parse_tensor_parallel(*args, *device);
  if (!tp) return fail(cmd, tp.message());

  // Everything about the files is checked before the model loads.
  auto lines = server::read_batch_input(*input);
  if (!lines) return fail(cmd, lines.message());
  std::error_code ec;
  const bool exists = std::filesystem::exists(*output, ec);
  if (exists && !resume)
    return fail(cmd, *output + " exists: give --resume to continue that job, or another --output");
  bool repaired = false;
  auto done = server::recover_batch_output(*output, &repaired);
  if (!done) return fail(cmd, done.message());
  std::vector<const server::BatchLine*> todo;
  size_t skipped = 0;
  for (const auto& l : *lines) {
    if (done->count(l.key()))
      ++skipped;
    else
      todo.push_back(&l);
  }
  if (repaired) std::fprintf(stderr, "deltaflow batch: %s: cut a torn last line\n", output->c_str());
  if (resume && exists)
    std::fprintf(stderr, "deltaflow batch: resuming: %zu of %zu requests already done\n", skipped,
                 lines->size());

  const int fd = ::open(output->c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return fail(cmd, *output + ": cannot open for writing");
  auto write_line = [&](const std::string& line) -> bool {
    const std::string s = line + "\n";
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t w = ::write(fd, s.data() + off, s.size() - off);
      if (w < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      off += static_cast<size_t>(w);
    }
    return ::fsync(fd) == 0;
  };

  size_t ok = 0, failed = 0, bad_lines = 0;
  std::unique_ptr<server::ServedModel> model;
  server::ServerContext ctx;
  const bool need_model = std::any_of(todo.begin(), todo.end(), [](auto* l) { return l->error.empty(); });
  if (need_model) {
    server::ModelLoadOptions lo;
    lo.model_dir = model_dir(*args);
    lo.device = *device;
    lo.tensor_parallel = *tp;
    lo.served_name = args->get_or("--served-model-name", "");
    lo.engine.max_model_len = *len;
    lo.allow_special_in_content = args->has("--allow-special-in-content");
    lo.engine.max_queue = static_cast<size_t>(*window) * 16 + 16;  // a request may hold 16 engine requests
    auto loaded = server::ServedModel::load(lo);
    if (!loaded) {
      ::close(fd);
      return fail(cmd, loaded.message());
    }
    model = std::move(*loaded);
    ctx.defaults = server::resolve_request_defaults(*model, thinking, *max_tokens);
  }

  const auto start = Clock::now();
  Progress progress(todo.size(), !args->has("--no-progress") && ::isatty(STDERR_FILENO));
  std::deque<InFlight> flight;
  size_t next = 0, finished = 0;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  bool io_error = false;
  auto record = [&](const std::string& line, bool success) {
    if (!write_line(line)) io_error = true;
    ++finished;
    (success ? ok : failed) += 1;
    progress.update(finished);
  };
  auto answer = [&](const server::BatchLine& l, int status, const std::string& body, const std::string& id) {
    if (status == 200) {
      server::Json b = server::Json::parse(body, nullptr, false);
      if (b.is_object() && b.contains("usage") && b["usage"].is_object()) {
        prompt_tokens += b["usage"].value("prompt_tokens", int64_t{0});
        completion_tokens += b["usage"].value("completion_tokens", int64_t{0});
      }
    }
    record(server::batch_response_line(l, status, body, id), status == 200);
  };
  progress.update(0, true);
  while ((next < todo.size() || !flight.empty()) && !io_error && !g_stop_signal) {
    // Fill the window.
    while (next < todo.size() && flight.size() < static_cast<size_t>(*window)) {
      const server::BatchLine& l = *todo[next++];
      if (!l.error.empty()) {
        ++bad_lines;
        record(server::batch_error_line(l, "invalid_request", l.error), false);
        continue;
      }
      try {
        if (l.body.contains("stream") && l.body["stream"].is_boolean() && l.body["stream"].get<bool>())
          throw server::bad_field("stream", "'stream' is not available in a batch");
        const auto now = Clock::now();
        server::OpenAICall call = l.url == "/v1/chat/completions"
                                      ? server::prepare_chat(l.body, *model, ctx, now)
                                      : server::prepare_completions(l.body, *model, ctx, now);
        if (!call.run) {
          auto [status, body] = call.whole();
          answer(l, status, body, call.id);
        } else {
          flight.push_back({&l, std::move(call)});
        }
      } catch (const server::ApiError& e) {
        answer(l, e.status, server::openai_error_body(e), "");
      } catch (const std::exception& e) {  // as the server's guard answers it: a 500 for this request
        answer(l, 500,
               server::openai_error_body(server::internal_error(std::string("internal error: ") + e.what())),
               "");
      }
    }
    // Collect what finished.
    bool progressed = false;
    for (auto it = flight.begin(); it != flight.end();) {
      auto p = it->call.run->pump(
          std::chrono::milliseconds(0), [](int, const server::OutputDelta&) { return true; }, nullptr);
      if (p != server::GenerationRun::Pump::kIdle) progressed = true;
      if (it->call.run->done()) {
        auto [status, body] = it->call.whole();
        answer(*it->line, status, body, it->call.id);
        it = flight.erase(it);
      } else {
        ++it;
      }
    }
    if (!progressed && !flight.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  progress.update(finished, true);
  progress.end();
  const size_t cancelled = flight.size();
  for (auto& f : flight) f.call.run->cancel();
  flight.clear();
  const bool closed = ::close(fd) == 0;
  if (io_error || !closed) return fail(cmd, *output + ": write failed (disk full?); run again with --resume");
  if (g_stop_signal)
    return fail(cmd, std::string("stopped by ") + (g_stop_signal == SIGINT ? "SIGINT" : "SIGTERM") + ": " +
                         std::to_string(skipped + finished) + " of " + std::to_string(skipped + todo.size()) +
                         " requests in " + *output + " (" + std::to_string(cancelled) +
                         " in flight cancelled, not written); run again with --resume to finish");
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  std::fprintf(
      stderr,
      "deltaflow batch: %zu requests: %zu ok, %zu failed (%zu bad lines)%s in %s; %lld prompt + %lld "
      "completion tokens (%.1f tokens/s); results in %s\n",
      todo.size(), ok, failed, bad_lines,
      skipped ? (", " + std::to_string(skipped) + " done before").c_str() : "", clock_text(secs).c_str(),
      static_cast<long long>(prompt_tokens), static_cast<long long>(completion_tokens),
      secs > 0 ? static_cast<double>(completion_tokens) / secs : 0.0, output->c_str());
  return 0;
}

}  // namespace deltaflow::cli
