#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "cli/commands.hpp"

namespace deltaflow::cli {

int fail(const std::string& cmd, const std::string& message) {
  // A typo'd flag also says where the list of flags is.
  const bool usage = message.rfind("unknown flag ", 0) == 0 || message.rfind("unexpected argument ", 0) == 0;
  std::fprintf(stderr, "deltaflow %s: %s%s\n", cmd.c_str(), message.c_str(),
               usage ? (" (see 'deltaflow " + cmd + " --help')").c_str() : "");
  return 2;
}

std::string default_model_dir() {
  if (const char* e = std::getenv("DELTAFLOW_DEFAULT_MODEL")) return e;
  return std::string(DELTAFLOW_SOURCE_DIR) + "/models/house";
}

}  // namespace deltaflow::cli
