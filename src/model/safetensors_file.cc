// The reader maps the whole file once (PROT_READ, MAP_PRIVATE) and hands the
// mapping to the codec (epd/safetensors/safetensors_codec.h), which parses
// and validates only the header; a tensor's bytes are paged in when someone
// reads them.
#include "epd/model/safetensors_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <span>
#include <system_error>

namespace epd {

SafetensorsFile::~SafetensorsFile() {
  if (base_ != nullptr) munmap(const_cast<std::byte*>(base_), size_);
}

std::string_view SafetensorsFile::header() const {
  return {reinterpret_cast<const char*>(base_) + 8, static_cast<std::size_t>(header_bytes_)};
}

const TensorView* SafetensorsFile::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

StatusOr<std::shared_ptr<const SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return Status(StatusCode::kNotFound, "safetensors file not found: " + path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return Status(StatusCode::kUnavailable, "cannot open " + path + ": " + std::generic_category().message(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status(StatusCode::kUnavailable, path + " is not a readable regular file");
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  const std::string source = "safetensors file " + path;
  if (size == 0) {
    // mmap refuses a zero length; the codec names what is wrong.
    ::close(fd);
    return ParseSafetensors({}, source).status();
  }
  void* mapped = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file open
  if (mapped == MAP_FAILED)
    return Status(StatusCode::kUnavailable, "cannot map " + path + ": " + std::generic_category().message(errno));

  // From here on the object owns the mapping, so every early return unmaps it.
  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->base_ = static_cast<const std::byte*>(mapped);
  file->size_ = size;
  StatusOr<ParsedSafetensors> parsed = ParseSafetensors(std::span(file->base_, size), source);
  if (!parsed.ok()) return parsed.status();
  file->header_bytes_ = parsed->header.size();
  file->tensors_ = std::move(parsed->tensors);
  file->metadata_ = std::move(parsed->metadata);
  return std::shared_ptr<const SafetensorsFile>(std::move(file));
}

}  // namespace epd
