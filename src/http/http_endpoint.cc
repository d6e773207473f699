// HttpEndpoint: Start binds and starts the I/O thread and the handler pool;
// the connections are Sessions (http_session.h); this file holds what they
// share: routes, error pages, the handler call, the body budget, Stop.
#include "epd/http/http_endpoint.h"

#include <algorithm>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cctype>
#include <cstdio>
#include <limits>
#include <utility>

#include "endpoint_impl.h"
#include "http_session.h"
#include "tls_context.h"

namespace epd {
namespace {

namespace asio = boost::asio;
using boost::system::error_code;

// The length of the valid UTF-8 sequence at s[i] (RFC 3629: no overlong
// forms, no surrogates, at most U+10FFFF), or 0.
std::size_t ValidUtf8SequenceAt(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  std::size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(1) < lo || b(1) > hi) return 0;
  for (std::size_t k = 2; k < n; ++k) {
    if (b(k) < 0x80 || b(k) > 0xBF) return 0;
  }
  return n;
}

}  // namespace

std::string Utf8Safe(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = ValidUtf8SequenceAt(s, i);
    if (n == 0) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02X", static_cast<unsigned char>(s[i]));
      out += hex;
      ++i;
      continue;
    }
    out.append(s.substr(i, n));
    i += n;
  }
  return out;
}

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
      {"max_body_bytes", o.max_body_bytes},
      {"max_header_bytes", o.max_header_bytes},
      {"min_body_bytes_per_s", o.min_body_bytes_per_s}};
  for (const auto& [name, value] : positive) {
    if (value <= 0)
      return InvalidArgument(std::string("HTTP endpoint: ") + name + " must be > 0, got " + std::to_string(value));
  }
  if (o.max_header_bytes > std::numeric_limits<std::uint32_t>::max())
    return InvalidArgument("HTTP endpoint: max_header_bytes must be < 2^32, got " + std::to_string(o.max_header_bytes));
  if (o.port < 0 || o.port > 65535)
    return InvalidArgument("HTTP endpoint: port must be in [0, 65535], got " + std::to_string(o.port));
  return Status::Ok();
}

// --- Responder -------------------------------------------------------------

HttpResponder::State::~State() {
  if (answered.exchange(true) || ep == nullptr) return;
  ++ep->counters.handler_exceptions;
  std::fprintf(stderr, "epd-encode: HTTP handler returned without answering; answered 500\n");
  asio::post(ep->io, [s = session, page = ep->ErrorPage(500, "internal error: the handler did not answer")] {
    if (auto locked = s.lock()) locked->Deliver(page);
  });
}

void HttpResponder::operator()(HttpResponse response) const {
  if (state_->answered.exchange(true)) return;
  asio::post(state_->ep->io, [s = state_->session, r = std::move(response)]() mutable {
    if (auto locked = s.lock()) locked->Deliver(std::move(r));
  });
}

bool HttpResponder::client_gone() const { return state_->gone->load(); }

std::shared_ptr<const std::atomic<bool>> HttpResponder::client_gone_flag() const { return state_->gone; }

void HttpResponder::Post(std::function<void()> work) const {
  HttpEndpoint::Impl* ep = state_->ep.get();
  const HttpResponder self = *this;
  const bool queued = ep->pool->Submit([ep, self, work = std::move(work)] {
    try {
      work();
    } catch (const std::exception& e) {
      ++ep->counters.handler_exceptions;
      std::fprintf(stderr, "epd-encode: HTTP handler threw: %s\n", Utf8Safe(e.what()).c_str());
      self(ep->ErrorPage(500, std::string("internal error: ") + e.what()));
    }
  });
  if (!queued) (*this)(ep->ErrorPage(503, "the server is shutting down"));
}

// --- Impl ------------------------------------------------------------------

HttpResponse HttpEndpoint::Impl::ErrorPage(int status, const std::string& message) const {
  const std::string safe = Utf8Safe(message);
  if (options.error_page) {
    try {
      return options.error_page(status, safe);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "epd-encode: HTTP error page failed: %s\n", Utf8Safe(e.what()).c_str());
    }
  }
  return HttpResponse{status, "text/plain; charset=utf-8", safe + "\n"};
}

const HttpRoute* HttpEndpoint::Impl::FindRoute(std::string_view method, std::string_view path,
                                               std::string& allow) const {
  const HttpRoute* found = nullptr;
  for (const HttpRoute& r : routes) {
    if (r.path != path) continue;
    allow += (allow.empty() ? "" : ", ") + r.method;
    if (r.method == method) found = &r;
  }
  return found;
}

void HttpEndpoint::Impl::RunHandler(const HttpRoute& route, const HttpRequest& request, const HttpResponder& respond) {
  std::string what;
  try {
    if (route.async_handler) {
      route.async_handler(request, respond);
    } else {
      respond(route.handler(request));
    }
    return;
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "an exception that is not a std::exception";
  }
  ++counters.handler_exceptions;
  std::fprintf(stderr, "epd-encode: HTTP handler for %s %s threw: %s\n", route.method.c_str(), route.path.c_str(),
               Utf8Safe(what).c_str());
  respond(ErrorPage(500, "internal error: " + what));
}

void HttpEndpoint::Impl::BodyBytesReleased(std::int64_t bytes) {
  body_bytes_free += bytes;
  // Oldest first, but a body that fits passes a larger one that does not.
  for (auto it = body_waiters.begin(); it != body_waiters.end() && body_bytes_free > 0;) {
    std::shared_ptr<internal::Session> s = it->lock();
    if (s == nullptr || s->BodyBudgetGranted()) {
      it = body_waiters.erase(it);
    } else {
      ++it;
    }
  }
}

