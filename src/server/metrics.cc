// Counters and gauges are rebuilt from a ServerStats snapshot per scrape (see
// metrics.h; stats_series.h builds them from the stats field tables); only the
// histograms live in a prometheus-cpp Registry. Render()
// serialises both as one page.
//
// Why not prometheus-cpp's Exposer (prometheus-cpp::pull): it serves through
// civetweb, which Debian builds with a fixed 100 KiB thread stack
// (pthread_attr_setstacksize(0x19000)). In a process that links libtorch, the
// static TLS of libopenblas (60 KiB), libglog (30 KiB) and libtorch_cpu
// (10 KiB) alone exceeds that, so pthread_create fails with EINVAL and the
// Exposer cannot start. A scrape endpoint needs very little, so MetricsHttp
// below is a minimal HTTP/1.0 responder: it answers GET /metrics (and /) with
// the text exposition format, 404 otherwise, closing each connection after
// the response. Benefits: no thread-stack constraint, no extra dependency.
//
// One accept thread hands each connection to a thread of its own (at most
// kMaxConnections at once; past that the accept thread waits for one to
// end), and each connection gets read_timeout in all to send its request
// head, however it trickles the bytes. So a client that connects and sends
// nothing, or one byte at a time, holds one slot for read_timeout and never
// delays another client's scrape.
#include "metrics.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <prometheus/collectable.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "stats_series.h"

namespace epd::internal {
namespace {

// Builds the counter and gauge families from a ServerStats snapshot
// (stats_series.h).
class StatsCollectable : public prometheus::Collectable {
 public:
  explicit StatsCollectable(std::function<ServerStats()> snapshot) : snapshot_(std::move(snapshot)) {}

  std::vector<prometheus::MetricFamily> Collect() const override { return StatsFamilies(snapshot_()); }

 private:
  std::function<ServerStats()> snapshot_;
};

class MeteredTower : public VisionTower {
 public:
  MeteredTower(std::unique_ptr<VisionTower> inner, std::shared_ptr<ServerMetrics> metrics)
      : inner_(std::move(inner)), metrics_(std::move(metrics)) {}

  StatusOr<TowerOutput> Encode(std::span<const TowerItem> items) override {
    std::int64_t tokens = 0;
    for (const TowerItem& it : items) tokens += it.grid.tokens(inner_->merge_size());
    const auto start = std::chrono::steady_clock::now();
    StatusOr<TowerOutput> out = inner_->Encode(items);
    metrics_->ObserveBatch(tokens, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return out;
  }
  std::int64_t patch_dim() const override { return inner_->patch_dim(); }
  std::int64_t merge_size() const override { return inner_->merge_size(); }
  std::int64_t hidden() const override { return inner_->hidden(); }
  std::int64_t deepstack_layers() const override { return inner_->deepstack_layers(); }
  DType dtype() const override { return inner_->dtype(); }
  bool output_on_device() const override { return inner_->output_on_device(); }
  bool temporal_chunks_independent() const override { return inner_->temporal_chunks_independent(); }
  std::string Describe() const override { return inner_->Describe(); }

 private:
  std::unique_ptr<VisionTower> inner_;
  std::shared_ptr<ServerMetrics> metrics_;
};

// See the note at the top of the file.
class MetricsHttp {
 public:
  static constexpr int kMaxConnections = 16;

  static StatusOr<std::unique_ptr<MetricsHttp>> Start(const std::string& host, int port,
                                                      std::chrono::milliseconds read_timeout,
                                                      std::function<std::string()> render) {
    const std::string where = host + ":" + std::to_string(port);
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
      return Status(StatusCode::kUnavailable, "cannot serve metrics on " + where + ": " + gai_strerror(rc));
    }
    int fd = -1;
    std::string why = "no address";
    for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
      fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      const int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
        why = std::strerror(errno);
        close(fd);
        fd = -1;
      }
    }
    freeaddrinfo(res);
    if (fd < 0) return Status(StatusCode::kUnavailable, "cannot serve metrics on " + where + ": " + why);
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
    const int bound_port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                                       : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    int wake[2];
    if (pipe2(wake, O_CLOEXEC) != 0) {
      close(fd);
      return Status(StatusCode::kUnavailable, std::string("metrics endpoint: pipe: ") + std::strerror(errno));
    }
    return std::unique_ptr<MetricsHttp>(new MetricsHttp(fd, wake, bound_port, read_timeout, std::move(render)));
  }

