// epd/http/media_fetch.h: fetching an image or video named by an http(s)
// URL, with libcurl (Debian's libcurl4-openssl-dev), guarded against
// server-side request forgery.
//
// Every hop is checked, the first and each redirect (followed here, one at
// a time, never by curl itself):
//   1. the scheme is http or https;
//   2. with allowed_domains set, the URL's host is one of them (exact,
//      case-insensitive, as vLLM's --allowed-media-domains);
//   3. every address curl is about to connect to, after DNS resolution
//      (CURLOPT_OPENSOCKETFUNCTION, so the address checked is the address
//      used: no second lookup a DNS rebinding could answer differently), is
//      public unicast, unless allow_private_addresses or it lies in one of
//      allowed_networks (address_policy.h lists the classes refused).
// Proxies from the environment (http_proxy, ...) are not used: through a
// proxy the address checked would be the proxy's. No Accept-Encoding is
// sent, so a small compressed reply cannot inflate past max_bytes.
//
// Errors (each message names the URL, and the hop when it is a redirect):
//   kPermissionDenied  the policy refused a hop (scheme, domain, an address
//                      and its class, e.g. "127.0.0.1 (loopback)")
//   kResourceExhausted the body is over max_bytes (by Content-Length or as
//                      it streams)
//   kUnavailable       the fetch failed: DNS, connect, TLS, timeout (the
//                      whole fetch, redirects included, has `timeout`), an
//                      HTTP status other than 2xx, more than max_redirects
//   kInvalidArgument   the URL does not parse
// Create: kInvalidArgument for a bad range in allowed_networks or a
// non-positive limit.
//
// Thread safety: Fetch is thread-safe (one curl handle per call).
// Complexity: one transfer per hop; memory O(body).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "epd/core/status.h"

namespace epd {

struct MediaFetchOptions {
  std::int64_t max_bytes = std::int64_t{64} << 20;
  std::chrono::milliseconds timeout{10000};  // whole fetch, redirects included
  int max_redirects = 3;
  std::vector<std::string> allowed_domains{};  // empty = any host
  bool allow_private_addresses = false;
  std::vector<std::string> allowed_networks{};  // CIDRs exempt from the refusal, e.g. "10.1.0.0/16"
};

class MediaFetcher {
 public:
  static StatusOr<std::unique_ptr<MediaFetcher>> Create(MediaFetchOptions options);
  ~MediaFetcher();
  MediaFetcher(const MediaFetcher&) = delete;
  MediaFetcher& operator=(const MediaFetcher&) = delete;

  // The body of `url` (see the header comment for the errors).
  StatusOr<std::string> Fetch(const std::string& url) const;

  struct Impl;

 private:
  explicit MediaFetcher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace epd
