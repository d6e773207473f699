// See epd/openai/ec_publisher.h.
//
// The index (files, by_age) maps each file this publisher knows, by its
// path relative to the ec-dir ("<id name>" or "tenant=<t>/<id name>"), to
// its size and age; every file it names is a regular file in a real
// directory (the scan and Publish see to that), so eviction deletes only
// those. Publish checks and writes without the lock (different ids in
// parallel) and takes it only to record and evict.
//
// Publish, for a namespace directory B (the ec-dir, or a tenant's) and an
// id name N:
//   B/N/encoder_cache.safetensors records the same key -> renewed (kPresent);
//   otherwise the bytes go to B/N/<temp> (O_EXCL, 0640, fsync), then
//     linkat(temp -> file): nothing there yet -> kWritten;
//     EEXIST and the file there records the same key (a concurrent
//       publisher of the same item won) -> kPresent;
//     EEXIST and anything else there -> renameat(temp -> file), kWritten.
// A directory this publish created is removed again when it fails; one
// removed under a writer (by another's failure, or by eviction) makes it
// start over (ENOENT, at most 3 tries).
#include "epd/openai/ec_publisher.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <optional>
#include <system_error>
#include <unordered_map>
#include <vector>

#include "ec_files.h"
#include "epd/core/mutex.h"
#include "epd/safetensors/safetensors_codec.h"

namespace epd {
namespace {

using SysClock = std::chrono::system_clock;
using internal::EcProbe;
using internal::Fd;
using internal::kEcFile;
using internal::kEcTempPrefix;

Status WriteFailed(const std::string& path, int err) {
  return Status(StatusCode::kInternal, "ec_dir_write_failed: cannot write " + path + ": " +
                                           std::generic_category().message(err) + " (--ec-dir)");
}

// main rows, each followed by its deepstack row (levels in order).
std::vector<std::byte> Interleave(const Embedding& e) {
  const std::size_t main_row = static_cast<std::size_t>(e.hidden) * DTypeSize(e.dtype);
  const std::size_t deep_row = main_row * static_cast<std::size_t>(e.deepstack_layers);
  std::vector<std::byte> out(e.main.size() + e.deepstack.size());
  if (main_row == 0) return out;  // no bytes: and memcpy must not see a null source
  std::byte* dst = out.data();
  for (std::int64_t r = 0; r < e.tokens; ++r) {
    std::memcpy(dst, e.main.data() + r * main_row, main_row);
    if (deep_row > 0) std::memcpy(dst + main_row, e.deepstack.data() + r * deep_row, deep_row);
    dst += main_row + deep_row;
  }
  return out;
}

// The file's bytes: one "ec_cache" tensor, the key in __metadata__.
StatusOr<std::string> FileBytes(const Embedding& e, const std::string& key) {
  std::vector<std::byte> interleaved;
  std::span<const std::byte> rows(e.main);
  if (e.deepstack_layers > 0) {
    interleaved = Interleave(e);
    rows = interleaved;
  }
  const NamedTensor t{"ec_cache",
                      TensorView{ToTensorDType(e.dtype), {e.tokens, e.hidden * (1 + e.deepstack_layers)}, rows}};
  return SerializeSafetensors(std::span<const NamedTensor>(&t, 1), {{internal::kEcKeyField, key}});
}

bool InGroup(gid_t gid) {
  if (geteuid() == 0 || getegid() == gid) return true;
  std::vector<gid_t> groups(static_cast<std::size_t>(std::max(getgroups(0, nullptr), 0)));
  const int n = groups.empty() ? 0 : getgroups(static_cast<int>(groups.size()), groups.data());
  groups.resize(static_cast<std::size_t>(std::max(n, 0)));
  return std::find(groups.begin(), groups.end(), gid) != groups.end();
}

// A group name or a numeric gid, one the server's user may give its files.
StatusOr<gid_t> ResolveGroup(const std::string& group) {
  const bool numeric = std::all_of(group.begin(), group.end(), [](char c) { return c >= '0' && c <= '9'; });
  gid_t gid = 0;
  if (numeric && group.size() <= 9) {
    gid = static_cast<gid_t>(std::stoul(group));
  } else {
    std::vector<char> buf(16384);
    struct group g {};
    struct group* found = nullptr;
    while (getgrnam_r(group.c_str(), &g, buf.data(), buf.size(), &found) == ERANGE && buf.size() < (1u << 24)) {
      buf.resize(buf.size() * 4);
    }
    if (found == nullptr) return InvalidArgument("--ec-dir-group: no group named '" + group + "'");
    gid = g.gr_gid;
  }
  if (!InGroup(gid)) {
    return InvalidArgument("--ec-dir-group: the server's user is not in group '" + group +
                           "', so it cannot give its files that group");
  }
  return gid;
}

}  // namespace

struct EcPublisher::Impl {
  EcPublisherOptions o;
  internal::EcModes modes;
  Fd root;  // the ec-dir
  std::atomic<std::uint64_t> temp_seq{0};

