// `epd-encode serve | client | bench-server`: the gRPC encode server and its
// command-line clients (docs/SERVER.md).
//
//   serve         runs an EncodeServer until SIGTERM or SIGINT, then shuts
//                 down gracefully (--grace-s) and exits 0. Prints one line
//                 "READY port=<p> metrics_port=<m> server_id=<id>" on stdout
//                 once it accepts calls, so scripts can wait for it.
//   client        encodes image files; one stdout line per item:
//                   index=<i> key=<hex> tokens=<n> hidden=<h> source=<l1|l2|miss|joined> ms=<server ms> server=<id>
//                 --out FILE writes the embeddings as safetensors
//                 (epd/safetensors.h). A failure prints "<CODE_NAME>: <message>"
//                 on stderr and exits 1.
//   bench-server  a bounded load generator for a server on loopback: closed
//                 loop (--concurrency callers back to back) or open loop
//                 (--rate R requests/s on a fixed schedule, latency measured
//                 from each request's scheduled start, so a stalled server
//                 cannot hide its queueing: no coordinated omission). One
//                 image per request. Stops after --duration-s.
//
// Exit codes: 0 success; 1 a call or item failed (client) or setup failed;
// 2 usage error (CLI11); 3 bench-server saw errors.
#include <malloc.h>
#include <signal.h>
#include <unistd.h>
#include <turbojpeg.h>

#include <algorithm>
#include <filesystem>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fmt/format.h>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <sstream>
#include <thread>

#include "commands.h"
#include "exit_deadline.h"
#include "flag_checks.h"
#include "security_flags.h"
#include "epd/client.h"
#include "epd/safetensors.h"
#include "epd/server.h"
#include "trace.h"
#include "worker_flags.h"

