// src/server/metrics.h (internal): the server's Prometheus metrics.
//
// Two sources feed the text exposition at /metrics:
//   * Counters and gauges the worker already keeps (WorkerStats) are not
//     mirrored into prometheus-cpp objects; a Collectable builds them from a
//     fresh ServerStats snapshot on every scrape (stats_series.h, from the
//     same field tables as the Stats RPC), so they can never drift from it.
//   * Per-event distributions the worker does not keep are prometheus-cpp
//     histograms, observed as events happen: tokens and latency of every
//     tower batch (ObserveBatch, from the MeteredTower decorator on the
//     worker thread) and latency of every Encode call (ObserveCall, on
//     whichever thread finishes the call).
//
// Names (all prefixed epd_; see docs/SERVER.md for the full list):
//   epd_cache_hits_total{tier}, epd_cache_misses_total, epd_joins_total,
//   epd_cache_evictions_total{tier}, epd_cache_lru_victims_total{tier},
//   epd_cache_demotions_total,
//   epd_cache_promotions_total, epd_cache_bytes{tier},
//   epd_cache_capacity_bytes{tier}, epd_cache_entries{tier},
//   epd_queue_items, epd_queue_tokens, epd_in_flight_requests,
//   epd_requests_total, epd_items_total, epd_tower_batches_total,
//   epd_tower_failures_total, epd_item_errors_total{code},
//   epd_rpc_errors_total{code}, epd_buffered_bytes,
//   epd_sink_full_stalls_total, epd_reply_held_bytes,
//   epd_reply_refusals_total, epd_throttled_calls_total,
//   epd_write_timeouts_total; histograms epd_batch_tokens,
//   epd_tower_seconds, epd_request_seconds.
//
// Serving: Serve() puts the page on an epd::HttpEndpoint (epd/http/
// http_endpoint.h) at GET /metrics (and /): idle connections hold no
// thread, and with `authorize` set (the server's bearer token) a scrape
// without the token gets 401. AddSource() appends more families, already in
// the text exposition format, to every page (the OpenAI front's counters,
// epd/openai/openai_front.h), so a front never touches the tables here.
//
// Thread safety: thread-safe (prometheus-cpp histograms lock internally; the
// snapshot function and the sources must be thread-safe).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "epd/core/status.h"
#include "epd/core/vision_tower.h"
#include "epd/rpc/server_stats.h"

namespace epd::internal {

class TenantLabels;  // tenant_labels.h

struct MetricsEndpointOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  // Checks the Authorization header of a scrape (nullopt = absent); null =
  // no check.
  std::function<Status(const std::optional<std::string>&)> authorize{};
  std::chrono::milliseconds read_timeout{5000};
};

class ServerMetrics {
 public:
  // `snapshot` is called on every scrape (on the exposer's thread);
  // `tenant_labels` caps the per-tenant cache families' labels
  // (tenant_labels.h, --max-tenant-labels; null = kDefaultMaxTenantLabels).
  explicit ServerMetrics(std::function<ServerStats()> snapshot, std::shared_ptr<TenantLabels> tenant_labels = nullptr);
  ~ServerMetrics();

  // Serves /metrics on host:port (port 0 = any free port). A connection that
  // has not sent a complete request head within `read_timeout` (from accept,
  // or between keep-alive requests from its first byte; idle keep-alive
  // connections are closed after it too) is closed. kUnavailable when it
  // cannot bind; kInvalidArgument for a timeout <= 0. Call at most once.
  Status Serve(const MetricsEndpointOptions& options);
  // Appends the text `text()` returns (Prometheus text exposition format,
  // complete families) to every page. Thread-safe.
  void AddSource(std::function<std::string()> text);
  // The bound port, -1 before Serve.
  int port() const;
  // Closes the endpoint (no scrape runs after it returns). Idempotent.
  void Stop();

  void ObserveBatch(std::int64_t tokens, double seconds);
  void ObserveCall(double seconds);

  // The exposition text /metrics serves (for tests and debugging).
  std::string Render() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A VisionTower that forwards to `inner` and reports each Encode call's
// post-merge tokens and wall time to `metrics`. Thread-compatible, like any
// tower.
std::unique_ptr<VisionTower> MeterTower(std::unique_ptr<VisionTower> inner, std::shared_ptr<ServerMetrics> metrics);

}  // namespace epd::internal