  ~MetricsHttp() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    slot_freed_.notify_all();
    // Never read, so it stays readable: every poll below sees it.
    const char c = 0;
    (void)!write(wake_[1], &c, 1);
    acceptor_.join();
    for (Connection& c : connections_) c.thread.join();
    close(listen_);
    close(wake_[0]);
    close(wake_[1]);
  }

  int port() const { return port_; }

 private:
  struct Connection {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };

  MetricsHttp(int fd, const int wake[2], int port, std::chrono::milliseconds read_timeout,
              std::function<std::string()> render)
      : listen_(fd), wake_{wake[0], wake[1]}, port_(port), read_timeout_(read_timeout), render_(std::move(render)) {
    acceptor_ = std::thread([this] { Accept(); });
  }

  // Joins the threads of connections that have ended; returns how many remain.
  std::size_t Reap() {
    std::erase_if(connections_, [](Connection& c) {
      if (!c.done->load()) return false;
      c.thread.join();
      return true;
    });
    return connections_.size();
  }

  void Accept() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        slot_freed_.wait(lock, [&] { return stopping_ || Reap() < kMaxConnections; });
        if (stopping_) return;
      }
      pollfd fds[2] = {{listen_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      if (poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents != 0) return;
      if ((fds[0].revents & POLLIN) == 0) continue;
      const int conn = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) continue;
      auto done = std::make_shared<std::atomic<bool>>(false);
      std::lock_guard<std::mutex> lock(mu_);
      connections_.push_back(Connection{std::thread([this, conn, done] {
                                          Serve(conn);
                                          close(conn);
                                          std::lock_guard<std::mutex> lock(mu_);
                                          done->store(true);
                                          slot_freed_.notify_all();
                                        }),
                                        done});
    }
  }

  // Reads the request head (at most 8 KiB, read_timeout in all) and answers
  // it. Returns without answering on timeout, EOF or shutdown.
  void Serve(int conn) {
    const timeval send_tv{static_cast<time_t>(read_timeout_.count() / 1000),
                          static_cast<suseconds_t>(read_timeout_.count() % 1000 * 1000)};
    setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &send_tv, sizeof(send_tv));
    const auto deadline = std::chrono::steady_clock::now() + read_timeout_;
    std::string head;
    char buf[1024];
    while (head.find("\r\n\r\n") == std::string::npos && head.size() < 8192) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return;
      pollfd fds[2] = {{conn, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      const int ready = poll(fds, 2, static_cast<int>(std::min<std::int64_t>(left.count(), 1 << 30)));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0 || fds[1].revents != 0) return;
      const ssize_t n = recv(conn, buf, sizeof(buf), MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (n <= 0) break;
      head.append(buf, static_cast<std::size_t>(n));
    }
    const std::string line = head.substr(0, head.find("\r\n"));
    std::string status = "404 Not Found", type = "text/plain", body = "not found; try /metrics\n";
    if (line.starts_with("GET /metrics ") || line.starts_with("GET /metrics?") || line.starts_with("GET / ")) {
      status = "200 OK";
      type = "text/plain; version=0.0.4; charset=utf-8";
      body = render_();
    } else if (!line.starts_with("GET ")) {
      status = "405 Method Not Allowed";
      body = "only GET\n";
    }
    const std::string response = "HTTP/1.0 " + status + "\r\nContent-Type: " + type +
                                 "\r\nContent-Length: " + std::to_string(body.size()) +
                                 "\r\nConnection: close\r\n\r\n" + body;
    for (std::size_t off = 0; off < response.size();) {
      const ssize_t n = send(conn, response.data() + off, response.size() - off, MSG_NOSIGNAL);
      if (n <= 0) break;
      off += static_cast<std::size_t>(n);
    }
  }

  int listen_;
  int wake_[2];
  int port_;
  std::chrono::milliseconds read_timeout_;
  std::function<std::string()> render_;
  std::mutex mu_;
  std::condition_variable slot_freed_;   // a connection ended, or stopping_
  bool stopping_ = false;                // guarded by mu_
  std::vector<Connection> connections_;  // guarded by mu_
  std::thread acceptor_;
};

}  // namespace

