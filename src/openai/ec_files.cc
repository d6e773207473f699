// See ec_files.h. Every call here names a file by (directory descriptor,
// one component) and passes O_NOFOLLOW / AT_SYMLINK_NOFOLLOW, so nothing
// another user plants in the ec-dir (a symlink, a FIFO) is followed or
// blocked on: a symlink is refused as a directory and is never a regular
// file.
#include "ec_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

namespace epd::internal {
namespace {

constexpr char kHashPrefix[] = "sha256=";
constexpr char kTenantPrefix[] = "tenant=";
// A header larger than this is not one we wrote (ours is a few hundred bytes).
constexpr std::uint64_t kMaxHeader = 1 << 20;

bool IsLiteral(std::string_view s) {
  if (s.empty() || s.size() > 255 || s.front() == '.') return false;
  for (const char c : s) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

bool IsHashed(std::string_view s) {
  if (!s.starts_with(kHashPrefix)) return false;
  s.remove_prefix(sizeof(kHashPrefix) - 1);
  if (s.size() != 64) return false;
  for (const char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string Sha256Hex(std::string_view s) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned int n = 0;
  EVP_Digest(s.data(), s.size(), md.data(), &n, EVP_sha256(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * static_cast<std::size_t>(n));
  for (unsigned int i = 0; i < n; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 15]);
  }
  return out;
}

// REQUIRES: fd open on what this process just created.
int ApplyModes(int fd, mode_t mode, const EcModes& modes) {
  if (fchmod(fd, mode) != 0) return errno;
  if (modes.gid != static_cast<gid_t>(-1) && fchown(fd, static_cast<uid_t>(-1), modes.gid) != 0) return errno;
  return 0;
}

bool ReadFully(int fd, char* out, std::size_t n, off_t at) {
  while (n > 0) {
    const ssize_t got = pread(fd, out, n, at);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    out += got;
    n -= static_cast<std::size_t>(got);
    at += got;
  }
  return true;
}

// The key the safetensors header `json` records in __metadata__, or "".
std::string KeyIn(const std::string& json) {
  const nlohmann::json h = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!h.is_object()) return "";
  const auto meta = h.find("__metadata__");
  if (meta == h.end() || !meta->is_object()) return "";
  const auto key = meta->find(kEcKeyField);
  return key != meta->end() && key->is_string() ? key->get<std::string>() : "";
}

}  // namespace

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) close(fd_);
    fd_ = o.Release();
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) close(fd_);
}

std::string EcIdName(std::string_view id) { return IsLiteral(id) ? std::string(id) : kHashPrefix + Sha256Hex(id); }

std::string EcTenantDirName(std::string_view tenant) { return kTenantPrefix + EcIdName(tenant); }

bool IsEcIdName(std::string_view name) { return IsLiteral(name) || IsHashed(name); }

bool IsEcTenantDirName(std::string_view name) {
  if (!name.starts_with(kTenantPrefix)) return false;
  name.remove_prefix(sizeof(kTenantPrefix) - 1);
  return IsEcIdName(name);
}

Fd OpenDirAt(int parent, const std::string& name) {
  return Fd(openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
}

Fd MakeDirAt(int parent, const std::string& name, const EcModes& modes, bool* created) {
  *created = mkdirat(parent, name.c_str(), modes.dir) == 0;
  if (!*created && errno != EEXIST) return Fd();
  Fd fd = OpenDirAt(parent, name);
  if (fd && *created) {
    if (const int err = ApplyModes(fd.get(), modes.dir, modes); err != 0) {
      fd = Fd();
      unlinkat(parent, name.c_str(), AT_REMOVEDIR);
      *created = false;
      errno = err;
    }
  }
  return fd;
}

std::vector<std::string> ListNames(int dir) {
  std::vector<std::string> out;
  const int own = fcntl(dir, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return out;
  DIR* d = fdopendir(own);
  if (d == nullptr) {
    close(own);
    return out;
  }
  while (const dirent* e = readdir(d)) {  // NOLINT(concurrency-mt-unsafe): a DIR stream of this call's own, one thread
    const std::string_view name = e->d_name;
    if (name != "." && name != "..") out.emplace_back(name);
  }
  closedir(d);
  return out;
}

std::optional<EcProbe> ProbeAt(int dir, const std::string& name) {
  Fd fd(openat(dir, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st {};
  if (!fd || fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  EcProbe out{std::move(fd), "", st.st_size};
  std::uint64_t n = 0;
  if (st.st_size < 8 || !ReadFully(out.fd.get(), reinterpret_cast<char*>(&n), 8, 0)) return out;
  if (n > kMaxHeader || n > static_cast<std::uint64_t>(st.st_size) - 8) return out;
  std::string header(n, '\0');
  if (ReadFully(out.fd.get(), header.data(), n, 8)) out.key = KeyIn(header);
  return out;
}

int WriteNewFileAt(int dir, const std::string& temp, const std::string& bytes, const EcModes& modes) {
  Fd fd(openat(dir, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, modes.file));
  if (!fd) return errno;
  int err = 0;
  for (std::size_t off = 0; off < bytes.size() && err == 0;) {
    const ssize_t n = write(fd.get(), bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) err = n < 0 ? errno : ENOSPC;
    if (n > 0) off += static_cast<std::size_t>(n);
  }
  if (err == 0) err = ApplyModes(fd.get(), modes.file, modes);
  if (err == 0 && fsync(fd.get()) != 0) err = errno;
  if (close(fd.Release()) != 0 && err == 0) err = errno;
  if (err != 0) unlinkat(dir, temp.c_str(), 0);
  return err;
}

}  // namespace epd::internal