namespace epd::cli {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Fail(int code, const std::string& message) {
  spdlog::error("{}", message);
  throw CLI::RuntimeError(code);
}

StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status(StatusCode::kNotFound, "cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every response and request buffer here is about one embedding (~1-2 MB).
// glibc's defaults serve such blocks by mmap, or trim them back to the kernel
// when freed, so each message pays ~500 fresh page faults per 2 MB; measured
// on loopback this halved hit-only throughput (docs/BENCHMARKS-server.md).
// Keeping blocks under 32 MB in the heap and trimming only above 64 MB of
// free top memory per arena reuses them instead. Process-wide, so it is set
// here in the executable, not in the libraries.
void TuneMallocForEmbeddingMessages() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
}

// ---------------------------------------------------------------- serve ---

struct ServeFlags {
  WorkerFlags worker;
  std::string host = "0.0.0.0";
  int port = 50051;
  int metrics_port = -1;
  std::string metrics_host = "0.0.0.0";
  std::string server_id;
  std::int64_t max_queue = 1024;
  double grace_s = 10;
  std::int64_t max_items_per_request = 256;
  double max_request_mb = 64;
  double max_buffered_mb = 256;
  int max_rpc_threads = 256;
  ServerSecurityFlags security;
};

int RunServe(const ServeFlags& f) {
  TuneMallocForEmbeddingMessages();
  // Block the stop signals in every thread (the ones started below inherit
  // the mask) and take them with sigwait on this one.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  WorkerOptions wo;
  wo.max_pending_items = f.max_queue;
  StatusOr<WorkerParts> parts = MakeWorkerParts(f.worker, wo);
  if (!parts.ok()) Fail(1, "cannot load the tower: " + parts.status().ToString());

  ServerOptions so;
  so.address = f.host + ":" + std::to_string(f.port);
  so.server_id = f.server_id;
  so.metrics_port = f.metrics_port;
  so.metrics_address = f.metrics_host;
  so.max_items_per_request = f.max_items_per_request;
  so.max_request_bytes = static_cast<std::int64_t>(f.max_request_mb * (1 << 20));
  so.max_buffered_bytes = static_cast<std::int64_t>(f.max_buffered_mb * (1 << 20));
  so.max_rpc_threads = f.max_rpc_threads;
  if (Status s = ApplyServerSecurityFlags(f.security, so); !s.ok()) Fail(1, s.message());
  so.log = [](const std::string& line) { spdlog::warn("{}", line); };
  const std::string tower = parts->tower->Describe();
  StatusOr<std::unique_ptr<EncodeServer>> server =
      EncodeServer::Start(so, std::move(parts->options), std::move(parts->tower));
  if (!server.ok()) Fail(1, "cannot start the server: " + server.status().ToString());

  spdlog::info("serving {} on {}:{} as '{}' (metrics: {})", tower, f.host, (*server)->port(),
               (*server)->server_id(),
               (*server)->metrics_port() < 0 ? std::string("off")
                                            : fmt::format("http://{}:{}/metrics", so.metrics_address,
                                                          (*server)->metrics_port()));
  std::printf("READY port=%d metrics_port=%d server_id=%s\n", (*server)->port(), (*server)->metrics_port(),
              (*server)->server_id().c_str());
  std::fflush(stdout);

  int sig = 0;
  sigwait(&stop, &sig);
  spdlog::info("{}: stopping; calls in flight get {:.1f} s to finish", sig == SIGTERM ? "SIGTERM" : "SIGINT",
               f.grace_s);
  {
    const std::chrono::milliseconds grace(static_cast<std::int64_t>(f.grace_s * 1000));
    const ExitDeadline backstop(grace + std::chrono::seconds(1),
                                "shutdown outlived --grace-s + 1 s (a tower batch still running?); exiting now");
    (*server)->Shutdown(grace);
  }
  const ServerStats s = (*server)->Stats();
  spdlog::info("stopped after {} requests ({} items: {} l1, {} l2, {} miss, {} joined)", s.worker.requests,
               s.worker.items, s.worker.hits_l1, s.worker.hits_l2, s.worker.misses, s.worker.joins);
  return 0;
}

// --------------------------------------------------------------- client ---

struct ClientFlags {
  std::string server;
  std::vector<std::string> images;
  std::string out;
  double timeout_s = 30;
  bool no_route = false;
  std::string request_id;
  ClientSecurityFlags security;
};

int RunClient(const ClientFlags& f) {
  TuneMallocForEmbeddingMessages();
  std::vector<ClientItem> items;
  for (const std::string& path : f.images) {
    StatusOr<std::string> bytes = ReadFile(path);
    if (!bytes.ok()) Fail(1, bytes.status().message());
    items.push_back(ClientItem{std::move(*bytes), std::nullopt, 0});
  }
  ClientOptions co;
  co.target = f.server;
  co.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(f.timeout_s * 1000));
  co.route_by_key = !f.no_route;
  if (Status s = ApplyClientSecurityFlags(f.security, co); !s.ok()) Fail(1, s.message());
  StatusOr<std::unique_ptr<EncodeClient>> client = EncodeClient::Connect(co);
  if (!client.ok()) Fail(1, client.status().ToString());

  EncodeResult r = (*client)->Encode(std::move(items), f.request_id);
  std::vector<KeyedEmbedding> out;
  for (const ClientItemResult& item : r.items) {
    if (!item.status.ok()) {
      // One line per failed item when there are several; the final line
      // below always carries the (lowest-index) failure.
      if (r.items.size() > 1) {
        std::fprintf(stderr, "index=%lld %s: %s\n", static_cast<long long>(item.index),
                     GrpcStatusName(item.status.code()).c_str(), item.status.message().c_str());
      }
      continue;
    }
    const Embedding& e = *item.embedding;
    std::printf("index=%lld key=%s tokens=%lld hidden=%lld source=%s ms=%.3f server=%s\n",
                static_cast<long long>(item.index), item.key.Hex().c_str(), static_cast<long long>(e.tokens),
                static_cast<long long>(e.hidden), std::string(ItemSourceName(item.source)).c_str(), item.total_ms,
                item.server_id.c_str());
    out.push_back({item.key, item.embedding});
  }
  std::fflush(stdout);
  if (!f.out.empty() && !out.empty()) {
    std::map<std::string, std::string> meta = {{"server", f.server}};
    if (StatusOr<ServerInfo> info = (*client)->Health(); info.ok()) meta["model_id"] = info->model_id;
    if (Status s = WriteEmbeddingsSafetensors(f.out, out, meta); !s.ok()) Fail(1, "--out: " + s.ToString());
  }
  if (!r.status.ok()) {
    std::fprintf(stderr, "%s: %s\n", GrpcStatusName(r.status.code()).c_str(), r.status.message().c_str());
    return 1;
  }
  return 0;
}

