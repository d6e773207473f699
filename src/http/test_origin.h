// src/http/test_origin.h (test-only): a small HTTP/1.1 origin on loopback
// written on raw sockets, for the media fetch tests, that tells what it saw:
// how many requests it served at once, and which clients closed their
// connection before the answer was complete.
//
// Each connection gets a thread; it reads the head, finds the route by path
// (the query ignored; 404 otherwise) and answers "Connection: close":
//   status, headers, body      the answer;
//   barrier = k                wait (up to 20 s) until k requests of the
//                              route (or of its barrier_group) are in, so
//                              the answer proves k were at once;
//   delay_ms                   wait before the head is sent;
//   chunk, gap_ms              send the body `chunk` bytes at a time with a
//                              gap between pieces;
//   endless                    no Content-Length: send until the client goes.
// A request is "active" from its head until just before its last byte is
// sent, so a client's next request can never overlap its previous one.
//
// Thread safety: every accessor is thread-safe.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace epd::testing_http {

struct OriginRoute {
  int status = 200;
  std::string body{};
  std::vector<std::pair<std::string, std::string>> headers{};
  int barrier = 0;
  std::string barrier_group{};  // routes that share a barrier; "" = the route's own
  int delay_ms = 0;
  std::size_t chunk = 0;  // 0 = the whole body at once
  int gap_ms = 0;
  bool endless = false;
};

class TestOrigin {
 public:
  explicit TestOrigin(const std::string& ip = "127.0.0.1") : ip_(ip) {
    listen_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    setsockopt(listen_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
    bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    listen(listen_, 64);
    socklen_t len = sizeof(a);
    getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~TestOrigin() {
    stop_ = true;
    cv_.notify_all();
    acceptor_.join();
    close(listen_);
    std::vector<std::thread> conns;
    {
      std::lock_guard<std::mutex> lock(mu_);
      conns.swap(conns_);
    }
    for (std::thread& t : conns) t.join();
  }
  TestOrigin(const TestOrigin&) = delete;
  TestOrigin& operator=(const TestOrigin&) = delete;

  void Route(const std::string& path, OriginRoute r) {
    std::lock_guard<std::mutex> lock(mu_);
    routes_[path] = std::move(r);
  }
  int port() const { return port_; }
  std::string Url(const std::string& path) const { return "http://" + ip_ + ":" + std::to_string(port_) + path; }

  int max_active() const { return max_active_.load(); }
  int active() const { return active_.load(); }
  int requests() const { return requests_.load(); }
  int closed_by_client() const { return closed_by_client_.load(); }

  // Waits until `pred` holds, up to `timeout`; true when it did.
  template <typename Pred>
  bool WaitFor(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(20)) const {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (!pred()) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

 private:
  void Accept() {
    while (!stop_) {
      pollfd p{listen_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const int fd = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      std::lock_guard<std::mutex> lock(mu_);
      conns_.emplace_back([this, fd] {
        Serve(fd);
        close(fd);
      });
    }
  }

  // False when the client closed (or the origin stops) during the wait.
  bool Wait(int fd, int ms) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (!stop_ && std::chrono::steady_clock::now() < end) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 10) > 0) {
        char c;
        if (recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) <= 0) return false;
      }
    }
    return !stop_;
  }

  bool Send(int fd, const std::string& s) { return send(fd, s.data(), s.size(), MSG_NOSIGNAL) == ssize_t(s.size()); }

  void Serve(int fd) {
    timeval tv{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string head;
    char buf[4096];
    while (head.find("\r\n\r\n") == std::string::npos) {
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) return;
      head.append(buf, static_cast<std::size_t>(n));
    }
    const std::size_t sp = head.find(' ');
    std::string path = head.substr(sp + 1, head.find(' ', sp + 1) - sp - 1);
    path = path.substr(0, path.find('?'));
    OriginRoute r{404, "no such path"};
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = routes_.find(path); it != routes_.end()) r = it->second;
    }
    ++requests_;
    const int now = ++active_;
    for (int m = max_active_.load(); now > m && !max_active_.compare_exchange_weak(m, now);) {
    }
    const bool complete = Answer(fd, r, path);
    if (!complete) {
      --active_;
      ++closed_by_client_;
    }
  }

  // Sends `r`; false when the client went away first. Leaves active_ as it
  // found it when true (it is decremented before the last byte).
  bool Answer(int fd, const OriginRoute& r, const std::string& path) {
    if (r.barrier > 0) {
      std::unique_lock<std::mutex> lock(mu_);
      const std::string group = r.barrier_group.empty() ? path : r.barrier_group;
      ++at_barrier_[group];
      cv_.notify_all();
      cv_.wait_for(lock, std::chrono::seconds(20), [&] { return stop_ || at_barrier_[group] >= r.barrier; });
    }
    if (r.delay_ms > 0 && !Wait(fd, r.delay_ms)) return false;
    std::string head = "HTTP/1.1 " + std::to_string(r.status) + " X\r\nConnection: close\r\n";
    if (!r.endless) head += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
    for (const auto& [k, v] : r.headers) head += k + ": " + v + "\r\n";
    if (!Send(fd, head + "\r\n")) return false;
    if (r.endless) {
      const std::string piece(r.chunk > 0 ? r.chunk : 4096, 'e');
      while (Send(fd, piece) && Wait(fd, r.gap_ms)) {
      }
      return false;
    }
    const std::size_t step = r.chunk > 0 ? r.chunk : std::max<std::size_t>(r.body.size(), 1);
    for (std::size_t off = 0; off < r.body.size(); off += step) {
      if (off > 0 && r.gap_ms > 0 && !Wait(fd, r.gap_ms)) return false;
      if (off + step >= r.body.size()) --active_;  // before the last byte: see the header comment
      if (!Send(fd, r.body.substr(off, step))) {
        if (off + step >= r.body.size()) ++active_;
        return false;
      }
    }
    if (r.body.empty()) --active_;
    shutdown(fd, SHUT_WR);
    Wait(fd, 2000);  // until the client closes: no reset for an unread answer
    return true;
  }

  const std::string ip_;
  int listen_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, OriginRoute> routes_;
  std::map<std::string, int> at_barrier_;  // requests that reached each route's barrier
  std::vector<std::thread> conns_;
  std::atomic<int> active_{0}, max_active_{0}, requests_{0}, closed_by_client_{0};
};

}  // namespace epd::testing_http
