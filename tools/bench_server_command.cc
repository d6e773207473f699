// `epd-encode bench-server`: a bounded load generator for an encode server
// on loopback (docs/SERVER.md). Closed loop (--concurrency callers back to
// back) or open loop (--rate R requests/s on a fixed schedule, latency
// measured from each request's scheduled start, so a stalled server cannot
// hide its queueing: no coordinated omission). One image per request. Stops
// after --duration-s.
//
// Exit codes: 0 no call failed; 1 setup failed or a usage error; 3 some
// calls failed.
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <turbojpeg.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli_util.h"
#include "commands.h"
#include "epd/client/client.h"
#include "flag_checks.h"
#include "security_flags.h"
#include "trace.h"

namespace epd::cli {
namespace {

ClientItem ImageItem(const std::string& image) {
  ClientItem item;
  item.image = image;
  return item;
}

using Clock = std::chrono::steady_clock;

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
  bool shm = false;
  bool route_by_key = false;
  bool json = false;
  ClientSecurityFlags security;
};

// A size x size JPEG (quality 90, 4:2:0, as cameras and browsers send them)
// whose pixels depend on `seed`, so every seed is a distinct image with a
// distinct key. Smooth gradients plus mild per-pixel noise give about the
// compressed size of a photograph (~100 KB at 512x512).
std::string SyntheticJpeg(int size, std::uint64_t seed) {
  std::vector<unsigned char> rgb(static_cast<std::size_t>(size) * size * 3);
  SplitMix64 noise(seed);
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
  if (target.starts_with("unix:")) return true;  // a Unix socket is on this host by construction
  std::string host = target.substr(0, target.rfind(':'));
  if (host.starts_with("ipv4:")) host = host.substr(5);
  return host == "localhost" || host == "[::1]" || host == "::1" || host.starts_with("127.");
}

double RssMb(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with("VmRSS:")) return std::stod(line.substr(6)) / 1024.0;  // kB -> MB
  }
  return 0;
}

// --server-pid: samples the process's RSS every 200 ms on a thread of its
// own from construction to Stop(); without a pid (0) it samples nothing and
// every figure is 0. The figures are read after Stop().
class RssSampler {
 public:
  explicit RssSampler(int pid) : pid_(pid) {
    if (pid_ <= 0) return;
    start_ = max_ = end_ = RssMb(pid_);
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        const double mb = RssMb(pid_);
        max_ = std::max(max_, mb);
        end_ = mb;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    });
  }
  ~RssSampler() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  double start_mb() const { return start_; }
  double max_mb() const { return max_; }
  double end_mb() const { return end_; }

 private:
  int pid_;
  double start_ = 0, max_ = 0, end_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The images to send: every file of --images, or --synthetic generated JPEGs.
std::vector<std::string> LoadBenchImages(const BenchFlags& f) {
  std::vector<std::string> images;
  if (f.images.empty()) {
    for (int i = 0; i < f.synthetic; ++i) images.push_back(SyntheticJpeg(f.image_size, static_cast<std::uint64_t>(i)));
    return images;
  }
  StatusOr<std::vector<std::string>> paths = ListImages(f.images);
  if (!paths.ok()) FailCommand(1, paths.status().message());
  for (const std::string& name : *paths) {  // names relative to --images
    StatusOr<std::string> b = ReadFile((std::filesystem::path(f.images) / name).string());
    if (!b.ok()) FailCommand(1, b.status().message());
    images.push_back(std::move(*b));
  }
  return images;
}

// `n_conn` clients (one HTTP/2 connection each), the first of which must
// answer Health.
std::vector<std::unique_ptr<EncodeClient>> ConnectBenchClients(const BenchFlags& f, int n_conn) {
  ClientOptions co;
  co.target = f.server;
  co.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(f.timeout_s * 1000));
  if (Status s = ApplyClientSecurityFlags(f.security, co); !s.ok()) FailCommand(1, s.message());
  co.delivery = f.shm ? Delivery::kShm : Delivery::kInline;
  // The benchmark talks to one server directly, where no load balancer reads
  // the route header, so by default the client does not hash each image to
  // make one (ClientOptions::route_by_key); --route-by-key measures with it.
  co.route_by_key = f.route_by_key;
  std::vector<std::unique_ptr<EncodeClient>> clients;
  for (int i = 0; i < n_conn; ++i) {
    StatusOr<std::unique_ptr<EncodeClient>> c = EncodeClient::Connect(co);
    if (!c.ok()) FailCommand(1, c.status().ToString());
    clients.push_back(std::move(*c));
  }
  if (StatusOr<ServerInfo> info = clients[0]->Health(); !info.ok()) {
    FailCommand(1, "server " + f.server + " does not answer Health: " + info.status().ToString());
  }
  return clients;
}

