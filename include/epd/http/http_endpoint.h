// epd/http/http_endpoint.h: an event-driven HTTP/1.1 server on Boost.Beast
// (Debian's Boost 1.74) for the OpenAI front and the /metrics port.
//
// One I/O thread reads and writes every connection without blocking; a
// pool of `threads` threads runs the handlers. No thread ever waits on one
// client's bytes: a silent, trickling or slow connection costs a socket and
// a few kilobytes, never a thread. Per connection:
//   - the head (request line and headers) must arrive within
//     `header_timeout` of the accept (the TLS handshake included), or of its
//     first byte between keep-alive requests; a kept-alive connection idle
//     for `idle_timeout` is closed. Heads over `max_header_bytes` get 431.
//   - the route, the method and the bearer token are checked from the head,
//     before any byte of the body is read (404, 405, 401);
//   - the body, whatever its framing (Content-Length or chunked), is
//     bounded by `max_body_bytes` as it arrives (413), must arrive within
//     `body_timeout` and, after its first second, at `min_body_bytes_per_s`
//     on average (408 otherwise);
//   - at most `max_idle_connections` connections wait for a head; one more
//     closes the one nearest its deadline (counted as evicted);
//   - the bodies held at once are bounded by 4 x `max_body_bytes`, until
//     their request is answered: a body reserves 64 KiB before it is read
//     (waiting up to `body_timeout` for room, then 503) and is charged as
//     it arrives (a chunked one twice its bytes, for its buffer's growth);
//     503 when the budget has no room for what arrived.
// A refusal sent before the body was read closes the connection after a
// short lingering read (at most 2 s and 1 MiB, discarded), so the client
// reads the answer rather than a reset.
//
// Pages. Every page the endpoint builds (`error_page`) gets a message that
// is valid UTF-8, whatever bytes the request held (Utf8Safe). A handler
// that throws is answered 500, counted in `handler_exceptions` and logged to
// stderr; the process never terminates because of a request. Every status
// sent is counted in HttpEndpointStats::responses.
//
// Handlers. A route has a synchronous `handler` (runs on a pool thread and
// returns the response) or an `async_handler` (runs on a pool thread and
// answers later, from any thread, through its HttpResponder; a responder
// dropped unanswered is answered 500). A responder also tells whether the
// client has gone (the connection closed while its request was served), so
// long work can be cancelled.
//
// TLS: with a certificate and key (PEM text), every connection is TLS 1.2+
// (OpenSSL); with a client CA too, a client certificate signed by it is
// required during the handshake.
//
// Errors of Start: kInvalidArgument for bad options (naming them) or PEM
// that does not parse / a key that is not the certificate's; kUnavailable
// when host:port cannot be bound.
//
// Thread safety: Start, Stop and Stats are thread-safe; handlers run
// concurrently (up to `threads` at once) and must be thread-safe. Stop()
// (also the destructor) stops accepting, closes idle and reading
// connections, lets the handlers already running finish and writes their
// answers (for up to `write_timeout`), then joins every thread. Responders
// outlive the endpoint safely: an answer after Stop is dropped.
// Design and the comparison with libmicrohttpd: docs/SERVER.md, "HTTP edge".
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "epd/core/status.h"

namespace epd {

struct HttpRequest {
  std::string method;  // "GET", "POST", ... (as sent; checked against the routes)
  std::string path;    // without the query string, as sent (not percent-decoded)
  // Header names as sent; look them up with Header(), which ignores case.
  std::vector<std::pair<std::string, std::string>> headers;
  // The body. It stays valid while any copy of this request lives (the
  // bytes are co-owned by `body_storage`), so an async handler may keep a
  // copy of the request.
  std::string_view body;
  std::shared_ptr<const std::string> body_storage{};
  std::string remote_ip;  // "127.0.0.1", "::1"
  int remote_port = 0;
  // The first header called `name` (any case), or nullopt.
  std::optional<std::string> Header(std::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers{};  // extra headers
};

// The one answer of an async request. Copyable; every copy answers the same
// request, and only the first answer counts. Thread-safe.
class HttpResponder {
 public:
  struct State;
  explicit HttpResponder(std::shared_ptr<State> state) : state_(std::move(state)) {}
  // Sends `response` (later calls are ignored; after Stop, dropped).
  void operator()(HttpResponse response) const;
  // True once the client closed its connection while its request was served.
  bool client_gone() const;
  // The same, as a flag another component can poll (e.g. a fetch to abort).
  std::shared_ptr<const std::atomic<bool>> client_gone_flag() const;
  // Runs `work` on the endpoint's handler pool (e.g. the part of a request
  // that follows a fetch); dropped after Stop, which answers 503.
  void Post(std::function<void()> work) const;

