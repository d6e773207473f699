// See media_source.h.
//
// ResolveAll's scheduling: a Batch (one call) starts min(parallelism, n)
// "tokens" on the pool. A token takes the next unstarted item, resolves it,
// records the result, and posts itself again at the back of the pool's
// queue while items remain and nothing has failed; otherwise it retires.
// So a request never has more than `parallelism` items in flight, and
// requests take turns item by item. The last token to retire calls done:
// by then no fetch of the batch runs, so no charge can follow done.
// The first failure sets the batch's stop flag, which every fetch of the
// batch watches (FetchControl::stop): siblings in flight abort.
#include "media_source.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <system_error>

#include "epd/core/mutex.h"
#include "fetch_pool.h"

namespace epd::internal {
namespace {

using Clock = std::chrono::steady_clock;

std::string RealPath(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) != nullptr ? std::string(buf) : std::string();
}

// True when `url` starts with `scheme` (lower case, with its ':'),
// whatever the URL's case.
bool HasScheme(const std::string& url, std::string_view scheme) {
  if (url.size() < scheme.size()) return false;
  for (std::size_t i = 0; i < scheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(url[i])) != scheme[i]) return false;
  }
  return true;
}

bool IsSet(const std::shared_ptr<const std::atomic<bool>>& flag) {
  return flag != nullptr && flag->load(std::memory_order_relaxed);
}

Status Charge(const FetchControl& control, std::int64_t bytes) {
  if (!control.charge || bytes <= 0) return Status::Ok();
  try {
    return control.charge(bytes);
  } catch (...) {
    return Status(StatusCode::kInternal, "the media byte charge threw");
  }
}

// What a file that is not regular is, for the message.
const char* Kind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

// Reads `size` bytes of the regular file `fd` (fewer if it shrank).
std::string ReadAll(int fd, std::size_t size) {
  std::string out(size, '\0');
  std::size_t off = 0;
  while (off < out.size()) {
    const ssize_t n = read(fd, out.data() + off, out.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += static_cast<std::size_t>(n);
  }
  out.resize(off);
  return out;
}

// The bytes of a base64 payload; kInvalidArgument when it is not base64.
StatusOr<std::string> DecodeBase64(std::string_view payload) {
  std::string out(payload.size() / 4 * 3 + 3, '\0');
  auto* dst = reinterpret_cast<unsigned char*>(out.data());
  const auto* src = reinterpret_cast<const unsigned char*>(payload.data());
  // (Not find_first_of: libstdc++ runs a memchr over the set per character.)
  const bool one_block = payload.size() % 4 == 0 && std::none_of(payload.begin(), payload.end(), [](char c) {
                           return c == ' ' || c == '\t' || c == '\r' || c == '\n';
                         });
  if (one_block) {
    // One block, no line breaks: EVP_DecodeBlock, several times faster than
    // the line-oriented EVP_DecodeUpdate. It writes the padding's zero
    // bytes too, which are cut off here.
    const int n = EVP_DecodeBlock(dst, src, static_cast<int>(payload.size()));
    if (n < 0) return InvalidArgument("the data: URL's payload is not valid base64");
    const std::size_t pad = payload.ends_with("==") ? 2 : payload.ends_with("=") ? 1 : 0;
    out.resize(static_cast<std::size_t>(n) - pad);
  } else {
    EVP_ENCODE_CTX* ctx = EVP_ENCODE_CTX_new();
    EVP_DecodeInit(ctx);
    int n = 0, tail = 0;
    const int rc = EVP_DecodeUpdate(ctx, dst, &n, src, static_cast<int>(payload.size()));
    const int fin = rc < 0 ? -1 : EVP_DecodeFinal(ctx, dst + n, &tail);
    EVP_ENCODE_CTX_free(ctx);
    if (rc < 0 || fin < 0) return InvalidArgument("the data: URL's payload is not valid base64");
    out.resize(static_cast<std::size_t>(n) + static_cast<std::size_t>(tail));
  }
  if (out.empty()) return InvalidArgument("the data: URL's payload is empty");
  return out;
}

}  // namespace

bool IsHttpUrl(const std::string& url) { return HasScheme(url, "http://") || HasScheme(url, "https://"); }