// --hit-only's warm-up, not measured: afterwards every request is a cache
// hit (if the caches hold the whole set), and every connection has made its
// first calls (Health, HTTP/2 window growth, with --shm the arena's
// mapping), whose one-time costs would otherwise land in the first measured
// requests of each connection.
void WarmUp(const std::vector<std::unique_ptr<EncodeClient>>& clients, const std::vector<std::string>& images) {
  for (const std::unique_ptr<EncodeClient>& c : clients) {
    for (std::size_t i = 0; i < images.size(); ++i) {
      EncodeResult r = c->Encode({ImageItem(images[i])});
      if (!r.status.ok()) FailCommand(1, "warm-up of image " + std::to_string(i) + " failed: " + r.status.ToString());
    }
  }
}

// Image choice: uniform (zipf 0) or Zipf(s) over `n` images, as a CDF.
std::vector<double> PopularityCdf(std::size_t n, double zipf) {
  std::vector<double> cdf(n);
  double total = 0;
  for (std::size_t r = 0; r < n; ++r) cdf[r] = (total += 1.0 / std::pow(static_cast<double>(r + 1), zipf));
  for (double& c : cdf) c /= total;
  return cdf;
}

// A caller reads every row it receives, either way, so inline and
// shared-memory delivery are compared doing the same work: a sum over one
// float per 64-byte line touches every cache line once. Returns `sum` plus
// the floats read.
float AddLines(const std::byte* rows, std::size_t n, float sum) {
  for (std::size_t b = 0; b + sizeof(float) <= n; b += 64) {
    float v;
    std::memcpy(&v, rows + b, sizeof(v));
    sum += v;
  }
  return sum;
}

// The sum of one float per line of `item`'s rows: main, then deepstack.
float ReadRows(const ClientItemResult& item) {
  if (item.shm != nullptr) return AddLines(item.shm->main(), item.shm->main_bytes() + item.shm->deepstack_bytes(), 0);
  const std::vector<std::byte>& d = item.embedding->deepstack;
  return AddLines(d.data(), d.size(), AddLines(item.embedding->main.data(), item.embedding->main.size(), 0));
}

// What one caller saw.
struct CallerStats {
  std::vector<double> latency_ms;
  std::map<std::string, std::uint64_t> errors;
  std::map<std::string, std::uint64_t> sources;
  std::uint64_t by_shm = 0;  // replies that came by reference
  double checksum = 0;       // keeps the reads of the rows from being optimised away
};

// What every caller shares: the images, their popularity, the clients and
// the schedule.
struct BenchLoad {
  const std::vector<std::string>& images;
  std::vector<double> cdf;
  const std::vector<std::unique_ptr<EncodeClient>>& clients;
  Clock::time_point start, end;
  std::atomic<std::uint64_t> ticket{0};  // open loop: the next request's slot
};

// Caller `t`: requests back to back (closed loop), or in the next free slot
// of the --rate schedule (open loop), until the end of the run.
void RunCaller(const BenchFlags& f, int t, BenchLoad& load, CallerStats& me) {
  SplitMix64 rng(f.seed * 1000003 + static_cast<std::uint64_t>(t));
  for (;;) {
    Clock::time_point scheduled = Clock::now();
    if (f.rate > 0) {
      const std::uint64_t k = load.ticket.fetch_add(1);
      scheduled =
          load.start + std::chrono::nanoseconds(static_cast<std::int64_t>(static_cast<double>(k) * 1e9 / f.rate));
      if (scheduled >= load.end) break;
      std::this_thread::sleep_until(scheduled);
    } else if (scheduled >= load.end) {
      break;
    }
    const double u = rng.Unit();
    const std::size_t i = std::min<std::size_t>(
        static_cast<std::size_t>(std::lower_bound(load.cdf.begin(), load.cdf.end(), u) - load.cdf.begin()),
        load.images.size() - 1);
    EncodeResult r =
        load.clients[static_cast<std::size_t>(t) % load.clients.size()]->Encode({ImageItem(load.images[i])});
    if (r.status.ok()) {
      me.checksum += ReadRows(r.items[0]);
      if (r.items[0].shm != nullptr) ++me.by_shm;
      r.items[0].shm.reset();  // done reading: the release rides on this caller's next call
    }
    me.latency_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - scheduled).count());
    if (!r.status.ok()) {
      ++me.errors[GrpcStatusName(r.status.code())];
    } else {
      ++me.sources[std::string(ItemSourceName(r.items[0].source))];
    }
  }
}

