#include "cli/args.hpp"

#include <cerrno>
#include <cstdlib>

namespace deltaflow::cli {

core::Expected<Args> Args::parse(const std::vector<std::string>& argv, const ArgSpec& spec) {
  Args a;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& s = argv[i];
    if (s.rfind("--", 0) == 0 && s.size() > 2) {
      std::string flag = s, value;
      bool inline_value = false;
      if (auto eq = s.find('='); eq != std::string::npos) {
        flag = s.substr(0, eq);
        value = s.substr(eq + 1);
        inline_value = true;
      }
      if (spec.boolean.count(flag)) {
        if (inline_value) return core::Error{"flag " + flag + " takes no value"};
        a.flags_.insert(flag);
      } else if (spec.with_value.count(flag)) {
        if (!inline_value) {
          if (i + 1 >= argv.size()) return core::Error{"flag " + flag + " needs a value"};
          value = argv[++i];
        }
        a.values_[flag] = value;
      } else {
        return core::Error{"unknown flag " + flag};
      }
    } else {
      if (a.positionals_.size() >= spec.max_positionals)
        return core::Error{"unexpected argument '" + s + "'"};
      a.positionals_.push_back(s);
    }
  }
  return a;
}

std::optional<std::string> Args::get(const std::string& flag) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Args::get_or(const std::string& flag, const std::string& def) const {
  auto v = get(flag);
  return v ? *v : def;
}

core::Expected<long long> Args::get_int(const std::string& flag, long long def) const {
  auto v = get(flag);
  if (!v) return def;
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || errno != 0)
    return core::Error{"flag " + flag + ": '" + *v + "' is not an integer"};
  return x;
}

core::Expected<double> Args::get_double(const std::string& flag, double def) const {
  auto v = get(flag);
  if (!v) return def;
  errno = 0;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0' || errno != 0)
    return core::Error{"flag " + flag + ": '" + *v + "' is not a number"};
  return x;
}

namespace {

// The comma-separated items of a flag's value, each parsed by `parse` (nullopt: not valid, an error naming
// the flag, the item and `what`); an empty value or an empty item is an error.
template <class T, class Parse>
core::Expected<std::vector<T>> parse_list(const std::string& text, const std::string& flag, const char* what,
                                          Parse parse) {
  std::vector<T> out;
  size_t pos = 0;
  if (text.empty()) return core::Error{"flag " + flag + " is empty"};
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(pos, comma - pos);
    errno = 0;
    const std::optional<T> v = item.empty() ? std::nullopt : parse(item);
    if (!v) return core::Error{"flag " + flag + ": '" + item + "' is not " + what};
    out.push_back(*v);
    pos = comma + 1;
  }
  return out;
}

}  // namespace

core::Expected<std::vector<int>> parse_id_list(const std::string& text, const std::string& flag) {
  return parse_list<int>(text, flag, "a token id", [](const std::string& item) -> std::optional<int> {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (*end != '\0' || errno != 0 || v < 0 || v > 0x7fffffff) return std::nullopt;
    return static_cast<int>(v);
  });
}

core::Expected<std::vector<double>> parse_number_list(const std::string& text, const std::string& flag) {
  return parse_list<double>(text, flag, "a number", [](const std::string& item) -> std::optional<double> {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (*end != '\0' || errno != 0) return std::nullopt;
    return v;
  });
}

}  // namespace deltaflow::cli
