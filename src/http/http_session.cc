// See http_session.h. Every completion handler first checks that the
// session is still in the phase that started the operation: a timer, an
// eviction or Stop may have moved it on (or closed it) meanwhile.
#include "http_session.h"

#include <sys/socket.h>

#include <boost/asio/write.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <cerrno>
#include <limits>

namespace epd::internal {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using boost::system::error_code;
using std::chrono::milliseconds;

constexpr std::size_t kMaxTarget = 8192;
constexpr auto kRateGrace = std::chrono::seconds(1);
constexpr auto kLingerTime = std::chrono::seconds(2);
constexpr std::size_t kLingerBytes = 1 << 20;  // what a refused client may still have in flight
constexpr std::int64_t kBodyStart = 64 << 10;  // a body's first reservation
const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";

std::string Seconds(milliseconds d) {
  std::string s = std::to_string(static_cast<double>(d.count()) / 1000.0);
  s.erase(s.find_last_not_of('0') + 1);
  if (s.back() == '.') s.pop_back();
  return s + " s";
}

bool PeerClosed(const error_code& ec) {
  return ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::error::broken_pipe || ec == asio::ssl::error::stream_truncated;
}

std::string NoNewlines(std::string v) {
  for (char& c : v) {
    if (c == '\r' || c == '\n') c = ' ';
  }
  return v;
}

}  // namespace

Session::Session(HttpEndpoint::Impl* ep, asio::ip::tcp::socket socket)
    : ep_(ep), socket_(std::move(socket)), timer_(ep->io) {
  ep_->sessions.insert(this);
  ++ep_->counters.open;
  ++ep_->counters.connections;
  error_code ec;
  const asio::ip::tcp::endpoint peer = socket_.remote_endpoint(ec);
  if (!ec) {
    asio::ip::address a = peer.address();
    if (a.is_v6() && a.to_v6().is_v4_mapped()) a = asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6());
    remote_ip_ = a.to_string();
    remote_port_ = peer.port();
  }
  if (ep_->tls) tls_ = std::make_unique<asio::ssl::stream<asio::ip::tcp::socket&>>(socket_, *ep_->tls);
}

Session::~Session() {
  Unpark();
  ReleaseBody();
  if (gone_) gone_->store(true);
  ep_->sessions.erase(this);
  --ep_->counters.open;
}

template <class F>
void Session::WithStream(F&& f) {
  if (tls_) {
    f(*tls_);
  } else {
    f(socket_);
  }
}

bool Session::Park(HttpClock::time_point deadline) {
  Unpark();
  parked_ = ep_->park.emplace(deadline, this);
  if (static_cast<std::int64_t>(ep_->park.size()) > ep_->options.max_idle_connections) {
    Session* victim = ep_->park.begin()->second;
    victim->Close(/*count_evicted=*/true);
    if (victim == this) return false;
  }
  ep_->counters.parked = static_cast<std::int64_t>(ep_->park.size());
  return true;
}

void Session::Unpark() {
  if (!parked_) return;
  ep_->park.erase(*parked_);
  parked_.reset();
  ep_->counters.parked = static_cast<std::int64_t>(ep_->park.size());
}

void Session::ArmTimer(HttpClock::time_point when) {
  const std::uint64_t gen = ++timer_gen_;
  timer_.expires_at(when);
  timer_.async_wait([self = shared_from_this(), gen](const error_code& ec) {
    if (!ec && gen == self->timer_gen_) self->OnTimer();
  });
}

