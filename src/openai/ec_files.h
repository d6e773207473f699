// src/openai/ec_files.h (internal to epd::openai): the file operations of
// EcPublisher (epd/openai/ec_publisher.h), each relative to a directory
// descriptor and none following a symlink, and the names it gives ids and
// tenants inside the ec-dir.
//
// Names (each one path component, never "." or ".."):
//   an id      itself when it is 1..255 bytes of [A-Za-z0-9._-] not starting
//              with '.'; else "sha256=" + the 64 lower-case hex digits of
//              SHA-256(id) (the '=' keeps the two forms apart);
//   a tenant   "tenant=" + the same rule over the tenant's name.
// The '=' also keeps a tenant's directory apart from every id's.
//
// Thread safety: thread-safe (no shared state); each function is one or a
// few system calls on the descriptors it is given.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace epd::internal {

inline constexpr char kEcFile[] = "encoder_cache.safetensors";
inline constexpr char kEcTempPrefix[] = ".encoder_cache.safetensors.tmp-";
// The __metadata__ entry that records the namespaced content key.
inline constexpr char kEcKeyField[] = "epd_content_key";

// An owned file descriptor (-1 = none); closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.Release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

std::string EcIdName(std::string_view id);
std::string EcTenantDirName(std::string_view tenant);
// Whether `name` is a name EcIdName or EcTenantDirName can give.
bool IsEcIdName(std::string_view name);
bool IsEcTenantDirName(std::string_view name);

// How created files and directories are made: exact modes (whatever the
// umask) and, when gid != -1, their group.
struct EcModes {
  mode_t file = 0640;
  mode_t dir = 0750;
  gid_t gid = static_cast<gid_t>(-1);
};

// Opens parent/name as a directory, never through a symlink: -1 (errno
// ELOOP or ENOTDIR) when it is a symlink or no directory.
Fd OpenDirAt(int parent, const std::string& name);
// OpenDirAt, creating it (modes applied) when absent; *created says whether
// this call made it.
Fd MakeDirAt(int parent, const std::string& name, const EcModes& modes, bool* created);
// The names in the directory `dir`, "." and ".." left out; empty when it
// cannot be read.
std::vector<std::string> ListNames(int dir);

// A regular file dir/name, opened read-only without following a symlink or
// blocking on a FIFO, and the content key its header records ("" when it
// records none). nullopt: absent, not a regular file, or unreadable.
struct EcProbe {
  Fd fd;
  std::string key;
  std::int64_t size = 0;
};
std::optional<EcProbe> ProbeAt(int dir, const std::string& name);

// Writes `bytes` to a new file dir/temp (O_EXCL, O_NOFOLLOW), applies the
// modes, fsyncs and closes it; on failure removes it and returns errno.
int WriteNewFileAt(int dir, const std::string& temp, const std::string& bytes, const EcModes& modes);

}  // namespace epd::internal
