#include "io/json_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace deltaflow::io {
namespace {

core::Expected<std::string> read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return core::Error{path + ": cannot open: " + std::strerror(errno)};
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {  // a directory opens fine and fails here with EISDIR
      const int err = errno;
      ::close(fd);
      return core::Error{path + ": cannot read: " + std::strerror(err)};
    }
    if (got == 0) break;
    text.append(buf, static_cast<size_t>(got));
  }
  ::close(fd);
  return text;
}

}  // namespace

core::Expected<nlohmann::json> read_json_file(const std::string& path) {
  DF_ASSIGN(const std::string text, read_file(path));
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return core::Error{path + ": invalid JSON: " + e.what()};
  }
}

}  // namespace deltaflow::io
