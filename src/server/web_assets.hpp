// The chat page's files (src/server/web/*), compiled into the binary by cmake/embed_assets.cmake.
#pragma once

#include <string_view>
#include <vector>

namespace deltaflow::server {

struct EmbeddedAsset {
  const char* name;       // file name under src/server/web
  std::string_view text;  // exact bytes
};

const std::vector<EmbeddedAsset>& web_assets();

}  // namespace deltaflow::server