// Every caller's figures together.
struct BenchTotals {
  std::vector<double> latency_ms;  // ascending
  std::map<std::string, std::uint64_t> errors, sources;
  std::uint64_t n_errors = 0, by_shm = 0;
  double checksum = 0;
  double wall_s = 0;
};

BenchTotals MergeCallers(const std::vector<CallerStats>& per, double wall_s) {
  BenchTotals t;
  t.wall_s = wall_s;
  for (const CallerStats& p : per) {
    t.by_shm += p.by_shm;
    t.checksum += p.checksum;
    t.latency_ms.insert(t.latency_ms.end(), p.latency_ms.begin(), p.latency_ms.end());
    for (const auto& [k, v] : p.errors) t.errors[k] += v, t.n_errors += v;
    for (const auto& [k, v] : p.sources) t.sources[k] += v;
  }
  std::sort(t.latency_ms.begin(), t.latency_ms.end());
  return t;
}

void PrintBenchJson(const BenchFlags& f, int n_conn, const std::vector<std::string>& images, const BenchTotals& t,
                    const RssSampler& rss) {
  const std::vector<double>& lat = t.latency_ms;
  const std::size_t n = lat.size();
  nlohmann::json j = {{"server", f.server},
                      {"mode", f.rate > 0 ? "open" : "closed"},
                      {"rate", f.rate},
                      {"concurrency", f.concurrency},
                      {"connections", n_conn},
                      {"duration_s", t.wall_s},
                      {"requests", n},
                      {"errors", t.n_errors},
                      {"error_codes", t.errors},
                      {"sources", t.sources},
                      {"req_per_s", static_cast<double>(n) / t.wall_s},
                      {"p50_ms", Percentile(lat, 0.50)},
                      {"p90_ms", Percentile(lat, 0.90)},
                      {"p99_ms", Percentile(lat, 0.99)},
                      {"max_ms", lat.empty() ? 0 : lat.back()},
                      {"images", images.size()},
                      {"image_bytes", images.empty() ? 0 : images[0].size()},
                      {"delivery", f.shm ? "shm" : "inline"},
                      {"route_by_key", f.route_by_key},
                      {"replies_by_shm", t.by_shm},
                      {"checksum", t.checksum}};
  if (f.server_pid > 0) j["server_rss_mb"] = {{"start", rss.start_mb()}, {"max", rss.max_mb()}, {"end", rss.end_mb()}};
  std::printf("%s\n", j.dump().c_str());
}

void PrintBenchText(const BenchFlags& f, const BenchTotals& t, const RssSampler& rss) {
  const std::vector<double>& lat = t.latency_ms;
  const std::size_t n = lat.size();
  std::printf("mode %s%s  concurrency %d  duration_s %.2f\n", f.rate > 0 ? "open-loop" : "closed-loop",
              f.rate > 0 ? fmt::format(" at {:.0f} req/s", f.rate).c_str() : "", f.concurrency, t.wall_s);
  std::printf("requests %zu  errors %llu  req_per_s %.1f\n", n, static_cast<unsigned long long>(t.n_errors),
              static_cast<double>(n) / t.wall_s);
  std::printf("delivery %s  replies_by_shm %llu  checksum %g\n", f.shm ? "shm" : "inline",
              static_cast<unsigned long long>(t.by_shm), t.checksum);
  std::printf("latency_ms p50 %.3f  p90 %.3f  p99 %.3f  max %.3f\n", Percentile(lat, 0.50), Percentile(lat, 0.90),
              Percentile(lat, 0.99), lat.empty() ? 0 : lat.back());
  std::string src;
  for (const auto& [k, v] : t.sources) src += fmt::format(" {} {}", k, v);
  std::printf("sources%s\n", src.empty() ? " none" : src.c_str());
  for (const auto& [k, v] : t.errors) std::printf("error %s %llu\n", k.c_str(), static_cast<unsigned long long>(v));
  if (f.server_pid > 0) {
    std::printf("server_rss_mb start %.1f  max %.1f  end %.1f\n", rss.start_mb(), rss.max_mb(), rss.end_mb());
  }
}

