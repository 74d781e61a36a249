#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "cli/commands.hpp"

namespace deltaflow::cli {

int fail(const std::string& cmd, const std::string& message) {
  std::fprintf(stderr, "deltaflow %s: %s\n", cmd.c_str(), message.c_str());
  return 2;
}

std::string default_model_dir() {
  if (const char* e = std::getenv("DELTAFLOW_DEFAULT_MODEL")) return e;
  return std::string(DELTAFLOW_SOURCE_DIR) + "/models/house";
}

}  // namespace deltaflow::cli
