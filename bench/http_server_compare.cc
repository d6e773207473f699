// The HTTP edge's two candidates side by side (issue 40, docs/SERVER.md,
// "HTTP edge"): epd::HttpEndpoint (Boost.Beast, one I/O thread and a
// handler pool) and a minimal GNU libmicrohttpd server (epoll, a thread pool
// of the same size, MHD_OPTION_CONNECTION_TIMEOUT and
// MHD_OPTION_CONNECTION_MEMORY_LIMIT), both serving GET /health and a
// POST /upload that takes a body of up to --max-body-kb.
//
// For each server, with in-process client threads on raw loopback sockets:
//   keepalive   --clients threads, one keep-alive connection each, send
//               --requests GET /health each as fast as answered: requests/s
//               and the latency percentiles;
//   solo        one keep-alive connection, --probes GET /health spaced
//               --probe-gap-ms apart: p50/p99;
//   slow        the same probes while --slow connections each send a
//               POST /upload head (Content-Length: 100000) and then one body
//               byte every --trickle-s; a slow connection the server closes
//               is opened again (counted), so all of them trickle for the
//               whole measurement. Also counted: slow connections the server
//               still held at the end.
// Client and server share the machine's cores. Prints one JSON object
// (--json FILE writes it too) and a markdown table.
//
//   build/bench/http_server_compare [--threads 8] [--clients 2] [--requests 20000]
//       [--probes 400] [--probe-gap-ms 10] [--slow 200] [--trickle-s 2] [--json out.json]
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "epd/http/http_endpoint.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  int threads = 8;
  int clients = 2;
  int requests = 20000;
  int probes = 400;
  int probe_gap_ms = 10;
  int slow = 200;
  double trickle_s = 2;
  int max_body_kb = 1024;
  std::string json;
};

// --- A raw-socket client ----------------------------------------------------

int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  timeval tv{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<std::size_t>(n);
  }
  return true;
}

// One keep-alive connection that reads Content-Length-framed responses.
struct Conn {
  int port;
  int fd = -1;
  std::string buf;

  explicit Conn(int p) : port(p), fd(Connect(p)) {}
  ~Conn() {
    if (fd >= 0) ::close(fd);
  }
  // Sends GET /health and reads the answer: its status, or -1.
  int Get() {
    for (int attempt = 0; attempt < 2; ++attempt) {  // once more on a closed keep-alive connection
      if (fd < 0) fd = Connect(port);
      if (fd >= 0 && SendAll(fd, "GET /health HTTP/1.1\r\nHost: bench\r\n\r\n")) {
        const int status = ReadResponse();
        if (status > 0) return status;
      }
      if (fd >= 0) ::close(fd);
      fd = -1;
      buf.clear();
    }
    return -1;
  }
  int ReadResponse() {
    char tmp[4096];
    std::size_t head_end;
    while ((head_end = buf.find("\r\n\r\n")) == std::string::npos) {
      const ssize_t n = ::recv(fd, tmp, sizeof(tmp), 0);
      if (n <= 0) return -1;
      buf.append(tmp, static_cast<std::size_t>(n));
    }
    const std::string head = buf.substr(0, head_end);
    std::size_t length = 0;
    std::string lower = head;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    const std::size_t cl = lower.find("content-length:");
    if (cl != std::string::npos) length = std::strtoul(head.c_str() + cl + 15, nullptr, 10);
    while (buf.size() < head_end + 4 + length) {
      const ssize_t n = ::recv(fd, tmp, sizeof(tmp), 0);
      if (n <= 0) return -1;
      buf.append(tmp, static_cast<std::size_t>(n));
    }
    buf.erase(0, head_end + 4 + length);
    return std::atoi(head.c_str() + 9);  // "HTTP/1.1 200 ..."
  }
};

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p / 100.0 * static_cast<double>(v.size() - 1) + 0.5))];
}

struct Latency {
  std::vector<double> ms;
  int failures = 0;
};