void Session::OnTimer() {
  error_code ignored;
  switch (phase_) {
    case Phase::kHandshake:
    case Phase::kHead:
      timed_out_ = true;
      socket_.cancel(ignored);  // the read completes with operation_aborted
      return;
    case Phase::kIdle:
      ++ep_->counters.idle_closed;
      return Close();
    case Phase::kBudget:
      return Refuse(503, "the server holds too many request bodies; this one found no room within " +
                             Seconds(ep_->options.body_timeout));
    case Phase::kBody: {
      const auto now = HttpClock::now();
      const auto received = static_cast<std::int64_t>(parser_->get().body().size());
      const double elapsed = std::chrono::duration<double>(now - body_start_).count();
      const double grace = std::chrono::duration<double>(kRateGrace).count();
      if (now >= body_deadline_) {
        timeout_message_ = "the request body did not arrive within " + Seconds(ep_->options.body_timeout);
      } else if (elapsed > grace && static_cast<double>(received) <
                                        static_cast<double>(ep_->options.min_body_bytes_per_s) * (elapsed - grace)) {
        timeout_message_ = "the request body arrives too slowly: " + std::to_string(received) + " bytes in " +
                           std::to_string(static_cast<int>(elapsed)) + " s; at least " +
                           std::to_string(ep_->options.min_body_bytes_per_s) + " bytes/s are required";
      } else {
        return ArmTimer(std::min(body_deadline_, now + kRateGrace));
      }
      timed_out_ = true;
      socket_.cancel(ignored);
      return;
    }
    case Phase::kWriting:
    case Phase::kLinger:
      return Close();
    default:
      return;
  }
}

void Session::Start() {
  const auto deadline = HttpClock::now() + ep_->options.header_timeout;
  if (!Park(deadline)) return;
  ArmTimer(deadline);
  if (!tls_) return ReadHead(/*first=*/true);
  phase_ = Phase::kHandshake;
  tls_->async_handshake(asio::ssl::stream_base::server, [self = shared_from_this()](const error_code& ec) {
    if (self->phase_ != Phase::kHandshake) return;
    if (ec) {
      if (self->timed_out_) {
        ++self->ep_->counters.header_timeouts;
      } else {
        ++self->ep_->counters.tls_failures;
      }
      return self->Close();
    }
    self->ReadHead(/*first=*/true);
  });
}

void Session::ReadHead(bool first) {
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(ep_->options.max_header_bytes));
  // No body limit while the head is read: the route and the token are
  // answered first (OnHead checks the Content-Length, and sets the limit
  // that bounds a chunked body as it arrives).
  parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
  timed_out_ = false;
  linger_ = false;
  route_ = nullptr;
  auto read_head = [this] {
    phase_ = Phase::kHead;
    WithStream([&](auto& s) {
      http::async_read_header(s, buffer_, *parser_,
                              [self = shared_from_this()](const error_code& ec, std::size_t) { self->OnHead(ec); });
    });
  };
  if (first) return read_head();
  if (buffer_.size() > 0) {  // pipelined: the next head has begun
    const auto deadline = HttpClock::now() + ep_->options.header_timeout;
    if (!Park(deadline)) return;
    ArmTimer(deadline);
    return read_head();
  }
  phase_ = Phase::kIdle;
  const auto idle_until = HttpClock::now() + ep_->options.idle_timeout;
  if (!Park(idle_until)) return;
  ArmTimer(idle_until);
  WithStream([&](auto& s) {
    s.async_read_some(buffer_.prepare(4096),
                      [self = shared_from_this(), read_head](const error_code& ec, std::size_t n) {
                        if (self->phase_ != Phase::kIdle) return;
                        if (ec) return self->Close();
                        self->buffer_.commit(n);
                        const auto deadline = HttpClock::now() + self->ep_->options.header_timeout;
                        if (!self->Park(deadline)) return;
                        self->ArmTimer(deadline);
                        read_head();
                      });
  });
}

void Session::OnHead(error_code ec) {
  if (phase_ != Phase::kHead) return;
  const HttpEndpointOptions& o = ep_->options;
  if (ec) return OnHeadError(ec);
  Unpark();
  ++timer_gen_;
  ++ep_->counters.requests;
  if (!AcceptHead()) return;
  const auto length = parser_->content_length();
  if (length && *length > static_cast<std::uint64_t>(o.max_body_bytes)) {
    ++ep_->counters.bodies_too_large;
    return Refuse(413, "the request body is over " + std::to_string(o.max_body_bytes) + " bytes");
  }
  if (parser_->is_done()) return Dispatch();
  parser_->body_limit(static_cast<std::uint64_t>(o.max_body_bytes));
  // Every body starts small and is charged as it arrives (ReadMore), so slow
  // bodies hold what they sent, not what they announced.
  body_want_ = std::min<std::int64_t>(kBodyStart, o.max_body_bytes);
  phase_ = Phase::kBudget;
  if (!BodyBudgetGranted()) {
    ep_->body_waiters.push_back(weak_from_this());
    ArmTimer(HttpClock::now() + o.body_timeout);
  }
}

