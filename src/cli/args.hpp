// A small command-line parser: `--flag value`, `--flag=value`, boolean `--flag`, and positionals.
// Unknown flags and missing values are errors naming the flag, so every subcommand rejects typos.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/status.hpp"

namespace deltaflow::cli {

struct ArgSpec {
  std::set<std::string> with_value;  // flags that take a value, e.g. "--model"
  std::set<std::string> boolean;     // flags that take none, e.g. "--json"
  size_t max_positionals = 0;
};

class Args {
 public:
  static core::Expected<Args> parse(const std::vector<std::string>& argv, const ArgSpec& spec);

  bool has(const std::string& flag) const { return values_.count(flag) || flags_.count(flag); }
  std::optional<std::string> get(const std::string& flag) const;
  std::string get_or(const std::string& flag, const std::string& def) const;
  // Integer and float values; a malformed value is an error naming the flag.
  core::Expected<long long> get_int(const std::string& flag, long long def) const;
  core::Expected<double> get_double(const std::string& flag, double def) const;
  const std::vector<std::string>& positionals() const { return positionals_; }

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> flags_;
  std::vector<std::string> positionals_;
};

// Parses "1,2,3" into ids; errors name the flag and the bad item.
core::Expected<std::vector<int>> parse_id_list(const std::string& text, const std::string& flag);
// Parses "0.92,0.84" into numbers; errors name the flag and the bad item.
core::Expected<std::vector<double>> parse_number_list(const std::string& text, const std::string& flag);

}  // namespace deltaflow::cli