// --probes GET /health on one keep-alive connection, spaced apart.
Latency Probe(int port, const Config& c) {
  Latency out;
  Conn conn(port);
  for (int i = 0; i < c.probes; ++i) {
    const auto t = Clock::now();
    const int status = conn.Get();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t).count();
    if (status == 200) {
      out.ms.push_back(ms);
    } else {
      ++out.failures;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(c.probe_gap_ms));
  }
  return out;
}

struct Throughput {
  double requests_per_s = 0;
  Latency latency;
};

Throughput KeepAlive(int port, const Config& c) {
  std::vector<Latency> per(static_cast<std::size_t>(c.clients));
  std::vector<std::thread> threads;
  const auto t0 = Clock::now();
  for (int k = 0; k < c.clients; ++k) {
    threads.emplace_back([&, k] {
      Conn conn(port);
      Latency& mine = per[static_cast<std::size_t>(k)];
      mine.ms.reserve(static_cast<std::size_t>(c.requests));
      for (int i = 0; i < c.requests; ++i) {
        const auto t = Clock::now();
        if (conn.Get() == 200) {
          mine.ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t).count());
        } else {
          ++mine.failures;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  Throughput out;
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  for (auto& l : per) {
    out.latency.ms.insert(out.latency.ms.end(), l.ms.begin(), l.ms.end());
    out.latency.failures += l.failures;
  }
  out.requests_per_s = static_cast<double>(out.latency.ms.size()) / wall;
  return out;
}

// --slow connections trickling one body byte each every --trickle-s, until
// Stop(); a connection the server closed (or answered) is opened again.
class Trickler {
 public:
  Trickler(int port, const Config& c) : port_(port), c_(c) {
    for (int i = 0; i < c.slow; ++i) fds_.push_back(Open());
    thread_ = std::thread([this] { Run(); });
  }
  ~Trickler() { Stop(); }
  // Stops trickling; returns how many of the connections the server still
  // held open (not closed or answered) at that moment.
  int Stop() {
    if (!stop_.exchange(true)) thread_.join();
    int held = 0;
    for (int& fd : fds_) {
      if (fd >= 0 && !Answered(fd)) ++held;
      if (fd >= 0) ::close(fd);
      fd = -1;
    }
    return held;
  }
  int reopened() const { return reopened_; }

 private:
  int Open() {
    const int fd = Connect(port_);
    if (fd < 0) return -1;
    SendAll(fd, "POST /upload HTTP/1.1\r\nHost: bench\r\nContent-Length: 100000\r\n\r\n");
    return fd;
  }
  // The server answered or closed: readable (a response, or EOF).
  static bool Answered(int fd) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
  }
  void Run() {
    const auto period = std::chrono::duration<double>(c_.trickle_s);
    while (!stop_) {
      const auto round = Clock::now();
      for (int& fd : fds_) {
        if (fd < 0 || Answered(fd) || ::send(fd, "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
          if (fd >= 0) ::close(fd);
          fd = Open();
          ++reopened_;
        }
      }
      while (!stop_ && Clock::now() - round < period) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  int port_;
  const Config& c_;
  std::vector<int> fds_;
  std::atomic<bool> stop_{false};
  int reopened_ = 0;  // written by the thread; read after Stop
  std::thread thread_;
};

// --- The two servers ---------------------------------------------------------

struct Server {
  std::string name;
  int port = 0;
  std::function<void()> stop;
};

Server StartBeast(const Config& c) {
  epd::HttpEndpointOptions o;
  o.threads = c.threads;
  o.max_body_bytes = std::int64_t{c.max_body_kb} << 10;
  std::vector<epd::HttpRoute> routes;
  routes.push_back({"GET", "/health", false, [](const epd::HttpRequest&) {
                      return epd::HttpResponse{200, "text/plain", "ok"};
                    }});
  routes.push_back({"POST", "/upload", false, [](const epd::HttpRequest& r) {
                      return epd::HttpResponse{200, "text/plain", std::to_string(r.body.size())};
                    }});
  auto ep = epd::HttpEndpoint::Start(o, std::move(routes));
  if (!ep.ok()) {
    std::fprintf(stderr, "HttpEndpoint: %s\n", ep.status().message().c_str());
    std::exit(1);
  }
  std::shared_ptr<epd::HttpEndpoint> e(std::move(*ep));
  return {"Boost.Beast (epd::HttpEndpoint)", e->port(), [e] { e->Stop(); }};
}

struct MhdUpload {
  std::size_t bytes = 0;
};

MHD_Result Reply(MHD_Connection* connection, unsigned status, const std::string& body) {
  MHD_Response* r = MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  MHD_add_response_header(r, "Content-Type", "text/plain");
  const MHD_Result ret = MHD_queue_response(connection, status, r);
  MHD_destroy_response(r);
  return ret;
}

MHD_Result MhdHandler(void* cls, MHD_Connection* connection, const char* url, const char* method, const char*,
                      const char* upload_data, size_t* upload_data_size, void** con_cls) {
  const std::size_t limit = *static_cast<const std::size_t*>(cls);
  const std::string path(url), verb(method);
  if (path == "/health" && verb == "GET") return Reply(connection, 200, "ok");
  if (path != "/upload" || verb != "POST") return Reply(connection, 404, "no route");
  // The first call comes with the head alone: a token or Content-Length
  // check belongs here, before any byte of the body.
  if (*con_cls == nullptr) {
    const char* cl = MHD_lookup_connection_value(connection, MHD_HEADER_KIND, "Content-Length");
    if (cl != nullptr && std::strtoull(cl, nullptr, 10) > limit) return Reply(connection, 413, "too large");
    *con_cls = new MhdUpload;
    return MHD_YES;
  }
  auto* up = static_cast<MhdUpload*>(*con_cls);
  if (*upload_data_size != 0) {
    up->bytes += *upload_data_size;
    *upload_data_size = 0;
    // A chunked body past the limit: no response may be queued while body
    // data is being processed, so the only refusal is closing the connection.
    return up->bytes > limit ? MHD_NO : MHD_YES;
  }
  (void)upload_data;
  return Reply(connection, 200, std::to_string(up->bytes));
}

void MhdCompleted(void*, MHD_Connection*, void** con_cls, MHD_RequestTerminationCode) {
  delete static_cast<MhdUpload*>(*con_cls);
  *con_cls = nullptr;
}

Server StartMhd(const Config& c) {
  static std::size_t limit;
  limit = static_cast<std::size_t>(c.max_body_kb) << 10;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  MHD_Daemon* d = MHD_start_daemon(
      MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG, 0, nullptr, nullptr, &MhdHandler, &limit, MHD_OPTION_SOCK_ADDR,
      reinterpret_cast<sockaddr*>(&a), MHD_OPTION_THREAD_POOL_SIZE, static_cast<unsigned>(c.threads),
      MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_CONNECTION_MEMORY_LIMIT, static_cast<size_t>(32 << 10),
      MHD_OPTION_NOTIFY_COMPLETED, &MhdCompleted, nullptr, MHD_OPTION_END);
  if (d == nullptr) {
    std::fprintf(stderr, "MHD_start_daemon failed\n");
    std::exit(1);
  }
  const int port = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port;
  return {std::string("libmicrohttpd ") + MHD_get_version(), port, [d] { MHD_stop_daemon(d); }};
}

// --- Measurements and output -------------------------------------------------

std::string Json(const std::map<std::string, double>& m) {
  std::ostringstream s;
  s << "{";
  bool first = true;
  for (const auto& [k, v] : m) {
    s << (first ? "" : ", ") << "\"" << k << "\": " << v;
    first = false;
  }
  s << "}";
  return s.str();
}

std::map<std::string, double> Measure(const Server& server, const Config& c) {
  std::map<std::string, double> r;
  const Throughput ka = KeepAlive(server.port, c);
  r["keepalive_requests_per_s"] = ka.requests_per_s;
  r["keepalive_p50_ms"] = Pct(ka.latency.ms, 50);
  r["keepalive_p99_ms"] = Pct(ka.latency.ms, 99);
  r["keepalive_failures"] = ka.latency.failures;
  const Latency solo = Probe(server.port, c);
  r["solo_p50_ms"] = Pct(solo.ms, 50);
  r["solo_p99_ms"] = Pct(solo.ms, 99);
  r["solo_failures"] = solo.failures;
  Trickler slow(server.port, c);
  std::this_thread::sleep_for(std::chrono::duration<double>(c.trickle_s));  // every slow head has arrived
  const Latency under = Probe(server.port, c);
  r["slow_reopened"] = slow.reopened();
  r["slow_held_at_end"] = slow.Stop();
  r["slow_p50_ms"] = Pct(under.ms, 50);
  r["slow_p99_ms"] = Pct(under.ms, 99);
  r["slow_max_ms"] = Pct(under.ms, 100);
  r["slow_failures"] = under.failures;
  return r;
}

Config Parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--threads")
      c.threads = std::stoi(v);
    else if (k == "--clients")
      c.clients = std::stoi(v);
    else if (k == "--requests")
      c.requests = std::stoi(v);
    else if (k == "--probes")
      c.probes = std::stoi(v);
    else if (k == "--probe-gap-ms")
      c.probe_gap_ms = std::stoi(v);
    else if (k == "--slow")
      c.slow = std::stoi(v);
    else if (k == "--trickle-s")
      c.trickle_s = std::stod(v);
    else if (k == "--json")
      c.json = v;
    else {
      std::fprintf(stderr, "unknown flag %s (see the file's header)\n", k.c_str());
      std::exit(2);
    }
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  const Config c = Parse(argc, argv);
  std::vector<std::pair<std::string, std::map<std::string, double>>> results;
  for (auto start : {&StartBeast, &StartMhd}) {
    Server s = start(c);
    std::fprintf(stderr, "measuring %s on port %d\n", s.name.c_str(), s.port);
    results.emplace_back(s.name, Measure(s, c));
    s.stop();
  }
  std::ostringstream json;
  json << "{\"config\": {\"threads\": " << c.threads << ", \"clients\": " << c.clients
       << ", \"requests_per_client\": " << c.requests << ", \"probes\": " << c.probes
       << ", \"probe_gap_ms\": " << c.probe_gap_ms << ", \"slow\": " << c.slow << ", \"trickle_s\": " << c.trickle_s
       << ", \"cpus\": " << std::thread::hardware_concurrency() << "}, \"servers\": {";
  for (std::size_t i = 0; i < results.size(); ++i)
    json << (i ? ", " : "") << "\"" << results[i].first << "\": " << Json(results[i].second);
  json << "}}";
  std::printf("%s\n\n", json.str().c_str());
  if (!c.json.empty()) std::ofstream(c.json) << json.str() << "\n";
  std::printf(
      "| server | keep-alive req/s (%d clients) | keep-alive p99 ms | solo /health p50 / p99 ms | "
      "/health p50 / p99 / max ms, %d slow bodies | slow reopened / held at end |\n",
      c.clients, c.slow);
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  for (const auto& [name, r] : results) {
    std::printf("| %s | %.0f | %.3f | %.3f / %.3f | %.3f / %.3f / %.3f (%g failed) | %g / %g |\n", name.c_str(),
                r.at("keepalive_requests_per_s"), r.at("keepalive_p99_ms"), r.at("solo_p50_ms"), r.at("solo_p99_ms"),
                r.at("slow_p50_ms"), r.at("slow_p99_ms"), r.at("slow_max_ms"), r.at("slow_failures"),
                r.at("slow_reopened"), r.at("slow_held_at_end"));
  }
  return 0;
}