struct ServerMetrics::Impl {
  std::shared_ptr<StatsCollectable> stats;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  prometheus::Histogram* batch_tokens = nullptr;
  prometheus::Histogram* tower_seconds = nullptr;
  prometheus::Histogram* request_seconds = nullptr;
  std::unique_ptr<MetricsHttp> http;
  int port = -1;
};

ServerMetrics::ServerMetrics(std::function<ServerStats()> snapshot) : impl_(std::make_unique<Impl>()) {
  impl_->stats = std::make_shared<StatsCollectable>(std::move(snapshot));
  // Buckets: tokens from one small image (4) to a full 16k-token batch;
  // latencies from 0.1 ms (a hit) to 10 s (a large batch on CPU).
  impl_->batch_tokens =
      &prometheus::BuildHistogram()
           .Name("epd_batch_tokens")
           .Help("Post-merge tokens per tower batch")
           .Register(*impl_->registry)
           .Add({}, prometheus::Histogram::BucketBoundaries{4, 16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384});
  const prometheus::Histogram::BucketBoundaries seconds{0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025,
                                                        0.05,   0.1,     0.25,   0.5,   1,     2.5,   5,    10};
  impl_->tower_seconds = &prometheus::BuildHistogram()
                              .Name("epd_tower_seconds")
                              .Help("Wall time of each tower batch")
                              .Register(*impl_->registry)
                              .Add({}, seconds);
  impl_->request_seconds = &prometheus::BuildHistogram()
                                .Name("epd_request_seconds")
                                .Help("Wall time of each Encode call, arrival to final status")
                                .Register(*impl_->registry)
                                .Add({}, seconds);
}

ServerMetrics::~ServerMetrics() = default;

Status ServerMetrics::Serve(const std::string& address, int port, std::chrono::milliseconds read_timeout) {
  if (read_timeout.count() <= 0) return InvalidArgument("metrics read timeout must be > 0");
  StatusOr<std::unique_ptr<MetricsHttp>> http =
      MetricsHttp::Start(address, port, read_timeout, [this] { return Render(); });
  if (!http.ok()) return http.status();
  impl_->http = std::move(*http);
  impl_->port = impl_->http->port();
  return Status::Ok();
}

int ServerMetrics::port() const { return impl_->port; }

void ServerMetrics::Stop() { impl_->http.reset(); }

void ServerMetrics::ObserveBatch(std::int64_t tokens, double seconds) {
  impl_->batch_tokens->Observe(static_cast<double>(tokens));
  impl_->tower_seconds->Observe(seconds);
}

void ServerMetrics::ObserveCall(double seconds) { impl_->request_seconds->Observe(seconds); }

std::string ServerMetrics::Render() const {
  std::vector<prometheus::MetricFamily> families = impl_->stats->Collect();
  for (prometheus::MetricFamily& f : impl_->registry->Collect()) families.push_back(std::move(f));
  std::ostringstream os;
  prometheus::TextSerializer().Serialize(os, families);
  return os.str();
}

std::unique_ptr<VisionTower> MeterTower(std::unique_ptr<VisionTower> inner, std::shared_ptr<ServerMetrics> metrics) {
  return std::make_unique<MeteredTower>(std::move(inner), std::move(metrics));
}

}  // namespace epd::internal