// --------------------------------------------------------- bench-server ---

struct BenchFlags {
  std::string server;
  int concurrency = 8;
  double duration_s = 10;
  std::string images;
  int synthetic = 64;
  int image_size = 512;
  bool hit_only = false;
  double rate = 0;
  double zipf = 0;
  std::uint64_t seed = 1;
  double timeout_s = 10;
  int server_pid = 0;
  int connections = 0;
  bool json = false;
};

// SplitMix64 (Steele, Lea, Flood, OOPSLA 2014): same sequence everywhere.
struct SplitMix64 {
  std::uint64_t s;
  std::uint64_t Next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
};

// A size x size JPEG (quality 90, 4:2:0, as cameras and browsers send them)
// whose pixels depend on `seed`, so every seed is a distinct image with a
// distinct key. Smooth gradients plus mild per-pixel noise give about the
// compressed size of a photograph (~100 KB at 512x512).
std::string SyntheticJpeg(int size, std::uint64_t seed) {
  std::vector<unsigned char> rgb(static_cast<std::size_t>(size) * size * 3);
  SplitMix64 noise{seed};
  for (int y = 0; y < size; ++y) {
    for (int x = 0; x < size; ++x) {
      unsigned char* p = &rgb[(static_cast<std::size_t>(y) * size + x) * 3];
      const std::uint64_t n = noise.Next();
      p[0] = static_cast<unsigned char>((x / 2 + seed * 7 + (n & 15)) & 0xff);
      p[1] = static_cast<unsigned char>((y / 2 + seed * 13 + ((n >> 8) & 15)) & 0xff);
      p[2] = static_cast<unsigned char>(((x + y) / 4 + seed * 3 + ((n >> 16) & 15)) & 0xff);
    }
  }
  tjhandle tj = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long len = 0;
  const int rc = tjCompress2(tj, rgb.data(), size, 0, size, TJPF_RGB, &out, &len, TJSAMP_420, 90, TJFLAG_ACCURATEDCT);
  std::string jpeg = rc == 0 ? std::string(reinterpret_cast<char*>(out), len) : std::string();
  tjFree(out);
  tjDestroy(tj);
  return jpeg;
}

bool IsLoopback(const std::string& target) {
  std::string host = target.substr(0, target.rfind(':'));
  if (host.starts_with("ipv4:")) host = host.substr(5);
  return host == "localhost" || host == "[::1]" || host == "::1" || host.starts_with("127.");
}

double Percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::size_t rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  rank = std::clamp<std::size_t>(rank, 1, v.size());
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(rank - 1), v.end());
  return v[rank - 1];
}

double RssMb(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("VmRSS:")) return std::stod(line.substr(6)) / 1024.0;  // kB -> MB
  }
  return 0;
}

