// See connection_park.h.
#include "connection_park.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

namespace epd::internal {

ConnectionPark::ConnectionPark(Options options, ServeFn serve, RefuseFn refuse)
    : o_(options), serve_(std::move(serve)), refuse_(std::move(refuse)) {}

ConnectionPark::~ConnectionPark() {
  Stop();
  if (epfd_ >= 0) close(epfd_);
  if (wake_ >= 0) close(wake_);
}

Status ConnectionPark::Start() {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epfd_ < 0 || wake_ < 0) {
    return Status(StatusCode::kUnavailable,
                  std::string("HTTP: cannot create the epoll set: ") + std::generic_category().message(errno));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_, &ev);
  park_thread_ = std::thread([this] { Run(); });
  for (int i = 0; i < o_.threads; ++i) pool_.emplace_back([this] { Serve(); });
  return Status::Ok();
}

void ConnectionPark::Admit(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  SSL* ssl = nullptr;
  if (o_.tls != nullptr) {
    ssl = SSL_new(o_.tls);
    if (ssl == nullptr) {
      close(fd);
      ++tls_failures_;
      return;
    }
    SSL_set_fd(ssl, fd);
    SSL_set_accept_state(ssl);
  }
  auto c = std::make_unique<Connection>(fd, ssl);
  c->deadline = HttpClock::now() + o_.header_timeout;
  ++connections_;
  Enqueue(std::move(c));
}

void ConnectionPark::Enqueue(std::unique_ptr<Connection> c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;  // closes c
    inbox_.push_back(std::move(c));
  }
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = write(wake_, &one, sizeof(one));
}

void ConnectionPark::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  stop_ = true;
  ready_cv_.notify_all();
  if (wake_ >= 0) {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = write(wake_, &one, sizeof(one));
  }
  if (park_thread_.joinable()) park_thread_.join();
  for (std::thread& t : pool_) t.join();
  pool_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  inbox_.clear();
  ready_.clear();
}

HttpEndpointStats ConnectionPark::Stats() const {
  HttpEndpointStats s;
  s.connections = connections_;
  s.requests = requests_;
  s.header_timeouts = header_timeouts_;
  s.idle_closed = idle_closed_;
  s.evicted = evicted_;
  s.tls_failures = tls_failures_;
  s.parked = parked_count_;
  return s;
}

int ConnectionPark::WaitMs() const {
  if (deadlines_.empty()) return -1;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadlines_.begin()->first - HttpClock::now());
  return static_cast<int>(std::clamp<long long>(left.count(), 0, 60000));
}

void ConnectionPark::Run() {
  std::vector<epoll_event> events(64);
  while (!stop_) {
    const int n = epoll_wait(epfd_, events.data(), static_cast<int>(events.size()), WaitMs());
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == wake_) {
        std::uint64_t drained;
        [[maybe_unused]] const ssize_t r = read(wake_, &drained, sizeof(drained));
        continue;
      }
      Pump(events[i].data.fd);
    }
    std::vector<std::unique_ptr<Connection>> inbox;
    {
      std::lock_guard<std::mutex> lock(mu_);
      inbox.swap(inbox_);
    }
    for (auto& c : inbox) Park(std::move(c));
    ExpireDue();
  }
  parked_.clear();  // closes them
  deadlines_.clear();
  parked_count_ = 0;
}

void ConnectionPark::Park(std::unique_ptr<Connection> c) {
  const int fd = c->fd;
  Parked& p = parked_[fd];
  p.conn = std::move(c);
  p.due = deadlines_.emplace(p.conn->deadline, fd);
  ++parked_count_;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET | (p.conn->ssl != nullptr ? EPOLLOUT : 0u);
  ev.data.fd = fd;
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    Drop(fd, nullptr, 0);
    return;
  }
  if (static_cast<int>(parked_.size()) > o_.max_idle) {
    // The one nearest its deadline goes; never the one just parked unless
    // it is that one.
    Drop(deadlines_.begin()->second, &evicted_, 0);
  }
  // Bytes already buffered, or arrived before the epoll registration
  // (edge-triggered: reported on ADD when ready, but reading now is cheap).
  if (parked_.count(fd) != 0) Pump(fd);
}

