// See epd/http/media_fetch.h.
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

// What the callbacks of one hop share.
struct Hop {
  const MediaFetcher::Impl* fetcher = nullptr;
  std::string refused;  // why an address was refused ("" = none was)
  std::string body;
  std::int64_t max_bytes = 0;
  bool over = false;
};

}  // namespace

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

  static size_t Write(char* p, size_t size, size_t n, void* userdata) {
    auto* hop = static_cast<Hop*>(userdata);
    const std::size_t bytes = size * n;
    if (static_cast<std::int64_t>(hop->body.size() + bytes) > hop->max_bytes) {
      hop->over = true;
      return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
    }
    hop->body.append(p, bytes);
    return bytes;
  }

  // The scheme and domain checks of one hop's URL.
  Status CheckUrl(const std::string& url, const std::string& what) const {
    std::unique_ptr<CURLU, UrlDel> u(curl_url());
    if (curl_url_set(u.get(), CURLUPART_URL, url.c_str(), 0) != CURLUE_OK) {
      return InvalidArgument(what + " '" + url + "' is not a URL");
    }
    char* scheme = nullptr;
    char* host = nullptr;
    curl_url_get(u.get(), CURLUPART_SCHEME, &scheme, 0);
    curl_url_get(u.get(), CURLUPART_HOST, &host, 0);
    const std::string s = scheme != nullptr ? Lower(scheme) : "", h = host != nullptr ? Lower(host) : "";
    curl_free(scheme);
    curl_free(host);
    if (s != "http" && s != "https") {
      return Status(StatusCode::kPermissionDenied, what + " '" + url + "' is not http or https");
    }
    if (!options.allowed_domains.empty() && std::none_of(options.allowed_domains.begin(), options.allowed_domains.end(),
                                                         [&](const std::string& d) { return Lower(d) == h; })) {
      return Status(StatusCode::kPermissionDenied,
                    what + " '" + url + "': the host '" + h + "' is not among the allowed media domains");
    }
    return Status::Ok();
  }

  // One request; `next` gets the redirect target when the answer is a redirect.
  StatusOr<std::string> Get(const std::string& url, const std::string& what, Clock::time_point deadline,
                            std::string& next) const {
    std::unique_ptr<CURL, CurlDel> h(curl_easy_init());
    if (h == nullptr) return Status(StatusCode::kUnavailable, "libcurl could not create a handle");
    Hop hop;
    hop.fetcher = this;
    hop.max_bytes = options.max_bytes;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Status(StatusCode::kUnavailable, what + " '" + url + "': the fetch timed out");
    CURL* c = h.get();
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROXY, "");
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(left));
    curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(options.max_bytes));
    curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, &Impl::OpenSocket);
    curl_easy_setopt(c, CURLOPT_OPENSOCKETDATA, &hop);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &Impl::Write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &hop);
    const std::string agent = std::string("epd-encode/") + std::string(kVersion);
    curl_easy_setopt(c, CURLOPT_USERAGENT, agent.c_str());
    const CURLcode rc = curl_easy_perform(c);
    const std::string where = what + " '" + url + "'";
    if (!hop.refused.empty()) {
      return Status(StatusCode::kPermissionDenied,
                    where + " resolves to " + hop.refused +
                        ", which this server does not fetch from (public addresses only, unless allowed by flag)");
    }
    if (hop.over || rc == CURLE_FILESIZE_EXCEEDED) {
      return ResourceExhausted(where + " is over " + std::to_string(options.max_bytes) + " bytes");
    }
    if (rc != CURLE_OK) return Status(StatusCode::kUnavailable, where + ": " + curl_easy_strerror(rc));
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
    return std::move(hop.body);
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

StatusOr<std::string> MediaFetcher::Fetch(const std::string& url) const {
  const Clock::time_point deadline = Clock::now() + impl_->options.timeout;
  std::string current = url;
  for (int hop = 0;; ++hop) {
    const std::string what = hop == 0 ? "the media URL" : "redirect " + std::to_string(hop) + " of '" + url + "' to";
    if (Status s = impl_->CheckUrl(current, what); !s.ok()) return s;
    std::string next;
    StatusOr<std::string> body = impl_->Get(current, what, deadline, next);
    if (!body.ok() || next.empty()) return body;
    if (hop + 1 > impl_->options.max_redirects) {
      return Status(StatusCode::kUnavailable, "the media URL '" + url + "' redirects more than " +
                                                  std::to_string(impl_->options.max_redirects) + " times");
    }
    current = std::move(next);
  }
}

}  // namespace epd
