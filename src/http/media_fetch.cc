// See epd/http/media_fetch.h.
//
// One fetch is a chain of hops (the URL, then each redirect), each one curl
// easy transfer on the calling thread. What ends a transfer early is
// decided in curl's callbacks, and remembered in the hop's Hop so that the
// error names the real cause rather than curl's generic "write error" or
// "aborted by callback":
//   OpenSocket  an address the policy refuses (before any connect);
//   Write       a non-2xx answer (its body is never read), max_bytes, a
//               refused charge, a cancel;
//   Progress    a cancel while no bytes flow (curl calls it about once a
//               second when idle, more often while bytes arrive).
// The deadline is curl's own CURLOPT_TIMEOUT_MS, set per hop to what is
// left of the earlier of the request's deadline and the fetch's timeout.
#include "epd/http/media_fetch.h"

#include <curl/curl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <mutex>

#include "address_policy.h"
#include "epd/core/version.h"

namespace epd {
namespace {

using Clock = std::chrono::steady_clock;

struct CurlDel {
  void operator()(CURL* h) const { curl_easy_cleanup(h); }
};
struct UrlDel {
  void operator()(CURLU* u) const { curl_url_cleanup(u); }
};

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool Set(const std::shared_ptr<const std::atomic<bool>>& flag) {
  return flag != nullptr && flag->load(std::memory_order_relaxed);
}

// What the callbacks of one hop share.
struct Hop {
  const MediaFetcher::Impl* fetcher = nullptr;
  const FetchControl* control = nullptr;
  CURL* curl = nullptr;
  std::string refused;  // why an address was refused ("" = none was)
  std::string body;
  std::int64_t max_bytes = 0;
  bool over = false;
  bool not_2xx = false;  // the answer is not 2xx: its body was not read
  Status stopped;        // a cancel or a refused charge ended the transfer

  bool Stopped() {
    if (!stopped.ok()) return true;
    if (Set(control->cancel)) {
      stopped = Status(StatusCode::kCancelled, "the client went away");
    } else if (Set(control->stop)) {
      stopped = Status(StatusCode::kCancelled, "stopped");
    }
    return !stopped.ok();
  }
  // Room for the announced body (within max_bytes), so that it is never
  // copied as it grows: the pages are only touched, and resident, as the
  // charged bytes land, so memory follows the charge.
  void Reserve() {
    curl_off_t announced = -1;
    curl_easy_getinfo(curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &announced);
    if (announced > 0 && announced <= max_bytes) body.reserve(static_cast<std::size_t>(announced));
  }
  bool Charged(std::size_t bytes) {
    if (!control->charge) return true;
    try {
      stopped = control->charge(static_cast<std::int64_t>(bytes));
    } catch (...) {
      stopped = Status(StatusCode::kInternal, "the media byte charge threw");
    }
    return stopped.ok();
  }
};

// The length of the valid UTF-8 sequence at s[i], or 0.
std::size_t Utf8Length(std::string_view s, std::size_t i) {
  const auto at = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = at(i);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // the bounds of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // past U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size() || at(i + 1) < lo || at(i + 1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k) {
    if ((at(i + k) & 0xC0) != 0x80) return 0;
  }
  return n;
}

}  // namespace

std::size_t FirstInvalidUtf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = Utf8Length(text, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string MediaUrlForMessage(std::string_view url, std::size_t max_bytes) {
  std::string out;
  static const char kHex[] = "0123456789ABCDEF";
  std::size_t i = 0;
  while (i < url.size() && i < max_bytes) {
    const std::size_t n = Utf8Length(url, i);
    const auto c = static_cast<unsigned char>(url[i]);
    if (n == 0 || c < 0x20 || c == 0x7F) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
      ++i;
    } else if (i + n > max_bytes) {
      break;  // never cut a character
    } else {
      out.append(url.substr(i, n));
      i += n;
    }
  }
  if (i < url.size()) out += "...";
  return out;
}

struct MediaFetcher::Impl {
  MediaFetchOptions options;
  std::vector<internal::Cidr> networks;

  // Empty when `addr` may be connected to, else why not.
  std::string Refusal(const sockaddr* addr) const {
    if (options.allow_private_addresses) return "";
    const std::optional<std::string> what = internal::NonPublicClass(addr);
    if (!what.has_value()) return "";
    for (const internal::Cidr& n : networks) {
      if (internal::Contains(n, addr)) return "";
    }
    return internal::AddressText(addr) + " (" + *what + ")";
  }

