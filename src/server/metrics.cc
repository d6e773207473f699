// Counters and gauges are rebuilt from a ServerStats snapshot per scrape (see
// metrics.h); only the histograms live in a prometheus-cpp Registry. Render()
// serialises both as one page.
//
// Why not prometheus-cpp's Exposer (prometheus-cpp::pull): it serves through
// civetweb, which Debian builds with a fixed 100 KiB thread stack
// (pthread_attr_setstacksize(0x19000)). In a process that links libtorch, the
// static TLS of libopenblas (60 KiB), libglog (30 KiB) and libtorch_cpu
// (10 KiB) alone exceeds that, so pthread_create fails with EINVAL and the
// Exposer cannot start. The page is served instead by epd::HttpEndpoint
// (epd/http/http_endpoint.h, cpp-httplib with default-sized std::threads),
// the same HTTP server as the OpenAI-compatible front: idle and trickling
// connections wait in its epoll park and hold no thread, so they cost a
// scrape nothing (issue 27, fault 6), and with a bearer token configured the
// page requires it.
#include "metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include "epd/http/http_endpoint.h"
#include "proto_convert.h"

namespace epd::internal {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily Family(std::string name, std::string help, MetricType type) {
  return MetricFamily{std::move(name), std::move(help), type, {}};
}

void Add(MetricFamily& f, double value, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  if (f.type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f.metric.push_back(std::move(m));
}

// The shared tier's (L3) families, present only when the server has one.
void AddSharedTier(const SharedTierStats& l3, std::vector<MetricFamily>& out) {
  out.push_back(Family("epd_l3_degraded", "1 while the last operation on some L3 Redis failed", MetricType::Gauge));
  Add(out.back(), l3.degraded ? 1 : 0);
  const std::pair<const char*, std::uint64_t> counters[] = {
      {"epd_l3_gets_total", l3.gets},
      {"epd_l3_hits_total", l3.hits},
      {"epd_l3_misses_total", l3.misses},
      {"epd_l3_corrupt_total", l3.corrupt},
      {"epd_l3_writes_total", l3.writes},
      {"epd_l3_write_bytes_total", l3.write_bytes},
      {"epd_l3_write_drops_total", l3.write_drops},
      {"epd_l3_leases_acquired_total", l3.leases_acquired},
      {"epd_l3_leases_released_total", l3.leases_released},
      {"epd_l3_lease_waits_total", l3.lease_waits},
      {"epd_l3_lease_wait_hits_total", l3.lease_wait_hits},
      {"epd_l3_lease_takeovers_total", l3.lease_takeovers},
      {"epd_l3_lease_wait_timeouts_total", l3.lease_wait_timeouts}};
  for (const auto& [name, value] : counters) {
    out.push_back(Family(name, "L3 shared tier (docs/L3.md)", MetricType::Counter));
    Add(out.back(), static_cast<double>(value));
  }
  out.push_back(Family("epd_l3_errors_total", "Failed L3 operations, by kind", MetricType::Counter));
  for (const auto& [kind, n] : l3.errors) Add(out.back(), static_cast<double>(n), {{"kind", kind}});
}

// Builds the counter and gauge families from a ServerStats snapshot.
class StatsCollectable : public prometheus::Collectable {
 public:
  explicit StatsCollectable(std::function<ServerStats()> snapshot) : snapshot_(std::move(snapshot)) {}

  std::vector<MetricFamily> Collect() const override {
    const ServerStats s = snapshot_();
    const WorkerStats& w = s.worker;
    std::vector<MetricFamily> out;
    auto counter = [&](const char* name, const char* help, double v) {
      out.push_back(Family(name, help, MetricType::Counter));
      Add(out.back(), v);
    };
    auto gauge = [&](const char* name, const char* help, double v) {
      out.push_back(Family(name, help, MetricType::Gauge));
      Add(out.back(), v);
    };
    auto per_tier = [&](const char* name, const char* help, MetricType type, double l1, double l2) {
      out.push_back(Family(name, help, type));
      Add(out.back(), l1, {{"tier", "l1"}});
      Add(out.back(), l2, {{"tier", "l2"}});
    };
    per_tier("epd_cache_hits_total", "Items served from the cache, by tier", MetricType::Counter,
             static_cast<double>(w.hits_l1), static_cast<double>(w.hits_l2));
    Add(out.back(), static_cast<double>(w.hits_l3), {{"tier", "l3"}});
    if (s.l3_enabled) AddSharedTier(s.l3, out);
    counter("epd_cache_misses_total", "Items that missed the cache (ran the tower or failed before it)",
            static_cast<double>(w.misses));
    counter("epd_joins_total", "Items that joined a computation already queued or running",
            static_cast<double>(w.joins));
    counter("epd_shape_mismatches_total", "Cache hits whose shape differed from the request's",
            static_cast<double>(w.shape_mismatches));
    counter("epd_video_items_total", "Video items (also counted as cache hits or misses above)",
            static_cast<double>(w.video_items));
    counter("epd_video_decodes_total", "Video items decoded (not served whole from the cache)",
            static_cast<double>(w.video_decodes));
    out.push_back(
        Family("epd_video_chunks_total", "Temporal chunks of decoded videos, by outcome", MetricType::Counter));
    Add(out.back(), static_cast<double>(w.chunk_hits), {{"outcome", "hit"}});
    Add(out.back(), static_cast<double>(w.chunk_misses), {{"outcome", "miss"}});
    Add(out.back(), static_cast<double>(w.chunk_joins), {{"outcome", "joined"}});
    counter("epd_cache_errors_total",
            "Cache operations whose tier copy failed (served as a miss, or the victim dropped)",
            static_cast<double>(w.cache_errors));
    per_tier("epd_cache_evictions_total", "Capacity victims, by tier", MetricType::Counter,
             static_cast<double>(w.l1_evictions), static_cast<double>(w.l2_evictions));
    counter("epd_cache_demotions_total", "L1 victims moved to L2", static_cast<double>(w.demotions));
    counter("epd_cache_promotions_total", "L2 hits moved to L1", static_cast<double>(w.promotions));
    per_tier("epd_cache_bytes", "Bytes held by the cache, by tier", MetricType::Gauge,
             static_cast<double>(w.l1_used_bytes), static_cast<double>(w.l2_used_bytes));
    per_tier("epd_cache_capacity_bytes", "Cache capacity, by tier", MetricType::Gauge,
             static_cast<double>(s.l1_capacity_bytes), static_cast<double>(s.l2_capacity_bytes));
    per_tier("epd_cache_entries", "Entries held by the cache, by tier", MetricType::Gauge,
             static_cast<double>(w.l1_entries), static_cast<double>(w.l2_entries));
    gauge("epd_queue_items", "Computations queued for the tower", static_cast<double>(w.pending_items));
    gauge("epd_queue_tokens", "Post-merge tokens queued for the tower", static_cast<double>(w.pending_tokens));
    gauge("epd_in_flight_requests", "Requests accepted and not yet complete",
          static_cast<double>(w.in_flight_requests));
    counter("epd_requests_total", "Requests accepted by the worker", static_cast<double>(w.requests));
    counter("epd_items_total", "Items of accepted requests", static_cast<double>(w.items));
    counter("epd_rejected_requests_total", "Requests the worker refused (duplicate id, queue limit)",
            static_cast<double>(w.rejected_requests));
    counter("epd_cancelled_requests_total", "Requests cancelled (deadline, client, shutdown)",
            static_cast<double>(w.cancelled_requests));
    counter("epd_tower_batches_total", "Tower calls, failed ones included", static_cast<double>(w.tower_batches));
    counter("epd_tower_items_total", "Computations sent to the tower", static_cast<double>(w.tower_items));
    counter("epd_tower_failures_total", "Tower batches that failed", static_cast<double>(w.tower_failures));
    counter("epd_sink_full_stalls_total", "Worker steps skipped because result buffers were full",
            static_cast<double>(w.sink_full_stalls));
    gauge("epd_buffered_bytes", "Result bytes waiting to be written to clients", static_cast<double>(s.buffered_bytes));
    // Shared-memory delivery (docs/SHM.md); all 0 without an arena.
    gauge("epd_shm_capacity_bytes", "Size of the shared-memory arena", static_cast<double>(s.shm.capacity_bytes));
    gauge("epd_shm_leased_bytes", "Arena bytes under lease (each shared span once)",
          static_cast<double>(s.shm.leased_bytes));
    gauge("epd_shm_leases", "Shared-memory leases held by clients", static_cast<double>(s.shm.leases));
    counter("epd_shm_items_total", "Items delivered by reference into the arena", static_cast<double>(s.shm.items));
    counter("epd_shm_reused_total", "Items delivered from a span already holding the key (no copy)",
            static_cast<double>(s.shm.reused));
    counter("epd_shm_fallbacks_total", "Items asked for by shared memory but sent inline (arena full)",
            static_cast<double>(s.shm.fallbacks));
    counter("epd_shm_expired_total", "Shared-memory leases ended by their deadline",
            static_cast<double>(s.shm.expired));
    counter("epd_shm_refused_releases_total", "Releases that matched no lease (repeated, stale or expired)",
            static_cast<double>(s.shm.refused_releases));
    gauge("epd_shm_sessions", "Lease sessions open now", static_cast<double>(s.shm.sessions));
    counter("epd_shm_session_reclaimed_total", "Shared-memory leases ended because their session ended",
            static_cast<double>(s.shm.session_reclaimed));
    // CUDA IPC delivery (docs/SHM.md, "CUDA IPC"); all 0 without it.
    gauge("epd_ipc_capacity_bytes", "Bound on bytes of live CUDA IPC exports",
          static_cast<double>(s.ipc.capacity_bytes));
    gauge("epd_ipc_exported_bytes", "Bytes of live CUDA IPC exports (each shared export once)",
          static_cast<double>(s.ipc.exported_bytes));
    gauge("epd_ipc_leases", "CUDA IPC leases held by clients", static_cast<double>(s.ipc.leases));
    counter("epd_ipc_items_total", "Items delivered by CUDA IPC", static_cast<double>(s.ipc.items));
    counter("epd_ipc_reused_total", "Items delivered from a live export of their key (no copy)",
            static_cast<double>(s.ipc.reused));
    counter("epd_ipc_fallbacks_total", "Items asked for by CUDA IPC but sent otherwise (bound reached, export failed)",
            static_cast<double>(s.ipc.fallbacks));
    counter("epd_ipc_not_resident_total", "Items asked for by CUDA IPC whose rows were not in device memory",
            static_cast<double>(s.ipc.not_resident));
    counter("epd_ipc_expired_total", "CUDA IPC leases ended by their deadline", static_cast<double>(s.ipc.expired));
    counter("epd_ipc_refused_releases_total", "CUDA IPC releases that matched no lease",
            static_cast<double>(s.ipc.refused_releases));
    counter("epd_ipc_session_reclaimed_total", "CUDA IPC leases ended because their session ended",
            static_cast<double>(s.ipc.session_reclaimed));

    out.push_back(Family("epd_item_errors_total", "Failed items, by status code", MetricType::Counter));
    for (const auto& [code, n] : w.errors) {
      Add(out.back(), static_cast<double>(n), {{"code", GrpcCodeName(static_cast<int>(code))}});
    }
    out.push_back(Family("epd_rpc_errors_total", "Calls (any service) that ended with an error, by status code",
                         MetricType::Counter));
    for (const auto& [code, n] : s.rpc_errors) {
      Add(out.back(), static_cast<double>(n), {{"code", GrpcCodeName(static_cast<int>(code))}});
    }
    return out;
  }

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

}  // namespace

struct ServerMetrics::Impl {
  std::shared_ptr<StatsCollectable> stats;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  prometheus::Histogram* batch_tokens = nullptr;
  prometheus::Histogram* tower_seconds = nullptr;
  prometheus::Histogram* request_seconds = nullptr;
  std::unique_ptr<HttpEndpoint> http;
  std::mutex sources_mu;
  std::vector<std::function<std::string()>> sources;  // guarded by sources_mu
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

ServerMetrics::~ServerMetrics() { Stop(); }

Status ServerMetrics::Serve(const MetricsEndpointOptions& o) {
  if (o.read_timeout.count() <= 0) return InvalidArgument("metrics read timeout must be > 0");
  HttpEndpointOptions eo;
  eo.host = o.host;
  eo.port = o.port;
  eo.authorize = o.authorize;
  eo.threads = 2;  // a scrape takes milliseconds; idle connections hold none
  eo.header_timeout = o.read_timeout;
  eo.idle_timeout = o.read_timeout;
  eo.body_timeout = o.read_timeout;
  eo.write_timeout = o.read_timeout;
  eo.max_body_bytes = 64 << 10;  // a GET has no body
  auto page = [this](const HttpRequest&) {
    return HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", Render()};
  };
  StatusOr<std::unique_ptr<HttpEndpoint>> http =
      HttpEndpoint::Start(eo, {{"GET", "/metrics", true, page}, {"GET", "/", true, page}});
  if (!http.ok()) {
    return Status(http.status().code(),
                  "cannot serve metrics on " + o.host + ":" + std::to_string(o.port) + ": " + http.status().message());
  }
  impl_->http = std::move(*http);
  impl_->port = impl_->http->port();
  return Status::Ok();
}

void ServerMetrics::AddSource(std::function<std::string()> text) {
  std::lock_guard<std::mutex> lock(impl_->sources_mu);
  impl_->sources.push_back(std::move(text));
}

int ServerMetrics::port() const { return impl_->port; }

void ServerMetrics::Stop() {
  if (impl_->http != nullptr) impl_->http->Stop();
}

void ServerMetrics::ObserveBatch(std::int64_t tokens, double seconds) {
  impl_->batch_tokens->Observe(static_cast<double>(tokens));
  impl_->tower_seconds->Observe(seconds);
}

void ServerMetrics::ObserveCall(double seconds) { impl_->request_seconds->Observe(seconds); }

std::string ServerMetrics::Render() const {
  std::vector<MetricFamily> families = impl_->stats->Collect();
  for (MetricFamily& f : impl_->registry->Collect()) families.push_back(std::move(f));
  std::ostringstream os;
  prometheus::TextSerializer().Serialize(os, families);
  std::lock_guard<std::mutex> lock(impl_->sources_mu);
  for (const auto& text : impl_->sources) os << text();
  return os.str();
}

std::unique_ptr<VisionTower> MeterTower(std::unique_ptr<VisionTower> inner, std::shared_ptr<ServerMetrics> metrics) {
  return std::make_unique<MeteredTower>(std::move(inner), std::move(metrics));
}

}  // namespace epd::internal
