// src/http/connection_park.h (internal): where an HttpEndpoint's connections
// wait for their next request without holding a thread, and the bounded
// pool that serves the requests (epd/http/http_endpoint.h, "Connections").
//
// One epoll thread owns every parked connection: fresh ones (admitted by
// httplib's accept thread) and kept-alive ones between requests (given
// back by a pool thread). It reads what arrives without blocking, does the
// TLS handshake, and hands a connection to the pool once a complete request
// head is buffered. Deadlines, all on the steady clock:
//   fresh connection      accept + header_timeout
//   between requests      last response + idle_timeout, until the first
//                         byte of the next head; then that byte +
//                         header_timeout
// A connection past its deadline is closed: with a 408 (via `refuse`) when
// part of a head had arrived, silently otherwise. A head over
// max_head_bytes gets 431, and one declaring a Content-Length over
// max_body_bytes gets 413 from the park, so no thread waits for (or reads
// and discards, as httplib would) a body that will be refused. After such a
// refusal the park shuts its side down and drops what the client still
// sends for up to 2 s (a "lingering close"), so a client that sends its body
// without waiting reads the 413 instead of a reset. When more
// than max_idle connections are parked,
// the one nearest its deadline is closed (counted as evicted).
//
// The pool: `threads` threads take connections in the order their heads
// completed and call serve(c), which answers one request (reading the body
// within body_timeout) and says whether to keep the connection; a kept one
// whose buffer already holds the next head (pipelining) is served again at
// once, else it goes back to the park.
//
// Thread safety: Admit and Repark from any thread; Stats from any thread.
// Stop (also the destructor) closes the parked connections, lets requests
// being served finish, and joins every thread.
#pragma once

#include <openssl/ssl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "connection.h"
#include "epd/core/status.h"
#include "epd/http/http_endpoint.h"

namespace epd::internal {

class ConnectionPark {
 public:
  struct Options {
    std::chrono::milliseconds header_timeout{10000};
    std::chrono::milliseconds idle_timeout{5000};
    int threads = 8;
    int max_idle = 1024;
    int max_requests_per_connection = 1000;
    std::size_t max_head_bytes = std::size_t{64} << 10;
    std::uint64_t max_body_bytes = std::uint64_t{64} << 20;
    SSL_CTX* tls = nullptr;  // not owned; null = plaintext
  };
  // Serves one request whose head is complete in `c`; true = keep `c` open.
  using ServeFn = std::function<bool(Connection& c)>;
  // Writes a short error response of `status` (408, 413, 431) on `c`, without blocking.
  using RefuseFn = std::function<void(Connection& c, int status)>;

  ConnectionPark(Options options, ServeFn serve, RefuseFn refuse);
  ~ConnectionPark();
  ConnectionPark(const ConnectionPark&) = delete;
  ConnectionPark& operator=(const ConnectionPark&) = delete;

  // Creates the epoll set and starts the threads. kUnavailable on failure.
  Status Start();
  // Takes ownership of an accepted socket.
  void Admit(int fd);
  void Stop();
  HttpEndpointStats Stats() const;

 private:
  struct Parked {
    std::unique_ptr<Connection> conn;
    std::multimap<HttpClock::time_point, int>::iterator due;
  };

  void Run();                                   // the park thread
  void Serve();                                 // a pool thread
  void Enqueue(std::unique_ptr<Connection> c);  // to the park, from any thread
  void Park(std::unique_ptr<Connection> c);     // park thread
  void Pump(int fd);                            // park thread: an epoll event
  void SetDeadline(Parked& p, HttpClock::time_point when);
  void HandOver(int fd);
  void Drop(int fd, std::atomic<std::uint64_t>* counter, int refuse_status);
  void Linger(int fd, int refuse_status);  // refuse, then drain until EOF or 2 s
  void ExpireDue();
  int WaitMs() const;

  const Options o_;
  const ServeFn serve_;
  const RefuseFn refuse_;
  int epfd_ = -1, wake_ = -1;
  std::thread park_thread_;
  std::vector<std::thread> pool_;

  // Touched only by the park thread.
  std::unordered_map<int, Parked> parked_;
  std::multimap<HttpClock::time_point, int> deadlines_;

  std::mutex mu_;
  std::condition_variable ready_cv_;
  std::vector<std::unique_ptr<Connection>> inbox_;  // guarded by mu_: to be parked
  std::deque<std::unique_ptr<Connection>> ready_;   // guarded by mu_: heads complete, for the pool
  bool stopping_ = false;                           // guarded by mu_
  std::atomic<bool> stop_{false};

  std::atomic<std::uint64_t> connections_{0}, requests_{0}, header_timeouts_{0}, idle_closed_{0}, evicted_{0},
      tls_failures_{0};
  std::atomic<std::int64_t> parked_count_{0};
};

}  // namespace epd::internal
