// epd/server/front_door.h: another front end's way into an EncodeServer.
//
// The OpenAI-compatible HTTP front (epd/openai/openai_front.h) serves beside
// the gRPC port over the same server: one WorkerLoop (so the same L1/L2
// cache, in-flight joins, batching, L3 and fair shares), the same in-flight
// request budget, bearer token, tenant rule and metrics page. It reaches
// them through this door, which EncodeServer::front_door() hands out; the
// front owns its own transport, parsing and replies.
//
// Encode() is the Encode RPC's path after its transport checks: serving?,
// the request budget (waits up to ServerOptions::admission_wait for room,
// then kResourceExhausted naming the budget), an id the server assigns
// (never one a gRPC client may send, request_id.h), the worker, and the
// budget's bytes back once the request is done. It blocks the calling
// thread until the request completes (a synchronous HTTP handler's model);
// the worker's callbacks only fulfil a promise.
//
// Thread safety: every method is thread-safe. Lifetime: the door refers to
// the server; use it only while the server lives (Shutdown may have run:
// Encode then answers kUnavailable).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "epd/core/status.h"
#include "epd/rpc/server_stats.h"
#include "epd/server/server.h"
#include "epd/worker/encode_worker.h"
#include "epd/worker/item_probe.h"

namespace epd {

// The tower's output shape, as the server reports it in Health.
struct FrontTowerInfo {
  std::string description;
  std::int64_t hidden = 0;
  std::int64_t deepstack_layers = 0;
  DType dtype = DType::kFloat32;
};

class ServerFrontDoor {
 public:
  explicit ServerFrontDoor(EncodeServer::Impl* server) : s_(server) {}

  // Admits, submits and waits (see the header comment). `bytes`: what the
  // request holds in memory (its media), charged to the budget; more than
  // the budget's capacity is kResourceExhausted. The request id is assigned
  // here (request.id is overwritten). A refusal comes back as
  // RequestResult::status with no items: kUnavailable (shutting down),
  // kResourceExhausted (budget, queue), or the worker's.
  // `caller` (from Caller()) sets the request's fair share and key
  // namespace and is counted in the per-tenant stats.
  RequestResult Encode(EncodeRequest request, std::int64_t bytes, const CallerIdentity& caller) const;

  // The Probe RPC's path after its transport checks (src/server/
  // probe_call.cc): serving?, then ProbeItems (epd/worker/item_probe.h) with
  // `caller`'s key namespace, on the calling thread. The media's bytes must
  // be charged already (TakeBudget). kUnavailable when shutting down; else
  // one entry per item.
  StatusOr<std::vector<StatusOr<ItemProbe>>> Probe(EncodeRequest request, const CallerIdentity& caller) const;

  // Takes `bytes` of the in-flight request budget at once (no wait), for
  // bytes a front comes to hold before it calls Encode (media as they are
  // fetched): OK, or kResourceExhausted naming the budget and what is in
  // flight. Each OK take is given back with ReleaseBudget. O(1).
  Status TakeBudget(std::int64_t bytes) const;
  void ReleaseBudget(std::int64_t bytes) const;

  bool serving() const;
  const std::string& server_id() const;
  const WorkerOptions& worker_options() const;  // model_id, preprocess, video_sampling, key_mode
  FrontTowerInfo tower() const;
  std::int64_t max_items_per_request() const;
  // The bearer-token check of every gRPC call, for an Authorization header
  // (nullopt = absent); OK when the server has no token.
  Status Authorize(const std::optional<std::string>& authorization) const;
  bool auth_enabled() const;
  // Who a client is that sent the Authorization header `authorization` and
  // `value` under tenant_header() (nullopt = absent) from address `ip` (no
  // port): as for a gRPC call with the same metadata from the same address
  // (src/server/tenants.h; HTTP has no client certificate here).
  // kUnauthenticated for a refused token, kInvalidArgument for a malformed
  // tenant header.
  StatusOr<CallerIdentity> Caller(const std::optional<std::string>& authorization,
                                  const std::optional<std::string>& value, const std::string& ip) const;
  const std::string& tenant_header() const;
  // One front request's wall time, into the epd_request_seconds histogram.
  void ObserveRequest(double seconds) const;
  // Appends families (text exposition format) to the metrics page.
  void AddMetricsSource(std::function<std::string()> text) const;
  ServerStats Stats() const;

 private:
  EncodeServer::Impl* s_;
};

}  // namespace epd