int RunBench(const BenchFlags& f) {
  TuneMallocForEmbeddingMessages();
  if (!IsLoopback(f.server)) {
    Fail(1, "bench-server only loads servers on loopback (127.0.0.0/8, localhost, ::1); got " + f.server);
  }
  std::vector<std::string> images;
  if (!f.images.empty()) {
    StatusOr<std::vector<std::string>> paths = ListImages(f.images);
    if (!paths.ok()) Fail(1, paths.status().message());
    for (const std::string& name : *paths) {  // names relative to --images
      StatusOr<std::string> b = ReadFile((std::filesystem::path(f.images) / name).string());
      if (!b.ok()) Fail(1, b.status().message());
      images.push_back(std::move(*b));
    }
  } else {
    for (int i = 0; i < f.synthetic; ++i) images.push_back(SyntheticJpeg(f.image_size, static_cast<std::uint64_t>(i)));
  }

  ClientOptions co;
  co.target = f.server;
  co.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(f.timeout_s * 1000));
  // Callers share `connections` clients (one HTTP/2 connection each),
  // round robin by caller.
  const int n_conn = f.connections > 0 ? f.connections : std::min(f.concurrency, 4);
  std::vector<std::unique_ptr<EncodeClient>> clients;
  for (int i = 0; i < n_conn; ++i) {
    StatusOr<std::unique_ptr<EncodeClient>> c = EncodeClient::Connect(co);
    if (!c.ok()) Fail(1, c.status().ToString());
    clients.push_back(std::move(*c));
  }
  std::unique_ptr<EncodeClient>* client = &clients[0];
  if (StatusOr<ServerInfo> info = (*client)->Health(); !info.ok()) {
    Fail(1, "server " + f.server + " does not answer Health: " + info.status().ToString());
  }
  if (f.hit_only) {
    // Warm-up, not measured: afterwards every request is a cache hit (if the
    // caches hold the whole set).
    for (std::size_t i = 0; i < images.size(); ++i) {
      EncodeResult r = (*client)->Encode({ClientItem{images[i], std::nullopt, 0}});
      if (!r.status.ok()) Fail(1, "warm-up of image " + std::to_string(i) + " failed: " + r.status.ToString());
    }
  }

  // Image choice: uniform (zipf 0) or Zipf(s) over the image list.
  std::vector<double> cdf(images.size());
  double total = 0;
  for (std::size_t r = 0; r < images.size(); ++r) cdf[r] = (total += 1.0 / std::pow(static_cast<double>(r + 1), f.zipf));
  for (double& c : cdf) c /= total;

  struct PerThread {
    std::vector<double> latency_ms;
    std::map<std::string, std::uint64_t> errors;
    std::map<std::string, std::uint64_t> sources;
  };
  std::vector<PerThread> per(static_cast<std::size_t>(f.concurrency));
  std::atomic<std::uint64_t> ticket{0};
  std::atomic<bool> stop_rss{false};
  double rss_start = f.server_pid > 0 ? RssMb(f.server_pid) : 0, rss_max = rss_start, rss_end = rss_start;
  std::thread rss_thread;
  if (f.server_pid > 0) {
    rss_thread = std::thread([&] {
      while (!stop_rss.load()) {
        const double mb = RssMb(f.server_pid);
        rss_max = std::max(rss_max, mb);
        rss_end = mb;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    });
  }

  const Clock::time_point start = Clock::now();
  const Clock::time_point end = start + std::chrono::milliseconds(static_cast<std::int64_t>(f.duration_s * 1000));
  std::vector<std::thread> threads;
  for (int t = 0; t < f.concurrency; ++t) {
    threads.emplace_back([&, t] {
      PerThread& me = per[static_cast<std::size_t>(t)];
      SplitMix64 rng{f.seed * 1000003 + static_cast<std::uint64_t>(t)};
      for (;;) {
        Clock::time_point scheduled = Clock::now();
        if (f.rate > 0) {
          const std::uint64_t k = ticket.fetch_add(1);
          scheduled = start + std::chrono::nanoseconds(static_cast<std::int64_t>(static_cast<double>(k) * 1e9 / f.rate));
          if (scheduled >= end) break;
          std::this_thread::sleep_until(scheduled);
        } else if (scheduled >= end) {
          break;
        }
        const double u = rng.Uniform();
        const std::size_t i = std::min<std::size_t>(
            static_cast<std::size_t>(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin()), images.size() - 1);
        EncodeResult r = clients[static_cast<std::size_t>(t % n_conn)]->Encode({ClientItem{images[i], std::nullopt, 0}});
        me.latency_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - scheduled).count());
        if (!r.status.ok()) {
          ++me.errors[GrpcStatusName(r.status.code())];
        } else {
          ++me.sources[std::string(ItemSourceName(r.items[0].source))];
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  stop_rss = true;
  if (rss_thread.joinable()) rss_thread.join();

  std::vector<double> lat;
  std::map<std::string, std::uint64_t> errors, sources;
  std::uint64_t n_errors = 0;
  for (PerThread& p : per) {
    lat.insert(lat.end(), p.latency_ms.begin(), p.latency_ms.end());
    for (auto& [k, v] : p.errors) errors[k] += v, n_errors += v;
    for (auto& [k, v] : p.sources) sources[k] += v;
  }
  const std::size_t n = lat.size();
  const double p50 = Percentile(lat, 0.50), p90 = Percentile(lat, 0.90), p99 = Percentile(lat, 0.99);
  const double max = lat.empty() ? 0 : *std::max_element(lat.begin(), lat.end());
  if (f.json) {
    nlohmann::json j = {{"server", f.server},        {"mode", f.rate > 0 ? "open" : "closed"},
                        {"rate", f.rate},            {"concurrency", f.concurrency}, {"connections", n_conn},
                        {"duration_s", wall_s},      {"requests", n},
                        {"errors", n_errors},        {"error_codes", errors},
                        {"sources", sources},        {"req_per_s", static_cast<double>(n) / wall_s},
                        {"p50_ms", p50},             {"p90_ms", p90},
                        {"p99_ms", p99},             {"max_ms", max},
                        {"images", images.size()},   {"image_bytes", images.empty() ? 0 : images[0].size()}};
    if (f.server_pid > 0) j["server_rss_mb"] = {{"start", rss_start}, {"max", rss_max}, {"end", rss_end}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("mode %s%s  concurrency %d  duration_s %.2f\n", f.rate > 0 ? "open-loop" : "closed-loop",
                f.rate > 0 ? fmt::format(" at {:.0f} req/s", f.rate).c_str() : "", f.concurrency, wall_s);
    std::printf("requests %zu  errors %llu  req_per_s %.1f\n", n, static_cast<unsigned long long>(n_errors),
                static_cast<double>(n) / wall_s);
    std::printf("latency_ms p50 %.3f  p90 %.3f  p99 %.3f  max %.3f\n", p50, p90, p99, max);
    std::string src;
    for (auto& [k, v] : sources) src += fmt::format(" {} {}", k, v);
    std::printf("sources%s\n", src.empty() ? " none" : src.c_str());
    for (auto& [k, v] : errors) std::printf("error %s %llu\n", k.c_str(), static_cast<unsigned long long>(v));
    if (f.server_pid > 0) std::printf("server_rss_mb start %.1f  max %.1f  end %.1f\n", rss_start, rss_max, rss_end);
  }
  std::fflush(stdout);
  return n_errors == 0 ? 0 : 3;
}

}  // namespace

void RegisterServerCommands(CLI::App& app) {
  {
    auto f = std::make_shared<ServeFlags>();
    CLI::App* cmd = app.add_subcommand("serve", "run the gRPC encode server until SIGTERM/SIGINT");
    AddWorkerFlags(*cmd, f->worker);
    cmd->add_option("--host", f->host, "address to listen on")->capture_default_str();
    cmd->add_option("--port", f->port, "gRPC port, 0 = any free port (printed)")->capture_default_str()
        ->check(Integer(0, 65535));
    cmd->add_option("--metrics-port", f->metrics_port, "Prometheus /metrics port, -1 = off, 0 = any free port")
        ->capture_default_str()->check(Integer(-1, 65535));
    cmd->add_option("--metrics-host", f->metrics_host, "address the metrics endpoint listens on")
        ->capture_default_str();
    cmd->add_option("--server-id", f->server_id, "name reported in every item [<hostname>:<port>]");
    cmd->add_option("--max-queue", f->max_queue,
                    "most images queued for the tower; requests past it get RESOURCE_EXHAUSTED (0 = unbounded)")
        ->capture_default_str()->check(Integer(0));
    cmd->add_option("--grace-s", f->grace_s, "on SIGTERM/SIGINT, seconds calls in flight get to finish")
        ->capture_default_str()->check(Number(0, 86400, "s"));
    cmd->add_option("--max-items-per-request", f->max_items_per_request, "most images in one request")
        ->capture_default_str()->check(Integer(1));
    cmd->add_option("--max-request-mb", f->max_request_mb, "largest request message, MB")->capture_default_str()
        ->check(Number(0.001, 2047, "MB"));
    cmd->add_option("--max-buffered-mb", f->max_buffered_mb,
                    "result bytes waiting for slow clients above which no new tower batch starts, MB")
        ->capture_default_str()->check(Number(0.001, 1e9, "MB"));
    cmd->add_option("--max-rpc-threads", f->max_rpc_threads, "most gRPC handler threads (one per call in flight)")
        ->capture_default_str()->check(Integer(2, 100000));
    AddServerSecurityFlags(*cmd, f->security);
    cmd->callback([f] {
      if (int rc = RunServe(*f); rc != 0) throw CLI::RuntimeError(rc);
    });
  }
  {
    auto f = std::make_shared<ClientFlags>();
    CLI::App* cmd = app.add_subcommand("client", "encode image files with a running server");
    cmd->add_option("--server", f->server, "HOST:PORT of a server or of the nginx front")->required();
    cmd->add_option("images", f->images, "JPEG/PNG files")->required()->check(CLI::ExistingFile);
    cmd->add_option("--out", f->out, "write the embeddings to this safetensors file");
    cmd->add_option("--timeout-s", f->timeout_s, "deadline of each call, seconds")->capture_default_str()
        ->check(Number(0, 1e6, "s", /*lo_open=*/true));
    cmd->add_flag("--no-route", f->no_route, "one call for all images, without the x-epd-route header");
    cmd->add_option("--request-id", f->request_id, "request id [random]");
    AddClientSecurityFlags(*cmd, f->security);
    cmd->callback([f] {
      if (int rc = RunClient(*f); rc != 0) throw CLI::RuntimeError(rc);
    });
  }
  {
    auto f = std::make_shared<BenchFlags>();
    CLI::App* cmd = app.add_subcommand("bench-server", "load a server on loopback for a bounded time");
    cmd->add_option("--server", f->server, "HOST:PORT on loopback")->required();
    cmd->add_option("--concurrency", f->concurrency, "callers (closed loop) or in-flight cap (open loop)")
        ->capture_default_str()->check(Integer(1, 4096));
    cmd->add_option("--duration-s", f->duration_s, "how long to send, seconds")->capture_default_str()
        ->check(Number(0.1, 3600, "s"));
    auto* images = cmd->add_option("--images", f->images, "directory of JPEG/PNG files to send");
    cmd->add_option("--synthetic", f->synthetic, "without --images: this many generated JPEGs")
        ->capture_default_str()->check(Integer(1, 100000))->excludes(images);
    cmd->add_option("--image-size", f->image_size, "side of the generated square JPEGs, pixels")
        ->capture_default_str()->check(Integer(28, 4096));
    cmd->add_flag("--hit-only", f->hit_only, "encode every image once first, so measured requests are cache hits");
    cmd->add_option("--rate", f->rate, "open loop: requests/s on a fixed schedule (0 = closed loop)")
        ->capture_default_str()->check(Number(0, 1e6, "requests/s"));
    cmd->add_option("--zipf", f->zipf, "image popularity: Zipf exponent s over the image list (0 = uniform)")
        ->capture_default_str()->check(Number(0, 10));
    cmd->add_option("--seed", f->seed, "image choice seed")->capture_default_str();
    cmd->add_option("--timeout-s", f->timeout_s, "deadline of each call, seconds")->capture_default_str()
        ->check(Number(0, 1e6, "s", /*lo_open=*/true));
    cmd->add_option("--server-pid", f->server_pid, "sample this process's RSS during the run (same machine)")
        ->check(Integer(1));
    cmd->add_option("--connections", f->connections, "HTTP/2 connections to spread callers over [min(concurrency, 4)]")
        ->check(Integer(1, 256));
    cmd->add_flag("--json", f->json, "print one JSON object instead of text");
    cmd->callback([f] {
      if (int rc = RunBench(*f); rc != 0) throw CLI::RuntimeError(rc);
    });
  }
}

}  // namespace epd::cli
