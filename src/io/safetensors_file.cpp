// SafetensorsFile: one read-only mmap of a .safetensors file, validated before any tensor is handed out.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "io/safetensors.hpp"

namespace deltaflow::io {

core::Expected<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return core::Error{path + ": cannot open: " + std::strerror(errno)};
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return core::Error{path + ": cannot stat: " + std::strerror(err)};
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return core::Error{path + ": not a regular file"};
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size == 0) {  // mmap of 0 bytes fails with EINVAL, which would hide the real problem
    ::close(fd);
    return core::Error{path + ": file is empty"};
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (p == MAP_FAILED) return core::Error{path + ": cannot mmap: " + std::strerror(err)};

  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->base_ = static_cast<const uint8_t*>(p);
  f->size_ = size;
  DF_ASSIGN(f->header_, parse_safetensors_header(f->base_, size, path));
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

}  // namespace deltaflow::io