 private:
  std::shared_ptr<State> state_;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;
using HttpAsyncHandler = std::function<void(const HttpRequest&, HttpResponder)>;

struct HttpRoute {
  std::string method;  // "GET" or "POST"
  std::string path;    // exact match
  bool authenticated = true;
  HttpHandler handler;                       // set this one,
  HttpAsyncHandler async_handler = nullptr;  // or this one
};

struct HttpEndpointOptions {
  std::string host = "127.0.0.1";  // a numeric address or a host name
  int port = 0;                    // 0 = a free port (see port())
  // TLS, as PEM text (not paths); both empty = plaintext.
  std::string tls_cert_pem{}, tls_key_pem{}, tls_client_ca_pem{};
  // Checks the Authorization header (nullopt = absent) of authenticated
  // routes, from the head, before the body is read; a non-OK status is
  // answered 401 with its message. Null = no check. Called on the I/O
  // thread: it must be quick and must not block.
  std::function<Status(const std::optional<std::string>&)> authorize{};
  int threads = 8;                  // handlers run at once (>= 1)
  int max_idle_connections = 1024;  // connections waiting for a head (>= 1)
  int max_requests_per_connection = 1000;
  std::chrono::milliseconds header_timeout{10000};  // accept (or first byte) to a complete head, handshake included
  std::chrono::milliseconds idle_timeout{5000};     // keep-alive: idle this long after a response = closed
  std::chrono::milliseconds body_timeout{30000};    // end of the head to the end of the body
  std::chrono::milliseconds write_timeout{30000};   // a response not written within this ends the connection
  std::int64_t max_body_bytes = std::int64_t{64} << 20;
  std::int64_t max_header_bytes = 16 << 10;  // request line and headers
  // After the body's first second, a body arriving slower than this on
  // average is answered 408 (a slow-body client holds nothing but its
  // socket meanwhile; this bounds how long).
  std::int64_t min_body_bytes_per_s = 16 << 10;
  // Builds every error page the endpoint sends itself (400, 401, 404, 405,
  // 408, 413, 414, 431, 500, 503): the status, and a sentence saying what
  // was wrong (valid UTF-8). Null = text/plain. If it throws, a text/plain
  // page is sent instead.
  std::function<HttpResponse(int status, const std::string& message)> error_page{};
};

// Counters since Start (monotonic, but the gauges).
struct HttpEndpointStats {
  std::uint64_t connections = 0;             // accepted
  std::uint64_t requests = 0;                // complete heads
  std::uint64_t header_timeouts = 0;         // closed waiting for a head (silent or trickling)
  std::uint64_t idle_closed = 0;             // keep-alive connections closed by idle_timeout
  std::uint64_t evicted = 0;                 // closed because too many waited for a head
  std::uint64_t tls_failures = 0;            // handshakes that failed
  std::uint64_t body_timeouts = 0;           // bodies too slow (body_timeout or the minimum rate): 408
  std::uint64_t bodies_too_large = 0;        // 413, by Content-Length or as a body streamed
  std::uint64_t handler_exceptions = 0;      // handlers that threw (answered 500)
  std::uint64_t clients_gone = 0;            // connections closed by the client while served
  std::int64_t parked = 0;                   // waiting for a head now (a gauge)
  std::int64_t open = 0;                     // open connections now (a gauge)
  std::map<int, std::uint64_t> responses{};  // every response sent, by status
};

class HttpEndpoint {
 public:
  static StatusOr<std::unique_ptr<HttpEndpoint>> Start(HttpEndpointOptions options, std::vector<HttpRoute> routes);
  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  int port() const;  // the bound port
  bool tls() const;
  HttpEndpointStats Stats() const;
  // See the header comment. Idempotent.
  void Stop();

  struct Impl;

 private:
  explicit HttpEndpoint(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

// Validates the timeouts and sizes of `o` (all > 0): kInvalidArgument
// naming the first that is not. Start calls it.
Status ValidateHttpEndpointOptions(const HttpEndpointOptions& o);

// `s` with every byte that is not part of a valid UTF-8 sequence replaced
// by "\xNN" (its hex), so a message that quotes a request's bytes is valid
// UTF-8 and still shows them. O(|s|).
std::string Utf8Safe(std::string_view s);

}  // namespace epd
