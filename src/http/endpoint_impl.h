// src/http/endpoint_impl.h (internal): the state an HttpEndpoint's
// connections share (epd/http/http_endpoint.h). The I/O thread owns the
// acceptor, the park (connections waiting for a head, by deadline), the
// body budget and every Session; the counters are read from any thread.
#pragma once

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <unordered_set>

#include "epd/core/mutex.h"
#include "epd/http/http_endpoint.h"
#include "handler_pool.h"

namespace epd::internal {

using HttpClock = std::chrono::steady_clock;
class Session;

// Counters, written on the I/O thread (responses also from Stop).
struct EndpointCounters {
  std::atomic<std::uint64_t> connections{0}, requests{0}, header_timeouts{0}, idle_closed{0}, evicted{0},
      tls_failures{0}, body_timeouts{0}, bodies_too_large{0}, handler_exceptions{0}, clients_gone{0};
  std::atomic<std::int64_t> parked{0}, open{0};
  mutable Mutex mu;
  std::map<int, std::uint64_t> responses EPD_GUARDED_BY(mu);

  void CountResponse(int status) {
    MutexLock lock(mu);
    ++responses[status];
  }
};

}  // namespace epd::internal

namespace epd {

struct HttpEndpoint::Impl {
  HttpEndpointOptions options;
  std::vector<HttpRoute> routes;
  internal::EndpointCounters counters;
  std::atomic<bool> stopping{false};
  Mutex stop_mu;
  bool stopped EPD_GUARDED_BY(stop_mu) = false;
  int port = 0;
  std::weak_ptr<Impl> self;  // for the responders, which may outlive the endpoint

  // I/O thread only.
  std::multimap<internal::HttpClock::time_point, internal::Session*> park;
  std::unordered_set<internal::Session*> sessions;
  std::int64_t body_bytes_free = 0;  // the body budget: 4 x max_body_bytes
  std::deque<std::weak_ptr<internal::Session>> body_waiters;

  std::unique_ptr<internal::HandlerPool> pool;
  std::unique_ptr<boost::asio::ssl::context> tls;  // null = plaintext
  // Last, so that it goes first: destroying it destroys the sessions its
  // pending handlers own, which still use the members above.
  boost::asio::io_context io{1};
  boost::asio::ip::tcp::acceptor acceptor{io};
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
  std::thread io_thread;

  // The page for an error the endpoint answers itself; `message` is made
  // valid UTF-8 first, and a throwing error_page falls back to text/plain.
  HttpResponse ErrorPage(int status, const std::string& message) const;
  // The route for (method, path): the route, or null with `allow` set to
  // the methods that path has ("" = no such path).
  const HttpRoute* FindRoute(std::string_view method, std::string_view path, std::string& allow) const;
  // Runs a route's handler for `request` (on a pool thread), answering
  // through `respond`; exceptions become a counted, logged 500.
  void RunHandler(const HttpRoute& route, const HttpRequest& request, const HttpResponder& respond);
  void Accept();
  void BodyBytesReleased(std::int64_t bytes);
};

// The shared state behind every copy of one request's HttpResponder.
struct HttpResponder::State {
  std::shared_ptr<HttpEndpoint::Impl> ep;
  std::weak_ptr<internal::Session> session;
  std::shared_ptr<std::atomic<bool>> gone = std::make_shared<std::atomic<bool>>(false);
  std::atomic<bool> answered{false};
  ~State();
};

}  // namespace epd