void Session::OnHeadError(error_code ec) {
  const HttpEndpointOptions& o = ep_->options;
  if (timed_out_) {
    ++ep_->counters.header_timeouts;
    if (parser_->got_some() || buffer_.size() > 0)
      return Refuse(408, "the request head did not arrive within " + Seconds(o.header_timeout));
    return Close();
  }
  if (ec == http::error::body_limit) {  // a Content-Length over the limit, seen in the head
    ++ep_->counters.bodies_too_large;
    return Refuse(413, "the request body is over " + std::to_string(o.max_body_bytes) + " bytes");
  }
  if (ec == http::error::header_limit)
    return Refuse(431, "the request head is over " + std::to_string(o.max_header_bytes) + " bytes");
  if (PeerClosed(ec) || ec == asio::error::operation_aborted) return Close();
  return Refuse(400, "malformed HTTP request (request line, headers or body framing)");
}

bool Session::AcceptHead() {
  const HttpEndpointOptions& o = ep_->options;
  const auto& req = parser_->get();
  const std::string_view target(req.target().data(), req.target().size());
  const std::string method(req.method_string());
  const std::string path(target.substr(0, target.find('?')));
  auto refuse = [this](int status, const std::string& message,
                       std::vector<std::pair<std::string, std::string>> headers = {}) {
    Refuse(status, message, std::move(headers));
    return false;
  };
  if (target.size() > kMaxTarget)
    return refuse(414, "the request target is " + std::to_string(target.size()) + " bytes; at most " +
                           std::to_string(kMaxTarget) + " are accepted");
  // RFC 9112 6.3: a Transfer-Encoding whose final coding is not chunked
  // leaves the body's length unknown; Beast would read it as empty and take
  // the body's bytes for the next request (a smuggling primitive): 400.
  if (req.find(http::field::transfer_encoding) != req.end() && !parser_->chunked())
    return refuse(400, "a Transfer-Encoding other than chunked leaves the body's length unknown");
  std::string allow;
  route_ = ep_->FindRoute(method, path, allow);
  if (route_ == nullptr && allow.empty()) return refuse(404, "no route for " + method + " " + path);
  if (route_ == nullptr)
    return refuse(405, method + " is not allowed on " + path + "; use " + allow, {{"Allow", allow}});
  if (!route_->authenticated || !o.authorize) return true;
  const auto it = req.find(http::field::authorization);
  std::optional<std::string> auth;
  if (it != req.end()) auth = std::string(it->value());
  Status s = Status::Ok();
  try {
    s = o.authorize(auth);
  } catch (const std::exception& e) {
    s = Status(StatusCode::kUnauthenticated, std::string("the token check failed: ") + e.what());
  }
  if (!s.ok()) return refuse(401, s.message(), {{"WWW-Authenticate", "Bearer"}});
  return true;
}

bool Session::BodyBudgetGranted() {
  if (phase_ != Phase::kBudget) return true;  // no longer waiting
  if (ep_->body_bytes_free < body_want_) return false;
  ep_->body_bytes_free -= body_want_;
  body_reserved_ = body_want_;
  StartBody();
  return true;
}

void Session::ReleaseBody() {
  if (body_reserved_ == 0) return;
  const std::int64_t bytes = body_reserved_;
  body_reserved_ = 0;
  ep_->BodyBytesReleased(bytes);
}