int RunBench(const BenchFlags& f) {
  TuneMalloc(MallocUse::kMessages);
  if (!IsLoopback(f.server)) {
    FailCommand(
        1, "bench-server only loads servers on loopback (127.0.0.0/8, localhost, ::1, unix:/path); got " + f.server);
  }
  const std::vector<std::string> images = LoadBenchImages(f);
  // Callers share `connections` clients (one HTTP/2 connection each),
  // round robin by caller.
  const int n_conn = f.connections > 0 ? f.connections : std::min(f.concurrency, 4);
  const std::vector<std::unique_ptr<EncodeClient>> clients = ConnectBenchClients(f, n_conn);
  if (f.hit_only) WarmUp(clients, images);

  std::vector<CallerStats> per(static_cast<std::size_t>(f.concurrency));
  RssSampler rss(f.server_pid);
  BenchLoad load{images, PopularityCdf(images.size(), f.zipf), clients, Clock::now(), {}};
  load.end = load.start + std::chrono::milliseconds(static_cast<std::int64_t>(f.duration_s * 1000));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(f.concurrency));
  for (int t = 0; t < f.concurrency; ++t) {
    threads.emplace_back([&f, &load, &per, t] { RunCaller(f, t, load, per[static_cast<std::size_t>(t)]); });
  }
  for (std::thread& t : threads) t.join();
  const BenchTotals totals = MergeCallers(per, std::chrono::duration<double>(Clock::now() - load.start).count());
  rss.Stop();
  if (f.json) {
    PrintBenchJson(f, n_conn, images, totals, rss);
  } else {
    PrintBenchText(f, totals, rss);
  }
  std::fflush(stdout);
  return totals.n_errors == 0 ? 0 : 3;
}

}  // namespace

void RegisterBenchServerCommand(CLI::App& app) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand("bench-server", "load a server on loopback for a bounded time");
  cmd->add_option("--server", f->server, "HOST:PORT on loopback, or unix:/path")->required();
  cmd->add_option("--concurrency", f->concurrency, "callers (closed loop) or in-flight cap (open loop)")
      ->capture_default_str()
      ->check(Integer(1, 4096));
  cmd->add_option("--duration-s", f->duration_s, "how long to send, seconds")
      ->capture_default_str()
      ->check(Number(0.1, 3600, "s"));
  auto* images = cmd->add_option("--images", f->images, "directory of JPEG/PNG files to send");
  cmd->add_option("--synthetic", f->synthetic, "without --images: this many generated JPEGs")
      ->capture_default_str()
      ->check(Integer(1, 100000))
      ->excludes(images);
  cmd->add_option("--image-size", f->image_size, "side of the generated square JPEGs, pixels")
      ->capture_default_str()
      ->check(Integer(28, 4096));
  cmd->add_flag("--hit-only", f->hit_only, "encode every image once first, so measured requests are cache hits");
  cmd->add_option("--rate", f->rate, "open loop: requests/s on a fixed schedule (0 = closed loop)")
      ->capture_default_str()
      ->check(Number(0, 1e6, "requests/s"));
  cmd->add_option("--zipf", f->zipf, "image popularity: Zipf exponent s over the image list (0 = uniform)")
      ->capture_default_str()
      ->check(Number(0, 10));
  cmd->add_option("--seed", f->seed, "image choice seed")->capture_default_str();
  cmd->add_option("--timeout-s", f->timeout_s, "deadline of each call, seconds")
      ->capture_default_str()
      ->check(Number(0, 1e6, "s", /*lo_open=*/true));
  cmd->add_option("--server-pid", f->server_pid, "sample this process's RSS during the run (same machine)")
      ->check(Integer(1));
  cmd->add_option("--connections", f->connections, "HTTP/2 connections to spread callers over [min(concurrency, 4)]")
      ->check(Integer(1, 256));
  cmd->add_flag("--shm", f->shm,
                "ask for shared-memory delivery (the server needs --shm-arena-mb); each caller reads the rows in "
                "place and releases them with its next call");
  cmd->add_flag("--route-by-key", f->route_by_key,
                "hash each image on the client and send its key as the route header, as behind a load balancer");
  cmd->add_flag("--json", f->json, "print one JSON object instead of text");
  AddClientSecurityFlags(*cmd, f->security);  // a server with TLS or a token is loaded the same way
  cmd->callback([f] {
    if (int rc = RunBench(*f); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace epd::cli
