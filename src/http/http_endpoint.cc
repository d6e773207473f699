// HttpEndpoint: httplib parses and routes, ConnectionPark (connection_park.h)
// owns the connections. ParkingServer is the seam between the two: httplib's
// accept thread hands each socket to process_and_close_socket, which parks
// it instead of serving it; a pool thread later serves one request at a time
// through httplib's process_request on a ConnStream (connection.h).
#include "epd/http/http_endpoint.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <utility>

#include "connection_park.h"
#include "tls_context.h"

namespace epd {
namespace internal {
namespace {

// The request a pool thread is serving, for the error handler (which gets
// only httplib's Request and Response): a read that timed out is a 408.
thread_local const ConnStream* t_stream = nullptr;

}  // namespace

// httplib's queue for accepted sockets: the task parks the socket, which
// takes microseconds, so it runs on the accept thread itself. It and
// ParkingServer sit outside the anonymous namespace, since
// HttpEndpoint::Impl (external linkage) holds a ParkingServer.
class InlineQueue final : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

class ParkingServer final : public httplib::Server {
 public:
  ParkingServer() {
    new_task_queue = [] { return new InlineQueue; };
  }
  void set_park(ConnectionPark* park) { park_ = park; }
  // httplib listens with a backlog of 5: a burst of connects (a proxy's
  // pool opening, a scrape beside many idle clients) would see SYNs dropped
  // and retried a second later. listen() again raises it (Linux).
  void RaiseBacklog() { ::listen(svr_sock_, SOMAXCONN); }

  // One request of `c`; true when the connection stays open.
  bool ServeOne(Connection& c, HttpClock::time_point read_deadline, std::chrono::milliseconds write_timeout,
                bool last) {
    ConnStream s(c, read_deadline, write_timeout);
    t_stream = &s;
    bool closed = false;
    const bool ok = process_request(s, last, closed, [](httplib::Request&) {});
    t_stream = nullptr;
    return ok && !closed && !last;
  }

 private:
  bool process_and_close_socket(socket_t sock) override {
    park_->Admit(sock);
    return true;
  }
  ConnectionPark* park_ = nullptr;
};

namespace {

std::string Reason(int status) {
  static const std::map<int, std::string> kReasons = {{400, "Bad Request"},
                                                      {401, "Unauthorized"},
                                                      {404, "Not Found"},
                                                      {405, "Method Not Allowed"},
                                                      {408, "Request Timeout"},
                                                      {413, "Payload Too Large"},
                                                      {431, "Request Header Fields Too Large"}};
  const auto it = kReasons.find(status);
  return it == kReasons.end() ? "Error" : it->second;
}

std::string EscapeRegex(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(ch) != std::string_view::npos) out += '\\';
    out += ch;
  }
  return out;
}

std::string Seconds(std::chrono::milliseconds d) {
  std::string s = std::to_string(static_cast<double>(d.count()) / 1000.0);
  s.erase(s.find_last_not_of('0') + 1);
  if (s.back() == '.') s.pop_back();
  return s + " s";
}

}  // namespace
}  // namespace internal

std::optional<std::string> HttpRequest::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k.size() == name.size() && std::equal(k.begin(), k.end(), name.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
        })) {
      return v;
    }
  }
  return std::nullopt;
}

Status ValidateHttpEndpointOptions(const HttpEndpointOptions& o) {
  const std::pair<const char*, std::int64_t> positive[] = {
      {"threads", o.threads},
      {"max_idle_connections", o.max_idle_connections},
      {"max_requests_per_connection", o.max_requests_per_connection},
      {"header_timeout (ms)", o.header_timeout.count()},
      {"idle_timeout (ms)", o.idle_timeout.count()},
      {"body_timeout (ms)", o.body_timeout.count()},
      {"write_timeout (ms)", o.write_timeout.count()},
      {"max_body_bytes", o.max_body_bytes}};
  for (const auto& [name, value] : positive) {
    if (value <= 0)
      return InvalidArgument(std::string("HTTP endpoint: ") + name + " must be > 0, got " + std::to_string(value));
  }
  if (o.port < 0 || o.port > 65535)
    return InvalidArgument("HTTP endpoint: port must be in [0, 65535], got " + std::to_string(o.port));
  return Status::Ok();
}

