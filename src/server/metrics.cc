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
// Exposer cannot start. The page is served instead by epd::HttpEndpoint
// (epd/http/http_endpoint.h, Boost.Beast with default-sized std::threads),
// the same HTTP server as the OpenAI-compatible front: idle, trickling and
// slow-body connections hold no thread, so they cost a scrape nothing
// (issue 27, fault 6; issue 40, B64), a body is bounded however it is
// framed, and with a bearer token configured the page requires it, checked
// from the head before any body byte is read.
#include "metrics.h"

#include <prometheus/client_metric.h>
#include <prometheus/collectable.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "epd/core/mutex.h"
#include "epd/http/http_endpoint.h"
#include "stats_series.h"

namespace epd::internal {

// Builds the counter and gauge families from a ServerStats snapshot
// (stats_series.h). Outside the anonymous namespace, since
// ServerMetrics::Impl (external linkage) holds one.
class StatsCollectable : public prometheus::Collectable {
 public:
  StatsCollectable(std::function<ServerStats()> snapshot, std::shared_ptr<TenantLabels> tenant_labels)
      : snapshot_(std::move(snapshot)), tenant_labels_(std::move(tenant_labels)) {}

  std::vector<prometheus::MetricFamily> Collect() const override { return StatsFamilies(snapshot_(), *tenant_labels_); }

 private:
  std::function<ServerStats()> snapshot_;
  std::shared_ptr<TenantLabels> tenant_labels_;
};

namespace {

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
  Mutex sources_mu;
  std::vector<std::function<std::string()>> sources EPD_GUARDED_BY(sources_mu);
  int port = -1;
};

ServerMetrics::ServerMetrics(std::function<ServerStats()> snapshot, std::shared_ptr<TenantLabels> tenant_labels)
    : impl_(std::make_unique<Impl>()) {
  if (tenant_labels == nullptr)
    tenant_labels = std::make_shared<TenantLabels>(kDefaultMaxTenantLabels, std::set<std::string>{});
  impl_->stats = std::make_shared<StatsCollectable>(std::move(snapshot), std::move(tenant_labels));
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
  MutexLock lock(impl_->sources_mu);  // Render reads http under it
  impl_->http = std::move(*http);
  impl_->port = impl_->http->port();
  return Status::Ok();
}

void ServerMetrics::AddSource(std::function<std::string()> text) {
  MutexLock lock(impl_->sources_mu);
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
  std::vector<prometheus::MetricFamily> families = impl_->stats->Collect();
  for (prometheus::MetricFamily& f : impl_->registry->Collect()) families.push_back(std::move(f));
  MutexLock lock(impl_->sources_mu);
  if (impl_->http != nullptr) {
    // This port's own answers (its 401s, 404s, 408s and 413s too).
    prometheus::MetricFamily own{"epd_metrics_http_responses_total",
                                 "Responses of the metrics port, by HTTP status",
                                 prometheus::MetricType::Counter,
                                 {}};
    for (const auto& [status, n] : impl_->http->Stats().responses) {
      prometheus::ClientMetric m;
      m.label.push_back({"status", std::to_string(status)});
      m.counter.value = static_cast<double>(n);
      own.metric.push_back(std::move(m));
    }
    families.push_back(std::move(own));
  }
  std::ostringstream os;
  prometheus::TextSerializer().Serialize(os, families);
  for (const auto& text : impl_->sources) os << text();
  return os.str();
}

std::unique_ptr<VisionTower> MeterTower(std::unique_ptr<VisionTower> inner, std::shared_ptr<ServerMetrics> metrics) {
  return std::make_unique<MeteredTower>(std::move(inner), std::move(metrics));
}

}  // namespace epd::internal
