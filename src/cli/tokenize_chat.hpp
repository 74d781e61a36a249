// `deltaflow tokenize --chat F.json`: renders an OpenAI chat request body with the model's chat template.
#pragma once

#include "cli/args.hpp"

namespace deltaflow::cli {

// Called by cmd_tokenize when --chat is given. Prints the rendered prompt exactly (no trailing newline added)
// and returns 0, or prints one error line and returns non-zero.
int tokenize_chat(const Args& args);

}  // namespace deltaflow::cli