struct HttpEndpoint::Impl {
  HttpEndpointOptions options;
  std::vector<HttpRoute> routes;
  internal::SslCtxPtr tls;
  internal::ParkingServer server;
  std::unique_ptr<internal::ConnectionPark> park;
  std::thread listener;
  int port = 0;
  std::mutex stop_mu;
  bool stopped = false;  // guarded by stop_mu

  HttpResponse ErrorPage(int status, const std::string& message) const {
    if (options.error_page) return options.error_page(status, message);
    return HttpResponse{status, "text/plain; charset=utf-8", message + "\n"};
  }

  static void Write(const HttpResponse& r, httplib::Response& res) {
    res.status = r.status;
    for (const auto& [k, v] : r.headers) res.set_header(k, v);
    res.set_content(r.body, r.content_type);
  }

  // The page httplib (or the park) answers with when no handler ran.
  HttpResponse HttplibError(const httplib::Request& req, int status) const {
    if (status == 400 && internal::t_stream != nullptr && internal::t_stream->timed_out()) {
      return ErrorPage(408, "the request body did not arrive within " + internal::Seconds(options.body_timeout));
    }
    switch (status) {
      case 404:
        return ErrorPage(404, "no route for " + req.method + " " + req.path);
      case 413:
        return ErrorPage(413, "the request body is over " + std::to_string(options.max_body_bytes) + " bytes");
      case 400:
        return ErrorPage(400, "malformed HTTP request (request line, headers or body framing)");
      default:
        return ErrorPage(status, "HTTP " + std::to_string(status) + " " + internal::Reason(status));
    }
  }

  void Dispatch(const std::string& path, const httplib::Request& req, httplib::Response& res) const {
    const HttpRoute* route = nullptr;
    std::string allow;
    for (const HttpRoute& r : routes) {
      if (r.path != path) continue;
      allow += (allow.empty() ? "" : ", ") + r.method;
      if (r.method == req.method) route = &r;
    }
    if (route == nullptr) {
      HttpResponse page = ErrorPage(405, req.method + " is not allowed on " + path + "; use " + allow);
      page.headers.emplace_back("Allow", allow);
      return Write(page, res);
    }
    HttpRequest in;
    in.method = req.method;
    in.path = req.path;
    for (const auto& [k, v] : req.headers) in.headers.emplace_back(k, v);
    in.body = req.body;
    in.remote_ip = req.remote_addr;
    in.remote_port = req.remote_port;
    if (route->authenticated && options.authorize) {
      if (Status s = options.authorize(in.Header("Authorization")); !s.ok()) {
        HttpResponse page = ErrorPage(401, s.message());
        page.headers.emplace_back("WWW-Authenticate", "Bearer");
        return Write(page, res);
      }
    }
    Write(route->handler(in), res);
  }

