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
// A fetch may carry a FetchControl (the request's shared deadline, a
// cancellation flag, a byte-charging callback): see FetchControl below.
//
// Errors (each message names the URL, and the hop when it is a redirect;
// a URL echoed in a message is MediaUrlForMessage's text, valid UTF-8):
//   kPermissionDenied  the policy refused a hop (scheme, domain, an address
//                      and its class, e.g. "127.0.0.1 (loopback)")
//   kResourceExhausted the body is over max_bytes (by Content-Length or as
//                      it streams)
//   kUnavailable       the fetch failed: DNS, connect, TLS, timeout (the
//                      whole fetch, redirects included, has `timeout`), an
//                      HTTP status other than 2xx, more than max_redirects
//   kDeadlineExceeded  FetchControl::deadline passed first (before `timeout`)
//   kCancelled         FetchControl::cancel or ::stop became true
//   (any)              FetchControl::charge refused bytes: its status
//   kInvalidArgument   the URL does not parse, or is not valid UTF-8
// Create: kInvalidArgument for a bad range in allowed_networks or a
// non-positive limit.
//
// Schemes are case-insensitive ("HTTP://" is http). Only 2xx bodies are
// read and charged: a redirect's or an error page's body is not.
//
// Thread safety: Fetch is thread-safe (one curl handle per call); the
// callbacks of one call run on the calling thread only.
// Complexity: one transfer per hop; memory O(body).
//
// Example:
//   auto f = MediaFetcher::Create({});
//   FetchControl c{.deadline = Clock::now() + 5s, .cancel = client_gone,
//                  .charge = [&](int64_t n) { return budget.Take(n); }};
//   StatusOr<std::string> bytes = (*f)->Fetch("https://example.com/a.png", c);
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
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

// What one fetch is bound by besides MediaFetchOptions. Every field is
// optional; a default FetchControl is Fetch(url).
struct FetchControl {
  // Absolute; the fetch ends with kDeadlineExceeded when it passes (the
  // earlier of this and now + MediaFetchOptions::timeout applies). One
  // request's fetches share one deadline.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // When *cancel becomes true the transfer aborts within about a second
  // (curl's progress callback; at once when bytes are flowing) and closes
  // its connection: kCancelled "the client went away". Null = never.
  std::shared_ptr<const std::atomic<bool>> cancel{};
  // A second flag with the same effect, for a caller's own reason to stop
  // (MediaSource: a sibling item failed): kCancelled "stopped". Null = never.
  std::shared_ptr<const std::atomic<bool>> stop{};
  // Called on the fetching thread before each piece of a 2xx body is kept,
  // with its size in bytes (> 0). OK charges them; any other status aborts
  // the fetch with that status (e.g. kResourceExhausted from the in-flight
  // budget) and those bytes count as not charged. The fetcher never
  // uncharges: the caller releases what it charged when it drops the
  // result, success or failure. Must not throw (a throw is kInternal).
  // Empty = no charging.
  std::function<Status(std::int64_t more_bytes)> charge{};
};

class MediaFetcher {
 public:
  static StatusOr<std::unique_ptr<MediaFetcher>> Create(MediaFetchOptions options);
  ~MediaFetcher();
  MediaFetcher(const MediaFetcher&) = delete;
  MediaFetcher& operator=(const MediaFetcher&) = delete;

  // The body of `url` (see the header comment for the errors). Blocks the
  // calling thread until the body, an error, the deadline or a cancel.
  StatusOr<std::string> Fetch(const std::string& url) const;
  StatusOr<std::string> Fetch(const std::string& url, const FetchControl& control) const;

  struct Impl;

 private:
  explicit MediaFetcher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// `url` as an error message may echo it: valid UTF-8 whatever the input
// (each byte that is not part of a valid UTF-8 sequence, and each control
// character, as \xHH), at most `max_bytes` of the input (cut on a
// character boundary, then "..."). O(size).
std::string MediaUrlForMessage(std::string_view url, std::size_t max_bytes = 256);

// The offset of the first byte of `text` that is not valid UTF-8 (overlong
// forms, surrogates and code points past U+10FFFF are invalid, as is a
// sequence cut at the end), or npos. O(size).
std::size_t FirstInvalidUtf8(std::string_view text);

}  // namespace epd
