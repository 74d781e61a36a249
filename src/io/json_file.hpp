// Reading a whole JSON file (config.json, the shard index, ...) as a value, never as an exception.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/status.hpp"

namespace deltaflow::io {

// Errors: "<path>: cannot open: <reason>", "<path>: cannot read: <reason>",
// "<path>: invalid JSON: <parser message with byte position>".
core::Expected<nlohmann::json> read_json_file(const std::string& path);

}  // namespace deltaflow::io