struct MediaSource::Batch {
  std::vector<std::string> urls;
  ResolveOptions options;
  ResolveDone done;
  std::shared_ptr<std::atomic<bool>> stop = std::make_shared<std::atomic<bool>>(false);

  Mutex mu;
  std::size_t next EPD_GUARDED_BY(mu) = 0;  // the next item to start
  int tokens EPD_GUARDED_BY(mu) = 0;        // tokens not retired
  ResolvedMedia result EPD_GUARDED_BY(mu);

  Mutex charge_mu;  // serializes options.charge
  std::int64_t charged EPD_GUARDED_BY(charge_mu) = 0;
};

MediaSource::MediaSource() = default;

void MediaSource::StopAll() {
  MutexLock lock(batches_mu_);
  for (Batch* b : batches_) b->stop->store(true);
}

MediaSource::~MediaSource() {
  StopAll();
  if (pool_ != nullptr) pool_->Stop();  // runs every token left (they may post more): each batch ends, done called
  if (root_fd_ >= 0) close(root_fd_);
}

StatusOr<std::unique_ptr<MediaSource>> MediaSource::Create(MediaFetchOptions fetch,
                                                           const std::string& allowed_local_path, int fetch_threads) {
  auto m = std::unique_ptr<MediaSource>(new MediaSource());
  m->max_bytes_ = fetch.max_bytes;
  StatusOr<std::unique_ptr<MediaFetcher>> f = MediaFetcher::Create(std::move(fetch));
  if (!f.ok()) return f.status();
  m->fetcher_ = std::move(*f);
  if (!allowed_local_path.empty()) {
    struct stat st {};
    m->local_root_ = RealPath(allowed_local_path);
    if (m->local_root_.empty() || stat(m->local_root_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return InvalidArgument("--allowed-local-media-path " + MediaUrlForMessage(allowed_local_path) +
                             " is not a directory");
    }
    m->root_fd_ = open(m->local_root_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (m->root_fd_ < 0) {
      return InvalidArgument("--allowed-local-media-path " + MediaUrlForMessage(allowed_local_path) +
                             " cannot be opened: " + std::error_code(errno, std::generic_category()).message());
    }
  }
  m->pool_ = std::make_unique<FetchPool>(fetch_threads);
  return m;
}

StatusOr<std::string> MediaSource::Resolve(const std::string& url) const { return ResolveOne(url, FetchControl{}); }

StatusOr<std::string> MediaSource::ResolveOne(const std::string& url, const FetchControl& control) const {
  if (const std::size_t bad = FirstInvalidUtf8(url); bad != std::string::npos) {
    return InvalidArgument("the media URL '" + MediaUrlForMessage(url, 64) + "' is not valid UTF-8 (byte " +
                           std::to_string(bad) + ")");
  }
  if (HasScheme(url, "data:")) return FromData(url, control);
  if (HasScheme(url, "file:")) return FromFile(url, control);
  if (IsHttpUrl(url)) return fetcher_->Fetch(url, control);
  return InvalidArgument("the media URL '" + MediaUrlForMessage(url, 64) +
                         "' is neither data:, http(s):// nor file://");
}

void MediaSource::ResolveAll(std::vector<std::string> urls, ResolveOptions options, ResolveDone done) {
  auto b = std::make_shared<Batch>();
  const std::size_t n = urls.size();
  b->urls = std::move(urls);
  b->options = std::move(options);
  b->done = std::move(done);
  const int tokens = static_cast<int>(std::clamp<std::size_t>(n, 1, std::max(1, b->options.parallelism)));
  {
    MutexLock lock(b->mu);  // not shared yet: for the analysis, at no cost
    b->result.items.assign(n, Status(StatusCode::kCancelled, "not resolved"));
    b->tokens = tokens;
  }
  {
    MutexLock lock(batches_mu_);
    batches_.insert(b.get());
  }
  for (int t = tokens; t > 0; --t) pool_->Post([this, b] { Step(b); });
}

// One item of `b`, as its token resolves it.
StatusOr<std::string> MediaSource::ItemOf(Batch& b, std::size_t i) const {
  const ResolveOptions& o = b.options;
  if (IsSet(o.cancel)) return Status(StatusCode::kCancelled, "the client went away");
  if (b.stop->load()) return Status(StatusCode::kCancelled, "stopped");
  if (Clock::now() >= o.deadline) {
    return Status(StatusCode::kDeadlineExceeded, "the request's fetch deadline passed before this item started");
  }
  FetchControl c;
  c.deadline = o.deadline;
  c.cancel = o.cancel;
  c.stop = b.stop;
  if (o.charge) {
    c.charge = [&b](std::int64_t bytes) {
      MutexLock lock(b.charge_mu);
      Status s = b.options.charge(bytes);
      if (s.ok()) b.charged += bytes;
      return s;
    };
  }
  return ResolveOne(b.urls[i], c);
}

void MediaSource::Step(const std::shared_ptr<Batch>& b) {
  std::optional<std::size_t> item;
  {
    MutexLock lock(b->mu);
    if (!b->result.failed.has_value() && b->next < b->urls.size()) item = b->next++;
  }
  if (item.has_value()) {
    StatusOr<std::string> got = ItemOf(*b, *item);
    MutexLock lock(b->mu);
    if (!got.ok() && !b->result.failed.has_value()) {
      b->result.failed = *item;
      b->stop->store(true);
    }
    b->result.items[*item] = std::move(got);
  }
  bool again = false, last = false;
  {
    MutexLock lock(b->mu);
    again = item.has_value() && !b->result.failed.has_value() && b->next < b->urls.size();
    if (!again) last = --b->tokens == 0;
  }
  if (again) pool_->Post([this, b] { Step(b); });
  if (last) Finish(*b);
}

void MediaSource::Finish(Batch& b) {
  {
    MutexLock lock(batches_mu_);
    batches_.erase(&b);
  }
  ResolvedMedia r;
  std::size_t started = 0;
  {
    MutexLock lock(b.mu);
    r = std::move(b.result);
    started = b.next;
  }
  if (r.failed.has_value()) {
    // Items the failure stopped, or kept from starting, say so; an item
    // that failed on its own keeps its error.
    const Status why(StatusCode::kCancelled, "not resolved: item " + std::to_string(*r.failed) + " failed first");
    for (std::size_t i = 0; i < r.items.size(); ++i) {
      if (i == *r.failed || r.items[i].ok()) continue;
      const Status& s = r.items[i].status();
      if (i >= started || (s.code() == StatusCode::kCancelled && s.message().ends_with("stopped"))) r.items[i] = why;
    }
  }
  {
    MutexLock lock(b.charge_mu);
    r.charged_bytes = b.charged;
  }
  try {
    b.done(std::move(r));
  } catch (...) {  // NOLINT(bugprone-empty-catch): done must not throw; the pool thread must go on
  }
}

StatusOr<std::string> MediaSource::FromData(const std::string& url, const FetchControl& control) const {
  const std::size_t comma = url.find(',');
  std::string head = url.substr(0, comma == std::string::npos ? 0 : comma);
  std::transform(head.begin(), head.end(), head.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (comma == std::string::npos || head.find(";base64") == std::string::npos) {
    return InvalidArgument("a data: media URL must be data:<type>;base64,<payload>");
  }
  const std::size_t encoded = url.size() - comma - 1;
  if (static_cast<std::int64_t>(encoded / 4 * 3) > max_bytes_ + 2) {
    return ResourceExhausted("the data: URL holds about " + std::to_string(encoded / 4 * 3) + " bytes; at most " +
                             std::to_string(max_bytes_) + " are accepted (--media-max-mb)");
  }
  StatusOr<std::string> out = DecodeBase64(std::string_view(url).substr(comma + 1));
  if (!out.ok()) return out;
  if (Status s = Charge(control, static_cast<std::int64_t>(out->size())); !s.ok()) return s;
  return out;
}

namespace {

// The percent-decoded absolute path of a file:// URL, or kInvalidArgument.
StatusOr<std::string> FilePath(const std::string& url) {
  CURLU* u = curl_url();
  char* path = nullptr;
  char* host = nullptr;
  const bool parsed = curl_url_set(u, CURLUPART_URL, url.c_str(), 0) == CURLUE_OK &&
                      curl_url_get(u, CURLUPART_PATH, &path, CURLU_URLDECODE) == CURLUE_OK;
  curl_url_get(u, CURLUPART_HOST, &host, 0);
  const std::string p = path != nullptr ? path : "";
  std::string h = host != nullptr ? host : "";
  curl_free(path);
  curl_free(host);
  curl_url_cleanup(u);
  std::transform(h.begin(), h.end(), h.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (!parsed || (!h.empty() && h != "localhost") || p.empty() || p[0] != '/' || p.find('\0') != std::string::npos) {
    return InvalidArgument("the media URL '" + MediaUrlForMessage(url) + "' is not file:///absolute/path");
  }
  return p;
}

// Opens `rel` (a realpath below the root, made relative) under `root_fd`
// without following any symbolic link on the way: the realpath had none, so
// one found now was swapped in since. openat2's RESOLVE_BENEATH also keeps
// ".." from leaving the root. Kernels before 5.6 lack openat2: there only
// the last component is held (O_NOFOLLOW).
int OpenBeneath(int root_fd, const std::string& rel) {
  constexpr int kFlags = O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY;
  open_how how{};
  how.flags = kFlags;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  const long fd = syscall(SYS_openat2, root_fd, rel.c_str(), &how, sizeof(how));
  if (fd >= 0 || errno != ENOSYS) return static_cast<int>(fd);
  return openat(root_fd, rel.c_str(), kFlags);
}

// A descriptor of the regular file `rel` under `root_fd`, opened so that
// nothing can block: fstatat refuses what is not regular before any open
// (opening a device can have effects of its own); O_NONBLOCK keeps a FIFO
// swapped in since from blocking the open; fstat, on the descriptor
// itself, must find the same regular file before any read. `shown` names
// the file in messages.
StatusOr<int> OpenRegular(int root_fd, const std::string& rel, const std::string& shown, struct stat& st) {
  const auto not_regular = [&](mode_t mode) {
    return Status(StatusCode::kPermissionDenied,
                  "the media file " + shown + " is " + Kind(mode) + ", not a regular file; refused");
  };
  struct stat before {};
  if (fstatat(root_fd, rel.c_str(), &before, AT_SYMLINK_NOFOLLOW) != 0) {
    return Status(StatusCode::kNotFound, "the media file " + shown + " does not exist");
  }
  if (!S_ISREG(before.st_mode)) return not_regular(before.st_mode);
  const int fd = OpenBeneath(root_fd, rel);
  if (fd < 0) {
    const int e = errno;
    if (e == ELOOP || e == EXDEV) {
      return Status(StatusCode::kPermissionDenied, "the media file " + shown + " changed while it was opened; refused");
    }
    return Status(StatusCode::kPermissionDenied, "the media file " + shown + " cannot be opened: " +
                                                     std::error_code(e, std::generic_category()).message());
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != before.st_dev || st.st_ino != before.st_ino) {
    const mode_t mode = st.st_mode;
    close(fd);
    if (!S_ISREG(mode)) return not_regular(mode);
    return Status(StatusCode::kPermissionDenied, "the media file " + shown + " changed while it was opened; refused");
  }
  return fd;
}

}  // namespace

StatusOr<std::string> MediaSource::FromFile(const std::string& url, const FetchControl& control) const {
  if (local_root_.empty()) {
    return Status(StatusCode::kPermissionDenied,
                  "file:// media URLs are off; start the server with --allowed-local-media-path DIR");
  }
  StatusOr<std::string> p = FilePath(url);
  if (!p.ok()) return p.status();
  const std::string shown = MediaUrlForMessage(*p);
  const std::string real = RealPath(*p);
  if (real.empty()) return Status(StatusCode::kNotFound, "the media file " + shown + " does not exist");
  if (real.rfind(local_root_ + "/", 0) != 0) {
    return Status(StatusCode::kPermissionDenied, "the media file " + shown + " is outside --allowed-local-media-path " +
                                                     MediaUrlForMessage(local_root_));
  }
  struct stat st {};
  StatusOr<int> fd = OpenRegular(root_fd_, real.substr(local_root_.size() + 1), shown, st);
  if (!fd.ok()) return fd.status();
  Status s = st.st_size > max_bytes_
                 ? ResourceExhausted("the media file " + shown + " is " + std::to_string(st.st_size) +
                                     " bytes; at most " + std::to_string(max_bytes_) + " are accepted (--media-max-mb)")
                 : Charge(control, st.st_size);
  std::string out = s.ok() ? ReadAll(*fd, static_cast<std::size_t>(st.st_size)) : std::string();
  close(*fd);
  if (!s.ok()) return s;
  return out;
}

}  // namespace epd::internal