void Session::StartBody() {
  const auto& req = parser_->get();
  const auto it = req.find(http::field::expect);
  if (it == req.end() || !boost::beast::iequals(it->value(), "100-continue")) return ReadBody();
  phase_ = Phase::kBody;
  ArmTimer(HttpClock::now() + ep_->options.write_timeout);
  WithStream([&](auto& s) {
    asio::async_write(s, asio::buffer(kContinue, sizeof(kContinue) - 1),
                      [self = shared_from_this()](const error_code& ec, std::size_t) {
                        if (self->phase_ != Phase::kBody) return;
                        if (ec) return self->Close();
                        self->ReadBody();
                      });
  });
}

void Session::ReadBody() {
  phase_ = Phase::kBody;
  body_start_ = HttpClock::now();
  body_deadline_ = body_start_ + ep_->options.body_timeout;
  ArmTimer(std::min(body_deadline_, body_start_ + kRateGrace));
  ReadMore();
}

void Session::ReadMore() {
  WithStream([&](auto& s) {
    http::async_read_some(s, buffer_, *parser_, [self = shared_from_this()](const error_code& ec, std::size_t) {
      if (self->phase_ != Phase::kBody) return;
      if (ec || self->parser_->is_done()) return self->OnBody(ec);
      if (!self->ChargeArrived()) {
        return self->Refuse(503, "the server holds too many request bodies now; try again later");
      }
      self->ReadMore();
    });
  });
}

bool Session::ChargeArrived() {
  // A body of known length has its string reserved once (its pages are
  // touched as bytes arrive); a chunked body's string grows by doubling, so
  // it counts twice what arrived.
  const std::int64_t factor = parser_->content_length() ? 1 : 2;
  const std::int64_t limit = ep_->options.max_body_bytes;
  const std::int64_t held = std::min(
      factor * static_cast<std::int64_t>(parser_->get().body().size()) + std::min(kBodyStart, limit), factor * limit);
  if (held <= body_reserved_) return true;
  const std::int64_t more = held - body_reserved_;
  if (ep_->body_bytes_free < more) return false;
  ep_->body_bytes_free -= more;
  body_reserved_ += more;
  return true;
}

void Session::OnBody(error_code ec) {
  if (phase_ != Phase::kBody) return;
  ++timer_gen_;
  if (!ec) return Dispatch();
  if (timed_out_) {
    ++ep_->counters.body_timeouts;
    return Refuse(408, timeout_message_);
  }
  if (ec == http::error::body_limit) {
    ++ep_->counters.bodies_too_large;
    return Refuse(413, "the request body is over " + std::to_string(ep_->options.max_body_bytes) + " bytes");
  }
  if (PeerClosed(ec) || ec == asio::error::operation_aborted) return Close();
  Refuse(400, "malformed HTTP request (request line, headers or body framing)");
}

void Session::Dispatch() {
  phase_ = Phase::kServing;
  auto& req = parser_->get();
  keep_alive_ = req.keep_alive() && served_ + 1 < ep_->options.max_requests_per_connection && !ep_->stopping;
  HttpRequest in;
  in.method = std::string(req.method_string());
  const std::string_view target(req.target().data(), req.target().size());
  in.path = std::string(target.substr(0, target.find('?')));
  for (const auto& f : req) in.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
  auto body = std::make_shared<const std::string>(std::move(req.body()));
  in.body = *body;
  in.body_storage = std::move(body);
  in.remote_ip = remote_ip_;
  in.remote_port = remote_port_;
  gone_ = std::make_shared<std::atomic<bool>>(false);
  auto state = std::make_shared<HttpResponder::State>();
  state->ep = ep_->self.lock();
  state->session = weak_from_this();
  state->gone = gone_;
  HttpResponder respond(std::move(state));
  HttpEndpoint::Impl* ep = ep_;
  const HttpRoute* route = route_;
  serving_hold_ = shared_from_this();
  if (!ep_->pool->Submit([ep, route, in = std::move(in), respond] { ep->RunHandler(*route, in, respond); })) {
    respond(ep_->ErrorPage(503, "the server is shutting down"));
  }
  WatchClient();
}

