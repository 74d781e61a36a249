// One function per subcommand; each returns the process exit code and prints errors as one line on stderr.
#pragma once

#include <string>
#include <vector>

namespace deltaflow::cli {

using Argv = std::vector<std::string>;

int cmd_batch(const Argv& args);
int cmd_chat(const Argv& args);
int cmd_bench(const Argv& args);
int cmd_bench_serving(const Argv& args);  // bench --requests
int cmd_bench_images(const Argv& args);   // bench --images
int cmd_bench_gemv(const Argv& args);     // bench --gemv
int cmd_generate(const Argv& args);
int cmd_eval(const Argv& args);
int cmd_inspect(const Argv& args);
int cmd_make_tiny(const Argv& args);
int cmd_quantize(const Argv& args);
int cmd_tokenize(const Argv& args);
int cmd_serve(const Argv& args);

// Prints "deltaflow <cmd>: <message>" to stderr and returns 2 (bad usage or bad input).
int fail(const std::string& cmd, const std::string& message);

// The model directory used when --model is not given: the house model shipped in the repository.
std::string default_model_dir();

}  // namespace deltaflow::cli