void ConnectionPark::SetDeadline(Parked& p, HttpClock::time_point when) {
  const int fd = p.conn->fd;
  deadlines_.erase(p.due);
  p.conn->deadline = when;
  p.due = deadlines_.emplace(when, fd);
}

void ConnectionPark::Pump(int fd) {
  auto it = parked_.find(fd);
  if (it == parked_.end()) return;
  Connection& c = *it->second.conn;
  if (c.draining) {
    for (;;) {
      c.in.clear();
      c.in_off = 0;
      const Connection::Io io = c.ReadAvailable(1 << 16);
      if (io == Connection::Io::kClosed) return Drop(fd, nullptr, 0);
      if (io == Connection::Io::kWouldBlock) return;
    }
  }
  if (c.ssl != nullptr && !c.handshaken) {
    const Connection::Io h = c.Handshake();
    if (h == Connection::Io::kClosed) return Drop(fd, &tls_failures_, 0);
    if (h == Connection::Io::kWouldBlock) return;
  }
  if (!c.HeadComplete() && c.ReadAvailable(o_.max_head_bytes + 1) == Connection::Io::kClosed) {
    return Drop(fd, nullptr, 0);
  }
  if (!c.pending().empty() && !c.got_bytes) {
    c.got_bytes = true;
    // The first byte of the next head on a kept connection: the head has
    // header_timeout from here (a fresh connection keeps its deadline from
    // accept).
    if (c.served > 0) SetDeadline(it->second, HttpClock::now() + o_.header_timeout);
  }
  if (c.HeadComplete()) {
    if (const auto length = c.DeclaredContentLength(); length.has_value() && *length > o_.max_body_bytes) {
      return Linger(fd, 413);
    }
    return HandOver(fd);
  }
  if (c.pending().size() > o_.max_head_bytes) Linger(fd, 431);
}

void ConnectionPark::Linger(int fd, int refuse_status) {
  Parked& p = parked_.at(fd);
  refuse_(*p.conn, refuse_status);
  shutdown(fd, SHUT_WR);
  p.conn->draining = true;
  SetDeadline(p, HttpClock::now() + std::chrono::seconds(2));
  Pump(fd);  // drops what is there already
}

void ConnectionPark::HandOver(int fd) {
  auto it = parked_.find(fd);
  epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
  deadlines_.erase(it->second.due);
  std::unique_ptr<Connection> c = std::move(it->second.conn);
  parked_.erase(it);
  --parked_count_;
  ++requests_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_.push_back(std::move(c));
  }
  ready_cv_.notify_one();
}

void ConnectionPark::Drop(int fd, std::atomic<std::uint64_t>* counter, int refuse_status) {
  auto it = parked_.find(fd);
  if (it == parked_.end()) return;
  if (refuse_status != 0) refuse_(*it->second.conn, refuse_status);
  if (counter != nullptr) ++*counter;
  epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
  deadlines_.erase(it->second.due);
  parked_.erase(it);  // closes the socket
  --parked_count_;
}

void ConnectionPark::ExpireDue() {
  const auto now = HttpClock::now();
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const int fd = deadlines_.begin()->second;
    const Connection& c = *parked_.at(fd).conn;
    if (c.draining) {
      Drop(fd, nullptr, 0);
    } else if (c.got_bytes) {
      Drop(fd, &header_timeouts_, 408);
    } else {
      Drop(fd, c.served > 0 ? &idle_closed_ : &header_timeouts_, 0);
    }
  }
}

void ConnectionPark::Serve() {
  for (;;) {
    std::unique_ptr<Connection> c;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ready_cv_.wait(lock, [this] { return stopping_ || !ready_.empty(); });
      if (stopping_) return;
      c = std::move(ready_.front());
      ready_.pop_front();
    }
    for (;;) {
      if (!serve_(*c)) break;
      ++c->served;
      c->got_bytes = false;
      if (c->served >= o_.max_requests_per_connection || stop_) break;
      if (c->HeadComplete()) {
        ++requests_;
        continue;  // pipelined
      }
      c->deadline = HttpClock::now() + o_.idle_timeout;
      Enqueue(std::move(c));
      break;
    }
  }
}

}  // namespace epd::internal