void Session::WatchClient() {
  if (buffer_.size() > 0) return;  // pipelined bytes: the client is there
  watching_ = true;
  socket_.async_wait(asio::ip::tcp::socket::wait_read, [self = shared_from_this()](const error_code& ec) {
    self->watching_ = false;
    if (ec || self->phase_ != Phase::kServing) return;
    char c;
    const ssize_t n = ::recv(self->socket_.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
      self->gone_->store(true);
      ++self->ep_->counters.clients_gone;
    } else if (n < 0) {
      self->WatchClient();  // spurious wake-up
    }
  });
}

void Session::Deliver(HttpResponse response) {
  if (phase_ != Phase::kServing) return;
  const std::shared_ptr<Session> hold = std::move(serving_hold_);
  ReleaseBody();  // answered: the handler is done with the body
  error_code ignored;
  if (watching_) socket_.cancel(ignored);
  Write(std::move(response));
}

void Session::Refuse(int status, const std::string& message, std::vector<std::pair<std::string, std::string>> headers) {
  Unpark();
  ReleaseBody();
  keep_alive_ = false;
  linger_ = true;  // the client may still be sending what was not read
  HttpResponse page = ep_->ErrorPage(status, message);
  for (auto& h : headers) page.headers.push_back(std::move(h));
  Write(std::move(page));
}

void Session::Write(HttpResponse r) {
  phase_ = Phase::kWriting;
  response_.emplace(static_cast<http::status>(r.status), 11);
  response_->set(http::field::server, "epd-encode");
  response_->set(http::field::content_type, NoNewlines(r.content_type));
  for (auto& [k, v] : r.headers) response_->insert(NoNewlines(k), NoNewlines(v));
  response_->body() = std::move(r.body);
  response_->keep_alive(keep_alive_ && !ep_->stopping);
  response_->prepare_payload();
  ep_->counters.CountResponse(r.status);
  ArmTimer(HttpClock::now() + ep_->options.write_timeout);
  WithStream([&](auto& s) {
    http::async_write(s, *response_,
                      [self = shared_from_this()](const error_code& ec, std::size_t) { self->AfterWrite(ec); });
  });
}

void Session::AfterWrite(error_code ec) {
  if (phase_ != Phase::kWriting) return;
  ++timer_gen_;
  response_.reset();
  ReleaseBody();
  if (ec) return Close();
  if (!keep_alive_ || ep_->stopping) {
    if (linger_ && !tls_) return Linger();
    return Close();
  }
  ++served_;
  ReadHead(/*first=*/false);
}

void Session::Linger() {
  if (phase_ != Phase::kLinger) {  // once: stop sending, and bound the drain
    phase_ = Phase::kLinger;
    error_code ignored;
    socket_.shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
    if (!scratch_) scratch_ = std::make_unique<char[]>(4096);
    lingered_ = 0;
    ArmTimer(HttpClock::now() + kLingerTime);
  }
  socket_.async_read_some(asio::buffer(scratch_.get(), 4096),
                          [self = shared_from_this()](const error_code& e, std::size_t n) {
                            if (self->phase_ != Phase::kLinger) return;
                            self->lingered_ += n;
                            if (e || self->lingered_ > kLingerBytes) return self->Close();
                            self->Linger();
                          });
}

void Session::CloseIfWaiting() {
  if (phase_ == Phase::kServing || phase_ == Phase::kWriting) {
    keep_alive_ = false;
    return;
  }
  Close();
}

void Session::Close(bool count_evicted) {
  if (phase_ == Phase::kClosed) return;
  const std::shared_ptr<Session> hold = std::move(serving_hold_);  // `this` lives to the end
  phase_ = Phase::kClosed;
  Unpark();
  ReleaseBody();
  ++timer_gen_;
  error_code ignored;
  timer_.cancel(ignored);
  if (count_evicted) ++ep_->counters.evicted;
  if (gone_) gone_->store(true);
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
}

}  // namespace epd::internal
