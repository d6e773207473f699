// epd/http/http_endpoint.h: an HTTP/1.1 server on cpp-httplib (Debian's
// libcpp-httplib) whose idle connections hold no thread.
//
// Both HTTP ends of epd-encode serve through it: the Prometheus /metrics
// endpoint (src/server/metrics.cc) and the OpenAI-compatible front
// (epd/openai/openai_front.h). httplib parses requests, routes them and
// writes responses; what this class adds is how connections wait.
//
// Connections. httplib's own server hands every accepted connection to a
// pool thread, which then waits on the socket for the request (and, with
// keep-alive, for the next one): N silent connections hold N threads, so 16
// idle TCP connections once made every scrape of the old responder wait
// seconds (issue 27, fault 6). Here a connection waits in a *park* instead:
// one epoll thread holds every connection that has no complete request head
// yet, fresh or idle between keep-alive requests, reading what arrives
// without blocking (and doing the TLS handshake) until the head is complete
// ("\r\n\r\n"). Only then does a pool thread (`threads` of them) take it,
// read the body and run the handler. So:
//   - an idle or silent connection costs a file descriptor and a few hundred
//     bytes, never a thread: a scrape is answered beside 200 idle
//     connections as fast as beside none;
//   - a trickled head (slow-loris) costs nothing either: it is closed at
//     `header_timeout` from accept (or from its first byte, between
//     keep-alive requests), with 408 when some of it had arrived;
//   - a trickled body does hold a pool thread, for at most `body_timeout`
//     (then 408);
//   - at most `max_idle_connections` wait in the park; one more closes the
//     one that has waited longest.
//
// Requests. A route is (method, path, handler). Unknown paths get 404, a
// known path with another method 405; an authenticated route checks the
// Authorization header with `authorize` first (401 with
// "WWW-Authenticate: Bearer" on a refusal); a body over `max_body_bytes`
// gets 413 before it is read. Every error page, httplib's own included, is
// built by `error_page`, so each endpoint answers errors in its format (the
// OpenAI front in OpenAI JSON, /metrics in text).
//
// TLS: with a certificate and key (PEM text), every connection is TLS
// (OpenSSL, TLS 1.2 or later); with a client CA too, a client certificate
// signed by it is required during the handshake. httplib's SSLServer is not
// used: it does the handshake and keep-alive waits on a pool thread, which
// is the fault above; the park does the handshake instead.
//
// Errors of Start: kInvalidArgument for bad options (naming them) or PEM
// that does not parse / a key that is not the certificate's; kUnavailable
// when host:port cannot be bound.
//
// Thread safety: Start, Stop and Stats are thread-safe; handlers run on the
// pool threads, concurrently (up to `threads` at once) and must be
// thread-safe. Stop() (also the destructor) stops accepting, closes the
// parked connections, lets requests being served finish, and joins the
// threads; a handler must therefore return (none may wait on Stop).
//
// Example:
//   epd::HttpEndpointOptions o;
//   o.port = 0;
//   auto ep = epd::HttpEndpoint::Start(o, {{"GET", "/health", false,
//       [](const epd::HttpRequest&) { return epd::HttpResponse{200, "text/plain", "ok\n"}; }}});
//   std::printf("port %d\n", (*ep)->port());
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "epd/core/status.h"

namespace epd {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // without the query string
  // Header names as sent; look them up with Header(), which ignores case.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string_view body;  // valid for the handler's call only
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

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

struct HttpRoute {
  std::string method;  // "GET" or "POST"
  std::string path;    // exact match
  bool authenticated = true;
  HttpHandler handler;
};

struct HttpEndpointOptions {
  std::string host = "127.0.0.1";  // a numeric address or a host name
  int port = 0;                    // 0 = a free port (see port())
  // TLS, as PEM text (not paths); both empty = plaintext.
  std::string tls_cert_pem{}, tls_key_pem{}, tls_client_ca_pem{};
  // Checks the Authorization header (nullopt = absent) of authenticated
  // routes; a non-OK status is answered 401 with its message. Null = no
  // check. Called on pool threads.
  std::function<Status(const std::optional<std::string>&)> authorize{};
  int threads = 8;                  // requests served at once (>= 1)
  int max_idle_connections = 1024;  // connections waiting in the park (>= 1)
  int max_requests_per_connection = 1000;
  std::chrono::milliseconds header_timeout{10000};  // accept (or first byte) to a complete head, handshake included
  std::chrono::milliseconds idle_timeout{5000};     // keep-alive: idle this long after a response = closed
  std::chrono::milliseconds body_timeout{30000};    // end of the head to the end of the body
  std::chrono::milliseconds write_timeout{30000};   // a response write blocked this long ends the connection
  std::int64_t max_body_bytes = std::int64_t{64} << 20;
  // Builds every error page (404, 405, 401, 408, 413, httplib's 400): the
  // status, and a sentence saying what was wrong. Null = text/plain.
  std::function<HttpResponse(int status, const std::string& message)> error_page{};
};

// Counters since Start (monotonic).
struct HttpEndpointStats {
  std::uint64_t connections = 0;      // accepted
  std::uint64_t requests = 0;         // handed to httplib (complete heads)
  std::uint64_t header_timeouts = 0;  // closed waiting for a head (silent or trickling)
  std::uint64_t idle_closed = 0;      // keep-alive connections closed by idle_timeout
  std::uint64_t evicted = 0;          // closed because the park was full
  std::uint64_t tls_failures = 0;     // handshakes that failed
  std::int64_t parked = 0;            // waiting in the park now (a gauge)
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
  explicit HttpEndpoint(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Validates the timeouts and sizes of `o` (all > 0): kInvalidArgument
// naming the first that is not. Start calls it.
Status ValidateHttpEndpointOptions(const HttpEndpointOptions& o);

}  // namespace epd