  struct Entry {
    std::int64_t bytes = 0;
    std::multimap<SysClock::time_point, std::string>::iterator age;
  };
  mutable Mutex mu;
  std::unordered_map<std::string, Entry> files EPD_GUARDED_BY(mu);             // by relative path
  std::multimap<SysClock::time_point, std::string> by_age EPD_GUARDED_BY(mu);  // oldest first
  EcPublisherStats stats EPD_GUARDED_BY(mu);

  SysClock::time_point Now() const { return o.now ? o.now() : SysClock::now(); }
  std::string Shown(const std::string& rel) const { return o.dir + "/" + rel; }

  void Record(const std::string& rel, std::int64_t bytes, SysClock::time_point when) EPD_REQUIRES(mu) {
    auto it = files.find(rel);
    if (it != files.end()) {
      by_age.erase(it->second.age);
      stats.bytes -= it->second.bytes;
    } else {
      it = files.emplace(rel, Entry{}).first;
      ++stats.files;
    }
    it->second.bytes = bytes;
    it->second.age = by_age.emplace(when, rel);
    stats.bytes += bytes;
  }

  // `keep` (the file just published) is never deleted, whatever the grace.
  void Evict(SysClock::time_point now, const std::string& keep = "") EPD_REQUIRES(mu) {
    if (o.max_bytes <= 0) return;
    while (stats.bytes > o.max_bytes && !by_age.empty()) {
      auto oldest = by_age.begin();
      if (now - oldest->first < o.grace || oldest->second == keep) {
        ++stats.over_budget;
        return;
      }
      const std::string rel = oldest->second;
      const std::int64_t bytes = files.at(rel).bytes;
      Delete(rel);
      by_age.erase(oldest);
      files.erase(rel);
      --stats.files;
      stats.bytes -= bytes;
      ++stats.evicted;
      stats.evicted_bytes += static_cast<std::uint64_t>(bytes);
    }
  }

  // Removes <rel>/encoder_cache.safetensors and, when then empty, its
  // directory; nothing when a symlink has taken the place of a directory.
  void Delete(const std::string& rel) const {
    const std::size_t slash = rel.find('/');
    Fd tenant;
    if (slash != std::string::npos) {
      tenant = internal::OpenDirAt(root.get(), rel.substr(0, slash));
      if (!tenant) return;
    }
    const int base = tenant ? tenant.get() : root.get();
    const std::string name = slash == std::string::npos ? rel : rel.substr(slash + 1);
    const Fd id = internal::OpenDirAt(base, name);
    if (!id) return;
    unlinkat(id.get(), kEcFile, 0);              // a symlink there goes itself, never its target
    unlinkat(base, name.c_str(), AT_REMOVEDIR);  // fails harmlessly when not empty
  }

  // Files present at Open, oldest by mtime first; stale temporaries (older
  // than the grace: no live writer is that slow) are removed. Symlinks,
  // FIFOs and names no id maps to are skipped.
  void Scan() {
    const auto now = Now();
    MutexLock lock(mu);
    for (const std::string& name : internal::ListNames(root.get())) {
      if (internal::IsEcTenantDirName(name)) {
        const Fd tenant = internal::OpenDirAt(root.get(), name);
        if (!tenant) continue;
        const std::string prefix = name + "/";
        for (const std::string& id : internal::ListNames(tenant.get())) ScanIdDir(tenant.get(), id, prefix + id, now);
      } else {
        ScanIdDir(root.get(), name, name, now);
      }
    }
    Evict(now);
  }