  static curl_socket_t OpenSocket(void* clientp, curlsocktype, curl_sockaddr* a) {
    auto* hop = static_cast<Hop*>(clientp);
    if (std::string why = hop->fetcher->Refusal(&a->addr); !why.empty()) {
      if (hop->refused.empty()) hop->refused = std::move(why);
      return CURL_SOCKET_BAD;
    }
    return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
  }

  // Returning less than size * n aborts the transfer (CURLE_WRITE_ERROR).
  static size_t Write(char* p, size_t size, size_t n, void* userdata) {
    auto* hop = static_cast<Hop*>(userdata);
    const std::size_t bytes = size * n;
    long code = 0;
    curl_easy_getinfo(hop->curl, CURLINFO_RESPONSE_CODE, &code);
    if (code < 200 || code >= 300) {
      hop->not_2xx = true;  // a redirect's Location and the code are already known
      return 0;
    }
    if (hop->Stopped()) return 0;
    if (static_cast<std::int64_t>(hop->body.size() + bytes) > hop->max_bytes) {
      hop->over = true;
      return 0;
    }
    if (!hop->Charged(bytes)) return 0;
    if (hop->body.empty()) hop->Reserve();
    hop->body.append(p, bytes);
    return bytes;
  }

  static int Progress(void* clientp, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    return static_cast<Hop*>(clientp)->Stopped() ? 1 : 0;
  }

  // The scheme and domain checks of one hop's URL.
  Status CheckUrl(const std::string& url, const std::string& what) const {
    const std::string shown = "'" + MediaUrlForMessage(url) + "'";
    if (const std::size_t bad = FirstInvalidUtf8(url); bad != std::string::npos) {
      return InvalidArgument(what + " " + shown + " is not valid UTF-8 (byte " + std::to_string(bad) + ")");
    }
    std::unique_ptr<CURLU, UrlDel> u(curl_url());
    if (curl_url_set(u.get(), CURLUPART_URL, url.c_str(), 0) != CURLUE_OK) {
      return InvalidArgument(what + " " + shown + " is not a URL");
    }
    char* scheme = nullptr;
    char* host = nullptr;
    curl_url_get(u.get(), CURLUPART_SCHEME, &scheme, 0);
    curl_url_get(u.get(), CURLUPART_HOST, &host, 0);
    const std::string s = scheme != nullptr ? Lower(scheme) : "", h = host != nullptr ? Lower(host) : "";
    curl_free(scheme);
    curl_free(host);
    if (s != "http" && s != "https") {
      return Status(StatusCode::kPermissionDenied, what + " " + shown + " is not http or https");
    }
    if (!options.allowed_domains.empty() && std::none_of(options.allowed_domains.begin(), options.allowed_domains.end(),
                                                         [&](const std::string& d) { return Lower(d) == h; })) {
      return Status(StatusCode::kPermissionDenied, what + " " + shown + ": the host '" + MediaUrlForMessage(h) +
                                                       "' is not among the allowed media domains");
    }
    return Status::Ok();
  }

