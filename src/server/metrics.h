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
//   epd_cache_evictions_total{tier}, epd_cache_demotions_total,
//   epd_cache_promotions_total, epd_cache_bytes{tier},
//   epd_cache_capacity_bytes{tier}, epd_cache_entries{tier},
//   epd_queue_items, epd_queue_tokens, epd_in_flight_requests,
//   epd_requests_total, epd_items_total, epd_tower_batches_total,
//   epd_tower_failures_total, epd_item_errors_total{code},
//   epd_rpc_errors_total{code}, epd_buffered_bytes,
//   epd_sink_full_stalls_total; histograms epd_batch_tokens,
//   epd_tower_seconds, epd_request_seconds.
//
// Thread safety: thread-safe (prometheus-cpp histograms lock internally; the
// snapshot function must be thread-safe).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "epd/core/status.h"
#include "epd/core/vision_tower.h"
#include "epd/rpc/server_stats.h"

namespace epd::internal {

class ServerMetrics {
 public:
  // `snapshot` is called on every scrape (on the exposer's thread).
  explicit ServerMetrics(std::function<ServerStats()> snapshot);
  ~ServerMetrics();

  // Serves /metrics on address:port (port 0 = any free port), each
  // connection on its own thread (at most 16 at once). A connection that has
  // not sent its request head within `read_timeout` is closed unanswered.
  // kUnavailable when it cannot bind; kInvalidArgument for a timeout <= 0.
  // Call at most once.
  Status Serve(const std::string& address, int port, std::chrono::milliseconds read_timeout = std::chrono::seconds(5));
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