  void ScanIdDir(int base, const std::string& name, const std::string& rel, SysClock::time_point now) EPD_REQUIRES(mu) {
    if (!internal::IsEcIdName(name)) return;
    const Fd id = internal::OpenDirAt(base, name);  // a symlink or a non-directory: skipped
    if (!id) return;
    for (const std::string& f : internal::ListNames(id.get())) {
      struct stat st {};
      if (fstatat(id.get(), f.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
      const auto mtime = SysClock::time_point(std::chrono::duration_cast<SysClock::duration>(
          std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec)));
      if (f.starts_with(kEcTempPrefix)) {
        if (now - mtime >= o.grace) unlinkat(id.get(), f.c_str(), 0);
      } else if (f == kEcFile) {
        Record(rel, st.st_size, mtime);
      }
    }
  }

  // The size of B/N's file when it records `key`, renewed; else nullopt.
  std::optional<std::int64_t> Renew(const std::string& tdir, const std::string& name, const std::string& key) const {
    const Fd tenant = tdir.empty() ? Fd() : internal::OpenDirAt(root.get(), tdir);
    if (!tdir.empty() && !tenant) return std::nullopt;
    const Fd id = internal::OpenDirAt(tenant ? tenant.get() : root.get(), name);
    if (!id) return std::nullopt;
    const std::optional<EcProbe> p = internal::ProbeAt(id.get(), kEcFile);
    if (!p || p->key != key) return std::nullopt;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Now().time_since_epoch()).count();
    const timespec times[2] = {{ns / 1000000000, ns % 1000000000}, {ns / 1000000000, ns % 1000000000}};
    futimens(p->fd.get(), times);  // renewed: a consumer may want it now
    return p->size;
  }

  StatusOr<EcOutcome> Write(const std::string& tdir, const std::string& name, const std::string& bytes,
                            const std::string& key) {
    StatusOr<EcOutcome> out = EcOutcome::kWritten;
    bool retry = true;
    for (int attempt = 0; attempt < 3 && retry; ++attempt) {
      retry = false;
      out = WriteOnce(tdir, name, bytes, key, &retry);
    }
    return out;
  }

  StatusOr<EcOutcome> WriteOnce(const std::string& tdir, const std::string& name, const std::string& bytes,
                                const std::string& key, bool* retry) {
    bool tenant_made = false;
    bool id_made = false;
    const Fd tenant = tdir.empty() ? Fd() : internal::MakeDirAt(root.get(), tdir, modes, &tenant_made);
    if (!tdir.empty() && !tenant) {
      const int err = errno;
      *retry = err == ENOENT;
      return WriteFailed(Shown(tdir), err);
    }
    const int base = tenant ? tenant.get() : root.get();
    const std::string rel = tdir.empty() ? name : tdir + "/" + name;
    const Fd id = internal::MakeDirAt(base, name, modes, &id_made);
    const int id_errno = errno;
    StatusOr<EcOutcome> out = WriteFailed(Shown(rel), id_errno);
    if (id) {
      out = Place(id.get(), rel, bytes, key, retry);
    } else {
      *retry = id_errno == ENOENT;
    }
    if (!out.ok()) {
      if (id_made) unlinkat(base, name.c_str(), AT_REMOVEDIR);
      if (tenant_made) unlinkat(root.get(), tdir.c_str(), AT_REMOVEDIR);
    }
    return out;
  }

