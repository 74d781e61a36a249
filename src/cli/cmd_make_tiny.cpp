#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "model/tiny_checkpoint.hpp"

namespace deltaflow::cli {

int cmd_make_tiny(const Argv& argv) {
  const std::string cmd = "make-tiny";
  auto args = Args::parse(argv, {{"--preset", "--seed", "--out"}, {}, 0});
  if (!args) return fail(cmd, args.message());
  const auto preset = args->get("--preset");
  const auto out = args->get("--out");
  if (!preset) return fail(cmd, "missing --preset NAME");
  if (!out) return fail(cmd, "missing --out DIR");
  auto seed = args->get_int("--seed", 0);
  if (!seed) return fail(cmd, seed.message());
  if (*seed < 0) return fail(cmd, "flag --seed must be non-negative");
  auto st = model::write_tiny_checkpoint(*preset, static_cast<uint64_t>(*seed), *out);
  if (!st) return fail(cmd, st.message());
  return 0;
}

}  // namespace deltaflow::cli
