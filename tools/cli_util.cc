#include "cli_util.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>

namespace epd::cli {

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(StatusCode::kNotFound, "cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {

const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string Mib(std::int64_t bytes) {
  std::ostringstream s;
  s << static_cast<double>(bytes) / (1 << 20) << " MiB";
  return s.str();
}

}  // namespace

StatusOr<std::string> ReadRegularFile(const std::string& path, std::int64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO returns at once instead of waiting for a
  // writer; it changes nothing for a regular file.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0)
    return Status(StatusCode::kNotFound, "cannot open " + path + ": " + std::generic_category().message(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    return Status(StatusCode::kNotFound, "cannot stat " + path + ": " + std::generic_category().message(errno));
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgument(path + " is " + FileKind(st.st_mode) + ", not a regular file: only files are read");
  }
  if (st.st_size > max_bytes) {
    return InvalidArgument(path + " is " + std::to_string(st.st_size) + " bytes (" + Mib(st.st_size) +
                           "), over the limit of " + std::to_string(max_bytes) + " bytes (" + Mib(max_bytes) +
                           ", the largest request)");
  }
  // Read to EOF but never past the limit, should the file grow meanwhile.
  std::string out(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  for (;;) {
    if (got == out.size()) {
      if (static_cast<std::int64_t>(out.size()) > max_bytes) {
        return InvalidArgument(path + " grew past the limit of " + std::to_string(max_bytes) + " bytes while read");
      }
      out.resize(out.size() + 4096);
    }
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return Status(StatusCode::kNotFound, "cannot read " + path + ": " + std::generic_category().message(errno));
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  out.resize(got);
  if (static_cast<std::int64_t>(got) > max_bytes) {
    return InvalidArgument(path + " grew past the limit of " + std::to_string(max_bytes) + " bytes while read");
  }
  return out;
}

double Percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  std::size_t rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(sorted.size())));
  rank = std::clamp<std::size_t>(rank, 1, sorted.size());
  return sorted[rank - 1];
}

void TuneMalloc(MallocUse use) {
#if defined(__GLIBC__)
  // NOLINTNEXTLINE(concurrency-mt-unsafe): TuneMalloc runs once, before the command starts threads (cli_util.h)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  // NOLINTNEXTLINE(concurrency-mt-unsafe): TuneMalloc runs once, before the command starts threads (cli_util.h)
  mallopt(M_TRIM_THRESHOLD, use == MallocUse::kTower ? 256 << 20 : 64 << 20);
#else
  (void)use;
#endif
}

void ReleaseFreeMemory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace epd::cli