  StatusOr<EcOutcome> Place(int dir, const std::string& rel, const std::string& bytes, const std::string& key,
                            bool* retry) {
    const std::string temp = kEcTempPrefix + std::to_string(getpid()) + "-" + std::to_string(++temp_seq);
    if (const int err = internal::WriteNewFileAt(dir, temp, bytes, modes); err != 0) {
      *retry = err == ENOENT;
      return WriteFailed(Shown(rel + "/" + temp), err);
    }
    EcOutcome out = EcOutcome::kWritten;
    int err = linkat(dir, temp.c_str(), dir, kEcFile, 0) == 0 ? 0 : errno;
    if (err == EEXIST) {
      // Something is there: the same item (a concurrent publisher won) is
      // kept; anything else (another key, a symlink, a FIFO) is replaced.
      const std::optional<EcProbe> there = internal::ProbeAt(dir, kEcFile);
      if (there && there->key == key) {
        out = EcOutcome::kPresent;
        err = 0;
      } else {
        err = renameat(dir, temp.c_str(), dir, kEcFile) == 0 ? 0 : errno;
      }
    }
    unlinkat(dir, temp.c_str(), 0);  // gone already after a rename
    if (err != 0) return WriteFailed(Shown(rel + "/" + kEcFile), err);
    return out;
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
  auto impl = std::make_unique<Impl>();
  if (!options.group.empty()) {
    StatusOr<gid_t> gid = ResolveGroup(options.group);
    if (!gid.ok()) return gid.status();
    impl->modes.gid = *gid;
  }
  const auto cannot = [&](const char* what) {
    return Status(StatusCode::kInternal, std::string("cannot ") + what + " --ec-dir " + options.dir + ": " +
                                             std::generic_category().message(errno));
  };
  const bool made = mkdir(options.dir.c_str(), impl->modes.dir) == 0;
  if (!made && errno != EEXIST) return cannot("create");
  // The configured path itself may be a symlink (e.g. to a tmpfs); nothing inside it is followed.
  impl->root = Fd(open(options.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!impl->root) return cannot("open");
  if (made && (fchmod(impl->root.get(), impl->modes.dir) != 0 ||
               (impl->modes.gid != static_cast<gid_t>(-1) &&
                fchown(impl->root.get(), static_cast<uid_t>(-1), impl->modes.gid) != 0))) {
    return cannot("set the mode or group of");
  }
  impl->o = std::move(options);
  impl->Scan();
  return std::unique_ptr<EcPublisher>(new EcPublisher(std::move(impl)));
}

std::string EcPublisher::IdName(std::string_view id) { return internal::EcIdName(id); }

std::string EcPublisher::TenantDir(std::string_view tenant) {
  return tenant.empty() ? std::string() : internal::EcTenantDirName(tenant);
}

std::string EcPublisher::PathOf(std::string_view id, std::string_view tenant) const {
  const std::string tdir = TenantDir(tenant);
  return impl_->o.dir + "/" + (tdir.empty() ? "" : tdir + "/") + IdName(id) + "/" + kEcFile;
}

StatusOr<EcOutcome> EcPublisher::Publish(const EcItem& item, const Embedding& e) {
  if (!e.on_host() || e.main.size() != e.EmbeddingShape::main_bytes() ||
      e.deepstack.size() != e.EmbeddingShape::deepstack_bytes()) {
    return InvalidArgument("EC publish of '" + item.id +
                           "': the embedding's bytes disagree with its shape (or are not on the host)");
  }
  Impl& m = *impl_;
  const std::string tdir = TenantDir(item.tenant);
  const std::string name = IdName(item.id);
  StatusOr<EcOutcome> outcome = EcOutcome::kPresent;
  std::int64_t size = 0;
  if (const std::optional<std::int64_t> present = m.Renew(tdir, name, item.key)) {
    size = *present;
  } else {
    StatusOr<std::string> bytes = FileBytes(e, item.key);
    if (!bytes.ok()) return bytes.status();
    size = static_cast<std::int64_t>(bytes->size());
    outcome = m.Write(tdir, name, *bytes, item.key);
  }
  MutexLock lock(m.mu);
  if (!outcome.ok()) {
    ++m.stats.write_failures;
    return outcome;
  }
  ++(*outcome == EcOutcome::kWritten ? m.stats.published : m.stats.already_present);
  const auto now = m.Now();
  const std::string rel = tdir.empty() ? name : tdir + "/" + name;
  m.Record(rel, size, now);
  m.Evict(now, rel);
  return outcome;
}

EcPublisherStats EcPublisher::Stats() const {
  MutexLock lock(impl_->mu);
  return impl_->stats;
}

}  // namespace epd