void HttpEndpoint::Impl::Accept() {
  acceptor.async_accept([this](const error_code& ec, asio::ip::tcp::socket socket) {
    if (!acceptor.is_open() || stopping) return;
    if (ec) {  // out of descriptors, say: try again shortly rather than spin
      auto t = std::make_shared<asio::steady_timer>(io, std::chrono::milliseconds(20));
      t->async_wait([this, t](const error_code&) { Accept(); });
      return;
    }
    error_code ignored;
    socket.set_option(asio::ip::tcp::no_delay(true), ignored);
    std::make_shared<internal::Session>(this, std::move(socket))->Start();
    Accept();
  });
}

// --- HttpEndpoint ----------------------------------------------------------

namespace {

Status Listen(HttpEndpoint::Impl& impl) {
  const HttpEndpointOptions& o = impl.options;
  const std::string where = o.host + ":" + std::to_string(o.port);
  error_code ec;
  asio::ip::tcp::resolver resolver(impl.io);
  const auto results = resolver.resolve(
      o.host, std::to_string(o.port), asio::ip::tcp::resolver::passive | asio::ip::tcp::resolver::numeric_service, ec);
  if (ec || results.empty())
    return Status(StatusCode::kUnavailable, "cannot listen for HTTP on " + where + ": " + ec.message());
  const asio::ip::tcp::endpoint at = results.begin()->endpoint();
  // SO_REUSEADDR but not SO_REUSEPORT: a second endpoint on a busy port
  // must fail, not share its traffic.
  if (!impl.acceptor.open(at.protocol(), ec) && !impl.acceptor.set_option(asio::socket_base::reuse_address(true), ec) &&
      !impl.acceptor.bind(at, ec) && !impl.acceptor.listen(asio::socket_base::max_listen_connections, ec)) {
    impl.port = impl.acceptor.local_endpoint().port();
    return Status::Ok();
  }
  return Status(StatusCode::kUnavailable,
                "cannot listen for HTTP on " + where + " (" + ec.message() + "; address in use, or not local?)");
}

}  // namespace

HttpEndpoint::HttpEndpoint(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpEndpoint::~HttpEndpoint() { Stop(); }

StatusOr<std::unique_ptr<HttpEndpoint>> HttpEndpoint::Start(HttpEndpointOptions options,
                                                            std::vector<HttpRoute> routes) {
  if (Status s = ValidateHttpEndpointOptions(options); !s.ok()) return s;
  for (const HttpRoute& r : routes) {
    if (!r.handler == !r.async_handler)
      return InvalidArgument("HTTP endpoint: route " + r.method + " " + r.path + " needs exactly one handler");
  }
  auto impl = std::make_shared<Impl>();
  impl->self = impl;
  StatusOr<internal::SslCtxPtr> tls =
      internal::MakeTlsContext(options.tls_cert_pem, options.tls_key_pem, options.tls_client_ca_pem);
  if (!tls.ok()) return tls.status();
  if (*tls != nullptr) impl->tls = std::make_unique<asio::ssl::context>(tls->release());
  impl->options = std::move(options);
  impl->routes = std::move(routes);
  const std::int64_t limit = impl->options.max_body_bytes;
  impl->body_bytes_free = limit > std::numeric_limits<std::int64_t>::max() / 4 ? limit : 4 * limit;
  if (Status s = Listen(*impl); !s.ok()) return s;
  impl->pool = std::make_unique<internal::HandlerPool>(impl->options.threads);
  impl->work.emplace(impl->io.get_executor());
  impl->Accept();
  impl->io_thread = std::thread([raw = impl.get()] { raw->io.run(); });
  return std::unique_ptr<HttpEndpoint>(new HttpEndpoint(std::move(impl)));
}

int HttpEndpoint::port() const { return impl_->port; }
bool HttpEndpoint::tls() const { return impl_->tls != nullptr; }

HttpEndpointStats HttpEndpoint::Stats() const {
  const internal::EndpointCounters& c = impl_->counters;
  HttpEndpointStats s;
  s.connections = c.connections;
  s.requests = c.requests;
  s.header_timeouts = c.header_timeouts;
  s.idle_closed = c.idle_closed;
  s.evicted = c.evicted;
  s.tls_failures = c.tls_failures;
  s.body_timeouts = c.body_timeouts;
  s.bodies_too_large = c.bodies_too_large;
  s.handler_exceptions = c.handler_exceptions;
  s.clients_gone = c.clients_gone;
  s.parked = c.parked;
  s.open = c.open;
  MutexLock lock(c.mu);
  s.responses = c.responses;
  return s;
}

void HttpEndpoint::Stop() {
  Impl& impl = *impl_;
  MutexLock lock(impl.stop_mu);
  if (impl.stopped) return;
  impl.stopped = true;
  impl.stopping = true;
  asio::post(impl.io, [&impl] {
    error_code ignored;
    impl.acceptor.close(ignored);
    const std::vector<internal::Session*> all(impl.sessions.begin(), impl.sessions.end());
    for (internal::Session* s : all) s->CloseIfWaiting();
  });
  impl.pool->Shutdown();  // the handlers running finish; their answers are posted
  const auto until = internal::HttpClock::now() +
                     std::min<std::chrono::milliseconds>(impl.options.write_timeout, std::chrono::seconds(5));
  while (impl.counters.open > 0 && internal::HttpClock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  asio::post(impl.io, [&impl] {
    const std::vector<internal::Session*> all(impl.sessions.begin(), impl.sessions.end());
    for (internal::Session* s : all) s->Close();
    impl.work.reset();
    impl.io.stop();
  });
  if (impl.io_thread.joinable()) impl.io_thread.join();
}

}  // namespace epd