  void Register() {
    std::set<std::string> paths;
    for (const HttpRoute& r : routes) paths.insert(r.path);
    for (const std::string& path : paths) {
      const std::string pattern = internal::EscapeRegex(path);
      auto h = [this, path](const httplib::Request& req, httplib::Response& res) { Dispatch(path, req, res); };
      server.Get(pattern, h).Post(pattern, h).Put(pattern, h).Delete(pattern, h).Patch(pattern, h).Options(pattern, h);
    }
    // httplib calls this for every status >= 400, also when a handler wrote
    // the page itself: only an empty body is httplib's own error.
    server.set_error_handler(httplib::Server::HandlerWithResponse(
        [this](const httplib::Request& req, httplib::Response& res) -> httplib::Server::HandlerResponse {
          if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
          Write(HttplibError(req, res.status), res);
          return httplib::Server::HandlerResponse::Handled;
        }));
    server.set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown exception";
      try {
        std::rethrow_exception(std::move(ep));
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      Write(ErrorPage(500, "internal error: " + what), res);
    });
    server.set_payload_max_length(static_cast<std::size_t>(options.max_body_bytes));
    server.set_keep_alive_max_count(static_cast<std::size_t>(options.max_requests_per_connection));
    // No SO_REUSEPORT (httplib's default sets it): a second endpoint on a
    // busy port must fail, not share its traffic.
    server.set_socket_options([](socket_t sock) {
      const int one = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    });
  }

  bool Serve(internal::Connection& c) {
    const bool last = c.served + 1 >= options.max_requests_per_connection;
    return server.ServeOne(c, internal::HttpClock::now() + options.body_timeout, options.write_timeout, last);
  }

  void Refuse(internal::Connection& c, int status) const {
    std::string message = "the request head is too large";
    if (status == 408) message = "the request head did not arrive within " + internal::Seconds(options.header_timeout);
    if (status == 413) message = "the request body is over " + std::to_string(options.max_body_bytes) + " bytes";
    const HttpResponse page = ErrorPage(status, message);
    c.SendNow("HTTP/1.1 " + std::to_string(status) + " " + internal::Reason(status) +
              "\r\nContent-Type: " + page.content_type + "\r\nContent-Length: " + std::to_string(page.body.size()) +
              "\r\nConnection: close\r\n\r\n" + page.body);
  }
};

HttpEndpoint::HttpEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpEndpoint::~HttpEndpoint() { Stop(); }

StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(HttpEndpointOptions options,
                                                            std::vector<HttpRoute> routes) {
  if (Status s = ValidateHttpEndpointOptions(options); !s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  Impl* self = impl.get();
  StatusOr<internal::SslCtxPtr> tls =
      internal::MakeTlsContext(options.tls_cert_pem, options.tls_key_pem, options.tls_client_ca_pem);
  if (!tls.ok()) return tls.status();
  self->tls = std::move(*tls);
  self->options = std::move(options);
  self->routes = std::move(routes);
  self->Register();
  internal::ConnectionPark::Options po;
  po.header_timeout = self->options.header_timeout;
  po.idle_timeout = self->options.idle_timeout;
  po.threads = self->options.threads;
  po.max_idle = self->options.max_idle_connections;
  po.max_requests_per_connection = self->options.max_requests_per_connection;
  po.max_body_bytes = static_cast<std::uint64_t>(self->options.max_body_bytes);
  po.tls = self->tls.get();
  self->park = std::make_unique<internal::ConnectionPark>(
      po, [self](internal::Connection& c) { return self->Serve(c); },
      [self](internal::Connection& c, int status) { self->Refuse(c, status); });
  self->server.set_park(self->park.get());
  const HttpEndpointOptions& o = self->options;
  const std::string where = o.host + ":" + std::to_string(o.port);
  if (o.port == 0) {
    self->port = self->server.bind_to_any_port(o.host);
  } else {
    self->port = self->server.bind_to_port(o.host, o.port) ? o.port : -1;
  }
  if (self->port <= 0) {
    return Status(StatusCode::kUnavailable,
                  "cannot listen for HTTP on " + where + " (address in use, or not a local address?)");
  }
  self->server.RaiseBacklog();
  if (Status s = self->park->Start(); !s.ok()) return s;
  self->listener = std::thread([self] { self->server.listen_after_bind(); });
  // stop() is a no-op until the accept loop runs: wait for it, so that a
  // Stop right after Start cannot leave the loop running.
  while (!self->server.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return std::unique_ptr<HttpEndpoint>(new HttpEndpoint(std::move(impl)));
}

int HttpEndpoint::port() const { return impl_->port; }
bool HttpEndpoint::tls() const { return impl_->tls != nullptr; }
HttpEndpointStats HttpEndpoint::Stats() const { return impl_->park->Stats(); }

void HttpEndpoint::Stop() {
  std::lock_guard<std::mutex> lock(impl_->stop_mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->server.stop();
  if (impl_->listener.joinable()) impl_->listener.join();
  impl_->park->Stop();
}

}  // namespace epd
