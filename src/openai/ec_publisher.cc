// See epd/openai/ec_publisher.h.
#include "epd/openai/ec_publisher.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "epd/safetensors/safetensors_codec.h"

namespace epd {
namespace {

namespace fs = std::filesystem;
using SysClock = std::chrono::system_clock;
constexpr char kFile[] = "encoder_cache.safetensors";
constexpr char kTempPrefix[] = ".encoder_cache.safetensors.tmp-";

Status WriteFailed(const std::string& path, int err) {
  return Status(StatusCode::kInternal, "ec_dir_write_failed: cannot write " + path + ": " +
                                           std::generic_category().message(err) + " (--ec-dir)");
}

// main rows, each followed by its deepstack row (levels in order).
std::vector<std::byte> Interleave(const Embedding& e) {
  const std::size_t main_row = static_cast<std::size_t>(e.hidden) * DTypeSize(e.dtype);
  const std::size_t deep_row = main_row * static_cast<std::size_t>(e.deepstack_layers);
  std::vector<std::byte> out(e.main.size() + e.deepstack.size());
  std::byte* dst = out.data();
  for (std::int64_t r = 0; r < e.tokens; ++r) {
    std::memcpy(dst, e.main.data() + r * main_row, main_row);
    std::memcpy(dst + main_row, e.deepstack.data() + r * deep_row, deep_row);
    dst += main_row + deep_row;
  }
  return out;
}

Status WriteAll(int fd, const std::string& bytes, const std::string& path) {
  for (std::size_t off = 0; off < bytes.size();) {
    const ssize_t n = write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return WriteFailed(path, n < 0 ? errno : ENOSPC);
    off += static_cast<std::size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

struct EcPublisher::Impl {
  EcPublisherOptions o;
  std::atomic<std::uint64_t> temp_seq{0};

  struct Entry {
    std::int64_t bytes = 0;
    std::multimap<SysClock::time_point, std::string>::iterator age;
  };
  mutable std::mutex mu;
  std::unordered_map<std::string, Entry> files;             // guarded by mu
  std::multimap<SysClock::time_point, std::string> by_age;  // guarded by mu: oldest first
  EcPublisherStats stats;                                   // guarded by mu

  SysClock::time_point Now() const { return o.now ? o.now() : SysClock::now(); }

  // REQUIRES: mu held.
  void Record(const std::string& id, std::int64_t bytes, SysClock::time_point when) {
    auto it = files.find(id);
    if (it != files.end()) {
      by_age.erase(it->second.age);
      stats.bytes -= it->second.bytes;
    } else {
      it = files.emplace(id, Entry{}).first;
      ++stats.files;
    }
    it->second.bytes = bytes;
    it->second.age = by_age.emplace(when, id);
    stats.bytes += bytes;
  }

  // REQUIRES: mu held. `keep` (the id just published) is never deleted,
  // whatever the grace.
  void Evict(SysClock::time_point now, const std::string& keep = "") {
    if (o.max_bytes <= 0) return;
    while (stats.bytes > o.max_bytes && !by_age.empty()) {
      auto oldest = by_age.begin();
      if (now - oldest->first < o.grace || oldest->second == keep) {
        ++stats.over_budget;
        return;
      }
      const std::string id = oldest->second;
      const std::int64_t bytes = files.at(id).bytes;
      unlink((o.dir + "/" + id + "/" + kFile).c_str());
      rmdir((o.dir + "/" + id).c_str());  // fails harmlessly when not empty
      by_age.erase(oldest);
      files.erase(id);
      --stats.files;
      stats.bytes -= bytes;
      ++stats.evicted;
      stats.evicted_bytes += static_cast<std::uint64_t>(bytes);
    }
  }

  // Files present at Open, oldest by mtime first; stale temporaries (older
  // than the grace: no live writer is that slow) are removed.
  // std::filesystem::directory_iterator, not readdir: readdir may share its
  // buffer across threads (concurrency-mt-unsafe).
  Status Scan() {
    std::error_code ec;
    fs::directory_iterator d(o.dir, ec);
    if (ec) return Status(StatusCode::kInternal, "cannot read --ec-dir " + o.dir + ": " + ec.message());
    const auto now = Now();
    std::lock_guard<std::mutex> lock(mu);
    for (; !ec && d != fs::directory_iterator(); d.increment(ec)) {
      const std::string id = d->path().filename().string();
      if (!CheckId(id).ok()) continue;
      const std::string sub = o.dir + "/" + id;
      std::error_code inner_ec;
      for (fs::directory_iterator f(sub, inner_ec); !inner_ec && f != fs::directory_iterator(); f.increment(inner_ec)) {
        ScanFile(id, f->path(), now);
      }
    }
    Evict(now);
    return Status::Ok();
  }

  // One file of <dir>/<id>: a stale temporary is removed, the cache file
  // recorded; anything else is left alone.
  void ScanFile(const std::string& id, const fs::path& file, SysClock::time_point now) {
    struct stat st {};
    const std::string path = file.string();
    if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return;
    const auto mtime = SysClock::time_point(std::chrono::seconds(st.st_mtim.tv_sec));
    const std::string name = file.filename().string();
    if (name.starts_with(kTempPrefix)) {
      if (now - mtime >= o.grace) unlink(path.c_str());
    } else if (name == kFile) {
      Record(id, st.st_size, mtime);
    }
  }

  // Writes `bytes` as <dir>/<id>/encoder_cache.safetensors unless it exists.
  StatusOr<EcOutcome> Write(const std::string& id, const std::string& bytes) {
    const std::string sub = o.dir + "/" + id;
    const std::string path = sub + "/" + kFile;
    if (mkdir(sub.c_str(), 0755) != 0 && errno != EEXIST) return WriteFailed(sub, errno);
    const std::string temp = sub + "/" + kTempPrefix + std::to_string(getpid()) + "-" + std::to_string(++temp_seq);
    const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return WriteFailed(temp, errno);
    Status written = WriteAll(fd, bytes, temp);
    if (close(fd) != 0 && written.ok()) written = WriteFailed(temp, errno);
    if (!written.ok()) {
      unlink(temp.c_str());
      return written;
    }
    const int linked = link(temp.c_str(), path.c_str());
    const int link_errno = errno;
    unlink(temp.c_str());
    if (linked == 0) return EcOutcome::kWritten;
    if (link_errno == EEXIST) return EcOutcome::kPresent;  // a concurrent publisher won
    return WriteFailed(path, link_errno);
  }
};

EcPublisher::EcPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EcPublisher::~EcPublisher() = default;

StatusOr<std::unique_ptr<EcPublisher>> EcPublisher::Open(EcPublisherOptions options) {
  if (options.dir.empty()) return InvalidArgument("--ec-dir is empty");
  if (options.max_bytes < 0 || options.grace.count() < 0) {
    return InvalidArgument("--ec-dir-max-mb and --ec-dir-grace-s must be >= 0");
  }
  while (options.dir.size() > 1 && options.dir.back() == '/') options.dir.pop_back();
  if (mkdir(options.dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return Status(StatusCode::kInternal,
                  "cannot create --ec-dir " + options.dir + ": " + std::generic_category().message(errno));
  }
  auto impl = std::make_unique<Impl>();
  impl->o = std::move(options);
  if (Status s = impl->Scan(); !s.ok()) return s;
  return std::unique_ptr<EcPublisher>(new EcPublisher(std::move(impl)));
}

Status EcPublisher::CheckId(std::string_view id) {
  if (id.empty() || id.size() > 255) {
    return InvalidArgument("an EC id (uuid) must be 1..255 characters, got " + std::to_string(id.size()));
  }
  if (id.front() == '.') return InvalidArgument("the EC id (uuid) '" + std::string(id) + "' starts with '.'");
  for (const char c : id) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) {
      return InvalidArgument("the EC id (uuid) '" + std::string(id) +
                             "' has a character that is unsafe in a path; use [A-Za-z0-9._-]");
    }
  }
  return Status::Ok();
}

std::string EcPublisher::PathOf(const std::string& id) const { return impl_->o.dir + "/" + id + "/" + kFile; }

StatusOr<EcOutcome> EcPublisher::Publish(const std::string& id, const Embedding& e) {
  if (Status s = CheckId(id); !s.ok()) return s;
  if (!e.on_host() || e.main.size() != e.EmbeddingShape::main_bytes() ||
      e.deepstack.size() != e.EmbeddingShape::deepstack_bytes()) {
    return InvalidArgument("EC publish of '" + id +
                           "': the embedding's bytes disagree with its shape (or are not on the host)");
  }
  Impl& m = *impl_;
  struct stat st {};
  StatusOr<EcOutcome> outcome = EcOutcome::kPresent;
  std::int64_t size = 0;
  if (stat(PathOf(id).c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    size = st.st_size;
    const auto now = m.Now();
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
    const timespec times[2] = {{ns / 1000000000, ns % 1000000000}, {ns / 1000000000, ns % 1000000000}};
    utimensat(AT_FDCWD, PathOf(id).c_str(), times, 0);  // renewed: a consumer may want it now
  } else {
    std::vector<std::byte> interleaved;
    std::span<const std::byte> rows(e.main);
    if (e.deepstack_layers > 0) {
      interleaved = Interleave(e);
      rows = interleaved;
    }
    const NamedTensor t{"ec_cache",
                        TensorView{ToTensorDType(e.dtype), {e.tokens, e.hidden * (1 + e.deepstack_layers)}, rows}};
    StatusOr<std::string> bytes = SerializeSafetensors(std::span<const NamedTensor>(&t, 1));
    if (!bytes.ok()) return bytes.status();
    size = static_cast<std::int64_t>(bytes->size());
    outcome = m.Write(id, *bytes);
  }
  std::lock_guard<std::mutex> lock(m.mu);
  if (!outcome.ok()) {
    ++m.stats.write_failures;
    return outcome;
  }
  ++(*outcome == EcOutcome::kWritten ? m.stats.published : m.stats.already_present);
  const auto now = m.Now();
  m.Record(id, size, now);
  m.Evict(now, id);
  return outcome;
}

EcPublisherStats EcPublisher::Stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace epd
