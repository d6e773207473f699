// FakeDevice's IPC: a memfd per export, mapped by the importer through
// /proc/<pid>/fd/<fd> (fake_device.h). The handle's `memory` bytes are
// "EPDFAKE1", then pid, fd and the memfd's random id as little-endian
// uint64s; the rest is zero.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <system_error>

#include "fake_device.h"

namespace epd {
namespace {

constexpr char kMagic[8] = {'E', 'P', 'D', 'F', 'A', 'K', 'E', '1'};

void PutU64(std::uint8_t* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
std::uint64_t GetU64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
std::string MemfdName(std::uint64_t id) {
  char name[40];
  std::snprintf(name, sizeof(name), "epd-fake-ipc-%016llx", static_cast<unsigned long long>(id));
  return name;
}
Status Errno(StatusCode code, const std::string& what) {
  return Status(code, what + " failed: " + std::generic_category().message(errno));
}

class FakeIpcExport final : public IpcExport {
 public:
  FakeIpcExport(int fd, IpcHandle handle) : fd_(fd), handle_(handle) {}
  ~FakeIpcExport() override { close(fd_); }
  const IpcHandle& handle() const override { return handle_; }

 private:
  int fd_;
  IpcHandle handle_;
};

class FakeIpcImport final : public IpcImport {
 public:
  FakeIpcImport(const std::byte* data, std::size_t size) : data_(data), size_(size) {}
  ~FakeIpcImport() override {
    if (size_ > 0) munmap(const_cast<std::byte*>(data_), size_);
  }
  const std::byte* data() const override { return data_; }
  std::size_t size() const override { return size_; }
  Status WaitReady() const override { return Status::Ok(); }

 private:
  const std::byte* data_;
  std::size_t size_;
};

}  // namespace

StatusOr<std::unique_ptr<IpcExport>> FakeDevice::ExportIpc(const void* device_src, std::size_t bytes) {
  if (device_src == nullptr || bytes == 0) return InvalidArgument("ExportIpc needs a non-null source and bytes > 0");
  std::uint64_t id = 0;
  if (getrandom(&id, sizeof(id), 0) != sizeof(id)) return Errno(StatusCode::kInternal, "getrandom");
  const int fd = memfd_create(MemfdName(id).c_str(), MFD_CLOEXEC);
  if (fd < 0) return Errno(StatusCode::kInternal, "memfd_create");
  if (fchmod(fd, 0600) != 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const Status s = Errno(StatusCode::kInternal, "sizing the IPC memfd");
    close(fd);
    return s;
  }
  // The write goes through the descriptor: no mapping to keep on this side.
  const auto* src = static_cast<const char*>(device_src);
  for (std::size_t done = 0; done < bytes;) {
    const ssize_t n = pwrite(fd, src + done, bytes - done, static_cast<off_t>(done));
    if (n <= 0) {
      const Status s = Errno(StatusCode::kInternal, "writing the IPC memfd");
      close(fd);
      return s;
    }
    done += static_cast<std::size_t>(n);
  }
  IpcHandle h;
  std::memcpy(h.memory.data(), kMagic, sizeof(kMagic));
  PutU64(h.memory.data() + 8, static_cast<std::uint64_t>(getpid()));
  PutU64(h.memory.data() + 16, static_cast<std::uint64_t>(fd));
  PutU64(h.memory.data() + 24, id);
  h.bytes = bytes;
  return std::unique_ptr<IpcExport>(new FakeIpcExport(fd, h));
}

StatusOr<std::unique_ptr<IpcImport>> FakeDevice::ImportIpc(const IpcHandle& handle) {
  if (std::memcmp(handle.memory.data(), kMagic, sizeof(kMagic)) != 0) {
    return FailedPrecondition("ImportIpc: the handle is not a FakeDevice's (a CUDA handle on a fake device?)");
  }
  if (handle.bytes == 0) return InvalidArgument("ImportIpc: the handle shares 0 bytes");
  const std::uint64_t pid = GetU64(handle.memory.data() + 8), fd = GetU64(handle.memory.data() + 16);
  const std::string name = MemfdName(GetU64(handle.memory.data() + 24));
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  char link[256] = {};
  if (readlink(path.c_str(), link, sizeof(link) - 1) < 0) {
    if (errno == EACCES || errno == EPERM) return Errno(StatusCode::kPermissionDenied, "reading " + path);
    return Errno(StatusCode::kFailedPrecondition, "reading " + path + " (the exporter has exited?)");
  }
  if (std::string(link).find(name) == std::string::npos) {
    return FailedPrecondition(path + " is not the exported memfd " + name + " (the export has ended?)");
  }
  const int f = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f < 0) {
    return Errno(errno == EACCES || errno == EPERM ? StatusCode::kPermissionDenied : StatusCode::kInternal,
                 "opening " + path);
  }
  struct stat st = {};
  if (fstat(f, &st) != 0 || static_cast<std::uint64_t>(st.st_size) < handle.bytes) {
    close(f);
    return FailedPrecondition(path + " is smaller than the handle's " + std::to_string(handle.bytes) + " bytes");
  }
  void* p = mmap(nullptr, handle.bytes, PROT_READ, MAP_SHARED, f, 0);
  const int err = errno;
  close(f);
  if (p == MAP_FAILED) {
    errno = err;
    return Errno(StatusCode::kInternal, "mapping " + path);
  }
  return std::unique_ptr<IpcImport>(new FakeIpcImport(static_cast<const std::byte*>(p), handle.bytes));
}

}  // namespace epd