  static void Configure(CURL* c, const std::string& url, Hop& hop, long timeout_ms) {
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROXY, "");
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(hop.max_bytes));
    curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, &Impl::OpenSocket);
    curl_easy_setopt(c, CURLOPT_OPENSOCKETDATA, &hop);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &Impl::Write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &hop);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, &Impl::Progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, &hop);
    static const std::string agent = std::string("epd-encode/") + std::string(kVersion);
    curl_easy_setopt(c, CURLOPT_USERAGENT, agent.c_str());
  }

  // One request; `next` gets the redirect target when the answer is a
  // redirect. `request_bound`: the deadline is FetchControl's, not the
  // fetch's own timeout.
  StatusOr<std::string> Get(const std::string& url, const std::string& what, const FetchControl& control,
                            Clock::time_point deadline, bool request_bound, std::string& next) const {
    std::unique_ptr<CURL, CurlDel> h(curl_easy_init());
    if (h == nullptr) return Status(StatusCode::kUnavailable, "libcurl could not create a handle");
    const std::string where = what + " '" + MediaUrlForMessage(url) + "'";
    Hop hop;
    hop.fetcher = this;
    hop.control = &control;
    hop.curl = h.get();
    hop.max_bytes = options.max_bytes;
    if (hop.Stopped()) return Status(hop.stopped.code(), where + ": " + hop.stopped.message());
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return TimedOut(where, request_bound);
    Configure(h.get(), url, hop, static_cast<long>(left));
    const CURLcode rc = curl_easy_perform(h.get());
    if (!hop.refused.empty()) {
      return Status(StatusCode::kPermissionDenied,
                    where + " resolves to " + hop.refused +
                        ", which this server does not fetch from (public addresses only, unless allowed by flag)");
    }
    if (!hop.stopped.ok()) return Status(hop.stopped.code(), where + ": " + hop.stopped.message());
    if (hop.over || rc == CURLE_FILESIZE_EXCEEDED) {
      return ResourceExhausted(where + " is over " + std::to_string(options.max_bytes) + " bytes");
    }
    if (rc == CURLE_OPERATION_TIMEDOUT) return TimedOut(where, request_bound);
    if (rc != CURLE_OK && !hop.not_2xx) return Status(StatusCode::kUnavailable, where + ": " + curl_easy_strerror(rc));
    return Answer(h.get(), where, std::move(hop.body), next);
  }

  static Status TimedOut(const std::string& where, bool request_bound) {
    if (request_bound) return Status(StatusCode::kDeadlineExceeded, where + ": the request's fetch deadline passed");
    return Status(StatusCode::kUnavailable, where + ": the fetch timed out");
  }

  // The body of a 2xx answer, the target of a redirect (into `next`), or
  // the error of any other status.
  static StatusOr<std::string> Answer(CURL* c, const std::string& where, std::string body, std::string& next) {
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    if (code >= 300 && code < 400) {
      char* location = nullptr;
      curl_easy_getinfo(c, CURLINFO_REDIRECT_URL, &location);
      if (location != nullptr) {
        next = location;
        return std::string();
      }
    }
    if (code < 200 || code >= 300) {
      return Status(StatusCode::kUnavailable, where + " answered HTTP " + std::to_string(code));
    }
    return body;
  }
};

StatusOr<std::unique_ptr<MediaFetcher>> MediaFetcher::Create(MediaFetchOptions options) {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (options.max_bytes <= 0 || options.timeout.count() <= 0 || options.max_redirects < 0) {
    return InvalidArgument("media fetch: max_bytes and timeout must be > 0 and max_redirects >= 0");
  }
  auto impl = std::make_unique<Impl>();
  for (const std::string& n : options.allowed_networks) {
    StatusOr<internal::Cidr> c = internal::ParseCidr(n);
    if (!c.ok()) return InvalidArgument("allowed media networks: " + c.status().message());
    impl->networks.push_back(*c);
  }
  impl->options = std::move(options);
  return std::unique_ptr<MediaFetcher>(new MediaFetcher(std::move(impl)));
}

MediaFetcher::MediaFetcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MediaFetcher::~MediaFetcher() = default;

StatusOr<std::string> MediaFetcher::Fetch(const std::string& url) const { return Fetch(url, FetchControl{}); }

StatusOr<std::string> MediaFetcher::Fetch(const std::string& url, const FetchControl& control) const {
  const Clock::time_point own = Clock::now() + impl_->options.timeout;
  const bool request_bound = control.deadline < own;
  const Clock::time_point deadline = request_bound ? control.deadline : own;
  std::string current = url;
  for (int hop = 0;; ++hop) {
    const std::string what =
        hop == 0 ? "the media URL" : "redirect " + std::to_string(hop) + " of '" + MediaUrlForMessage(url) + "' to";
    if (Status s = impl_->CheckUrl(current, what); !s.ok()) return s;
    std::string next;
    StatusOr<std::string> body = impl_->Get(current, what, control, deadline, request_bound, next);
    if (!body.ok() || next.empty()) return body;
    if (hop + 1 > impl_->options.max_redirects) {
      return Status(StatusCode::kUnavailable, "the media URL '" + MediaUrlForMessage(url) + "' redirects more than " +
                                                  std::to_string(impl_->options.max_redirects) + " times");
    }
    current = std::move(next);
  }
}

}  // namespace epd
