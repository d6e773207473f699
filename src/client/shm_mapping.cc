#include "shm_mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <system_error>

#include "epd/core/mutex.h"

namespace epd::internal {

StatusOr<std::shared_ptr<const ShmMapping>> ShmMapping::Open(pid_t pid, int fd, std::uint64_t segment,
                                                             std::uint64_t segment_bytes) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  char name[32];
  std::snprintf(name, sizeof(name), "epd-shm-%016llx", static_cast<unsigned long long>(segment));
  char link[256] = {};
  const ssize_t n = readlink(path.c_str(), link, sizeof(link) - 1);
  if (n < 0 && (errno == EACCES || errno == EPERM)) {
    return Status(StatusCode::kPermissionDenied,
                  "cannot read " + path + ": " + std::generic_category().message(errno) +
                      "; the shared-memory arena opens only for the server's own user (or ask for inline delivery)");
  }
  if (n < 0 || std::string(link).find(name) == std::string::npos) {
    return Status(StatusCode::kFailedPrecondition,
                  path + " is not the server's shared-memory arena " + name +
                      " (is the server on another host or in another PID namespace? ask for inline delivery)");
  }
  const int f = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f < 0) {
    const int err = errno;
    if (err == EACCES || err == EPERM) {
      return Status(StatusCode::kPermissionDenied,
                    "cannot open " + path + ": " + std::generic_category().message(err) +
                        "; the shared-memory arena opens only for the server's own user");
    }
    return Status(StatusCode::kUnavailable, "cannot open " + path + ": " + std::generic_category().message(err));
  }
  struct stat st = {};
  if (fstat(f, &st) != 0 || static_cast<std::uint64_t>(st.st_size) < segment_bytes) {
    close(f);
    return Status(StatusCode::kFailedPrecondition,
                  path + " is smaller than the " + std::to_string(segment_bytes) + " bytes the server announced");
  }
  // Pre-faulted: the arena is mapped once per client and then read at every
  // reply, so its page-table entries are better paid for here, at once,
  // than one minor fault per 4 KiB page on the first read of each span.
  void* p = mmap(nullptr, segment_bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, f, 0);
  const int err = errno;
  close(f);  // the mapping keeps the memfd alive
  if (p == MAP_FAILED) {
    return Status(StatusCode::kUnavailable, "cannot map " + path + ": " + std::generic_category().message(err));
  }
  std::shared_ptr<ShmMapping> m(new ShmMapping());
  m->data_ = static_cast<const std::byte*>(p);
  m->size_ = segment_bytes;
  m->segment_ = segment;
  return std::shared_ptr<const ShmMapping>(std::move(m));
}

StatusOr<std::shared_ptr<const ShmMapping>> ShmMapping::Shared(pid_t pid, int fd, std::uint64_t segment,
                                                               std::uint64_t segment_bytes) {
  // The process's mappings, by segment. Leaked on purpose: clients may
  // outlive static destruction order.
  struct Live {
    Mutex mu;
    std::map<std::uint64_t, std::weak_ptr<const ShmMapping>> by_segment EPD_GUARDED_BY(mu);
  };
  static auto* live = new Live;
  MutexLock lock(live->mu);
  std::map<std::uint64_t, std::weak_ptr<const ShmMapping>>& by_segment = live->by_segment;
  for (auto it = by_segment.begin(); it != by_segment.end();) {  // forget mappings nobody holds any more
    it = it->second.expired() ? by_segment.erase(it) : std::next(it);
  }
  if (auto it = by_segment.find(segment); it != by_segment.end()) {
    if (std::shared_ptr<const ShmMapping> m = it->second.lock(); m != nullptr && m->size() >= segment_bytes) return m;
  }
  StatusOr<std::shared_ptr<const ShmMapping>> m = Open(pid, fd, segment, segment_bytes);
  if (m.ok()) by_segment[segment] = *m;
  return m;
}

ShmMapping::~ShmMapping() {
  if (data_ != nullptr) munmap(const_cast<std::byte*>(data_), size_);
}

}  // namespace epd::internal
